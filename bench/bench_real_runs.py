"""Step-time ratios of the hand-written strategies against their yardsticks.

    python bench/bench_real_runs.py [--model small] [--steps 8] [--nproc 2]

Runs each strategy once on gloo ranks on this machine and prints the median step time
(first steps dropped as warm-up) and three ratios, each with the bound it should meet:

- ``ddp / ddp-torch``         within 10 %   (<= 1.10)
- ``zero2-hook / zero2-step`` no slower     (<= 1.00)
- ``zero3 / fsdp-torch``      within 25 %   (<= 1.25)

On a CPU machine the ranks share cores with gloo's threads, so overlap of communication
with compute is partial at best; the ratios are what this machine measured, not a law.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile

from real_runs.launch import launch

PAIRS = (("ddp", "ddp-torch", 1.10), ("zero2-hook", "zero2-step", 1.00), ("zero3", "fsdp-torch", 1.25))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="small")
    ap.add_argument("--global-batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--bucket-mb", type=float, default=25.0)
    args = ap.parse_args()

    median = {}
    for name in dict.fromkeys(s for pair in PAIRS for s in pair[:2]):
        run = launch(name, nproc=args.nproc, out=tempfile.mkdtemp(prefix=f"bench-{name}-"),
                     model=args.model, global_batch=args.global_batch, seq_len=args.seq_len,
                     steps=args.steps, bucket_mb=args.bucket_mb)
        median[name] = statistics.median(run["step_times_s"][args.warmup:])
        print(f"{name:11s} median step {median[name] * 1e3:8.1f} ms   ({run['params']:,} params, "
              f"{args.nproc} {run['backend']} ranks)", flush=True)
    print()
    for mine, theirs, bound in PAIRS:
        ratio = median[mine] / median[theirs]
        verdict = "ok" if ratio <= bound else "OVER"
        print(f"{mine} / {theirs}: {ratio:.3f}   (bound {bound:.2f}: {verdict})")


if __name__ == "__main__":
    main()
