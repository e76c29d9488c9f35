"""Step-time ratios of the hand-written strategies against their yardsticks.

    python bench/bench_real_runs.py [--model small] [--rounds 20] [--nproc 2]

One ``torchrun`` on gloo ranks holds every strategy at once, each with its own copy of
the model, and steps them in turn, round after round.  Interleaving step by step means
that whatever else the machine is doing weighs on every strategy alike; separate runs
one after another swing by tens of percent on a shared two-core machine.  It prints the
median step time per strategy (the slowest rank's, first rounds dropped as warm-up) and
three ratios, each with the bound it should meet:

- ``ddp / ddp-torch``         within 10 %   (<= 1.10)
- ``zero2-hook / zero2-step`` no slower     (<= 1.00)
- ``fsdp / fsdp-torch``       within 25 %   (<= 1.25)

On a CPU machine the ranks share cores with gloo's threads, so overlap of communication
with compute is partial at best; the ratios are what this machine measured, not a law.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

PAIRS = (("ddp", "ddp-torch", 1.10), ("zero2-hook", "zero2-step", 1.00), ("fsdp", "fsdp-torch", 1.25))
NAMES = list(dict.fromkeys(s for pair in PAIRS for s in pair[:2]))


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="small")
    ap.add_argument("--global-batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=20, help="steps per strategy, warm-up included")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--bucket-mb", type=float, default=25.0)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def worker(args: argparse.Namespace) -> None:
    import time

    import torch
    import torch.distributed as dist

    from real_runs.model import PRESETS, build_model, count_params, global_batch, rank_shard
    from real_runs.record import Recorder
    from real_runs.strategies import STRATEGIES, AdamW

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = PRESETS[args.model]
    device = torch.device("cpu")
    strategies = {name: STRATEGIES[name](build_model(cfg, 0), Recorder(rank, device, enabled=False),
                                         AdamW(), args.bucket_mb) for name in NAMES}
    times = {name: [] for name in NAMES}
    for step in range(args.rounds):
        x, y = global_batch(cfg, 0, step, args.global_batch, args.seq_len)
        x, y = rank_shard(x, rank, world), rank_shard(y, rank, world)
        for name, strategy in strategies.items():
            dist.barrier()
            t0 = time.perf_counter()
            strategy.train_step(x, y)
            strategy.rec.end_step()
            times[name].append(time.perf_counter() - t0)
    slowest = {}
    for name in NAMES:
        t = torch.tensor(times[name][args.warmup:], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)  # a step lasts until its slowest rank is done
        slowest[name] = statistics.median(t.tolist())
    for s in strategies.values():
        s.rec.shutdown()
    dist.barrier()
    if rank == 0:
        print(f"{args.model}: {count_params(build_model(cfg, 0)):,} params, {world} gloo ranks, "
              f"global batch {args.global_batch} x {args.seq_len} tokens, "
              f"{args.rounds - args.warmup} interleaved steps per strategy after {args.warmup} warm-up")
        for name in NAMES:
            print(f"  {name:11s} median step {slowest[name] * 1e3:8.1f} ms")
        print()
        for mine, theirs, bound in PAIRS:
            ratio = slowest[mine] / slowest[theirs]
            print(f"{mine} / {theirs}: {ratio:.3f}   "
                  f"(bound {bound:.2f}: {'ok' if ratio <= bound else 'OVER'})")
    dist.destroy_process_group()


def main() -> None:
    args = parse()
    if args.worker:
        worker(args)
        return
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}",
           os.path.join(here, "bench_real_runs.py"), "--worker", *sys.argv[1:]]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": root, "PYTHONWARNINGS": "ignore"}
    sys.exit(subprocess.call(cmd, env=env))


if __name__ == "__main__":
    main()
