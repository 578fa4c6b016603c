"""The harness shipped into the jail (verifier/harness/harness.py) is generated from its parts
(codec.py, framing.py, control.py, runners.py): it must be exactly what the generator makes of
them now, so an edit to a part that was not regenerated fails here and not in a jail."""

from __future__ import annotations

import ast

from verifier.harness import build, harness_source


def test_shipped_harness_is_current() -> None:
    assert harness_source().decode() == build.build(), (
        "verifier/harness/harness.py is stale: run `python -m verifier.harness.build`")


def test_shipped_harness_is_self_contained() -> None:
    """One file, standard library only: no import of a sibling part or of the package."""
    tree = ast.parse(harness_source())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            assert node.level == 0 and not (node.module or "").startswith("verifier"), node.module
        elif isinstance(node, ast.Import):
            assert not any(a.name.startswith("verifier") for a in node.names)


def test_every_part_is_in_the_shipped_file() -> None:
    text = harness_source().decode()
    for part in build.PARTS:
        assert f"# {part}\n" in text
    assert "def main():" in text and 'if __name__ == "__main__":' in text


def test_shipped_harness_says_it_is_generated_in_its_first_lines() -> None:
    """Anyone opening harness.py reads first that it is generated, from what and how, and is not
    edited by hand; the header comes from the generator, so regenerating keeps it."""
    head = "\n".join(harness_source().decode().splitlines()[:6])
    assert head.startswith(build.generated_header().rstrip("\n"))
    assert "DO NOT EDIT BY HAND" in head and "python -m verifier.harness.build" in head
    for part in build.PARTS:
        assert part in head
    assert ast.get_docstring(ast.parse(harness_source())), "the docstring is still the module's"
