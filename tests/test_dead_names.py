"""No dead names: every module-level function, class and constant of verifier/, sandbox/ and
trainer/ is referenced somewhere else in the repository (code, tests, scripts, benchmarks, or
the docs and configs), or is on ``ALLOWED`` with the reason it stays.

A reference is a use in Python code (a name read, an attribute, an import, a word inside a
string that is not a docstring: ``__all__``, ``getattr``, a ``monkeypatch`` target) or a
word in a non-Python text file (Markdown, TOML, YAML, the Makefile, Dockerfiles). A docstring
that mentions a name does not keep it alive. Generated files (``harness.py``, the gRPC stubs)
are not checked; their parts are.
"""

from __future__ import annotations

import ast
import functools
import os
import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHECKED = ("verifier", "sandbox", "trainer")
SKIP_DIRS = {"node_modules", "runs", "__pycache__"}  # and every hidden directory (.venv, ...)
TEXT_SUFFIXES = {".md", ".toml", ".yaml", ".yml", ".cfg", ".txt", ".sh", ".proto"}
GENERATED = {"verifier/harness/harness.py"}
GENERATED_DIRS = ("verifier/proto/",)
MAX_BYTES = 4 << 20
WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

ALLOWED: dict[str, str] = {
    # "module.py:NAME": "why it stays although nothing references it",
}


def _files():
    for d, dirs, names in os.walk(ROOT):
        dirs[:] = sorted(x for x in dirs if x not in SKIP_DIRS and not x.startswith(".")
                         and not x.endswith(".egg-info"))
        for name in sorted(names):
            path = Path(d, name)
            rel = path.relative_to(ROOT).as_posix()
            if rel not in GENERATED and path.stat().st_size <= MAX_BYTES:
                yield rel, path


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                out.add(id(first.value))
    return out


def _references(tree: ast.AST, refs: Counter) -> None:
    docs = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Store):
            refs[node.id] += 1
        elif isinstance(node, ast.Attribute):
            refs[node.attr] += 1
        elif isinstance(node, ast.alias):
            refs[node.name.rsplit(".", 1)[-1]] += 1
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and id(node) not in docs):
            refs.update(WORD.findall(node.value))


def _definitions(rel: str, tree: ast.Module) -> list[str]:
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names += [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.append(node.target.id)
    return [f"{rel}:{n}" for n in names if not (n.startswith("__") and n.endswith("__"))]


@functools.lru_cache(maxsize=1)
def unreferenced() -> tuple[str, ...]:
    refs: Counter = Counter()
    defined: list[str] = []
    for rel, path in _files():
        if path.suffix == ".py":
            text = path.read_text(encoding="utf-8")
            try:
                tree = ast.parse(text, rel)
            except SyntaxError:  # a script for a newer Python than this one: its words count
                refs.update(WORD.findall(text))
                continue
            _references(tree, refs)
            if rel.split("/")[0] in CHECKED and not rel.startswith(GENERATED_DIRS):
                defined += _definitions(rel, tree)
        elif path.suffix in TEXT_SUFFIXES or path.name == "Makefile" or "Dockerfile" in path.name:
            try:
                refs.update(WORD.findall(path.read_text(encoding="utf-8")))
            except UnicodeDecodeError:
                pass
    return tuple(sorted(d for d in defined if refs[d.rsplit(":", 1)[1]] == 0))


def test_no_module_level_name_is_dead() -> None:
    dead = [d for d in unreferenced() if d not in ALLOWED]
    assert not dead, (
        "module-level names nothing references (delete them, or add them to ALLOWED in "
        f"{Path(__file__).name} with the reason they stay): {dead}")


def test_the_allow_list_holds_only_names_that_need_it() -> None:
    assert set(ALLOWED) <= set(unreferenced()), "ALLOWED names that are referenced now: drop them"
