"""A planning search at scale: every candidate bounded, only those that could rank simulated.

The space (:func:`search_space`): the planner's strategy and knob candidates
(:func:`zero_sim.plan.candidates.candidates`: each strategy at its defaults and with each main knob
varied, under each recompute mode) x GPU counts x micro-batches, with the gradient
accumulation that makes up the global batch when one is fixed.

The search (:func:`search`), in three passes:

1. every candidate's bounds (:mod:`zero_sim.plan.bounds`, milliseconds each): refused ones get
   their sentence; those whose reserved memory cannot fit are settled as not fitting;
2. the rest are simulated best-bound first, in batches on the executor
   (:mod:`zero_sim.plan.executors`), and after each batch any candidate whose throughput bound
   cannot reach the K-th fastest that fits is settled as out of the running;
3. the table: what fits first, fastest (tokens per second, all GPUs) first; each row says how it
   was settled (``settled``: simulated, memory bound, time bound, refused).

Both bounds are exact in the direction they are used (``tests/test_plan_search.py`` compares
a search with every candidate simulated), so the top K is the same as simulating everything.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import pandas as pd

from zero_sim.intervals.speed import later_columns
from zero_sim.plan.bounds import bounds
from zero_sim.plan.candidates import FITS, NO_FIT, REFUSED, candidates, knobs_label, ranked
from zero_sim.plan.executors import map_on
from zero_sim.plan.sweep import Progress, run_rows
from zero_sim.published.ranking import MIN_DIFFERENCE
from zero_sim.scenario import ScenarioError
from zero_sim.strategies import accepting
from zero_sim.strategies.capabilities import FP8_ALL_GATHER
from zero_sim.system.gpus import GB
from zero_sim.system.workload import RECOMPUTE_MODES

MICRO_BATCHES = (1, 2, 4, 8)
OUT_OF_RUNNING = "cannot reach the top"
SIMULATED, MEMORY_BOUND, TIME_BOUND, REFUSAL = "simulated", "memory bound", "time bound", "refused"


class PlanError(ValueError):
    """A search that cannot be made; the message says how to change it."""


def search_space(base: dict[str, Any], gpus: Sequence[int], micro_batches: Sequence[int] = MICRO_BATCHES,
                 global_batch: int | None = None, strategies: Iterable[str] | None = None,
                 recompute: Iterable[str] = RECOMPUTE_MODES) -> list[dict]:
    """Every scenario to plan: ``base`` settings x GPU counts x micro-batches x candidates.

    With ``global_batch`` (sequences per optimizer step) each micro-batch takes the gradient
    accumulation that makes it up exactly; combinations that cannot are left out, and a space
    left empty is refused in one sentence."""
    shapes = []
    for n in gpus:
        for m in micro_batches:
            if global_batch is None:
                shapes.append({"gpus": n, "micro_batch": m})
            elif global_batch % (n * m) == 0:
                shapes.append({"gpus": n, "micro_batch": m, "grad_accum": global_batch // (n * m)})
    if not shapes:
        raise PlanError(f"no micro-batch of {', '.join(map(str, micro_batches))} on "
                        f"{', '.join(map(str, gpus))} GPUs makes up a global batch of {global_batch} "
                        f"sequences "
                        f"(it must be GPUs x micro-batch x a whole number of accumulation steps); "
                        f"change --global-batch or --micro-batch")
    tried = fp8_variants(base, candidates(strategies, recompute))
    space = [base | shape | c for shape in shapes for c in tried]
    if not space:
        raise PlanError("the search space is empty: name at least one strategy and one recompute mode")
    return space


def fp8_variants(base: dict[str, Any], found: list[dict]) -> list[dict]:
    """Under ``--precision fp8``, each FSDP candidate also with FSDP2's float8 all-gather (its weights
    gathered at 1 byte an element; zero_sim.system.fp8); the other strategies gather nothing in fp8."""
    if base.get("precision") != "fp8":
        return found
    return found + [c | {"fp8_all_gather": True} for c in found if c["strategy"] in accepting(FP8_ALL_GATHER)]


def bound_or_refusal(scenario: dict) -> Any:
    """A candidate's bounds, or the sentence refusing it (top-level, for process pools)."""
    try:
        return bounds(**scenario)
    except (ScenarioError, ValueError) as exc:
        return str(exc)


def _bounded(space: list[dict], executor: Any) -> tuple[list[dict], list[tuple[Any, dict]]]:
    """Rows settled by their bounds alone, and the (bounds, scenario) pairs left to simulate."""
    settled, open_ = [], []
    for s, b in zip(space, map_on(executor, bound_or_refusal, space, chunksize=32), strict=True):
        if isinstance(b, str):
            settled.append(s | {"error": b, "settled": REFUSAL})
            continue
        if b.cannot_fit:
            settled.append(s | {"reserved_GB": b.reserved_low_bytes / GB, "fits": False, "error": None,
                                "capacity_GB": b.capacity_bytes / GB, "settled": MEMORY_BOUND})
        else:
            open_.append((b, s))
    open_.sort(key=lambda pair: -pair[0].tokens_per_s_high)
    return settled, open_


def search(space: list[dict], top: int = 10, executor: Any = None, progress: Progress = None,
           batch: int = 16) -> pd.DataFrame:
    """Rank ``space`` (from :func:`search_space`), simulating only candidates that could make the
    top ``top``; the table of every candidate, fastest that fits first."""
    settled, open_ = _bounded(space, executor)
    rows: list[dict] = []
    fastest: list[float] = []  # tokens/s of the candidates simulated that fit, best first
    while open_:
        kth = fastest[top - 1] if len(fastest) >= top else 0.0
        still = [(b, s) for b, s in open_ if not b.cannot_reach(kth)]
        settled += [s | {"error": None, "settled": TIME_BOUND, "fits": None,
                         "tokens_per_s_bound": b.tokens_per_s_high} for b, s in open_ if b.cannot_reach(kth)]
        if not still:
            break
        chunk, open_ = still[:batch], still[batch:]
        done = run_rows([s for _, s in chunk], executor=executor, interval="later")
        for row in done:
            row["settled"] = SIMULATED
            if row.get("error") is None and row.get("fits"):
                fastest.append(row["tokens_per_s"])
        fastest.sort(reverse=True)
        rows += done
        _forget_unshowable(rows, fastest, top)
        if progress is not None:
            progress(len(rows) + len(settled), len(space))
    with_intervals(rows, top)
    if progress is not None:
        progress(len(space), len(space))  # the rest settled by their bounds
    return rank(pd.DataFrame(rows + settled), top)


def _forget_unshowable(rows: list[dict], fastest: list[float], top: int) -> None:
    """Drop what computes the interval of a row that can no longer be shown: slower than MIN_DIFFERENCE
    below the K-th fastest, it can neither enter the top K nor tie with the fastest (near-ties are
    shown by room to spare), and the K-th fastest only grows."""
    if len(fastest) < top:
        return
    floor = fastest[top - 1] * (1.0 - MIN_DIFFERENCE)
    for row in rows:
        if row.get("later_interval") is not None and row["tokens_per_s"] < floor:
            row["later_interval"] = None


def with_intervals(rows: list[dict], top: int) -> None:
    """The 80% intervals of the rows a plan shows (the ``top`` fastest that fit), re-timed from the
    steps their simulations kept (the same figures as simulating them with intervals); no other row
    has one.  What computed them is then dropped from every row."""
    fitting = [i for i, row in enumerate(rows) if row.get("error") is None and row.get("fits")]
    if fitting:
        # The rows shown are those of the table's own order (near-ties broken toward room to spare).
        order = ranked(pd.DataFrame([{k: v for k, v in rows[i].items() if k != "later_interval"}
                                     for i in fitting]).assign(_row=fitting))
        for i in (int(i) for i in order["_row"].head(top)):
            if rows[i].get("later_interval") is not None:
                rows[i].update(later_columns(rows[i]["later_interval"]))
    for row in rows:
        row.pop("later_interval", None)


def rank(df: pd.DataFrame, top: int) -> pd.DataFrame:
    """Fits first, fastest first; each row's outcome, knobs and whether it is too close to call."""
    for column in ("fits", "tokens_per_s", "error", "settled", "reserved_GB"):
        if column not in df:
            df[column] = None
    df["fits"] = df["fits"].astype("boolean").fillna(False).astype(bool)
    df["outcome"] = [REFUSED if settled == REFUSAL else f"{OUT_OF_RUNNING} {top}" if settled == TIME_BOUND
                     else FITS if fits else NO_FIT
                     for settled, fits in zip(df["settled"], df["fits"], strict=True)]
    df.insert(0, "knobs", [knobs_label(r) for r in df.to_dict("records")])
    return ranked(df)


__all__ = ["MICRO_BATCHES", "PlanError", "rank", "search", "search_space"]
