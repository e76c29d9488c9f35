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
runs predicted at the default stack, with the distribution-free 80% range they span.  That
range is reported by ``zero-sim validate --published`` beside the coverage of the intervals
predictions carry, which are propagated from their inputs' spreads (:mod:`zero_sim.intervals.sampling`),
not taken from these residuals.

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
