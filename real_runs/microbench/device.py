"""Where a microbenchmark runs, and how it reads the time there.

On the CPU (gloo) the work is done when the call returns, so the host clock times it.  On
a GPU (NCCL) a call only queues kernels: the host clock times the work once the device
has been synchronised, which :meth:`Bench.now` does before every reading.  A per-layer or
per-collective timing then includes one synchronisation (tens of microseconds), far below
the millisecond layers and large collectives a calibration is read from.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import torch

DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class Bench:
    device: torch.device

    @property
    def backend(self) -> str:
        return "nccl" if self.device.type == "cuda" else "gloo"

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def now(self) -> float:
        """Seconds on the host clock, after the device has finished what it was given."""
        self.sync()
        return time.perf_counter()


CPU = Bench(torch.device("cpu"))


def bench_on(device: str) -> Bench:
    """This rank's device: the CPU, or the GPU of its local rank (one GPU per rank)."""
    if device == "cpu":
        return CPU
    index = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(index)
    return Bench(torch.device("cuda", index))
