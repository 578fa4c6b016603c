"""Answer extraction (docs/verifier.md 1): the think block and the last \\boxed{...}."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verifier.scoring.extract import (
    after_think,
    boxed_spans,
    last_boxed,
    last_boxed_at,
    last_code_block,
)


@pytest.mark.parametrize(
    "response, expected",
    [
        ("plain answer \\boxed{3}", "plain answer \\boxed{3}"),  # no tags: the whole text
        ("<think>reasoning</think>final \\boxed{3}", "final \\boxed{3}"),
        ("<think>a</think>mid</think>tail", "tail"),  # after the LAST </think>
        ("<think>reasoning \\boxed{3} cut off", None),  # opened, never closed
        ("<think>a</think> answer <think> second block, cut off", None),  # reopened, never closed
        ("no open tag</think>after", "after"),  # a stray close still ends the reasoning
        ("<think></think>", ""),
        ("", ""),
    ],
)
def test_after_think(response: str, expected: str | None) -> None:
    assert after_think(response) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("\\boxed{42}", "42"),
        ("first \\boxed{1} then \\boxed{2}", "2"),  # the last box counts
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),  # nested braces
        ("\\boxed{{{x}}}", "{{x}}"),
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),  # escaped braces do not count
        ("\\boxed{\\{1, 2}", "\\{1, 2"),  # \{ is escaped: the first } closes the box
        ("\\boxed{\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}}", "\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}"),
        ("\\boxed{a\\\\}", "a\\\\"),  # a line break \\ right before the closing brace
        ("\\fbox{7}", "7"),
        ("\\boxed{1} and \\fbox{9}", "9"),
        ("\\boxed {5}", "5"),  # space before the brace
        ("\\boxed 5 is it", "5"),  # no braces: the next token
        ("$\\boxed 5$", "5"),
        ("\\boxed{12", None),  # unclosed: cut off
        ("\\boxed{1} then \\boxed{2", None),  # the LAST box is unclosed: no earlier fallback
        ("\\boxed{}", ""),
        ("no box here", None),
        ("\\boxedx{3}", None),  # not the \boxed command
        ("\\boxed{3} \\boxedfoo", "3"),
        ("\\boxed{\\text{(B)}}", "\\text{(B)}"),
    ],
)
def test_last_boxed(text: str, expected: str | None) -> None:
    assert last_boxed(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("a \\boxed{1} b \\fbox{2}", [(2, 11, "1"), (14, 22, "2")]),
        ("\\boxed{\\boxed{5}}", [(0, 17, "\\boxed{5}")]),  # a box inside another is part of it
        ("\\boxed 5 and \\boxed{6}", [(0, 8, "5"), (13, 22, "6")]),
        ("\\boxed{1} \\boxed{2", [(0, 9, "1")]),  # stops at a box never closed
        ("\\boxedx{3} none", []),
        ("", []),
    ],
)
def test_boxed_spans(text: str, expected: list[tuple[int, int, str]]) -> None:
    spans = boxed_spans(text)
    assert spans == expected
    assert all(text[end - 1] in "}56" for _, end, _ in spans)


@pytest.mark.parametrize("text", ["x \\boxed{1} y \\boxed{2}", "\\boxed{\\boxed{5}}", "\\boxed 7",
                                  "\\boxed{1", "none", "\\fbox{a} \\boxed {b}"])
def test_last_boxed_at_is_where_last_boxed_reads(text: str) -> None:
    found = last_boxed_at(text)
    assert (found[1] if found else None) == last_boxed(text)
    if found:
        assert text.startswith(("\\boxed", "\\fbox"), found[0])


def test_last_boxed_is_linear_on_a_long_unclosed_box() -> None:
    text = "\\boxed{" + "{" * 200_000 + "x"
    assert last_boxed(text) is None


_SAFE = st.text(alphabet=st.characters(blacklist_characters="{}\\", blacklist_categories=("Cs",)))


@st.composite
def balanced(draw: st.DrawFn, depth: int = 3) -> str:
    parts = draw(st.lists(_SAFE, min_size=1, max_size=3))
    if depth > 0 and draw(st.booleans()):
        inner = draw(balanced(depth=depth - 1))
        return parts[0] + "{" + inner + "}" + "".join(parts[1:])
    return "".join(parts)


@settings(max_examples=200, deadline=None)
@given(prefix=_SAFE, content=balanced(), suffix=_SAFE)
def test_last_boxed_round_trips_balanced_content(prefix: str, content: str, suffix: str) -> None:
    assert last_boxed(prefix + "\\boxed{" + content + "}" + suffix) == content


def test_last_code_block_still_finds_the_last_python_block() -> None:
    text = "```python\na = 1\n```\ntext\n```py\nb = 2\n```\n```text\nnot code\n```"
    assert last_code_block(text) == "b = 2\n"
