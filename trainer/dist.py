"""The few collectives the loop needs across data-parallel ranks (no-ops in one process).

Every function here is a distributed sync point: all ranks must call it, in the same order.
"""

from __future__ import annotations

from typing import Any


def _on() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def gather(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order, on every rank."""
    if not _on():
        return [obj]
    import torch.distributed as dist

    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank."""
    if not _on():
        return obj
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier() -> None:
    if _on():
        import torch.distributed as dist

        dist.barrier()


def any_rank(flag: bool) -> bool:
    """True when ``flag`` is True on any rank (e.g. a Ctrl-C seen by one process)."""
    return any(gather(bool(flag)))
