"""What whole training runs lose that the kernel models do not see, and how far off a prediction may be.

The compute model is built from microbenchmarks: GEMM and attention kernels timed alone, at
full clocks, on an idle GPU.  Whole runs on the same GPUs come in slower: sustained power and
thermal limits lower clocks, kernels are interleaved with NCCL's, the allocator and Python
garbage collection interrupt.  None of that has a microbenchmark, so it is the one constant
fitted to whole runs: ``run_overhead``, a factor on every modelled compute time, **one per GPU
generation**, fitted by ``zero-sim validate --published --refit`` as the median over the
published table's time points of that generation of (predicted throughput / published), each
run predicted with the stack its source states and no per-point knob.  A generation without
published runs takes the pooled median of all of them.  The accuracy it is reported with is
leave-one-source-out: each source's runs predicted from the factor fitted without them
(``zero_sim.published.fit``).

The same refit records how the published runs scattered around their predictions, as
leave-one-source-out relative errors, in two groups: runs predicted knowing their stack, and
runs predicted at the default stack.  :func:`prediction_interval` turns them into the range
in which runs like this one came in (the 10th to 90th percentile: an 80% interval).

The figures live in ``run_overheads.json`` beside this module, written only by the refit; the
test suite refits and checks that the file is current.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

from zero_sim.system.gpus import GENERATIONS

FIT_FILE = Path(__file__).with_name("run_overheads.json")
# Interval groups: a prediction told its stack, and one left at the default stack.
KNOWN_STACK, DEFAULT_STACK_GROUP = "stack known", "default stack"


@cache
def fitted() -> dict:
    """The refit's figures: ``overheads`` by generation, ``pooled``, ``intervals`` by group."""
    if not FIT_FILE.exists():
        return {"overheads": {}, "pooled": 1.0, "intervals": {}}
    return json.loads(FIT_FILE.read_text())


def run_overhead(gpu_name: str) -> float:
    """The fitted factor on modelled compute time for this GPU's generation (1.0 for CPU ranks)."""
    generation = GENERATIONS.get(gpu_name)
    if generation == "cpu":
        return 1.0
    figures = fitted()
    return float(figures["overheads"].get(generation, figures["pooled"]))


def prediction_interval(group: str) -> tuple[float, float] | None:
    """(low, high) relative errors (predicted / published - 1) between which 80% of published
    runs of this group fell; None before a refit."""
    band = fitted()["intervals"].get(group)
    return (band["low"], band["high"]) if band else None


def throughput_interval(value: float, group: str) -> tuple[float, float] | None:
    """The range a throughput ``value`` predicts: published = predicted / (1 + error)."""
    band = prediction_interval(group)
    if band is None:
        return None
    low, high = band
    return value / (1.0 + high), value / (1.0 + low)


def time_interval(seconds: float, group: str) -> tuple[float, float] | None:
    """The range a step time predicts: a throughput error e is a time error 1 / (1 + e) - 1."""
    band = prediction_interval(group)
    if band is None:
        return None
    low, high = band
    return seconds * (1.0 + low), seconds * (1.0 + high)
