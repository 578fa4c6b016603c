"""The ``default`` profile's math rules that plain math-verify lacks (docs/verifier.md 1).

String rules, applied by verifier/scoring/math_score.py around its math-verify calls; sympy is only
imported by the two helpers that take parsed expressions (:func:`solution_sets`,
:func:`agree`). None of them applies under the ``skywork`` profile, which gives the released
Skywork-OR1 reward's verdict.

- What renders (:func:`render`): the answer region is read as TeX renders it. A ``%`` comment
  runs to the end of its line and takes the line break and the next line's leading blanks (a
  ``%`` right after a number is a percent sign: ``50%``); ``\\iffalse ... \\fi`` is dropped
  (``\\iftrue`` keeps its first branch); argument-free ``\\def``/``\\newcommand`` macros are
  expanded, macros with arguments and ``\\let`` are refused; ``\\phantom``, ``\\hphantom``
  and ``\\vphantom`` are dropped.
- Hedges (:func:`unretracted_boxes`): the boxes before the final one count as other final
  answers unless a retraction ("wait", "wrong", "mistake", "actually", "no,", ...) follows
  them before the final box.
- Relations: a relation symbol with no left side (``\\neq 9``, ``< 5``) states no value
  (:func:`missing_left_side`). An equation (``=``, ``\\approx``) answering a gold that is not
  a relation is judged by each of its sides (:func:`relation_chain`), but a left side that
  only names the quantity (a variable, ``f(2)``, ``a_{10}``, ``AB``, ``m + n``:
  :func:`names_a_quantity`).
- Alternatives in one box (``x = 13 \\lor x = 29``, ``13 or 29``) are a list
  (:func:`alternatives`), as math-verify already reads ``\\text{ or }``.
- Percentages (:func:`without_percent`), numbers in a base (:func:`based_number`),
  inequalities against intervals (:func:`solution_sets`).
"""

from __future__ import annotations

import re
from typing import Any

from verifier.scoring import extract

# --------------------------------------------------------------------------------------------
# what renders

MAX_DEFINITIONS = 32
"""Most macro definitions one response may make before it is refused."""
MAX_EXPANDED_CHARS = 2_000_000
"""Longest answer region that macro expansion may produce before the response is refused."""

_COMMENT_SCAN = re.compile(r"\\[\\%]|%")  # an escaped \% or \\ (then a real comment), or a %
_IF = re.compile(r"\\if(false|true)(?![A-Za-z])")
_ELSE_FI = re.compile(r"\\(else|fi)(?![A-Za-z])")
_FI = re.compile(r"\\fi(?![A-Za-z])")
_DEFINE = re.compile(
    r"\\(?:(?P<def>[gex]?def)|(?P<cmd>(?:re)?newcommand|providecommand|DeclareRobustCommand)\*?"
    r"|(?P<op>DeclareMathOperator)\*?|(?P<let>let))(?![A-Za-z])")
_MACRO_NAME = re.compile(r"\s*(\{\s*)?\\([A-Za-z]+|[^A-Za-z\s])\s*(\})?\s*")
_PHANTOM = re.compile(r"\\[hv]?phantom(?![A-Za-z])\s*")
_ONE_TOKEN = re.compile(r"\\[A-Za-z]+|\\.|\S")


def render(text: str) -> tuple[str, str | None]:
    """``(text as TeX renders it, None)``, or ``(text, why it is refused)`` when it defines
    macros that are not expanded here. Each step runs only when its trigger is present."""
    if "%" in text:
        text = _strip_comments(text)
    if "\\if" in text:
        text = _strip_conditionals(text)
    if _DEFINE.search(text):
        text, problem = _expand_macros(text)
        if problem is not None:
            return text, problem
    if "phantom" in text:
        text = _strip_phantoms(text)
    return text, None


def _skip_blanks(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t":
        i += 1
    return i


def _percent_sign(text: str, i: int) -> bool:
    """Whether the ``%`` at ``i`` is a percent sign: right after a number (``50%``,
    ``12.5 %``), as prose and unescaped answers write it."""
    j = i - 1
    while j >= 0 and text[j] in " \t":
        j -= 1
    return j >= 0 and text[j].isdigit()


def _strip_comments(text: str) -> str:
    """Drop every TeX comment: from an unescaped ``%`` that is not a percent sign through the
    line break and the next line's leading blanks."""
    pieces, pos = [], 0
    for m in _COMMENT_SCAN.finditer(text):
        i = m.start()
        if m.group() != "%" or i < pos or _percent_sign(text, i):
            continue
        end = text.find("\n", i)
        pieces.append(text[pos:i])
        pos = len(text) if end < 0 else _skip_blanks(text, end + 1)
    pieces.append(text[pos:])
    return "".join(pieces)


def _strip_conditionals(text: str) -> str:
    """``\\iffalse A \\else B \\fi`` -> ``B``, ``\\iftrue A \\else B \\fi`` -> ``A`` (not
    nested); an ``\\iffalse`` never closed hides the rest."""
    out, pos = [], 0
    while (m := _IF.search(text, pos)) is not None:
        out.append(text[pos:m.start()])
        keep_first = m.group(1) == "true"
        e = _ELSE_FI.search(text, m.end())
        if e is None:
            if keep_first:
                out.append(text[m.end():])
            return "".join(out)
        if e.group(1) == "fi":
            if keep_first:
                out.append(text[m.end():e.start()])
            pos = e.end()
            continue
        f = _FI.search(text, e.end())
        second_end, pos = (len(text), len(text)) if f is None else (f.start(), f.end())
        out.append(text[m.end():e.start()] if keep_first else text[e.end():second_end])
    out.append(text[pos:])
    return "".join(out)


def _expand_macros(text: str) -> tuple[str, str | None]:
    """Expand argument-free macro definitions (``\\def\\x{5}``, ``\\newcommand{\\x}{5}``,
    ``\\DeclareMathOperator{\\x}{x}``) in the text after each; ``(text, why)`` for one that is
    not expanded here (arguments, ``\\let``), or past the caps."""
    count, pos = 0, 0
    while (m := _DEFINE.search(text, pos)) is not None:
        count += 1
        if count > MAX_DEFINITIONS:
            return text, f"defines over {MAX_DEFINITIONS} macros"
        if m["let"]:
            return text, "redefines a control sequence with \\let"
        name = _MACRO_NAME.match(text, m.end())
        if name is None or bool(name.group(1)) != bool(name.group(3)):
            return text, "defines a macro whose name cannot be read"
        i = name.end()
        if i >= len(text) or text[i] != "{":
            return text, "defines a macro with arguments"
        body = extract.brace_group(text, i)
        if body is None:
            return text, "defines a macro whose body never closes"
        rest = text[i + len(body) + 2:]
        if m["op"]:
            body = "\\operatorname{" + body + "}"
        control = re.escape("\\" + name.group(2))
        if name.group(2).isalpha():
            control += r"(?![A-Za-z])"
        pattern = re.compile(control)
        uses = sum(1 for _ in pattern.finditer(rest))
        if m.start() + len(rest) + uses * len(body) > MAX_EXPANDED_CHARS:
            return text, f"expands its macros past {MAX_EXPANDED_CHARS:,} characters"
        text = text[:m.start()] + pattern.sub(lambda _: body, rest)
        pos = m.start()
    return text, None


def _strip_phantoms(text: str) -> str:
    """Drop ``\\phantom{...}``, ``\\hphantom{...}``, ``\\vphantom{...}``: they render as space."""
    out, pos = [], 0
    while (m := _PHANTOM.search(text, pos)) is not None:
        out.append(text[pos:m.start()])
        i = m.end()
        if i < len(text) and text[i] == "{":
            body = extract.brace_group(text, i)
            pos = len(text) if body is None else i + len(body) + 2
        else:
            tok = _ONE_TOKEN.match(text, i)
            pos = i if tok is None else tok.end()
    out.append(text[pos:])
    return "".join(out)


# --------------------------------------------------------------------------------------------
# hedges

_RETRACTION = re.compile(
    r"\b(?:wait|actually|oops|hmm+|sorry|no(?=\s*[,.!;:])|wrong|mistakes?|mistaken|incorrect\w*"
    r"|erroneous|errors?|correction|correct(?:ed|ing)|scratch that|on second thought|rather"
    r"|instead|not (?:right|correct|valid|possible|the (?:final |correct |right )?answer)"
    r"|(?:is|was)n'?t (?:right|correct)|re-?(?:check|calculat|comput|consider|evaluat|examin"
    r"|visit|do\b|work|think)\w*|double[- ]?check\w*|let me (?:try again|re))",
    re.IGNORECASE)


def unretracted_boxes(region: str, final_start: int) -> list[str]:
    """Contents of the boxes that end before the final box (at ``final_start``) and that no
    retraction follows before it: the other final answers the response gives. The text
    between boxes is searched for retractions; a box's own content is not."""
    if region.count("\\boxed") + region.count("\\fbox") < 2:
        return []
    spans = [s for s in extract.boxed_spans(region) if s[1] <= final_start]
    kept: list[str] = []
    for k, (_, end, content) in enumerate(spans):
        gap_end = spans[k + 1][0] if k + 1 < len(spans) else final_start
        if _RETRACTION.search(region, end, gap_end):
            kept.clear()  # this box and every one before it are taken back
        else:
            kept.append(content)
    return kept


# --------------------------------------------------------------------------------------------
# relations

_SCAN = re.compile(r"\\begin\s*\{[^{}]*\}|\\end\s*\{[^{}]*\}|\\[A-Za-z]+|\\.|<=|>=|!=|:=|==|\s+|.",
                   re.DOTALL)
_OPENERS = frozenset({"{", "(", "[", "\\{", "\\lbrace", "\\langle", "\\lceil", "\\lfloor"})
_CLOSERS = frozenset({"}", ")", "]", "\\}", "\\rbrace", "\\rangle", "\\rceil", "\\rfloor"})
_EQUALS = frozenset({"=", "==", ":="})
_APPROX = frozenset({"\\approx", "\\simeq", "\\thickapprox", "\\approxeq", "\\doteq"})
_ORDER = frozenset({"<", ">", "<=", ">=", "!=", "\\lt", "\\gt", "\\le", "\\leq", "\\ge", "\\geq",
                    "\\leqslant", "\\geqslant", "\\leqq", "\\geqq", "\\ne", "\\neq", "\\not",
                    "\\nless", "\\ngtr", "\\nleq", "\\ngeq"})
_OTHER_RELATIONS = frozenset({"\\in", "\\notin", "\\ni", "\\subset", "\\subseteq", "\\supset",
                              "\\supseteq", "\\equiv", "\\cong", "\\sim", "\\propto", "\\perp",
                              "\\parallel", "\\to", "\\rightarrow", "\\Rightarrow", "\\implies",
                              "\\iff", "\\Leftrightarrow", "\\longrightarrow", "\\mapsto"})
_RELATIONS = _EQUALS | _APPROX | _ORDER | _OTHER_RELATIONS


def _scan(s: str) -> list[tuple[int, str, int]]:
    """``(offset, token, bracket depth)`` of every token of ``s``; ``\\begin``/``\\end`` and
    brackets of any kind nest (mismatched ones like ``[1, 2)`` still balance)."""
    out, depth = [], 0
    for m in _SCAN.finditer(s):
        t = m.group()
        if t in _CLOSERS or t.startswith("\\end"):
            depth = max(depth - 1, 0)
        out.append((m.start(), t, depth))
        if t in _OPENERS or t.startswith("\\begin"):
            depth += 1
    return out


def missing_left_side(s: str) -> bool:
    """Whether ``s`` opens with an order or inequality relation (``\\neq 9``, ``< 5``,
    ``\\geq 2``): it states no value. A leading ``=`` or ``\\approx`` (the value itself) is not
    meant, nor a vector in angle brackets (``<1, 2>``)."""
    s = s.strip()
    if s.startswith("<") and s.endswith(">"):
        return False
    for _, t, _ in _scan(s):
        if not t.isspace():
            return t in _ORDER
    return False


def is_relation(s: str) -> bool:
    """Whether ``s`` has a relation symbol outside brackets (an equation, inequality, ``\\in``)."""
    return any(d == 0 and t in _RELATIONS for _, t, d in _scan(s))


def relation_chain(s: str) -> list[tuple[str, str]] | None:
    """``x = 13 \\approx 12.9`` -> ``[("", "x"), ("=", "13"), ("\\approx", "12.9")]``: the sides
    of a chain of equalities and approximations outside brackets, each with the relation before
    it; None when ``s`` has none, another relation, or a top-level list (``,`` ``;``)."""
    top = [(i, t) for i, t, d in _scan(s) if d == 0]
    rels = [(i, t) for i, t in top if t in _RELATIONS]
    if not rels or any(t not in _EQUALS and t not in _APPROX for _, t in rels):
        return None
    if any(t in (",", ";") for _, t in top):
        return None
    chain, prev, link = [], 0, ""
    for i, t in rels:
        chain.append((link, s[prev:i].strip()))
        link, prev = ("\\approx" if t in _APPROX else "="), i + len(t)
    chain.append((link, s[prev:].strip()))
    return chain


_GREEK = frozenset(
    "\\" + g for g in (
        "alpha beta gamma delta epsilon varepsilon zeta eta theta vartheta iota kappa lambda mu "
        "nu xi rho varrho sigma varsigma tau upsilon phi varphi chi psi omega Gamma Delta Theta "
        "Lambda Xi Sigma Upsilon Phi Psi Omega ell").split())
_NAME_MARKS = frozenset({
    "+", "-", "*", "/", "\\cdot", "\\times", "(", ")", "[", "]", "{", "}", "|", "\\|", "'", ",",
    "\\left", "\\right", "\\lvert", "\\rvert", "\\vert", "\\frac", "\\angle", "\\measuredangle",
    "\\triangle", "\\overline", "\\bar", "\\hat", "\\widehat", "\\vec", "\\overrightarrow",
    "\\tilde", "\\widetilde", "\\dot", "\\ddot", "\\text", "\\textrm", "\\mathrm", "\\textit",
    "\\mathit", "\\mathbf", "\\textbf", "\\boldsymbol", "\\mathcal", "\\operatorname", "\\sin",
    "\\cos", "\\tan", "\\cot", "\\sec", "\\csc", "\\log", "\\ln", "\\lg", "\\gcd", "\\det",
    "\\prime"})
_ARGUMENT_CHARS = frozenset("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ,.-/")
_PRIME_MARKS = frozenset({"\\prime", "*", "\\ast", "\\star", "{", "}"})


def _group_end(toks: list[str], i: int) -> int:
    """Index after the argument starting at ``toks[i]``: a ``{...}`` group or one token."""
    if i >= len(toks) or toks[i] != "{":
        return i + 1
    depth = 0
    for j in range(i, len(toks)):
        depth += {"{": 1, "}": -1}.get(toks[j], 0)
        if depth == 0:
            return j + 1
    return len(toks)


def names_a_quantity(s: str) -> bool:
    """Whether ``s`` only names the quantity asked, computing nothing: letters and Greek
    letters (not ``\\pi``), with subscripts (``a_{10}``), primes, accents, ``\\text{}``, a
    function's value at plain arguments (``f(2)``, ``P(A)``), joined by + - * / (``m + n``,
    ``AB``, ``\\angle ABC``). Any other digit, ``\\pi``, ``\\sqrt``, powers: no."""
    toks = [t for _, t, _ in _scan(s) if not t.isspace()]
    letters, i = False, 0
    while i < len(toks):
        t = toks[i]
        if t == "_":  # a subscript names, it does not compute
            i = _group_end(toks, i + 1)
            continue
        if t == "^":
            end = _group_end(toks, i + 1)
            if not all(x in _PRIME_MARKS for x in toks[i + 1:end]):
                return False
            i = end
            continue
        if t == "(" and i > 0 and (toks[i - 1].isalpha() or toks[i - 1] in _GREEK):
            close = toks.index(")", i) if ")" in toks[i:] else -1
            if close > i and all(x in _ARGUMENT_CHARS for x in toks[i + 1:close]):
                i = close + 1  # f(2): the value of a named function
                continue
        if (len(t) == 1 and t.isalpha()) or t in _GREEK:
            letters = True
        elif t not in _NAME_MARKS:
            return False
        i += 1
    return letters


_TRIG = re.compile(r"\\(?:sin|cos|tan|cot|sec|csc)(?![A-Za-z])")
_DEGREES = re.compile(r"(\d+(?:\.\d+)?)\s*\^\s*(?:\{\s*\\circ\s*\}|\\circ)")


def trig_in_radians(s: str) -> str:
    """``\\sin 30^\\circ`` -> ``\\sin (30\\pi/180)``: degrees inside a trigonometric side of an
    equation, which math-verify would read as radians once the degree mark is dropped."""
    if "circ" not in s or not _TRIG.search(s):
        return s
    return _DEGREES.sub(r"(\1\\pi/180)", s)


_ALTERNATIVE = re.compile(
    r"\\(?:lor|vee)(?![A-Za-z])"
    r"|\\(?:text|textrm|mathrm|mbox|textbf|textit|textnormal)\s*\{\s*,?\s*(?:or|and)\s*,?\s*\}"
    r"|(?<![A-Za-z\\])or(?![A-Za-z])")


def alternatives(s: str) -> str:
    """``x = 13 \\lor x = 29`` -> ``x = 13 , x = 29``: alternatives (``\\lor``, ``\\vee``,
    ``or``, ``\\text{ or }``, ``\\text{ and }``) outside brackets become a list, which matches
    a list of the same values and not one of them."""
    if not _ALTERNATIVE.search(s):
        return s
    depth = {i: d for i, _, d in _scan(s)}
    out, prev = [], 0
    for m in _ALTERNATIVE.finditer(s):
        if depth.get(m.start()) == 0:
            out += [s[prev:m.start()], ","]
            prev = m.end()
    return "".join(out) + s[prev:]


def list_items(s: str) -> list[str]:
    """``(2, 3)`` -> ``["2", "3"]``: the items of a tuple, set or interval (its outer brackets
    dropped) or of a bare list, split at commas outside brackets; ``[s]`` for anything else."""
    toks = _scan(s)
    if len(toks) >= 2 and toks[0][1] in _OPENERS and toks[-1][1] in _CLOSERS \
            and all(d > 0 for _, _, d in toks[1:-1]):
        toks = [(i, t, d - 1) for i, t, d in toks[1:-1]]
    if not toks:
        return [s]
    items, start = [], toks[0][0]
    for i, t, d in toks:
        if d == 0 and t == ",":
            items.append(s[start:i].strip())
            start = i + 1
    end = toks[-1][0] + len(toks[-1][1])
    items.append(s[start:end].strip())
    return items


# --------------------------------------------------------------------------------------------
# percentages and bases

_PERCENT_END = re.compile(r"\s*(?:\\%|%|\\text\s*\{\s*\\?%\s*\}|\\percent)\s*\.?\s*$")


def without_percent(s: str) -> str | None:
    """``12.5\\%`` -> ``12.5``: the number of an answer written as a percentage, else None."""
    m = _PERCENT_END.search(s)
    if m is None:
        return None
    rest = s[:m.start()].strip()
    return rest if rest and "%" not in rest else None


_BASED = re.compile(r"\(?([0-9][0-9A-Z]*)\)?_\{?\(?(\d{1,2})\)?\}?")


def based_number(norm: str) -> tuple[str, int] | None:
    """``1300_5`` or ``1300_{(5)}`` -> ``("1300", 5)``: a numeral with its base as a subscript
    (letters as digits only above base 10), leading zeros dropped; else None."""
    m = _BASED.fullmatch(norm)
    if m is None:
        return None
    digits, base = m.group(1), int(m.group(2))
    if base < 2 or (base <= 10 and not digits.isdigit()):
        return None
    return digits.lstrip("0") or "0", base


# --------------------------------------------------------------------------------------------
# parsed expressions (sympy)

_DECIMALS = re.compile(r"\d*\.(\d+)")


def solution_sets(gold: Any, answer: Any) -> tuple[Any, Any] | None:
    """``(gold, answer)`` with the side that is an inequality in one variable (``-2 < x < 2``,
    ``x \\ge 3``, an "or" of such) replaced by its set of solutions when the other side is an
    interval or a union of them; None when neither applies."""
    from sympy import Interval, Union  # lazy: math worker processes only

    if isinstance(gold, (Interval, Union)):
        converted = _solution_set(answer)
        return None if converted is None else (gold, converted)
    if isinstance(answer, (Interval, Union)):
        converted = _solution_set(gold)
        return None if converted is None else (converted, answer)
    return None


def _solution_set(expr: Any) -> Any:
    """The solutions of ``expr`` when it is a relation between one variable and numbers, an
    ``And`` of such (``-2 < x < 2``) or a set of them (math-verify's reading of an "or"); the
    variable must be alone on one side (``x^2 < 4`` is a question, not an answer)."""
    from sympy import And, Eq, FiniteSet, Ne, Or, Symbol  # lazy: math worker processes only
    from sympy.core.relational import Relational

    parts = list(expr.args) if isinstance(expr, FiniteSet) else [expr]
    variable, clauses = None, []
    for part in parts:
        relations = part.args if isinstance(part, And) else (part,)
        for r in relations:
            if not isinstance(r, Relational) or isinstance(r, Ne):
                return None
            on_left = isinstance(r.lhs, Symbol)
            if on_left == isinstance(r.rhs, Symbol):
                return None
            var, other = (r.lhs, r.rhs) if on_left else (r.rhs, r.lhs)
            if other.free_symbols or (variable is not None and var != variable):
                return None
            variable = var
        clauses.append(And(*relations))
    if variable is None or (len(parts) == 1 and isinstance(parts[0], Eq)):
        return None
    try:
        return Or(*clauses).as_set()
    except Exception:  # noqa: BLE001 - not a set sympy can write down: no conversion
        return None


def agree(a: Any, b: Any, a_latex: str, b_latex: str) -> bool:
    """Whether two parsed numbers agree to the decimals shown (``\\pi \\approx 3.14``: within
    one unit of the last decimal of the less precise side; whole numbers within 0.5)."""
    from sympy import N  # lazy: math worker processes only

    try:
        av, bv = complex(N(a, 30)), complex(N(b, 30))
    except Exception:  # noqa: BLE001 - not a number: no agreement
        return False
    shown = [max(len(m.group(1)) for m in found) for found in
             (list(_DECIMALS.finditer(a_latex)), list(_DECIMALS.finditer(b_latex))) if found]
    tolerance = 10.0 ** -min(shown) if shown else 0.5
    return abs(av - bv) <= tolerance * (1 + 1e-9)
