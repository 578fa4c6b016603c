"""verifier/service/allocator.py: the glibc malloc settings of ``verifier serve`` (arena cap, periodic
trim) against RSS growth by fragmentation. What they do to RSS is measured by
benchmarks/soak.py, not here (RSS on a shared machine is no test); these check that the
settings are applied, when, and that they are skipped where they must be."""

from __future__ import annotations

import pytest

from verifier.service import allocator
from verifier.service.allocator import ARENA_MAX, MallocTuning


class FakeLibc:
    def __init__(self, mallopt_ok: int = 1):
        self.calls: list[tuple] = []
        self.mallopt_ok = mallopt_ok

    def mallopt(self, param: int, value: int) -> int:
        self.calls.append(("mallopt", param, value))
        return self.mallopt_ok

    def malloc_trim(self, pad: int) -> int:
        self.calls.append(("malloc_trim", pad))
        return 1


def test_tune_caps_the_arenas(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    libc = FakeLibc()
    m = MallocTuning(libc)
    m.tune()
    assert libc.calls == [("mallopt", -8, ARENA_MAX)]  # M_ARENA_MAX in <malloc.h>
    assert m.arena_max == ARENA_MAX


def test_an_operators_malloc_arena_max_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    libc = FakeLibc()
    m = MallocTuning(libc)
    m.tune()
    assert libc.calls == [] and m.arena_max is None


def test_a_failed_mallopt_is_not_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    m = MallocTuning(FakeLibc(mallopt_ok=0))
    m.tune()
    assert m.arena_max is None


def test_maybe_trim_trims_once_per_period(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(allocator.time, "monotonic", lambda: now[0])
    libc = FakeLibc()
    m = MallocTuning(libc, every_s=60.0)
    assert not m.maybe_trim()  # a loop waking twice a second trims once a minute
    now[0] += 59.9
    assert not m.maybe_trim()
    now[0] += 0.2
    assert m.maybe_trim()
    assert not m.maybe_trim()
    now[0] += 60.0
    assert m.maybe_trim()
    assert libc.calls == [("malloc_trim", 0)] * 2 and m.trims == 2


def test_without_glibc_everything_is_a_no_op() -> None:
    m = MallocTuning(None)
    m.tune()
    m.trim()
    assert not m.active and m.arena_max is None and m.trims == 0
    assert not m.maybe_trim()


def test_this_processs_glibc() -> None:
    """On glibc (the verifier's image, this machine) the real functions are found and a trim
    runs; elsewhere the tuning is off."""
    m = MallocTuning()
    if allocator._glibc() is None:
        assert not m.active
        return
    m.trim()
    assert m.active and m.trims == 1
