"""LiveCodeBench's harness semantics, for the ``lcb`` profile's stdin/stdout and call-based tests.

Part of the judge's harness (generated into ``harness.py`` by ``python -m
verifier.harness.build``). Every rule here is LiveCodeBench's (LiveCodeBench/LiveCodeBench at
28fef95ea8c9f7a547c8329f2cd3d32b92c1fa24), read from ``lcb_runner/evaluation/testing_util.py``
(TU below) and ``lcb_runner/evaluation/compute_code_generation_metrics.py`` (CM), and written
here in our own code, inside our sandbox (nothing of the isolation is relaxed):

- one process runs the whole sample (TU ``run_test``: the module once, then every test in
  turn), so state persists between tests, as there;
- the reliability guard (TU ``reliability_guard``): ``quit``, ``help``, ``os.kill``,
  ``os.getcwd`` and the other names it sets to None are None; ``resource``, ``psutil``, ... are
  unimportable;
- stdin programs (TU ``grade_stdio``): ``clean_if_name`` (only a LAST statement whose test
  unparses to ``__name__ == '__main__'`` is unwrapped), then ``make_function`` (imports first,
  every other statement the body of ``wrapped_function``, the preamble pasted as text before
  them), run in a module named ``tmp_sol`` (TU ``compile_code``);
- call-based programs (TU ``grade_call_based``): the preamble pasted as text, ``"\\n\\n"``, then
  the program; ``"class Solution" in code`` decides between ONE ``Solution()`` for the whole
  sample and the module itself; the method is looked up on that object only (TU
  ``get_function``);
- the module's load has its own time limit and each test another (TU ``compile_code``'s
  ``signal.alarm(timeout)``, and one per test): the harness enforces each as a deadline;
- a test's stdin is TU's ``MockStdinWithBuffer`` (see :class:`LcbStdin`) and its stdout is
  captured by swapping ``sys.stdout`` for a StringIO only (TU ``Capturing``): what is written to
  the real stdout (``os.write(1, ...)``, a ``stdout`` bound before the test, ``sys.stdout.buffer``
  which a StringIO lacks) is lost, and the real stdin is empty (a multiprocessing child's)
  but for its ``readline``, ``readlines`` and ``read``, which TU patches for the test (a
  ``stdin`` bound by ``from sys import stdin`` reads the input through them);
- a stdin program's ``SystemExit`` ends its test cleanly (TU ``call_method``); a call-based
  program's fails it; ``os._exit`` ends the judging process: no verdict there, a failure here;
- results: a returned tuple is a list; Fractions, Decimals and lists nested up to
  ``LCB_MAX_DEPTH`` are sent as data for the judge's ``==`` (verifier/scoring/output_compare.py).

The ``skywork`` profile (``cfg["lcb_rules"] == "skywork"``) runs the same rules with the two
where Skywork-OR1's older copy of this judge differs (SkyworkAI/Skywork-OR1 at
64e96afa213ae89d0ad21932106d3b8aafe9ace2, ``verl/utils/reward_score/livecodebench/``: its
``lcb_runner/evaluation/testing_util.py``, SKY-TU below, and ``compute_score.py``, SKY-CS), found
by tests/test_lcb_differential.py against that copy:

- a test's stdin is a plain StringIO of the input (SKY-TU ``call_method`` patches
  ``sys.stdin`` with ``StringIO(inputs)``; its ``readline``/``readlines``/``read`` patches land
  on the stdin that was there before): iterable, ``readlines()`` keeps each line's ``"\n"`` and
  has no trailing ``''``, ``read()`` consumes, and there is no ``buffer``
  (:func:`skywork_stdin`);
- a call-based program without the text ``"class Solution"`` has its top-level function named
  ``fn_name`` moved into a new ``class Solution`` before it is judged (SKY-CS
  ``convert_function_to_class_method``, called by ``compute_score``), and fails every test when
  it has none (:func:`skywork_function_to_method`).

Not reproduced (the sandbox forbids it, or it cannot matter to a verdict): ctypes stays denied
(``deny_in_process_hooks``); ``builtins.open`` is not replaced by ``mock_open`` (a program sees
the preamble's own ``open`` from ``from io import *``/``from builtins import *``, which is the real
one there too); a program that catches the judge's ``TimeoutException`` by a bare ``except`` and
goes on is stopped at the deadline here all the same.
"""

import builtins
import io
import os
import sys
import time

from .codec import EncodeError, encode_message
from .control import (Watch, _limits_in_child, deny_in_process_hooks, kill_all, program_settings,
                      spawn)
from .framing import ERR_TAIL, MsgReader, json, send_msg, write_all

LCB_MAX_DEPTH = 900
"""The deepest list a call-based result may be under the lcb profile (LiveCodeBench compares
at any depth; the judge decodes the result with ``json``, whose decoder stops near 1,000)."""

_GUARD_OS = ("kill", "system", "putenv", "remove", "removedirs", "rmdir", "fchdir", "setuid",
             "fork", "forkpty", "killpg", "rename", "renames", "truncate", "replace", "unlink",
             "fchmod", "fchown", "chmod", "chown", "chroot", "lchflags", "lchmod", "lchown",
             "getcwd", "chdir")
_GUARD_MODULES = ("ipdb", "joblib", "resource", "psutil", "tkinter")


def lcb_reliability_guard():
    """Rule ``reliability_guard`` (TU): the names LiveCodeBench's judge sets to None before it
    runs a program (``quit``, ``help``, ``os.kill``, ``os.getcwd``, ...; ``shutil.rmtree``...,
    ``subprocess.Popen``) and the modules it makes unimportable (``sys.modules[name] = None``).
    Its memory limit is not set there (no argument): the profile's is generous instead."""
    builtins.quit = None
    builtins.help = None
    os.environ["OMP_NUM_THREADS"] = "1"
    for name in _GUARD_OS:
        if hasattr(os, name):
            setattr(os, name, None)
    import shutil  # lazy: only the lcb profile's program process needs it
    import subprocess  # lazy: likewise

    shutil.rmtree = shutil.move = shutil.chown = None
    subprocess.Popen = None
    for name in _GUARD_MODULES:
        sys.modules[name] = None


def lcb_clean_if_name(code):
    """Rule ``clean_if_name`` (TU): when the LAST top-level statement is an ``if`` whose test
    unparses to exactly ``__name__ == '__main__'``, it is replaced by its body (its ``else``
    dropped); any other guard (``"__main__" == __name__``, one not last) stays, and is false in a
    module named ``tmp_sol``. Source that does not parse is returned as it is."""
    import ast  # lazy: ~4 ms of every jail's start-up; only lcb stdin programs need it

    try:
        tree = ast.parse(code)
        last = tree.body[-1]
        if isinstance(last, ast.If) and ast.unparse(last.test).strip() == "__name__ == '__main__'":
            code = ast.unparse(tree.body[:-1]) + "\n" + ast.unparse(last.body)
    except Exception:  # noqa: BLE001 - as LiveCodeBench: anything leaves the code as it is
        pass
    return code


def lcb_make_function(code, preamble):
    """Rule ``make_function`` (TU): the preamble as text, the program's top-level imports, and
    every other top-level statement as the body of ``def wrapped_function():`` (so module-level
    names are the function's locals: ``global x`` in a nested function is a NameError, while
    ``return`` and ``nonlocal`` at the top level become legal). Source that does not parse is
    returned as it is (then it fails to compile, as there)."""
    import ast  # lazy: ~4 ms of every jail's start-up; only lcb stdin programs need it

    try:
        imports, others = [], []
        for stmt in ast.parse(code).body:
            (imports if isinstance(stmt, (ast.Import, ast.ImportFrom)) else others).append(stmt)
        fn = ast.FunctionDef(
            name="wrapped_function",
            args=ast.arguments(posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[],
                               defaults=[]),
            body=others, decorator_list=[], lineno=-1)
        return preamble + "\n" + ast.unparse(imports) + "\n" + ast.unparse(fn)
    except Exception:  # noqa: BLE001 - as LiveCodeBench
        return code


def skywork_function_to_method(code, fn_name):
    """Rule ``convert_function_to_class_method`` (SKY-CS, Skywork-OR1 at 64e96af,
    ``verl/utils/reward_score/livecodebench/compute_score.py``), applied by ``compute_score`` to
    a call-based program whose text lacks ``"class Solution"``: every top-level ``def`` (not
    ``async def``) named ``fn_name`` leaves its place; the last of them gets a first positional
    parameter ``self`` unless its first one is already called so, and becomes the one method of
    a new ``class Solution`` appended at the end; the module is re-written by ``ast.unparse``
    (comments dropped). None when there is no such function (there: a False score). A
    SyntaxError propagates (there: ``ast.parse`` fails first, a False score)."""
    import ast  # lazy: ~4 ms of every jail's start-up; only skywork call programs need it

    tree = ast.parse(code)
    body, target = [], None
    for stmt in tree.body:
        if type(stmt) is ast.FunctionDef and stmt.name == fn_name:
            target = stmt
        else:
            body.append(stmt)
    if target is None:
        return None
    params = target.args.args
    if not (params and params[0].arg == "self"):
        params.insert(0, ast.arg(arg="self", annotation=None))
    body.append(ast.ClassDef(name="Solution", bases=[], keywords=[], body=[target],
                             decorator_list=[]))
    tree.body = body
    return ast.unparse(tree)


def skywork_stdin(inputs):
    """Rule ``call_method`` (SKY-TU, Skywork-OR1 at 64e96af,
    ``verl/utils/reward_score/livecodebench/lcb_runner/evaluation/testing_util.py``): the
    program's ``sys.stdin`` is ``StringIO(inputs)`` itself, unpatched (the ``readline``,
    ``readlines`` and ``read`` patches there name ``sys.stdin`` before it is replaced, so they
    change the judge's own stdin): iterable, ``readlines()`` as StringIO's, no ``buffer``."""
    return io.StringIO(inputs)


class _LcbNoFunction(Exception):
    """Skywork's conversion found no top-level function to make a method of."""


def lcb_program_text(cfg):
    """The module text LiveCodeBench executes: stdin programs through ``clean_if_name`` and
    ``make_function``; call-based programs as ``preamble + "\\n\\n" + program`` (TU
    ``grade_call_based``: the preamble pasted as text, so ``from __future__`` after it is a
    SyntaxError). Under Skywork's rules a call-based program without ``"class Solution"`` is
    first converted (:func:`skywork_function_to_method`)."""
    preamble = cfg["prefix"]
    if cfg["mode"] == "stdio":
        return lcb_make_function(lcb_clean_if_name(cfg["source"]), preamble)
    source = cfg["source"]
    if cfg["lcb_rules"] == "skywork" and "class Solution" not in source:
        source = skywork_function_to_method(source, cfg["fn_name"])
        if source is None:
            raise _LcbNoFunction(f"no top-level function {cfg['fn_name']!r} to make a method "
                                 "of class Solution")
    return preamble + "\n\n" + source


class LcbBuffer:
    """Rule ``MockBuffer`` (TU): ``read()`` is the whole input as bytes, and ``readline()`` the
    FIRST line plus ``b"\\n"``, every time."""

    def __init__(self, inputs):
        self.inputs = inputs.encode("utf-8")

    def read(self, *args):
        return self.inputs

    def readline(self, *args):
        return self.inputs.split(b"\n")[0] + b"\n"


class LcbStdin:
    """Rule ``MockStdinWithBuffer`` (TU), as ``call_method``'s patches leave it (they patch the
    attributes of the stdin that was there before, then replace it by this object):
    ``read()`` is the whole input whatever was read before, ``readlines()`` is
    ``input.split("\\n")`` (a trailing ``''``), ``readline()`` (and so ``input()``) reads lines
    from a StringIO of the input; anything else is the StringIO's (``fileno()`` raises); not
    iterable (no ``__iter__``)."""

    def __init__(self, inputs):
        self.inputs = inputs
        self._stringio = io.StringIO(inputs)
        self.buffer = LcbBuffer(inputs)

    def read(self, *args):
        return self.inputs

    def readline(self, *args):
        return self._stringio.readline(*args)

    def readlines(self, *args):
        return self.inputs.split("\n")

    def __getattr__(self, name):
        return getattr(self._stringio, name)


class _LcbSyntax(Exception):
    """The module text does not compile (reported as the program's SyntaxError)."""


def _lcb_load(cfg):
    """Compile and run the module (rule ``compile_code``); the callable each test calls."""
    module = type(sys)("tmp_sol", "")  # types.ModuleType, without importing types
    try:
        text = lcb_program_text(cfg)
        code = compile(text, "<string>", "exec")
    except (SyntaxError, ValueError, OverflowError, RecursionError, MemoryError) as e:
        raise _LcbSyntax(f"{type(e).__name__}: {e}") from None
    exec(code, module.__dict__)
    if cfg["mode"] == "stdio":
        name, target = "wrapped_function", module
    else:
        name = cfg["fn_name"]
        # Rule: class vs function by the TEXT (TU compile_code: ``"class Solution" in code``),
        # one instance for the whole sample; the method looked up on it only (get_function).
        target = module.Solution() if "class Solution" in text else module
    if not hasattr(target, name):
        raise AttributeError(f"{type(target).__name__} has no attribute {name!r}")
    return getattr(target, name)


def _lcb_stdio_test(method, inp, out_fd, stdin_mock):
    """One stdin/stdout test (TU ``grade_stdio`` and ``call_method``): the output captured by
    swapping ``sys.stdout`` alone, a SystemExit swallowed, ``sys.stdin`` the judge's mock
    (``stdin_mock(inp)``: :class:`LcbStdin`, or :func:`skywork_stdin`). Writes the captured
    text on ``out_fd``; returns its size in bytes."""
    capture = io.StringIO()
    capture.close = lambda *a: 1  # as Capturing: closing it is a no-op
    saved_out, saved_in = sys.stdout, sys.stdin
    # TU ``call_method`` (and SKY-TU's): its ``@patch("sys.stdin.readline"/"readlines"/"read")``
    # decorators are entered BEFORE ``@patch("sys.stdin", ...)``, so they land on the stdin the
    # process already had, the object a program bound at load time (``from sys import stdin``)
    # still holds: there ``readline()`` is the next line without its newline, ``readlines()``
    # ``inp.split("\n")`` and ``read()`` the whole input, during this test only.
    lines = iter(inp.split("\n"))
    old_in = {"readline": lambda *a: next(lines), "readlines": lambda *a: inp.split("\n"),
              "read": lambda *a: inp}
    patched = []
    for name, fn in old_in.items():
        try:
            setattr(saved_in, name, fn)
            patched.append(name)
        except (AttributeError, TypeError):  # a stdin that takes no attributes: left as it is
            pass
    sys.stdout, sys.stdin = capture, stdin_mock(inp)
    try:
        method()
    except SystemExit:
        pass
    finally:
        sys.stdout, sys.stdin = saved_out, saved_in
        for name in patched:
            try:
                delattr(saved_in, name)
            except AttributeError:
                pass
    data = capture.getvalue().encode("utf-8", "surrogatepass")
    write_all(out_fd, data)
    return len(data)


def _lcb_program(cfg):
    """The program process of an lcb sample: guard, load, then one test per request."""
    _limits_in_child(cfg, cfg["_budget"] + 1)
    program_settings(cfg["int_digits"])
    deny_in_process_hooks()
    send, exit_now, Exc = send_msg, os._exit, Exception
    req = MsgReader(3)
    if cfg["sys_path"] and "numpy" in cfg["source"]:
        # LiveCodeBench's judging process imported numpy before its guard (TU imports it at
        # the top), so the program's ``import numpy`` finds it loaded: numpy's own import would
        # call what the guard removes. Imported only for programs that name it (~0.1 s).
        try:
            import numpy  # noqa: F401 - lazy: see above
        except BaseException:  # noqa: BLE001 - then the program's import fails as it would
            pass
    lcb_reliability_guard()
    try:
        method = _lcb_load(cfg)
    except BaseException as e:  # noqa: BLE001 - any failure to load fails every test there
        syntax = isinstance(e, _LcbSyntax)
        send(4, {"fatal": str(e)[:500] if syntax else f"{type(e).__name__}: {e}"[:500],
                 "memory": isinstance(e, MemoryError), "syntax": syntax})
        exit_now(0)
    send(4, {"ready": True})
    inputs = cfg["inputs"]
    stdin_mock = skywork_stdin if cfg["lcb_rules"] == "skywork" else LcbStdin
    while True:
        m = req.next_blocking()
        if m is None:
            exit_now(0)
        i = m["i"]
        try:
            if cfg["mode"] == "stdio":
                resp = {"n": _lcb_stdio_test(method, inputs[i], 5, stdin_mock)}
            else:
                result = method(*inputs[i])
                if isinstance(result, tuple):  # TU grade_call_based: tuples count as lists
                    result = list(result)
                resp = {"r": encode_message(result, max_depth=LCB_MAX_DEPTH, numbers=True)}
        except BaseException as e:  # noqa: BLE001 - the test fails (a SystemExit too here)
            memory = isinstance(e, MemoryError)
            try:
                detail = f"{type(e).__name__}: {e}"[:500]
            except Exc:
                detail = "an exception"
            if isinstance(e, EncodeError):
                detail = f"the result cannot be sent: {detail}"
            resp = {"exc": detail, "memory": memory}
        send(4, resp)


def _lcb_wait(watch, reader, deadline):
    """The next message from the program process, reading its captured output into
    ``watch.out`` meanwhile. Returns the message, "timeout", "output_limit", "garbage" or
    "eof" (it ended without one)."""
    os.set_blocking(reader.fd, False)
    while True:
        try:
            m = reader.take()
        except Exception:  # noqa: BLE001 - DecodeError: the channel holds garbage
            return "garbage"
        if m is not None:
            return m
        if reader.eof:
            return "eof"
        how = watch.run(deadline, others=(reader.fd,))
        if how == "output_limit":
            return how
        if how == "timeout":
            return "eof" if watch.wait_status is not None else "timeout"
        if how == "exited":  # what it wrote before is in the pipe: a moment to read it
            deadline = min(deadline, time.monotonic() + 0.05)
            continue
        reader.feed()


def _lcb_take_output(watch, fd, n):
    """Read the rest of a test's captured output (the program wrote all ``n`` bytes before it
    answered, so they are in the pipe): True, "output_limit", or False when they are not."""
    while len(watch.out) < n:
        if fd not in watch.fds:
            return False
        got = watch._read(fd)
        if got is False:
            return "output_limit"
        if got is None:
            return False
    return True


def run_lcb(cfg, rep):
    """The lcb profile's stdin/stdout and call-based tests: one program process for the whole
    sample (see the module docstring); the module gets its own ``test_timeout`` and each test
    another; the first failed test ends the sample (TU: ``grade_*`` return at the first
    failure)."""
    tt = float(cfg["test_timeout"])
    cpu_limit = cfg["_budget"] + 1
    req_r, req_w = os.pipe()
    resp_r, resp_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    # fd 1 is /dev/null: what a program writes to the real stdout is lost, as there.
    pid = spawn({0: None, 1: None, 2: err_w, 3: req_r, 4: resp_w, 5: out_w},
                lambda: _lcb_program(cfg))
    for fd in (req_r, resp_w, out_w, err_w):
        os.close(fd)
    watch = Watch(pid, out_r, err_r, None, int(cfg["output_bytes"]))
    reader = MsgReader(resp_r)
    t0 = time.monotonic()
    ready = _lcb_wait(watch, reader, min(t0 + tt, cfg["_deadline"]))
    if isinstance(ready, dict) and ready.get("syntax"):
        rep.emit({"type": "syntax", "detail": str(ready.get("fatal"))[:500]})
        _lcb_close(watch, pid, req_w, resp_r)
        return
    if not (isinstance(ready, dict) and ready.get("ready")):
        rec = _lcb_failure(watch, pid, cfg, cpu_limit, ready)
        if isinstance(ready, dict) and ready.get("fatal"):
            rec.update(status="memory" if ready.get("memory") else "load_error",
                       detail=str(ready["fatal"])[:500])
        rec.update(type="test", i=0, time=round(time.monotonic() - t0, 4))
        rep.emit(rec, [b"", bytes(watch.err[-ERR_TAIL:])])
        _lcb_close(watch, pid, req_w, resp_r)
        return
    for i in range(len(cfg["inputs"])):
        t0 = time.monotonic()
        watch.out = bytearray()
        try:
            send_msg(req_w, {"i": i})
            resp = _lcb_wait(watch, reader, min(t0 + tt, cfg["_deadline"]))
        except OSError:
            resp = "eof"
        took = round(time.monotonic() - t0, 4)
        if isinstance(resp, dict) and cfg["mode"] == "stdio" and "exc" not in resp:
            got = _lcb_take_output(watch, out_r, resp["n"] if type(resp.get("n")) is int else 0)
            if got is not True:
                resp = "output_limit" if got else "garbage"
        if isinstance(resp, dict) and "exc" not in resp:
            if cfg["mode"] == "stdio":
                blob = bytes(watch.out)
            else:
                r = resp.get("r") if isinstance(resp.get("r"), dict) else {}
                blob = json.dumps({"v": r.get("v"), "objs": r.get("objs", [])},
                                  allow_nan=True).encode()
            rep.emit({"type": "test", "i": i, "status": "exited", "exit": 0, "raised": False,
                      "time": took}, [blob, bytes(watch.err[-ERR_TAIL:])])
            continue
        if isinstance(resp, dict):
            rec = {"status": "memory" if resp.get("memory") else "error",
                   "detail": str(resp.get("exc"))[:500]}
        else:
            rec = _lcb_failure(watch, pid, cfg, cpu_limit, resp)
        rec.update(type="test", i=i, time=took)
        rep.emit(rec, [b"", bytes(watch.err[-ERR_TAIL:])])
        break
    _lcb_close(watch, pid, req_w, resp_r)


def _lcb_failure(watch, pid, cfg, cpu_limit, how):
    """Stop the program process and describe how it ended (a timeout, the output cap, garbage
    on the channel, or its death)."""
    if watch.wait_status is None:
        watch.kill()
    watch.reap(True)
    kill_all([pid])
    watch.drain()
    rec = watch.describe(cfg, cpu_limit, how if how in ("timeout", "output_limit") else "exited")
    if how == "garbage":
        rec.update(status="error", detail="the program wrote malformed data on the judge's channel")
    elif rec["status"] == "exited":
        rec.update(status="died", detail="the program process ended without answering")
    return rec


def _lcb_close(watch, pid, req_w, resp_r):
    kill_all([pid])
    watch.reap(True)
    watch.drain()
    for fd in (req_w, resp_r):
        try:
            os.close(fd)
        except OSError:
            pass
