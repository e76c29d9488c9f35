"""Which strategies and knobs fit one model on one cluster, and which of those is fastest.

:func:`candidates` lists the settings worth trying: every strategy at its defaults, then
each of its knobs varied one at a time, each under every activation-recompute mode.  The
variations come from the strategies' own knob declarations (booleans flipped, every other
choice of a multiple-choice knob), so a newly registered strategy is explored without
changes here.  :func:`plan` simulates them all with :func:`zero_sim.plan.sweep.sweep` and ranks
the table: candidates that fit in memory first, fastest (tokens per second) first.

A candidate can miss in two ways that call for different fixes, so they are told apart
(the ``outcome`` column, and :func:`tally` in words): it runs but does not fit in memory
(more GPUs, a smaller micro-batch, recompute), or the simulator refuses it on this cluster
(hybrid sharding on a single node), which no amount of memory changes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd

from zero_sim.plan.sweep import Progress, sweep
from zero_sim.published.ranking import MIN_DIFFERENCE
from zero_sim.strategies import STRATEGIES, all_knobs, get_strategy
from zero_sim.system.workload import RECOMPUTE_MODES

# Knobs the planner leaves at their defaults: they change number formats, not the schedule; ZeRO++'s
# quantization and secondary partition trade accuracy or memory for speed, so they are tried only
# when asked (`zero-sim plan --zero-quantized-weights ...` sets them on every zero3 candidate).
PLANNER_SKIPS = ("param_dtype", "reduce_dtype", "zero_quantized_weights", "zero_hpz_partition_size",
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


def plan(model: str = "gpt2-1.5b", gpus: int = 8, topology: str = "dgx-a100", gpu: str | None = None,
         micro_batch: int = 4, strategies: Iterable[str] | None = None,
         recompute: Iterable[str] = RECOMPUTE_MODES, progress: Progress = None, **extra) -> pd.DataFrame:
    """Simulate every candidate for one model on one cluster; fastest that fits first.

    ``outcome`` says of each row :data:`FITS`, :data:`NO_FIT` (it runs, in more memory than the
    GPU has) or :data:`REFUSED` (the simulator refuses it here; the sentence is in ``error``).
    ``progress`` is passed to :func:`zero_sim.plan.sweep.sweep`; ``extra`` are further
    ``simulate()`` settings shared by every candidate.
    """
    base = {"model": model, "gpus": gpus, "topology": topology, "micro_batch": micro_batch, **extra}
    if gpu:
        base["gpu"] = gpu
    scenarios = [base | c for c in candidates(strategies, recompute)]
    df = sweep(scenarios, progress=progress)
    df.insert(1, "knobs", [knobs_label(r) for r in df.to_dict("records")])
    if "fits" not in df:
        df["fits"] = False
    df["fits"] = df["fits"].fillna(False).astype(bool)
    refused = df["error"].notna() if "error" in df else pd.Series(False, index=df.index)
    df["outcome"] = [REFUSED if r else FITS if fits else NO_FIT
                     for r, fits in zip(refused, df["fits"], strict=True)]
    return ranked(df)


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
    most memory to spare, then speed.  Their speeds are within run-to-run noise; an out-of-memory is not."""
    close = df["too_close_to_call"]
    if close.sum() < 2 or "spare_GB" not in df:
        return df
    order = {"fits": 0, "tight": 1}
    verdict = df.get("fit_verdict", pd.Series(None, index=df.index))
    top = df[close].assign(_verdict=[order.get(v, 2) for v in verdict[close]],
                           _spare=df.loc[close, "spare_GB"].round(1))  # 0.1 GB: same memory, then speed
    top = top.sort_values(["_verdict", "_spare", "tokens_per_s"], ascending=[True, False, False])
    top = top.drop(columns=["_verdict", "_spare"])
    return pd.concat([top, df[~close]])


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


def tally(df: pd.DataFrame) -> str:
    """How the candidates of a plan fared, in words: "48 fit, 3 do not fit in memory, 3 cannot run on
    this topology: --hybrid needs at least two nodes; ...".  A refused candidate is never counted as
    a memory miss: that would send the reader after memory for a setup that cannot run at all."""
    counts = df["outcome"].value_counts()
    fit, miss, refused = (int(counts.get(k, 0)) for k in (FITS, NO_FIT, REFUSED))
    parts = [f"{fit} fit", f"{miss} {'does' if miss == 1 else 'do'} not fit in memory"]
    if refused:
        reasons = df.loc[df["outcome"] == REFUSED, "error"].value_counts()
        others = f" (and {len(reasons) - 1} other reasons)" if len(reasons) > 1 else ""
        parts.append(f"{refused} cannot run on this topology: {reasons.index[0]}{others}")
    return ", ".join(parts)


__all__ = ["FITS", "NO_FIT", "PLANNER_SKIPS", "REFUSED", "candidates", "knobs_label", "plan", "ranked",
           "room_first", "tally", "too_close_to_call"]
