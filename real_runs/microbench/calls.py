"""Asynchronous collective calls, ready to launch again and again on buffers of their own."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch
import torch.distributed as dist

from zero_sim.vocabulary import ALL_REDUCE, REDUCE_SCATTER

from ..strategies.base import all_gather_flat, reduce_scatter_flat


def launcher(kind: str, nbytes: int, world: int, slots: int,
             device: torch.device | str = "cpu") -> Callable[[], dist.Work]:
    """A function that launches one asynchronous ``kind`` of ``nbytes`` on the next of
    ``slots`` buffer pairs (so ops queued together never share a buffer) and returns its work.

    ``nbytes`` is the whole buffer: the gathered output for all_gather, the input for
    reduce_scatter.  Buffers live on ``device`` (a GPU's memory for NCCL)."""
    numel = nbytes // 4
    ones, empty = (lambda n: torch.ones(n, device=device)), (lambda n: torch.empty(n, device=device))
    if kind == ALL_REDUCE:
        bufs = [(ones(numel),) for _ in range(slots)]
        launch = lambda b: dist.all_reduce(b[0], async_op=True)  # noqa: E731
    elif kind == REDUCE_SCATTER:
        bufs = [(empty(numel // world), ones(numel)) for _ in range(slots)]
        launch = lambda b: reduce_scatter_flat(b[0], b[1], async_op=True)  # noqa: E731
    else:
        bufs = [(empty(numel), ones(numel // world)) for _ in range(slots)]
        launch = lambda b: all_gather_flat(b[0], b[1], async_op=True)  # noqa: E731
    turns = itertools.cycle(bufs)
    return lambda: launch(next(turns))
