"""Collectives while the ranks compute, and compute while collectives run.

On a CPU machine the collectives of backward run while the ranks compute, and gloo's
threads then wait for a core at every step of the ring.  Two measurements say what that
costs:

- :class:`ComputeLoad` keeps a rank computing in a background thread; the sweep's
  ``--under-load`` times every collective with it on, and each row says how much slower
  the background compute ran meanwhile.
- :func:`queue_under_compute` times two queues with every rank idle and while every rank's
  main thread computes: 1 MB and 4 KB calls alternating (mostly per-call work), and 4 MB
  calls alone (mostly bytes).  The two say how fast a collective's per-call work and its
  bytes progress while the cores compute, and how much slower that compute runs.  With more
  ranks than cores, gloo's threads barely get a core while the ranks compute; they need one
  every time a socket's buffer fills or drains, so a fast link's bytes slow down too.
"""

from __future__ import annotations

import math
import statistics
import threading
import time

import torch
import torch.distributed as dist

from .calls import launcher

# The queues timed with and without every rank computing: large and small calls alternating,
# as a training step mixes bucket-sized and parameter-sized ones, and large calls alone,
# whose time is nearly all bytes.
MIXED_QUEUE = (1 << 20, 4 << 10) * 8
LARGE_QUEUE = (4 << 20,) * 4
QUEUES = {"mixed": MIXED_QUEUE, "large": LARGE_QUEUE}


class ComputeLoad:
    """A thread that keeps this rank's core busy with matrix products, as a rank's
    forward or backward does, and counts how many it finished.

    Timing collectives with the load on says what they cost while every rank computes
    (on a shared CPU their threads must wait for a core); the load's rate with and without
    collectives running says how much compute loses to communication."""

    def __init__(self, dim: int = 128):
        # Small products, so that even a short window counts hundreds.
        self.a, self.b = torch.randn(dim, dim), torch.randn(dim, dim)
        self.out = torch.empty(dim, dim)
        self.done, self._stop = 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            torch.mm(self.a, self.b, out=self.out)  # releases the GIL: the main thread keeps launching
            self.done += 1

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def rate(self, seconds: float) -> float:
        """Products per second over the next ``seconds`` (nothing else running on this rank)."""
        start, t0 = self.done, time.perf_counter()
        time.sleep(seconds)
        return (self.done - start) / (time.perf_counter() - t0)


class _Products:
    """The compute a rank runs under a queue: matrix products the size of a small model's."""

    def __init__(self):
        self.a, self.b = torch.randn(512, 256), torch.randn(256, 1024)
        self.out = torch.empty(512, 1024)

    def one(self) -> None:
        torch.mm(self.a, self.b, out=self.out)

    def rate(self, seconds: float) -> float:
        """Products per second, alone, over ``seconds``."""
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            self.one()
            n += 1
        return n / (time.perf_counter() - t0)


def _one_queue(calls, products: _Products, loaded: bool) -> tuple[float, float]:
    """Launch every call, wait for them in launch order off the main thread (as a training step
    does), and compute on the main thread meanwhile when ``loaded``: (queue time, product rate)."""
    dist.barrier()
    finished = []
    t0 = time.perf_counter()
    works = [call() for call in calls]

    def watch():
        for w in works:
            w.wait()
        finished.append(time.perf_counter())

    watcher = threading.Thread(target=watch)
    watcher.start()
    count, c0 = 0, time.perf_counter()  # the compute's own window: launching is not computing
    while loaded and not finished:
        products.one()
        count += 1
    c1 = time.perf_counter()
    watcher.join()
    return finished[0] - t0, count / max(c1 - c0, 1e-9)


def _queue_row(kind: str, name: str, sizes, world: int, products: _Products, repeats: int) -> dict:
    """One collective's queue timed idle and under compute, and the compute's slowdown under it."""
    # Every size a multiple of 4 * world bytes, so each rank's chunk is whole fp32 elements.
    queue = [size // (4 * world) * 4 * world for size in sizes]
    probe = [launcher(kind, size, world, 1) for size in queue]
    _one_queue(probe, products, False)  # warm-up: connections
    # Long enough (0.15 s idle) that the compute rate under it is not a handful of products.
    idle_once = _one_queue(probe, products, False)[0]
    reps = torch.tensor([math.ceil(0.15 / max(idle_once, 1e-3))], dtype=torch.float64)
    dist.all_reduce(reps, op=dist.ReduceOp.MAX)  # every rank must launch the same calls
    reps = int(min(8, reps.item()))
    # Each launcher cycles over ``reps`` buffers: no two calls in flight share one.
    launchers = [launcher(kind, size, world, reps) for size in queue]
    calls = launchers * reps
    _one_queue(calls, products, False)  # warm-up: first touch of the buffers
    alone = products.rate(0.3)
    idle = [_one_queue(calls, products, False)[0] for _ in range(repeats)]
    loaded = [_one_queue(calls, products, True) for _ in range(repeats)]
    times = torch.tensor([statistics.median(idle), statistics.median(t for t, _ in loaded)],
                         dtype=torch.float64)
    dist.all_reduce(times, op=dist.ReduceOp.MAX)  # every rank waits for the slowest
    loaded_rate = statistics.median(r for _, r in loaded)
    slowdown = torch.tensor([max(0.0, alone / max(loaded_rate, 1e-9) - 1.0)], dtype=torch.float64)
    dist.all_reduce(slowdown)
    return {"collective": kind, "queue": name, "calls": len(calls), "bytes": sum(queue) * reps,
            "idle_s": float(times[0]), "loaded_s": float(times[1]),
            "compute_slowdown": float(slowdown) / world}


def queue_under_compute(kinds, repeats: int = 3) -> list[dict]:
    """Per collective and queue (:data:`QUEUES`): the queue's time with every rank idle, and
    while every rank's main thread computes (matrix products the size of a small model's, as
    forward and backward run them), plus how much slower that compute ran.  One row per
    collective and queue (``queue``: ``mixed`` or ``large``), medians of ``repeats``.

    The two sides of ranks sharing cores with their communication: how fast collectives
    progress while the cores compute (``idle_s / loaded_s``), and how much compute they take."""
    world, products = dist.get_world_size(), _Products()
    return [_queue_row(kind, name, sizes, world, products, repeats)
            for kind in kinds for name, sizes in QUEUES.items()]
