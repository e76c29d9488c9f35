"""How fast the simulator is: milliseconds per simulated step, and the engine's cost per op
beside bare simpy's cost per event, both measured in this one run.

    python bench/bench_engine.py

Goals (issue "Simulator core"): gpt2-124m at N=8 <= 50 ms, gpt2-1.5b at N=64 <= 200 ms,
gpt3-175b at N=1024 <= 2 s per simulated step.  Goal (issue "Plan a cluster from the command
line"): 1,024 explicitly simulated ranks (fsdp, gpt2-124m, the last case) in at most 2 s for
the whole simulation of two steps.

Events per second alone says little about speed: the engine schedules as few events as it can
(an op nobody waits on ends without one; the host issues without one), so it prints, per op
executed on a rank, the wall time and the events it took, beside bare simpy's time per event
(one process yielding timeouts): "op cost in events" is how many bare simpy events one op of
the engine costs.  Prints figures; asserts nothing.
"""

from __future__ import annotations

import statistics
import time

import simpy

from zero_sim import simulate

# model, N, strategy, goal (ms per step, or for the whole run when explicit), every rank simulated
CASES = [
    ("gpt2-124m", 8, "ddp", 50, False),
    ("gpt2-1.5b", 64, "ddp", 200, False),
    ("gpt3-175b", 1024, "ddp", 2000, False),
    ("gpt2-1.5b", 64, "zero3", 200, False),
    ("gpt2-1.5b", 64, "fsdp", 200, False),
    ("gpt2-124m", 1024, "fsdp", 2000, True),
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


def time_case(model: str, gpus: int, strategy: str, explicit: bool, repeats: int = 3):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        r = simulate(model=model, gpus=gpus, strategy=strategy, micro_batch=1, steps=2,
                     explicit_ranks=explicit)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), r


def main() -> None:
    bare = bare_simpy_events_per_s()
    print(f"bare simpy: {bare:,.0f} events/s, {1e6 / bare:.2f} us per event (one process yielding timeouts)")
    print(f"{'model':10s} {'N':>5s} {'strategy':8s} {'ranks':>5s} {'ms/step':>8s} {'run ms':>8s} "
          f"{'goal':>5s} {'events/s':>10s} {'vs bare':>7s} "
          f"{'us/op':>6s} {'events/op':>9s} {'op cost in events':>17s}")
    for model, gpus, strategy, goal, explicit in CASES:
        wall, r = time_case(model, gpus, strategy, explicit)
        steps = r.scenario.simulation.steps
        # Ops that ran on every simulated rank (the host lane's launch records are drawings of
        # the issue cost, not ops of their own).
        ops_run = sum(1 for op in r.ops if not op["name"].startswith("launch "))
        goal_of = "run" if explicit else "step"
        print(f"{model:10s} {gpus:5d} {strategy:8s} {len(r.simulated_ranks):5d} {wall / steps * 1e3:8.1f} "
              f"{wall * 1e3:8.0f} {goal:4d}{goal_of[0]} {r.events / wall:10,.0f} "
              f"{r.events / wall / bare:7.2f} "
              f"{wall / ops_run * 1e6:6.1f} {r.events / ops_run:9.2f} {wall / ops_run * bare:17.1f}")
    print("goal: ms per simulated step (s), or the whole run's ms for every rank simulated (r)")


if __name__ == "__main__":
    main()
