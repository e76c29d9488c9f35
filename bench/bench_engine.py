"""How fast the simulator is: milliseconds per simulated step, and events per second
against bare simpy measured in the same run.

    python bench/bench_engine.py

Goals (issue "Simulator core"): gpt2-124m at N=8 <= 50 ms, gpt2-1.5b at N=64 <= 200 ms,
gpt3-175b at N=1024 <= 2 s per simulated step.  Prints figures; asserts nothing.
"""

from __future__ import annotations

import statistics
import time

import simpy

from zero_sim import simulate

CASES = [
    ("gpt2-124m", 8, "ddp", 50),
    ("gpt2-1.5b", 64, "ddp", 200),
    ("gpt3-175b", 1024, "ddp", 2000),
    ("gpt2-1.5b", 64, "zero3", 200),
    ("gpt2-1.5b", 64, "fsdp", 200),
]


def bare_simpy_events_per_s(n_events: int = 200_000) -> float:
    env = simpy.Environment()

    def ticker():
        for _ in range(n_events):
            yield env.timeout(1)

    env.process(ticker())
    t0 = time.perf_counter()
    env.run()
    return n_events / (time.perf_counter() - t0)


def time_case(model: str, gpus: int, strategy: str, repeats: int = 3):
    times, events = [], 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        r = simulate(model=model, gpus=gpus, strategy=strategy, micro_batch=1, steps=2)
        times.append(time.perf_counter() - t0)
        events = r.events
    wall = statistics.median(times)
    steps = r.scenario.simulation.steps
    return wall / steps, events / wall, r


def main() -> None:
    bare = bare_simpy_events_per_s()
    print(f"bare simpy: {bare:,.0f} events/s (one process yielding timeouts)")
    print(f"{'model':10s} {'N':>5s} {'strategy':8s} {'ms/step':>9s} {'goal':>6s} {'events/s':>12s} "
          f"{'vs bare':>8s} {'ranks simulated':>16s}")
    for model, gpus, strategy, goal in CASES:
        per_step, rate, r = time_case(model, gpus, strategy)
        print(f"{model:10s} {gpus:5d} {strategy:8s} {per_step * 1e3:9.1f} {goal:6d} {rate:12,.0f} "
              f"{rate / bare:8.2f} {len(r.simulated_ranks):16d}")


if __name__ == "__main__":
    main()
