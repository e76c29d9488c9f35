"""Whether the simulator orders alternatives as they were measured: what a planner is for.

``points.toml``'s ``[[pair]]`` tables name two points of one source on the same hardware that
differ in one thing (optimized vs unoptimized code, 8 vs 128 GPUs, full vs selective
recompute).  For each pair the published speed ratio (b over a, in throughput terms: a step
time is inverted) is compared with the predicted one.  A pair *counts* when the published
difference exceeds :data:`MIN_DIFFERENCE`, since a smaller one is within run-to-run noise and
the sources' rounding; the score is the share of counted pairs the simulator orders the same
way.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from zero_sim.published.judge import POINTS_FILE, Judged, PublishedError

MIN_DIFFERENCE = 0.05


def load_pairs(path: str | Path = POINTS_FILE) -> list[dict]:
    """The ``[[pair]]`` tables of a points file (none is fine: a user's own file may have none)."""
    return tomllib.loads(Path(path).read_text()).get("pair", [])


def _speed(judged: Judged, value: float) -> float:
    return 1.0 / value if judged.point["metric"] == "step_time_s" else value


def rank_pairs(pairs: list[dict], judged: list[Judged]) -> dict:
    """Each pair's published and predicted ratio (b / a speed), whether it counts and is ordered
    right, and the share ordered right among those that count."""
    by_id = {j.id: j for j in judged}
    rows = []
    for pair in pairs:
        missing = [key for key in ("a", "b") if pair.get(key) not in by_id]
        if missing:
            raise PublishedError(f"pair {pair.get('a')!r} / {pair.get('b')!r} names a point that is not "
                                 f"in the file; check its a and b ids")
        a, b = by_id[pair["a"]], by_id[pair["b"]]
        if a.predicted is None or b.predicted is None:
            continue
        published = _speed(b, b.point["value"]) / _speed(a, a.point["value"])
        predicted = _speed(b, b.predicted) / _speed(a, a.predicted)
        counts = abs(published - 1.0) > MIN_DIFFERENCE
        rows.append({"a": a.id, "b": b.id, "differs": pair.get("differs", ""), "published_ratio": published,
                     "predicted_ratio": predicted, "ratio_error": predicted / published - 1.0,
                     "counts": counts, "ordered": (published > 1.0) == (predicted > 1.0)})
    counted = [r for r in rows if r["counts"]]
    share = sum(r["ordered"] for r in counted) / len(counted) if counted else None
    return {"pairs": rows, "counted": len(counted), "ordered_share": share}


def format_ranking(ranking: dict) -> list[str]:
    lines = [f"{'pair (b vs a)':72} {'published':>9} {'predicted':>9}  ordered"]
    for r in ranking["pairs"]:
        mark = ("yes" if r["ordered"] else "NO") if r["counts"] else "(within 5%)"
        lines.append(f"{r['differs'][:72]:72} {r['published_ratio']:9.2f}x {r['predicted_ratio']:8.2f}x  "
                     f"{mark}")
    if ranking["ordered_share"] is not None:
        lines.append(f"ranking: {ranking['ordered_share']:.0%} of {ranking['counted']} pairs that differ by "
                     f"more than {MIN_DIFFERENCE:.0%} ordered as published")
    return lines
