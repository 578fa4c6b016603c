"""The differential set for the ``lcb`` profile: problems in LiveCodeBench's ``input_output``
shape and programs that stress its judge's rules (how stdin is read and stdout written, the
function wrapping of stdin programs, exits, the import preamble, output size, class shapes,
state between tests, return types), one or more per rule.

Each program is labelled by LiveCodeBench's own judge (tests/fixtures/lcb_labels.json, made by
``scripts/lcb_label.py`` against LiveCodeBench/LiveCodeBench at a pinned commit; the labels are
committed, never LiveCodeBench's code). tests/test_lcb_differential.py checks that the ``lcb``
profile gives every program the same verdict. Problems are built here in code, so that outputs of
megabytes need not be stored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from verifier.scoring.bigint import MAX_INT_DIGITS, int_to_digits

BIG_EXPONENT = 17350  # 2**17350 has 5,223 digits: past Python's default of 4,300
DEEP = 450  # nesting of the "deep" problem's list: past the codec's former bound of 400
LINES = 1_250_000  # the "count" problem prints 1..n: about 8.9 MB of stdout


def _nested(n: int) -> list:
    x: list = []
    for _ in range(n):
        x = [x]
    return x


def problems() -> dict[str, dict]:
    """Problem id -> LiveCodeBench's ``input_output`` (inputs, outputs, fn_name)."""
    return {
        "sum": {"inputs": ["3\n1\n2\n3\n", "2\n10\n20\n"], "outputs": ["6\n", "30\n"]},
        "count": {"inputs": [f"{LINES}\n", "3\n"],
                  "outputs": ["\n".join(map(str, range(1, LINES + 1))) + "\n", "1\n2\n3\n"]},
        "add": {"inputs": ["1\n2", "5\n7"], "outputs": ["3", "12"], "fn_name": "add"},
        "square": {"inputs": ["3", "4"], "outputs": ["9", "16"], "fn_name": "square"},
        "half": {"inputs": ["1", "3"], "outputs": ["0.5", "1.5"], "fn_name": "half"},
        "deep": {"inputs": [str(DEEP), "2"],
                 "outputs": [json.dumps(_nested(DEEP)), "[[[]]]"], "fn_name": "deep"},
        "power": {"inputs": [f"2\n{BIG_EXPONENT}", "3\n5"],
                  "outputs": [int_to_digits(2**BIG_EXPONENT, MAX_INT_DIGITS), "243"], "fn_name": "power"},
        "divmod": {"inputs": ["7\n2", "9\n4"], "outputs": ["[3, 1]", "[2, 1]"],
                   "fn_name": "dm"},
        "odd": {"inputs": ["3", "4"], "outputs": ["true", "false"], "fn_name": "isOdd"},
    }


def fenced(code: str) -> str:
    """A response holding ``code`` as every judge under test extracts it: one ```` ```python ````
    block after a closed think (the same text for our profiles and the labelling script)."""
    return f"<think>\nplan\n</think>\nHere it is:\n```python\n{code}\n```\n"


@dataclass(frozen=True)
class Program:
    id: str
    problem: str
    rule: str
    """The class of rule it stresses (the table of known differences, and the rules found
    besides)."""
    code: str


_SUM_BODY = "n = int(input())\nprint(sum(int(input()) for _ in range(n)))\n"

P = Program
PROGRAMS: list[Program] = [
    # -- stdin read other ways ------------------------------------------------------------------
    P("stdin_input", "sum", "stdin", _SUM_BODY),
    P("stdin_readline", "sum", "stdin",
      "import sys\nn = int(sys.stdin.readline())\n"
      "print(sum(int(sys.stdin.readline()) for _ in range(n)))\n"),
    P("stdin_read_split", "sum", "stdin",
      "import sys\nd = sys.stdin.read().split()\nprint(sum(map(int, d[1:])))\n"),
    P("stdin_for_line", "sum", "stdin",
      "import sys\nv = [int(l) for l in sys.stdin]\nprint(sum(v[1:]))\n"),
    P("stdin_readlines_every_line", "sum", "stdin",
      "import sys\nlines = sys.stdin.readlines()\nprint(sum(int(x) for x in lines[1:]))\n"),
    P("stdin_readlines_split", "sum", "stdin",
      "import sys\nlines = sys.stdin.readlines()\n"
      "print(sum(int(x) for x in lines[1:] if x.strip()))\n"),
    P("stdin_buffer_readline", "sum", "stdin",
      "import sys\nn = int(sys.stdin.buffer.readline())\n"
      "print(sum(int(sys.stdin.buffer.readline()) for _ in range(n)))\n"),
    P("stdin_buffer_read", "sum", "stdin",
      "import sys\nd = sys.stdin.buffer.read().split()\nprint(sum(map(int, d[1:])))\n"),
    P("stdin_open0", "sum", "stdin",
      "d = open(0).read().split()\nprint(sum(map(int, d[1:])))\n"),
    P("stdin_os_read", "sum", "stdin",
      "import os\nd = os.read(0, 1 << 20).split()\nprint(sum(map(int, d[1:])))\n"),
    P("stdin_fileno_fastio", "sum", "stdin",
      "import os, sys\nfrom io import BytesIO\n"
      "inp = BytesIO(os.read(sys.stdin.fileno(), 1 << 20)).readline\n"
      "n = int(inp())\nprint(sum(int(inp()) for _ in range(n)))\n"),
    P("stdin_from_sys_import", "sum", "stdin",
      "from sys import stdin\nn = int(stdin.readline()[:-1])\n"
      "print(sum(int(stdin.readline()[:-1]) for _ in range(n)))\n"),
    P("stdin_from_sys_import_unstripped", "sum", "stdin",
      "from sys import stdin\nn = int(stdin.readline())\n"
      "print(sum(int(stdin.readline()) for _ in range(n)))\n"),
    P("stdin_from_sys_import_read", "sum", "stdin",
      "from sys import stdin\nd = stdin.read().split()\nprint(sum(map(int, d[1:])))\n"),
    P("stdin_read_whole", "sum", "stdin",
      "import sys\nd = sys.stdin.read()\nprint(sum(map(int, d.split()[1:])))\n"),
    P("stdin_readline_until_empty", "sum", "stdin",
      "import sys\nsys.stdin.readline()\nt = 0\nwhile True:\n    s = sys.stdin.readline()\n"
      "    if not s.strip():\n        break\n    t += int(s)\nprint(t)\n"),
    P("stdin_input_until_eof", "sum", "stdin",
      "input()\nt = 0\nwhile True:\n    try:\n        s = input()\n    except EOFError:\n"
      "        break\n    if not s:\n        break\n    t += int(s)\nprint(t)\n"),
    P("stdin_input_rebound", "sum", "stdin",
      "import sys\ninput = sys.stdin.readline\nn = int(input())\n"
      "print(sum(int(input()) for _ in range(n)))\n"),
    P("stdin_input_lambda_rstrip", "sum", "stdin",
      "import sys\ninput = lambda: sys.stdin.readline().rstrip()\nn = int(input())\n"
      "print(sum(int(input()) for _ in range(n)))\n"),
    # -- stdout written other ways --------------------------------------------------------------
    P("stdout_sys_write", "sum", "stdout",
      "import sys\nd = sys.stdin.read().split()\nsys.stdout.write(str(sum(map(int, d[1:]))) + '\\n')\n"),
    P("stdout_from_sys_import", "sum", "stdout",
      "from sys import stdout\nn = int(input())\n"
      "stdout.write(str(sum(int(input()) for _ in range(n))) + '\\n')\n"),
    P("stdout_buffer_write", "sum", "stdout",
      "import sys\nn = int(input())\n"
      "sys.stdout.buffer.write(str(sum(int(input()) for _ in range(n))).encode() + b'\\n')\n"),
    P("stdout_os_write", "sum", "stdout",
      "import os\nn = int(input())\n"
      "os.write(1, str(sum(int(input()) for _ in range(n))).encode() + b'\\n')\n"),
    P("stdout_stderr_debug", "sum", "stdout",
      "import sys\nn = int(input())\nprint('debug', n, file=sys.stderr)\n"
      "print(sum(int(input()) for _ in range(n)))\n"),
    P("stdout_no_newline", "sum", "stdout",
      "n = int(input())\nprint(sum(int(input()) for _ in range(n)), end='')\n"),
    P("stdout_print_file_stdout", "sum", "stdout",
      "import sys\nn = int(input())\nprint(sum(int(input()) for _ in range(n)), file=sys.stdout)\n"),
    # -- stdin programs run as the body of a function ------------------------------------------
    P("wrap_global_in_function", "sum", "wrap",
      "total = 0\ndef add(x):\n    global total\n    total += x\n"
      "n = int(input())\nfor _ in range(n):\n    add(int(input()))\nprint(total)\n"),
    P("wrap_nonlocal_at_module", "sum", "wrap",
      "total = 0\ndef add(x):\n    nonlocal total\n    total += x\n"
      "n = int(input())\nfor _ in range(n):\n    add(int(input()))\nprint(total)\n"),
    P("wrap_return_at_module", "sum", "wrap", _SUM_BODY + "return\nprint('never')\n"),
    P("wrap_function_reads_module_name", "sum", "wrap",
      "def main():\n    n = int(input())\n    print(sum(int(input()) for _ in range(n)))\nmain()\n"),
    # -- the __name__ guard ---------------------------------------------------------------------
    P("guard_standard", "sum", "name_guard",
      "def main():\n    n = int(input())\n    print(sum(int(input()) for _ in range(n)))\n"
      "if __name__ == \"__main__\":\n    main()\n"),
    P("guard_reversed", "sum", "name_guard",
      "def main():\n    n = int(input())\n    print(sum(int(input()) for _ in range(n)))\n"
      "if \"__main__\" == __name__:\n    main()\n"),
    P("guard_not_last", "sum", "name_guard",
      "import sys\ndef main():\n    n = int(input())\n    print(sum(int(input()) for _ in range(n)))\n"
      "if __name__ == '__main__':\n    main()\nsys.setrecursionlimit(10000)\n"),
    P("guard_with_else", "sum", "name_guard",
      "def main():\n    n = int(input())\n    print(sum(int(input()) for _ in range(n)))\n"
      "if __name__ == '__main__':\n    main()\nelse:\n    print('imported')\n"),
    # -- quit, exit, os._exit -------------------------------------------------------------------
    P("exit_quit", "sum", "exit", _SUM_BODY + "quit()\n"),
    P("exit_exit", "sum", "exit", _SUM_BODY + "exit()\n"),
    P("exit_sys_exit_0", "sum", "exit", "import sys\n" + _SUM_BODY + "sys.exit(0)\n"),
    P("exit_sys_exit_1", "sum", "exit", "import sys\n" + _SUM_BODY + "sys.exit(1)\n"),
    P("exit_os_exit", "sum", "exit", "import os, sys\n" + _SUM_BODY
      + "sys.stdout.flush()\nos._exit(0)\n"),
    P("exit_raise_after_print", "sum", "exit", _SUM_BODY + "raise ValueError('late')\n"),
    # -- the preamble pasted as text ------------------------------------------------------------
    P("preamble_future_stdio", "sum", "preamble",
      "from __future__ import annotations\n" + _SUM_BODY),
    P("preamble_future_call", "add", "preamble",
      "from __future__ import annotations\nclass Solution:\n"
      "    def add(self, a: int, b: int) -> int:\n        return a + b\n"),
    P("preamble_names_without_import", "sum", "preamble",
      "q = deque(int(input()) for _ in range(int(input())))\nprint(reduce(add, q, 0))\n"),
    # -- the reliability guard ------------------------------------------------------------------
    P("guard_os_getcwd", "sum", "reliability_guard", "import os\nos.getcwd()\n" + _SUM_BODY),
    P("guard_import_resource", "sum", "reliability_guard", "import resource\n" + _SUM_BODY),
    # -- output size ----------------------------------------------------------------------------
    P("output_9mb_stdout", "count", "output_cap",
      "import sys\nn = int(input())\nsys.stdout.write('\\n'.join(map(str, range(1, n + 1))) + '\\n')\n"),
    P("output_10mb_debug_prints_call", "add", "output_cap",
      "class Solution:\n    def add(self, a, b):\n        for _ in range(100000):\n"
      "            print('x' * 100)\n        return a + b\n"),
    # -- one Solution instance per sample; the class-vs-function text rule ---------------------
    P("call_solution", "add", "call_shape",
      "class Solution:\n    def add(self, a: int, b: int) -> int:\n        return a + b\n"),
    P("call_plain_function", "add", "call_shape", "def add(a, b):\n    return a + b\n"),
    P("call_memo_on_instance", "square", "solution_instance",
      "class Solution:\n    def square(self, n):\n        if not hasattr(self, 'memo'):\n"
      "            self.memo = n * n\n        return self.memo\n"),
    P("call_memo_keyed_on_instance", "square", "solution_instance",
      "class Solution:\n    def square(self, n):\n        self.memo = getattr(self, 'memo', {})\n"
      "        if n not in self.memo:\n            self.memo[n] = n * n\n"
      "        return self.memo[n]\n"),
    P("call_class_text_in_comment", "add", "call_shape",
      "# no class Solution here\ndef add(a, b):\n    return a + b\n"),
    P("call_function_beside_class", "add", "call_shape",
      "class Solution:\n    pass\ndef add(a, b):\n    return a + b\n"),
    P("call_function_beside_other_class", "add", "call_shape",
      "class Helper:\n    pass\ndef add(a, b):\n    return a + b\n"),
    P("call_sys_exit", "add", "exit", "import sys\nclass Solution:\n    def add(self, a, b):\n"
      "        sys.exit(0)\n"),
    P("call_returns_none", "add", "call_shape",
      "class Solution:\n    def add(self, a, b):\n        pass\n"),
    P("call_raises", "add", "call_shape",
      "class Solution:\n    def add(self, a, b):\n        return a + b + [][0]\n"),
    # -- time: the module's own alarm -----------------------------------------------------------
    P("time_module_then_first_call", "add", "module_alarm",
      "import time\ntime.sleep(3.5)\nclass Solution:\n    def add(self, a, b):\n"
      "        if a == 1:\n            time.sleep(3.5)\n        return a + b\n"),
    # -- == semantics of returned values --------------------------------------------------------
    P("eq_tuple_for_list", "divmod", "equality",
      "class Solution:\n    def dm(self, a, b):\n        return divmod(a, b)\n"),
    P("eq_int_for_bool", "odd", "equality",
      "class Solution:\n    def isOdd(self, n):\n        return n % 2\n"),
    P("eq_fraction_for_float", "half", "equality",
      "from fractions import Fraction\nclass Solution:\n    def half(self, n):\n"
      "        return Fraction(n, 2)\n"),
    P("eq_decimal_for_float", "half", "equality",
      "from decimal import Decimal\nclass Solution:\n    def half(self, n):\n"
      "        return Decimal(n) / 2\n"),
    P("eq_float", "half", "equality",
      "class Solution:\n    def half(self, n):\n        return n / 2\n"),
    P("eq_list_450_deep", "deep", "equality",
      "class Solution:\n    def deep(self, n):\n        x = []\n        for _ in range(n):\n"
      "            x = [x]\n        return x\n"),
    P("eq_numpy_int", "add", "equality",
      "import numpy as np\nclass Solution:\n    def add(self, a, b):\n"
      "        return np.int64(a) + np.int64(b)\n"),
    P("eq_big_int", "power", "big_int",
      "class Solution:\n    def power(self, a, b):\n        return a ** b\n"),
    P("eq_big_int_wrong", "power", "big_int",
      "class Solution:\n    def power(self, a, b):\n        return a ** b + 1\n"),
]
