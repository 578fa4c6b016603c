"""Where a rank sits (:class:`Layout`), and the few collectives the loop needs across ranks
(no-ops in one process).

Every collective here is a distributed sync point: all ranks must call it, in the same order.
"""

from __future__ import annotations

import gc
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence, TypeVar

import torch.distributed as dist

T = TypeVar("T")
log = logging.getLogger(__name__)

#: Where glibc's shm_open keeps POSIX shared-memory objects on Linux.
SHM_DIR = Path("/dev/shm")


@dataclass(frozen=True)
class Layout:
    """How a step's prompts spread over the ranks when rollout engines span several ranks.

    Training is data parallel over all ``world`` ranks. Rollout is data parallel over
    ``world // tp`` engine groups: with vLLM tensor parallelism, ``tp`` consecutive ranks run
    one engine together (each holds a shard of it), so they must generate the same prompts with
    the same seed and get the same completions. Each rank of a group then verifies and trains on
    its own ``1/tp`` of the group's prompts, so nothing is scored or trained twice.

    With ``tp == 1`` this is plain data parallelism: rank r generates and trains on prompts
    r, r + world, r + 2 world, ...
    """

    rank: int = 0
    world: int = 1
    tp: int = 1
    """Ranks per rollout engine (vLLM ``tensor_parallel_size`` across ranks), >= 1."""

    def __post_init__(self) -> None:
        if self.tp < 1 or self.world % self.tp:
            raise ValueError(f"engine.tensor_parallel_size ({self.tp}) must divide the number "
                             f"of ranks ({self.world}): each engine spans tp whole ranks")
        if not 0 <= self.rank < self.world:
            raise ValueError(f"rank {self.rank} is outside a world of {self.world}")

    @property
    def group(self) -> int:
        """This rank's rollout group (its engine), 0 .. groups - 1."""
        return self.rank // self.tp

    @property
    def groups(self) -> int:
        return self.world // self.tp

    @property
    def tp_rank(self) -> int:
        """Position inside the rollout group, 0 .. tp - 1."""
        return self.rank % self.tp

    def rollout_share(self, items: Sequence[T]) -> list[T]:
        """What this rank's engine generates: the same list on every rank of its group."""
        return list(items[self.group::self.groups])

    def owns(self, i: int) -> bool:
        """Whether item ``i`` of :meth:`rollout_share` is this rank's to verify and train on."""
        return i % self.tp == self.tp_rank

    def global_index(self, k: int) -> int:
        """Position in the full list of the ``k``-th item this rank owns."""
        return self.group + (self.tp_rank + k * self.tp) * self.groups


def _on() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def gather(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order, on every rank."""
    if not _on():
        return [obj]

    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank."""
    if not _on():
        return obj

    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier() -> None:
    if _on():
        dist.barrier()


def shutdown() -> None:
    """Tear the process group down in order, while the interpreter is whole: a barrier (no
    rank leaves while another still talks to it), ``destroy_process_group``, then a garbage
    collection so that the gloo groups, DeepSpeed's engines and their native threads are freed
    now. Left to interpreter finalization, native destructors run while modules are half torn
    down; a rank of the two-rank DeepSpeed test aborted there ("terminate called without an
    active exception") after all its work was done. The same abort is reported upstream for a
    gloo group left to finalization (pytorch/pytorch issue 190489: "terminate called without an
    active exception" when destroy_process_group is missed; PR 179291 explains it: gloo's worker
    threads still hold work objects whose tensors take the GIL while the interpreter is torn
    down). Sync point: every rank calls it last."""
    if dist.is_available() and dist.is_initialized():
        if dist.get_world_size() > 1:
            dist.barrier()
        dist.destroy_process_group()
    gc.collect()


def any_rank(flag: bool) -> bool:
    """True when ``flag`` is True on any rank (e.g. a Ctrl-C seen by one process)."""
    return any(gather(bool(flag)))


def unlink_shared_memory(names: Iterable[str]) -> list[str]:
    """Remove the named POSIX shared-memory objects (``shm_open`` names; leading slashes are
    dropped as glibc does) and return the names that were there.

    Why: the CPU collectives of DeepSpeed and vLLM put per-rank buffers in /dev/shm, which is
    RAM. DeepSpeed never removes its buffers (69 MB per rank per launch) and vLLM only in a
    clean shutdown, so a long session of launches, or one killed run, leaves RAM taken until
    the machine restarts (19 GiB after a day of tests here, and the next launch was OOM-killed).
    A mapped object stays usable after its name is removed, so callers remove the names once
    every rank has mapped them: nothing is left behind even when a rank is killed later.
    """
    removed = []
    for name in names:
        try:
            (SHM_DIR / name.lstrip("/")).unlink()
        except FileNotFoundError:
            continue
        removed.append(name)
    if removed:
        log.debug("removed the names of %d shared-memory buffers: %s", len(removed), removed)
    return removed
