"""The candidates a plan tries, and the order a plan's table is read in.

:func:`candidates` lists the settings worth trying: every strategy at its defaults, then each of
its knobs varied one at a time, each under every activation-recompute mode (the variations come
from the strategies' own knob declarations, so a newly registered strategy is explored without
changes here).  :func:`ranked` puts a table of them in rank order: what fits first, fastest
first, the rows too close to the fastest to call marked.  The notebook's planner
(:mod:`zero_sim.plan.planner`) and the command's search (:mod:`zero_sim.plan.search`) share them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd

from zero_sim.published.ranking import MIN_DIFFERENCE
from zero_sim.strategies import STRATEGIES, all_knobs, get_strategy
from zero_sim.system.workload import RECOMPUTE_MODES

# Knobs the planner leaves at their defaults: they change number formats, not the schedule; ZeRO++'s
# quantization and secondary partition trade accuracy or memory for speed, so they are tried only
# when asked (`zero-sim plan --zero-quantized-weights ...` sets them on every zero3 candidate).
PLANNER_SKIPS = ("param_dtype", "zero_quantized_weights", "zero_hpz_partition_size",
                 "zero_quantized_gradients")
# A candidate's outcome: it fits; it runs but needs more memory than the GPU has; it cannot run here.
FITS, NO_FIT, REFUSED = "fits", "does not fit in memory", "cannot run"


def candidates(strategies: Iterable[str] | None = None, recompute: Iterable[str] = RECOMPUTE_MODES,
               skip: Iterable[str] = PLANNER_SKIPS) -> list[dict]:
    """Settings worth trying: every strategy at its defaults, and each knob varied one at a time.

    Variations come from the knobs themselves (booleans flipped, every other choice of a
    multiple-choice knob), so a new strategy's knobs are explored without changes here.
    Each is tried under every activation-recompute mode in ``recompute``.
    """
    out = []
    for name in strategies or STRATEGIES:
        strategy = get_strategy(name)
        variants: list[dict] = [{}]
        for knob in strategy.knobs:
            if knob.name in skip:
                continue
            if knob.kind is bool:
                variants.append({knob.name: not knob.default})
            elif knob.choices:
                variants.extend({knob.name: c} for c in knob.choices if c != knob.default)
        for variant in variants:
            for mode in recompute:
                out.append({"strategy": name, **variant, "recompute": mode})
    return out


def knobs_label(row: Mapping[str, Any]) -> str:
    """The knobs a planned row sets, as ``name=value`` pairs (``defaults`` when it sets none)."""
    owners = all_knobs()
    # A table column that holds blanks holds floats: a whole number is shown as the integer it was.
    parts = [f"{k}={int(v) if isinstance(v, float) and v.is_integer() else v}" for k, v in row.items()
             if k in owners and v is not None and not _isnan(v)]
    if row.get("fp8_all_gather") is True:  # a common setting the fp8 search varies (plan_search)
        parts.append("fp8_all_gather")
    return ", ".join(parts) or "defaults"


def _isnan(v) -> bool:
    return isinstance(v, float) and math.isnan(v)


def ranked(df: pd.DataFrame) -> pd.DataFrame:
    """The table in rank order: what fits first, fastest first; rows too close to the fastest
    marked and ordered by room to spare (:func:`room_first`); rows numbered from 1."""
    df = df.sort_values(["fits", "tokens_per_s"], ascending=[False, False], na_position="last")
    df["too_close_to_call"] = too_close_to_call(df)
    df = room_first(df)
    df.index = range(1, len(df) + 1)
    df.index.name = "rank"
    return df


def room_first(df: pd.DataFrame) -> pd.DataFrame:
    """Near-ties broken toward room to spare: the candidates too close to call (the top rows) in the
    order of their memory verdict (the whole 80% interval fits before one that is tight), then the
    most memory to spare, then speed.  Their speeds are within run-to-run noise; an out-of-memory is
    not."""
    close = df["too_close_to_call"]
    if close.sum() < 2 or "spare_GB" not in df:
        return df
    order = {"fits": 0, "tight": 1}
    verdict = df.get("fit_verdict", pd.Series(None, index=df.index))
    top = df[close].assign(_verdict=[order.get(v, 2) for v in verdict[close]],
                           _spare=df.loc[close, "spare_GB"].round(1))  # 0.1 GB: same memory, then speed
    top = top.sort_values(["_verdict", "_spare", "tokens_per_s"], ascending=[True, False, False])
    return pd.concat([top.drop(columns=["_verdict", "_spare"]), df[~close]])


def too_close_to_call(df: pd.DataFrame) -> pd.Series:
    """Candidates that fit within :data:`~zero_sim.published.ranking.MIN_DIFFERENCE` (5%) of the
    fastest that fits.  Why not where the 80% intervals overlap: those intervals say where a run
    lands in absolute terms, and most of that uncertainty (the GPU's sustained speed, the software
    stack) is shared by every candidate of one plan; published pairs of runs that differ by more
    than 5% are all ordered as measured (``zero-sim validate --published``), smaller differences
    are within run-to-run noise and not checked, so below 5% the order is not claimed."""
    fitting = df["fits"] & df["tokens_per_s"].notna()
    if not fitting.any():
        return pd.Series(False, index=df.index)
    best = df.loc[fitting, "tokens_per_s"].max()
    return fitting & (df["tokens_per_s"] >= best * (1.0 - MIN_DIFFERENCE))


__all__ = ["FITS", "NO_FIT", "PLANNER_SKIPS", "REFUSED", "candidates", "knobs_label", "ranked",
           "room_first", "too_close_to_call"]
