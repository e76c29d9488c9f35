"""Fitting the one whole-run constant, leave one source out, and the intervals it leaves.

What is fitted (:mod:`zero_sim.system.run_overheads` says why): ``run_overhead`` per GPU
generation, the median over that generation's published time points of predicted speed over
published speed, each predicted with its source's stack and no other per-point knob and with
no overhead applied.  A generation with no points takes the pooled median.

How it is judged: **leave one source out**.  For each source (the publication a point comes
from), the factors are refitted from every *other* source's points and that source's points are
predicted with them; those errors are the headline.  A factor that only fits the points it was
fitted on shows up here as a larger error.

What is not fitted (:func:`in_fit`): the overhead is what plain runs lose beyond the kernel
models.  FP8, ZeRO++ and offloading add parts of their own (casts, quantization kernels, host
copies and the CPU's update) that no factor was fitted for, so a run whose scenario uses one of
them (:func:`zero_sim.published.judge.unfitted_feature`) is judged with the shipped fit and never
moves it; so is a point marked ``fit = false`` (a plain baseline published beside such runs to
form pairs, held out with them).

The intervals: the leave-one-source-out speed errors (``predicted / published - 1`` of
throughput, so positive = predicted too fast) of every time point, in two groups (stack known,
default stack), give a distribution-free 80% interval (:func:`interval`).  Coverage is checked
the same way: a point's interval is computed without its own source, and the point counts as
covered if its own leave-one-source-out error lies inside.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass

from zero_sim.published.judge import TIME_METRICS, load_points, predict, scenario_for, unfitted_feature
from zero_sim.system.gpus import GENERATIONS, GPUS
from zero_sim.system.run_overheads import DEFAULT_STACK_GROUP, FIT_FILE, KNOWN_STACK
from zero_sim.system.topology import PRESETS as TOPOLOGIES

LOW_QUANTILE = 0.10  # each tail of an 80% interval
# An interval narrower than this either side is not claimed: a few dozen runs cannot show more.
MIN_HALF_WIDTH = 0.05
NO_OVERHEAD = {"run_overhead": 1.0}


def in_fit(point: dict) -> bool:
    """Whether a point's figure enters the overhead fit: a training run's time figure, on none of the
    features without a fitted part, and not marked ``fit = false``."""
    return ("scenario" in point and point["metric"] in TIME_METRICS and point.get("fit", True) is not False
            and unfitted_feature(point["scenario"]) is None)


def source_of(point: dict) -> str:
    """The publication a point comes from: its source text up to the first comma."""
    return point["source"].split(",")[0].strip()


def generation_of(point: dict) -> str:
    scenario = point["scenario"]
    gpu = scenario.get("gpu") or TOPOLOGIES[scenario["topology"]].gpu
    return GENERATIONS.get(gpu, "unknown") if gpu in GPUS else "unknown"


def speed_error(point: dict, predicted: float) -> float:
    """Predicted speed over published speed, minus one: a step time's error inverted."""
    if point["metric"] == "step_time_s":
        return point["value"] / predicted - 1.0
    return predicted / point["value"] - 1.0


@dataclass
class Row:
    """One time point: its source, generation and speed errors without overhead, per mode."""

    point: dict
    source: str
    generation: str
    raw: dict[str, float]  # mode -> speed error with run_overhead 1


def _rows(points: list[dict]) -> list[Row]:
    rows = []
    for p in points:
        if not in_fit(p):
            continue
        raw = {}
        for mode in ("default", "stack", "configured"):
            judged = predict(p, mode, NO_OVERHEAD)
            if judged.predicted is None:
                break
            raw[mode] = speed_error(p, judged.predicted)
        else:
            rows.append(Row(p, source_of(p), generation_of(p), raw))
    return rows


def overheads(rows: list[Row]) -> tuple[dict[str, float], float]:
    """Median speed ratio by generation (from stack-mode predictions), and the pooled median."""
    by_generation: dict[str, list[float]] = {}
    for r in rows:
        by_generation.setdefault(r.generation, []).append(1.0 + r.raw["stack"])
    pooled = statistics.median(1.0 + r.raw["stack"] for r in rows) if rows else 1.0
    return {g: statistics.median(v) for g, v in sorted(by_generation.items())}, pooled


def _factor(fit: tuple[dict[str, float], float], generation: str) -> float:
    by_generation, pooled = fit
    return by_generation.get(generation, pooled)


def loso_errors(rows: list[Row]) -> tuple[dict[str, list[float]], dict[str, list[bool]]]:
    """Each row's speed error per mode, predicted with the factors fitted without its source, and
    whether the published figure lies inside that prediction's own (propagated) 80% interval."""
    errors: dict[str, list[float]] = {"default": [], "stack": [], "configured": []}
    inside: dict[str, list[bool]] = {mode: [] for mode in errors}
    fits = {s: overheads([r for r in rows if r.source != s]) for s in {r.source for r in rows}}
    for r in rows:
        factor = _factor(fits[r.source], r.generation)
        for mode in errors:
            judged = predict(r.point, mode, {"run_overhead": factor})
            errors[mode].append(speed_error(r.point, judged.predicted))
            band = judged.interval
            inside[mode].append(band is not None and band[0] <= r.point["value"] <= band[1])
    return errors, inside


def interval(errors: list[float]) -> dict[str, float]:
    """The distribution-free 80% prediction interval: with n errors sorted, the k-th smallest to
    the k-th largest, k = floor((n + 1) x 0.1), holds a new run's error with probability at least
    (n + 1 - 2k) / (n + 1) >= 80% when runs are exchangeable (split-conformal prediction)."""
    ordered = sorted(errors)
    if not ordered:
        return {"low": None, "high": None, "runs": 0}
    k = max(1, math.floor((len(ordered) + 1) * LOW_QUANTILE))
    low, high = ordered[k - 1], ordered[len(ordered) - k]
    return {"low": min(low, -MIN_HALF_WIDTH), "high": max(high, MIN_HALF_WIDTH), "runs": len(errors)}


def coverage(rows: list[Row], errors: list[float]) -> float:
    """Share of rows whose error lies in the interval built from the other sources' errors."""
    inside = 0
    for i, r in enumerate(rows):
        others = [e for j, e in enumerate(errors) if rows[j].source != r.source]
        band = interval(others)
        inside += bool(others) and band["low"] <= errors[i] <= band["high"]
    return inside / len(rows) if rows else 0.0


def summary(errors: list[float]) -> dict[str, float]:
    if not errors:
        return {"points": 0, "median_abs_error": None, "p90_abs_error": None, "too_fast": 0, "too_slow": 0}
    absolute = sorted(abs(e) for e in errors)
    p90 = absolute[min(len(absolute) - 1, math.ceil(0.9 * len(absolute)) - 1)]
    return {"points": len(errors), "median_abs_error": statistics.median(absolute), "p90_abs_error": p90,
            "too_fast": sum(e > 0 for e in errors), "too_slow": sum(e < 0 for e in errors)}


def refit(points: list[dict] | None = None) -> dict:
    """Fit the overheads and intervals; report leave-one-source-out accuracy and coverage."""
    rows = _rows(points if points is not None else load_points())
    by_generation, pooled = overheads(rows)
    errors, inside = loso_errors(rows)
    return {
        "overheads": by_generation, "pooled": pooled,
        "intervals": {KNOWN_STACK: interval(errors["stack"]),
                      DEFAULT_STACK_GROUP: interval(errors["default"])},
        "leave_one_source_out": {mode: summary(e) for mode, e in errors.items()},
        "coverage": {KNOWN_STACK: coverage(rows, errors["stack"]),
                     DEFAULT_STACK_GROUP: coverage(rows, errors["default"])},
        # The intervals predictions carry (propagated, zero_sim.intervals.sampling), overhead fitted without
        # the point's source: the share of points whose published figure lies inside, per mode.
        "propagated_coverage": {mode: sum(v) / len(v) if v else None for mode, v in inside.items()},
        "without_overhead": {mode: summary([r.raw[mode] for r in rows]) for mode in errors},
        "sources": sorted({r.source for r in rows}),
        "points": [{"id": r.point["id"], "source": r.source, "generation": r.generation,
                    **{f"loso_{m}": errors[m][i] for m in errors},
                    **{f"inside_{m}": inside[m][i] for m in inside}} for i, r in enumerate(rows)],
        "command": "zero-sim validate --published --refit",
    }


def write_fit(fit: dict) -> None:
    """Keep what predictions read (overheads, intervals) and the report beside them."""
    FIT_FILE.write_text(json.dumps(fit, indent=1, sort_keys=True) + "\n")


__all__ = ["refit", "write_fit", "scenario_for", "coverage", "interval", "overheads", "in_fit"]
