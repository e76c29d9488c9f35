"""``python -m real_runs.microbench``: its command line, its checks, and one run on this rank.

Outside ``torchrun`` with ``--nproc`` above 1 it starts ``torchrun`` on itself; under it
(or alone) every rank measures and rank 0 prints the table and writes ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist

from zero_sim.vocabulary.files import write_json_atomic

from ..gpu_stamp import gpu_stamp
from ..launch import RunFailed, run_module
from ..options import ArgParser, BadInput, check_preset
from ..precision import DEFAULT_PRECISION, TIMED
from ..presets import PRESETS
from ..processes import leave_rank
from .collectives import SWEEP_COLLECTIVES, collective_sweep, format_table, parse_bytes
from .device import DEVICES, bench_on
from .layers import layer_timings
from .under_compute import queue_under_compute

DESCRIPTION = "Measure what the simulator needs as inputs: collective times and per-layer compute times."


def make_parser() -> argparse.ArgumentParser:
    p = ArgParser(prog="python -m real_runs.microbench", description=DESCRIPTION)
    p.add_argument("--nproc", type=int, default=1, help="ranks to start when not already under torchrun")
    p.add_argument("--timeout-s", type=float, default=600.0)
    p.add_argument("--device", choices=DEVICES, default="cpu",
                   help="cpu (gloo), or cuda: each rank on its own GPU, over NCCL")
    sub = p.add_subparsers(dest="what", required=True, parser_class=ArgParser)
    c = sub.add_parser("collectives", help="nccl-tests-style sweep of all_reduce, reduce_scatter, all_gather")
    c.add_argument("--min-bytes", default="1K")
    c.add_argument("--max-bytes", default="256M")
    c.add_argument("--collectives", default=",".join(SWEEP_COLLECTIVES))
    c.add_argument("--budget-s", type=float, default=0.2, help="time to spend per size and collective")
    c.add_argument("--under-load", action="store_true",
                   help="keep every rank computing in the background while timing (collectives as they run "
                        "during backward), and report how much that compute slowed")
    c.add_argument("--out", default=None, help="write the sweep as JSON here")
    la = sub.add_parser("layers", help="per-layer forward/backward and optimizer times of the real model")
    la.add_argument("--model", default="small", help=", ".join(PRESETS))
    la.add_argument("--micro-batch", type=int, default=4, help="sequences per rank")
    la.add_argument("--seq-len", type=int, default=None)
    la.add_argument("--iters", type=int, default=5)
    la.add_argument("--precision", choices=TIMED, default=DEFAULT_PRECISION,
                    help="the weights' precision; bf16 also times the fp32-master update bf16 runs make")
    la.add_argument("--out", default=None)
    return p


def validate(args) -> None:
    if args.what == "collectives":
        args.min_bytes, args.max_bytes = parse_bytes(args.min_bytes), parse_bytes(args.max_bytes)
        if not 0 < args.min_bytes <= args.max_bytes:
            raise BadInput("--min-bytes must be positive and no larger than --max-bytes.")
        kinds = [k.strip() for k in args.collectives.split(",") if k.strip()]
        bad = [k for k in kinds if k not in SWEEP_COLLECTIVES]
        if bad or not kinds:
            raise BadInput(f"Unknown collective {bad[0] if bad else '(none)'}; choose from "
                           f"{', '.join(SWEEP_COLLECTIVES)}.")
        args.collectives = kinds
    else:
        args.seq_len = check_preset(args.model, args.seq_len)
        if args.micro_batch < 1 or args.iters < 1:
            raise BadInput("--micro-batch and --iters must be positive.")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise BadInput("--device cuda was asked for but this machine has no CUDA device.")
    if args.device == "cuda" and getattr(args, "under_load", False):
        raise BadInput("--under-load measures gloo's threads against compute on CPU cores; "
                       "it has no CUDA form.")


def run(args) -> dict:
    """This rank's part of one measurement; rank 0 prints it and writes ``args.out``.

    ``cores`` and ``threads_per_rank`` are recorded with the figures, because on a CPU they
    decide how much each rank gets."""
    torch.set_num_threads(1)  # as the training ranks do: one thread per rank
    bench = bench_on(args.device)
    if "RANK" in os.environ:
        dist.init_process_group(bench.backend)
    else:
        dist.init_process_group(bench.backend, store=dist.HashStore(), rank=0, world_size=1)
    try:
        if args.what == "collectives":
            result = collective_sweep(args.collectives, args.min_bytes, args.max_bytes, args.budget_s,
                                      args.under_load, bench)
            # What gloo's threads and compute take from each other's cores: a CPU question.
            if not args.under_load and bench.device.type == "cpu":
                result["under_compute"] = queue_under_compute(args.collectives)
            text = format_table(result)
        else:
            result = layer_timings(args.model, args.micro_batch, args.seq_len, args.iters, bench,
                                   args.precision)
            text = json.dumps(result["by_kind"])
        result["cores"] = os.cpu_count()
        result["threads_per_rank"] = torch.get_num_threads()
        if bench.device.type == "cuda":
            result["gpu"] = gpu_stamp()
        if dist.get_rank() == 0:
            print(text, flush=True)
            if args.out:
                write_json_atomic(args.out, result)
        dist.barrier()
        return result
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = make_parser().parse_args(argv)
        validate(args)
        if args.nproc < 1:
            raise BadInput("--nproc must be at least 1.")
    except BadInput as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if "RANK" not in os.environ and args.nproc > 1:
        try:
            run_module("real_runs.microbench", argv, args.nproc, on_line=print, timeout_s=args.timeout_s)
        except RunFailed as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        return 0
    run(args)
    if "RANK" in os.environ:
        leave_rank(0)  # under torchrun: done, process group closed (real_runs.processes)
    return 0
