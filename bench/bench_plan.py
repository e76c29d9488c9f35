"""How fast a plan is: the bounded search against simulating every candidate, side by side.

    python bench/bench_plan.py

For each case it times, in this one run, (a) ``zero_sim.plan.search.search`` in this process,
(b) the same search on a process pool over the machine's cores, and (c) every candidate
simulated one after another, then prints the candidates per second of each, the ratios, how
many candidates the bounds settled without the engine, and whether the top 10 agree.  Goal
(issue "Plan a cluster from the command line"): 1,000 candidates ranked in at most 10 s on a
2-core machine.  Prints figures; asserts nothing.
"""

from __future__ import annotations

import os
import time

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


def main() -> None:
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
