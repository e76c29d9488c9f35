"""Published measurements, predicted: how far the simulator is from runs others have reported.

``points.toml`` beside this module lists measurements from papers, blogs and benchmark
READMEs (``docs/published.md`` describes each source).  A point is either a training run
(``[point.scenario]``: ``simulate()`` keywords for the run as published) with one measured
figure, or one collective (``[point.collective]``) as nccl-tests reports it.  Nothing in
the file feeds a prediction: the simulator predicts each point from its configuration
alone, and the published value only judges it.

What each ``metric`` is compared with:

===================== ================================================================
metric                predicted as
===================== ================================================================
step_time_s           ``step_time_s``
tokens_per_s_per_gpu  ``tokens_per_s / gpus``
tflops_per_gpu        ``tflops_per_gpu`` (``flops = "model"``: no recompute, as MFU counts)
                      or ``hardware_tflops_per_gpu`` (``flops = "hardware"``)
peak_memory_gb        ``memory.peak_bytes`` (``memory = "allocated"``) or
                      ``memory.reserved_peak_bytes`` (``"reserved"``), in ``unit`` (GB or GiB)
collective_time_us    one isolated collective's time (:func:`zero_sim.links.predicted_collective_s`)
busbw_gbps            nccl-tests' busbw of that time: ``bytes x bus factor / time``
===================== ================================================================

The error of a point is ``(predicted - published) / published``.  Time-like metrics and
memory are summarised separately (median and 90th percentile of the absolute error),
and a run that completed as published (``ran = true``) must be predicted to fit.
"""

from __future__ import annotations

import math
import statistics
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zero_sim.links import predicted_collective_s
from zero_sim.scenario import ScenarioError, simulate
from zero_sim.system.stacks import STACKS
from zero_sim.vocabulary.collectives import bus_factor

POINTS_FILE = Path(__file__).with_name("points.toml")
TIME_METRICS = ("step_time_s", "tokens_per_s_per_gpu", "tflops_per_gpu", "collective_time_us", "busbw_gbps")
MEMORY_METRICS = ("peak_memory_gb",)
UNITS = {"GB": 1e9, "GiB": 2**30}
# What a point beyond this error must carry: a written cause (``cause = "..."`` in the file).
OUTLIER = 0.30
# How much of a point's configuration the prediction is given (a user who knows less, or more):
# default: the run's shape, cluster and strategy settings, nothing of its software; stack: those
# plus the stack its source implies; configured: every setting the point states.
MODES = ("default", "stack", "configured")
# A run's numerics (its precision, FSDP's gathered dtype) and DDP's bucket view are the run's, stated by
# its source, though stacks fill them too: kept whatever the mode.
RUN_SETTINGS = frozenset({"precision", "param_dtype", "gradient_as_bucket_view"})
STACK_SETTINGS = frozenset({"stack"}.union(*(s.settings() for s in STACKS.values()))) - RUN_SETTINGS


def scenario_for(point: dict, mode: str = "configured") -> dict:
    """The ``simulate()`` keywords a point is predicted from under ``mode`` (see :data:`MODES`)."""
    scenario = dict(point["scenario"])
    if mode == "configured":
        return scenario
    if mode not in MODES:
        raise PublishedError(f"unknown mode {mode!r}; use one of {', '.join(MODES)}")
    kept = {k: v for k, v in scenario.items() if k not in STACK_SETTINGS}
    if mode == "stack" and "stack" in scenario:
        kept["stack"] = scenario["stack"]
    return kept


def unfitted_feature(scenario: dict) -> str | None:
    """The first setting of a scenario that uses a feature with no fitted part (FP8, ZeRO++, offloading),
    or None.  Read from the keywords as given: a point names them directly, not through a config file."""
    if scenario.get("precision") == "fp8" or scenario.get("fp8_all_gather"):
        return "precision fp8"
    for key in ("zero_quantized_weights", "zero_quantized_gradients"):
        if scenario.get(key):
            return key
    if (scenario.get("zero_hpz_partition_size") or 1) > 1:
        return "zero_hpz_partition_size"
    for key in ("offload_optimizer", "offload_params"):
        if scenario.get(key, "none") != "none":
            return key
    return None


class PublishedError(ValueError):
    """A points file that cannot be used; the message says which point and how to fix it."""


@dataclass
class Judged:
    """One point with its prediction: ``error`` is None when the simulator refused the scenario."""

    point: dict[str, Any]
    predicted: float | None
    error: float | None
    fits: bool | None = None
    refusal: str | None = None
    interval: tuple[float, float] | None = None  # the prediction's 80% interval of the point's metric

    @property
    def id(self) -> str:
        return self.point["id"]

    @property
    def family(self) -> str:
        return "memory" if self.point["metric"] in MEMORY_METRICS else "time"


@dataclass
class Verdict:
    """Every judged point and the summaries the targets are read from."""

    judged: list[Judged]
    summary: dict[str, dict[str, Any]] = field(default_factory=dict)

    def outliers_without_cause(self) -> list[Judged]:
        return [j for j in self.judged
                if j.error is not None and abs(j.error) > OUTLIER and not j.point.get("cause")]

    def predicted_not_to_fit(self) -> list[Judged]:
        return [j for j in self.judged if j.point.get("ran", True) and j.fits is False]

    def to_dict(self) -> dict:
        return {"summary": self.summary,
                "points": [{"id": j.id, "metric": j.point["metric"], "published": j.point["value"],
                            "predicted": j.predicted, "error": j.error, "fits": j.fits, "refusal": j.refusal,
                            "source": j.point["source"], "cause": j.point.get("cause")} for j in self.judged],
                "outliers_without_cause": [j.id for j in self.outliers_without_cause()],
                "predicted_not_to_fit": [j.id for j in self.predicted_not_to_fit()]}


def load_points(path: str | Path = POINTS_FILE) -> list[dict[str, Any]]:
    """The points of a TOML file, checked: unique ids, a known metric, a value and a configuration."""
    try:
        points = tomllib.loads(Path(path).read_text())["point"]
    except (OSError, KeyError, tomllib.TOMLDecodeError) as exc:
        raise PublishedError(f"cannot read published points from {str(path)!r} ({exc}); it must be TOML "
                             f"with [[point]] tables") from None
    seen = set()
    for p in points:
        pid = p.get("id", "?")
        if pid in seen:
            raise PublishedError(f"point {pid!r} appears twice; ids must be unique")
        seen.add(pid)
        if p.get("metric") not in TIME_METRICS + MEMORY_METRICS:
            raise PublishedError(f"point {pid!r} has metric {p.get('metric')!r}; use one of "
                                 f"{', '.join(TIME_METRICS + MEMORY_METRICS)}")
        if not isinstance(p.get("value"), int | float) or p["value"] <= 0:
            raise PublishedError(f"point {pid!r} needs a positive numeric value")
        if ("scenario" in p) == ("collective" in p):
            raise PublishedError(f"point {pid!r} needs exactly one of [point.scenario] or [point.collective]")
        if not p.get("source"):
            raise PublishedError(f"point {pid!r} does not say where its figure was published (source)")
        if not isinstance(p.get("fit", True), bool):
            raise PublishedError(f"point {pid!r} has fit = {p['fit']!r}; use true or false")
    return points


def _collective(point: dict) -> float:
    c = point["collective"]
    kind, nbytes, gpus = c["kind"], float(c["bytes"]), int(c["gpus"])
    (seconds,) = predicted_collective_s([nbytes], c["topology"], gpus, kind, c.get("gpus_per_node"))
    if point["metric"] == "collective_time_us":
        return seconds * 1e6
    return nbytes * bus_factor(kind, gpus) / seconds / 1e9


def _training(point: dict, mode: str, extra: dict | None) -> tuple[float, bool, tuple[float, float] | None]:
    m = simulate(**scenario_for(point, mode), **(extra or {})).metrics
    value = metric_value(point, m)
    return value, bool(m["memory"]["fits"]), _interval(m, point["metric"], value)


def metric_value(point: dict, m: dict) -> float:
    """The simulated figure a training point's metric is compared with (see the module docstring)."""
    mem, metric = m["memory"], point["metric"]
    if metric == "step_time_s":
        value = m["step_time_s"]
    elif metric == "tokens_per_s_per_gpu":
        value = m["tokens_per_s"] / m["gpus"]
    elif metric == "tflops_per_gpu":
        value = m["hardware_tflops_per_gpu" if point.get("flops") == "hardware" else "tflops_per_gpu"]
    else:
        held = mem.get("reserved_peak_bytes", mem["peak_bytes"]) if point.get("memory") == "reserved" \
            else mem["peak_bytes"]
        value = held / UNITS[point.get("unit", "GB")]
    return value


def _interval(m: dict, metric: str, value: float) -> tuple[float, float] | None:
    """A time metric's 80% interval, from the step's (a throughput scales as one over the step)."""
    band = m.get("step_time_s_interval")
    if band is None or metric not in TIME_METRICS:
        return None
    if metric == "step_time_s":
        return band[0], band[1]
    return value * m["step_time_s"] / band[1], value * m["step_time_s"] / band[0]


def predict(point: dict, mode: str = "configured", extra: dict | None = None) -> Judged:
    """Predict one point under ``mode`` (with ``extra`` keywords, e.g. a fitted term left out);
    a scenario the simulator refuses is a result with its sentence, not a crash."""
    try:
        if "collective" in point:
            predicted, fits, band = _collective(point), None, None
        else:
            predicted, fits, band = _training(point, mode, extra)
    except (ScenarioError, ValueError, KeyError, TypeError) as exc:
        return Judged(point, None, None, None, f"{type(exc).__name__}: {exc}")
    return Judged(point, predicted, (predicted - point["value"]) / point["value"], fits, interval=band)


def _summary(judged: list[Judged]) -> dict[str, Any]:
    errors = sorted(abs(j.error) for j in judged if j.error is not None)
    if not errors:
        return {"points": len(judged), "predicted": 0, "median_abs_error": None, "p90_abs_error": None}
    p90 = errors[min(len(errors) - 1, math.ceil(0.9 * len(errors)) - 1)]
    return {"points": len(judged), "predicted": len(errors), "median_abs_error": statistics.median(errors),
            "p90_abs_error": p90}


def judge(points: list[dict] | None = None, mode: str = "configured") -> Verdict:
    """Predict every point under ``mode`` and summarise time and memory separately."""
    judged = [predict(p, mode) for p in (points if points is not None else load_points())]
    verdict = Verdict(judged)
    for family in ("time", "memory"):
        verdict.summary[family] = _summary([j for j in judged if j.family == family])
    return verdict


def _fmt(v: float | None, metric: str) -> str:
    if v is None:
        return "-"
    return f"{v:.3g}" if metric != "step_time_s" else f"{v:.4g}"


def format_table(verdict: Verdict, beside: dict[str, str] | None = None) -> str:
    """The verdict as a plain-text table a terminal shows (``beside``: text after a point's row),
    then the summaries."""
    lines = [f"{'point':34} {'metric':20} {'published':>10} {'predicted':>10} {'error':>8}  source"]
    for j in verdict.judged:
        metric = j.point["metric"]
        err = "refused" if j.refusal else f"{j.error:+.1%}"
        flag = " (predicted not to fit)" if j.point.get("ran", True) and j.fits is False else ""
        lines.append(f"{j.id:34.34} {metric:20} {_fmt(j.point['value'], metric):>10} "
                     f"{_fmt(j.predicted, metric):>10} {err:>8}  {j.point['source'][:60]}{flag}"
                     f"{(beside or {}).get(j.id, '')}")
    for family, s in verdict.summary.items():
        if s["median_abs_error"] is None:
            lines.append(f"{family}: no points predicted")
            continue
        lines.append(f"{family}: {s['predicted']} of {s['points']} points, median |error| "
                     f"{s['median_abs_error']:.1%}, 90th percentile {s['p90_abs_error']:.1%}")
    if (loose := verdict.outliers_without_cause()):
        lines.append(f"beyond {OUTLIER:.0%} with no written cause: {', '.join(j.id for j in loose)}")
    if (tight := verdict.predicted_not_to_fit()):
        lines.append(f"ran as published but predicted not to fit: {', '.join(j.id for j in tight)}")
    return "\n".join(lines)
