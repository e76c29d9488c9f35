"""How fast a plan is: the plans an engineer asks for beside one plain ``simulate``, and the bounded
search against simulating every candidate, side by side.

    python bench/bench_plan.py            # the plans of the "plans in seconds" goal
    python bench/bench_plan.py --compare  # and the bounded search against simulating everything

First it runs, each as its own ``python -m zero_sim`` process, one plain ``simulate`` and then the
four ``zero-sim plan`` commands and the 70B offloaded ``simulate`` of the goal, and in this process
the notebook's ``plan(model="gpt-7.5b", gpus=8, topology="dgx-a100", micro_batch=4)``, printing
each one's wall and CPU seconds (user + system, its worker processes included) and both as a
ratio to the plain ``simulate``'s: ratios measured side by side hold on a loaded machine where
seconds do not.  Goals: each plan at most 10 s of wall time on an idle 2-core machine, the
notebook's call at most 2 s, the offloaded ``simulate`` at most 3 s.

With ``--compare``, for each case it times, in this one run, (a) ``zero_sim.plan.search.search`` here,
(b) the same search on a process pool over the machine's cores, and (c) every candidate
simulated one after another, then prints the candidates per second of each, the ratios, how
many candidates the bounds settled without the engine, and whether the top 10 agree.  Goal
(issue "Plan a cluster from the command line"): 1,000 candidates ranked in at most 10 s on a
2-core machine.  Prints figures; asserts nothing.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from zero_sim.plan.executors import default_executor
from zero_sim.plan.search import SIMULATED, rank, search, search_space
from zero_sim.plan.sweep import run_rows

CASES = [
    ("gpt2-1.5b on dgx-a100, 8 and 16 GPUs, micro-batch 1-16",
     dict(model="gpt2-1.5b", topology="dgx-a100"), [8, 16], (1, 2, 4, 8, 16)),
    ("gpt2-124m on pcie, 8 GPUs (communication-bound)", dict(model="gpt2-124m", topology="pcie"), [8],
     (1, 2, 4, 8)),
    ("llama3-8b on p4d-efa, 16 and 32 GPUs, seq 4096",
     dict(model="llama3-8b", topology="p4d-efa", seq_len=4096), [16, 32], (1, 2, 4, 8)),
]
COLUMNS = ["strategy", "knobs", "recompute", "gpus", "micro_batch", "tokens_per_s"]


def _top(table: pd.DataFrame) -> pd.DataFrame:
    return table[table["fits"]].head(10)[COLUMNS].reset_index(drop=True)


PLAIN = ["simulate", "--model", "llama2-13b", "--gpus", "32", "--topology", "ib-400", "--seq-len", "4096"]
PLAN_1 = ["plan", "--model", "llama2-13b", "--gpus", "32", "--topology", "ib-400", "--seq-len", "4096",
          "--global-batch", "512", "--top", "5"]
COMMANDS = [
    ("plan llama2-13b on 32 GPUs, ib-400", PLAN_1),
    ("  the same, zero3 with hpZ 8", [*PLAN_1, "--strategies", "zero3", "--zero-hpz-partition-size", "8"]),
    ("  the same, zero3 with hpZ 8, qwZ and qgZ", [
        *PLAN_1, "--strategies", "zero3", "--zero-hpz-partition-size", "8", "--zero-quantized-weights",
        "--zero-quantized-gradients"]),
    ("plan llama3-70b on 8 GPUs, states offloaded", [
        "plan", "--model", "llama3-70b", "--gpus", "8", "--topology", "dgx-h100", "--seq-len", "8192",
        "--global-batch", "64", "--offload-optimizer", "cpu", "--offload-params", "cpu", "--top", "5"]),
    ("plan llama3-8b on 8-64 GPUs, p5-efa", [
        "plan", "--model", "llama3-8b", "--gpus", "8,16,32,64", "--topology", "p5-efa", "--seq-len", "8192",
        "--global-batch", "1024", "--top", "5"]),
]
# DeepSpeed's ZeRO-3 with the optimizer and the weights in host memory, 4 accumulation steps.
OFFLOAD_CONFIG = {"gradient_accumulation_steps": 4, "train_micro_batch_size_per_gpu": 1,
                  "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
                                        "offload_param": {"device": "cpu"}}}
OFFLOADED = ["simulate", "--model", "llama3-70b", "--gpus", "8", "--topology", "dgx-h100",
             "--seq-len", "4096", "--recompute", "full", "--deepspeed-config"]


def _timed(fn) -> tuple[float, float]:
    """Wall and CPU seconds (this process and its finished children) of ``fn()``."""
    def cpu() -> float:
        return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                     resource.getrusage(resource.RUSAGE_CHILDREN)))
    w0, c0 = time.perf_counter(), cpu()
    fn()
    return time.perf_counter() - w0, cpu() - c0


def _command(args: list[str]) -> tuple[float, float]:
    def run():
        done = subprocess.run([sys.executable, "-m", "zero_sim", *args], capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"zero-sim {' '.join(args)} failed: {done.stderr[-2000:]}")
    return _timed(run)


def timings() -> None:
    """The goal's plans, each beside one plain simulate."""
    from zero_sim.planner import plan

    wall0, cpu0 = _command(PLAIN)
    print(f"{os.cpu_count()} cores; one plain simulate (zero-sim {' '.join(PLAIN)}): "
          f"{wall0:.1f} s wall, {cpu0:.1f} s CPU")
    print(f"{'':48} {'wall s':>7} {'CPU s':>7} {'wall/sim':>9} {'CPU/sim':>8}")

    def show(label: str, wall: float, cpu: float) -> None:
        print(f"{label:48} {wall:7.1f} {cpu:7.1f} {wall / wall0:8.1f}x {cpu / cpu0:7.1f}x")

    for label, args in COMMANDS:
        show(label, *_command(args))
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "ds_config.json"
        config.write_text(json.dumps(OFFLOAD_CONFIG))
        show("simulate llama3-70b, ZeRO-3 offloaded, 4 accum.", *_command([*OFFLOADED, str(config)]))
    plan(model="gpt2-124m", gpus=8, topology="pcie", micro_batch=4, recompute=("none",))  # imports warm
    show("notebook: plan(gpt-7.5b, 8 GPUs, dgx-a100)", *_timed(
        lambda: plan(model="gpt-7.5b", gpus=8, topology="dgx-a100", micro_batch=4)))


def main() -> None:
    timings()
    if "--compare" in sys.argv[1:]:
        compare()


def compare() -> None:
    print(f"{os.cpu_count()} cores")
    for label, base, gpus, micro in CASES:
        space = search_space(base, gpus, micro)
        t0 = time.perf_counter()
        here = search(space, top=10)
        t1 = time.perf_counter()
        with default_executor(len(space) + 100) as pool:
            pooled = search(space, top=10, executor=pool)
        t2 = time.perf_counter()
        full = rank(pd.DataFrame(run_rows(space)), 10)
        t3 = time.perf_counter()
        n = len(space)
        simulated = int((here["settled"] == SIMULATED).sum())
        print(f"{label}: {n} candidates, {simulated} simulated ({n - simulated} settled by bounds)")
        print(f"  search here   {t1 - t0:6.1f} s  ({n / (t1 - t0):6.0f} candidates/s)")
        print(f"  search pooled {t2 - t1:6.1f} s  ({n / (t2 - t1):6.0f} candidates/s)")
        print(f"  every one     {t3 - t2:6.1f} s  ({n / (t3 - t2):6.0f} candidates/s)")
        same = _top(here).equals(_top(full)) and _top(pooled).equals(_top(full))
        print(f"  ratios: full / search {(t3 - t2) / (t1 - t0):.1f}x, full / pooled "
              f"{(t3 - t2) / (t2 - t1):.1f}x; same top 10 as every one simulated: {same}")


if __name__ == "__main__":
    main()
