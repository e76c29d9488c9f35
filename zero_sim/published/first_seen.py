"""How the model did on pre-registered sources: when it first saw them, and now.

Each file in ``preregistered/`` (:mod:`zero_sim.published.preregister`) holds a source's points
with the predictions a named commit's model made before anyone changed the model after reading
them.  Two summaries over the same points:

* ``first_seen``: the frozen predictions and intervals, read from the files (never recomputed);
* ``now``: the current model's predictions and intervals for the points the files hold.

Each reports ``median_abs_error`` (of the speed error: predicted over published throughput,
minus one, a step time's inverted, so positive = predicted too fast), ``coverage`` (the share of
points whose published value lies inside the printed 80% interval; a point printed with no
interval, or refused, counts as outside), and ``too_fast`` / ``too_slow`` as **counts** of points.
Errors and coverage are fractions.  The same per source.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from zero_sim.published.preregister import FROZEN_DIR, predict_point


def load_frozen(directory: Path = FROZEN_DIR) -> list[dict]:
    """Every pre-registered file, by name."""
    return [json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))]


def _inside(record: dict) -> bool:
    low, high = record.get("low"), record.get("high")
    return low is not None and high is not None and low <= record["published"] <= high


def summarise(records: list[dict]) -> dict:
    """median |speed error|, coverage of the 80% intervals and the counts too fast and too slow."""
    errors = [r["speed_error"] for r in records if r.get("speed_error") is not None]
    return {"points": len(records), "predicted": len(errors),
            "median_abs_error": statistics.median(abs(e) for e in errors) if errors else None,
            "coverage": sum(_inside(r) for r in records) / len(records) if records else None,
            "too_fast": sum(e > 0 for e in errors), "too_slow": sum(e < 0 for e in errors)}


def preregistered_block(frozen: list[dict] | None = None) -> dict:
    """``{"points", "sources", "first_seen", "now", "by_source"}`` over every pre-registered file."""
    frozen = load_frozen() if frozen is None else frozen
    first, now, by_source = [], [], {}
    for f in frozen:
        then = f["points"]
        current = [predict_point(r["point"]) for r in then]
        first += then
        now += current
        by_source[f["source"]["slug"]] = {"title": f["source"]["title"], "model_commit": f["model_commit"],
                                          "date": f["date"], "first_seen": summarise(then),
                                          "now": summarise(current)}
    return {"points": len(first), "sources": len(frozen), "first_seen": summarise(first),
            "now": summarise(now), "by_source": by_source}


def _cells(s: dict) -> str:
    if s["median_abs_error"] is None:
        return "no point predicted"
    refused = s["points"] - s["predicted"]
    return (f"median |error| {s['median_abs_error']:5.1%}, 80% intervals held {s['coverage']:4.0%}; "
            f"{s['too_fast']} of {s['points']} too fast, {s['too_slow']} too slow"
            f"{f', {refused} refused' if refused else ''}")


def format_block(block: dict) -> list[str]:
    """The block for a terminal: first-seen before now, overall then per source."""
    lines = [f"pre-registered sources (predicted before the model saw them): {block['points']} runs "
             f"from {block['sources']} sources"]
    if not block["points"]:
        return lines
    lines.append(f"  {'first seen':12} {_cells(block['first_seen'])}")
    lines.append(f"  {'now':12} {_cells(block['now'])}")
    for slug, s in block["by_source"].items():
        lines.append(f"  {slug} (model {s['model_commit'][:10]}, {s['date']}):")
        lines.append(f"    {'first seen':10} {_cells(s['first_seen'])}")
        lines.append(f"    {'now':10} {_cells(s['now'])}")
    return lines
