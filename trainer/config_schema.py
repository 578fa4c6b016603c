"""What every config dataclass shares: how a field is documented, how a key is checked and how
one is built from plain data.

A field is documented one way: the attribute docstring under it. tyro shows these docstrings as
flag help (``verifier --help``, ``trainer eval --help``); :func:`field_docs` reads the same
docstrings for ``trainer run --help`` and ``trainer config show``. An unknown key is refused by
:func:`check_keys`, naming the closest valid key.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import inspect
import textwrap
from collections.abc import Iterable, Mapping
from typing import Any


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """``{field name: its attribute docstring}`` of a dataclass, over its base classes too; a
    field without a docstring maps to "". Read from the class's source with ``ast``."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass) or klass is object:
            continue
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):  # built at run time: no source to read
            continue
        body = ast.parse(source).body[0]
        assert isinstance(body, ast.ClassDef)
        for stmt, nxt in zip(body.body, body.body[1:] + [None]):
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                doc = ""
                if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) \
                        and isinstance(nxt.value.value, str):
                    doc = inspect.cleandoc(nxt.value.value)
                docs[stmt.target.id] = " ".join(doc.split())
    return {f.name: docs.get(f.name, "") for f in dataclasses.fields(cls)}


def closest(key: str, known: Iterable[str]) -> str | None:
    """The valid key most like ``key`` (a misspelling), or None when none is close."""
    found = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    return found[0] if found else None


def check_keys(kind: str, data: Any, known: Iterable[str]) -> None:
    """Refuse a non-mapping ``data`` or keys of it that ``kind`` does not have; the ValueError
    names each unknown key with the closest valid one, and lists the valid keys."""
    if not isinstance(data, Mapping):
        raise ValueError(f"{kind} must be a mapping, got {data!r}")
    known = list(known)
    unknown = [k for k in data if k not in known]
    if not unknown:
        return
    hints = []
    for key in unknown:
        near = closest(str(key), known)
        hints.append(f"{key!r} (did you mean {near!r}?)" if near else repr(key))
    raise ValueError(f"unknown {kind} key{'s' if len(unknown) > 1 else ''} {', '.join(hints)}; "
                     f"valid keys: {', '.join(known)}")


def is_int(value: object) -> bool:
    """An int that is not a bool (YAML's ``true`` is not a count)."""
    return isinstance(value, int) and not isinstance(value, bool)


def construct(cls: Any, kind: str, data: Mapping[str, Any]) -> Any:
    """``cls(**data)``; a missing required key is a ValueError naming ``kind`` and the data."""
    try:
        return cls(**dict(data))
    except TypeError as exc:  # a missing required key
        raise ValueError(f"{kind} {dict(data)!r}: {exc}") from None
