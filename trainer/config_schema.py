"""What every config dataclass shares: how a field is documented, how a key is checked and how
one is built from plain data.

A field is documented one way: the attribute docstring under it. tyro shows these docstrings as
flag help (``verifier --help``, ``trainer eval --help``); :func:`field_docs` reads the same
docstrings for ``trainer run --help`` and ``trainer config show``. An unknown key is refused by
:func:`check_keys`, naming the closest valid key.

Plain data (parsed YAML, a run directory's ``config.yaml``, a checkpoint's state) becomes a
config dataclass one way, :func:`build`, for the whole tree (``RunConfig`` and its sections,
``MagicConfig``, its stages and plateaus, the off-policy quadruple): unknown keys refused, each
value checked against its field's annotation by :func:`coerce` (which also converts the few
lossless cases: a list to a tuple, an int or a numeric string to a float, a mapping to the
nested dataclass). Cross-field rules stay in each class's ``__post_init__``.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import inspect
import math
import textwrap
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any, Literal


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


def build(cls: Any, data: Any, path: str) -> Any:
    """The config dataclass ``cls`` from plain ``data``, recursively; the one parsing routine of
    the config tree. ``path`` names it in errors (``"magic"``, ``"magic.stages[0]"``; ``""`` for
    the run config itself).

    Raises:
        ValueError: naming an unknown key (and the closest valid one), a value of the wrong type
            (its dotted key, the type wanted and the value), a missing required key, or a
            broken cross-field rule of the class.
    """
    kind = path or "run config"
    check_keys(kind, data, [f.name for f in dataclasses.fields(cls)])
    hints = _hints(cls)
    prefix = f"{path}." if path else ""
    kwargs = {key: coerce(f"{prefix}{key}", hints[key], value) for key, value in data.items()}
    try:
        return cls(**kwargs)
    except TypeError as exc:  # a missing required key
        raise ValueError(f"{kind}: {exc}") from None


def coerce_fields(obj: Any, path: str) -> None:
    """Check (and convert, as :func:`coerce` does) every field of a frozen dataclass instance in
    place: for a class built directly from Python (``MagicConfig(stages=[{...}])``) as well as
    by :func:`build`."""
    hints = _hints(type(obj))
    for f in dataclasses.fields(obj):
        value = coerce(f"{path}.{f.name}" if path else f.name, hints[f.name], getattr(obj, f.name))
        object.__setattr__(obj, f.name, value)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


_WORDS = {bool: "bool", int: "int", float: "number", str: "string"}


def coerce(name: str, hint: Any, value: Any) -> Any:
    """``value`` checked against the annotation ``hint`` of the field ``name``, converted in the
    few lossless cases (a mapping to the nested dataclass, a list to a tuple, an int or a
    numeric string to a float: YAML 1.1 reads ``1e-6`` as a string). A bool is never an int
    (YAML's ``true`` is not a count); floats must be finite.

    Raises:
        ValueError: naming ``name``, the type wanted and the value given.
        TypeError: for an annotation this routine does not know (a programming error).
    """
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) != 1:
            raise TypeError(f"no rule for field {name} of type {hint}")
        return coerce(name, inner[0], value)
    if dataclasses.is_dataclass(hint):
        if isinstance(value, hint):
            return value
        if not isinstance(value, Mapping):
            raise ValueError(f"{name} must be a mapping (a {hint.__name__}), got {value!r}")
        return build(hint, value, name)
    if origin is Literal:
        if value not in args or isinstance(value, bool) != any(isinstance(a, bool) for a in args):
            raise ValueError(f"{name} must be one of {list(args)}, got {value!r}")
        return value
    if hint is bool or hint is int or hint is str:
        if not isinstance(value, hint) or (hint is int and isinstance(value, bool)):
            raise ValueError(f"{name} must be a{'n' if hint is int else ''} {_WORDS[hint]}, "
                             f"got {value!r}")
        return value
    if hint is float:
        return _number(name, value)
    if origin in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise ValueError(f"{name} must be a mapping, got {value!r}")
        return dict(value)
    if origin in (list, tuple):
        return _sequence(name, origin, args, value)
    raise TypeError(f"no rule for field {name} of type {hint}")


def _number(name: str, value: Any) -> float:
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise ValueError(f"{name} must be a number, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def _sequence(name: str, origin: Any, args: tuple[Any, ...], value: Any) -> list | tuple:
    """A ``list[X]``, ``tuple[X, ...]`` or fixed ``tuple[X, Y]`` field, each element coerced."""
    ok = isinstance(value, (list, tuple))
    if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):  # fixed length
        if not ok or len(value) != len(args):
            words = sorted({_WORDS.get(a, getattr(a, "__name__", str(a))) for a in args})
            raise ValueError(f"{name} must be a sequence of {len(args)} {'/'.join(words)}s, "
                             f"got {value!r}")
        return tuple(coerce(f"{name}[{i}]", a, v) for i, (a, v) in enumerate(zip(args, value)))
    elem = args[0]
    if not ok:
        word = _WORDS.get(elem) or getattr(elem, "__name__", str(elem)).lower()
        raise ValueError(f"{name} must be a list of {word}s, got {value!r}")
    items = [coerce(f"{name}[{i}]", elem, v) for i, v in enumerate(value)]
    return tuple(items) if origin is tuple else items
