"""Measure what the simulator needs as inputs: collective times and per-layer compute times.

Both run under ``torchrun`` on the ranks (and the network) that the real training runs
will use, so that whatever those ranks share (cores, a shaped link) is part of what is
measured::

    # the collective sweep: an nccl-tests-style table per collective, on 2 gloo ranks
    python -m real_runs.microbench --nproc 2 collectives --max-bytes 64M --out out/coll.json

    # the same sweep while every rank computes in the background (collectives during backward)
    python -m real_runs.microbench --nproc 2 collectives --under-load --out out/coll_loaded.json

    # per-layer forward/backward and optimizer times of the real model
    python -m real_runs.microbench --nproc 2 layers --model small --micro-batch 4 --out out/layers.json

    # the same on 8 GPUs over NCCL, layers in bf16
    python -m real_runs.microbench --nproc 8 --device cuda layers --model gpt2-350m --precision bf16

- :mod:`.collectives`: the sweep, how one size is timed, and the nccl-tests table;
- :mod:`.under_compute`: collectives while the ranks compute, and compute while they run;
- :mod:`.calls`: asynchronous collective calls on buffers of their own;
- :mod:`.device`: where a benchmark runs (CPU and gloo, or a rank's GPU and NCCL) and its clock;
- :mod:`.layers`: per-layer forward/backward and optimizer times of the real model;
- :mod:`.cli`: the command line (``__main__`` runs it).
"""

import os

if "TORCHELASTIC_RUN_ID" in os.environ:
    # A rank under torchrun dies with it, asked before torch is imported (seconds): a torchrun
    # killed meanwhile would leave the rank orphaned (real_runs.processes).
    from real_runs.processes import die_with_torchrun

    die_with_torchrun()

from .calls import launcher
from .cli import DESCRIPTION, main, make_parser, run, validate
from .collectives import (
    SMALL_CALLS_IN_TURN,
    SWEEP_COLLECTIVES,
    collective_sweep,
    format_table,
    parse_bytes,
    sizes,
)
from .layers import LAYER_KINDS, layer_timings
from .under_compute import LARGE_QUEUE, MIXED_QUEUE, ComputeLoad, queue_under_compute

__all__ = [
    "DESCRIPTION", "LARGE_QUEUE", "LAYER_KINDS", "MIXED_QUEUE", "SMALL_CALLS_IN_TURN", "SWEEP_COLLECTIVES",
    "ComputeLoad",
    "collective_sweep", "format_table", "launcher", "layer_timings", "main", "make_parser", "parse_bytes",
    "queue_under_compute", "run", "sizes", "validate",
]
