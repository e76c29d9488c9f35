"""Which strategies and knobs fit one model on one cluster, and which of those is fastest.

:func:`candidates` (:mod:`zero_sim.plan.candidates`) lists the settings worth trying: every
strategy at its defaults, then each of its knobs varied one at a time, each under every
activation-recompute mode.  :func:`plan` ranks them with the bounded search of :mod:`zero_sim.plan.search`
(only candidates that could make the top are simulated): candidates that fit in memory first,
fastest (tokens per second) first.

A candidate can miss in two ways that call for different fixes, so they are told apart
(the ``outcome`` column, and :func:`tally` in words): it runs but does not fit in memory
(more GPUs, a smaller micro-batch, recompute), or the simulator refuses it on this cluster
(hybrid sharding on a single node), which no amount of memory changes.
"""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd

from zero_sim.plan.candidates import (
    FITS,
    NO_FIT,
    PLANNER_SKIPS,
    REFUSED,
    candidates,
    knobs_label,
    ranked,
    too_close_to_call,
)
from zero_sim.plan.search import search
from zero_sim.plan.sweep import Progress
from zero_sim.system.workload import RECOMPUTE_MODES


def plan(model: str = "gpt2-1.5b", gpus: int = 8, topology: str = "dgx-a100", gpu: str | None = None,
         micro_batch: int = 4, strategies: Iterable[str] | None = None,
         recompute: Iterable[str] = RECOMPUTE_MODES, progress: Progress = None, top: int = 10,
         **extra) -> pd.DataFrame:
    """Rank every candidate for one model on one cluster; fastest that fits first.

    The bounded search (:func:`zero_sim.plan.search.search`) ranks them: every candidate's
    bounds first, then only those that could make the ``top`` fastest simulated, so the first
    ``top`` rows are those simulating every candidate would give.  ``outcome`` says of each row
    :data:`FITS`, :data:`NO_FIT` (it runs, in more memory than the GPU has: simulated, or known
    from its memory bound), ``cannot reach the top <top>`` (its throughput bound is below the
    ``top``-th fastest: not simulated) or :data:`REFUSED` (the simulator refuses it here; the
    sentence is in ``error``).  ``progress`` is as for :func:`zero_sim.plan.sweep.sweep`;
    ``extra`` are further ``simulate()`` settings shared by every candidate.
    """
    base = {"model": model, "gpus": gpus, "topology": topology, "micro_batch": micro_batch, **extra}
    if gpu:
        base["gpu"] = gpu
    scenarios = [base | c for c in candidates(strategies, recompute)]
    own_bar = progress is True
    if own_bar:
        from tqdm.auto import tqdm

        progress = tqdm(total=len(scenarios), desc="planning", unit="candidate")
    try:
        return search(scenarios, top, progress=_as_callback(progress))
    finally:
        if own_bar:
            progress.close()


def _as_callback(progress: Progress):
    """``progress`` as a ``(done, total)`` callback: a bar (anything with ``update``) advanced to ``done``."""
    if progress is None or progress is False or callable(progress):
        return progress or None
    return lambda done, _total: progress.update(done - progress.n)


def tally(df: pd.DataFrame) -> str:
    """How the candidates of a plan fared, in words: "48 fit, 3 do not fit in memory, 3 cannot run on
    this topology: --hybrid needs at least two nodes; ...".  A refused candidate is never counted as
    a memory miss: that would send the reader after memory for a setup that cannot run at all."""
    counts = df["outcome"].value_counts()
    fit, miss, refused = (int(counts.get(k, 0)) for k in (FITS, NO_FIT, REFUSED))
    parts = [f"{fit} fit", f"{miss} {'does' if miss == 1 else 'do'} not fit in memory"]
    # Candidates a bounded search left unsimulated: their best possible speed is below the top's.
    parts += [f"{int(n)} {outcome}" for outcome, n in counts.items()
              if outcome not in (FITS, NO_FIT, REFUSED)]
    if refused:
        reasons = df.loc[df["outcome"] == REFUSED, "error"].value_counts()
        others = f" (and {len(reasons) - 1} other reasons)" if len(reasons) > 1 else ""
        parts.append(f"{refused} cannot run on this topology: {reasons.index[0]}{others}")
    return ", ".join(parts)


__all__ = ["FITS", "NO_FIT", "PLANNER_SKIPS", "REFUSED", "candidates", "knobs_label", "plan", "ranked",
           "tally", "too_close_to_call"]
