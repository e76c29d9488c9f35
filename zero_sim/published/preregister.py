"""Pre-registration: a new source's points predicted by the model as it stands, frozen before any change.

A model built by reading published runs describes those runs well; the only honest measure of
it is a run it had not seen when it was built.  So each new source of published measurements
is registered in two steps that one commit holds together:

1. its points go into ``sources/<slug>.toml`` in ``points.toml``'s format (each point states what
   the source states and what was assumed in ``unstated``), with a ``[source]`` table: title,
   url and the exact table or figure the points come from;
2. ``python -m zero_sim.published.preregister zero_sim/published/sources/<slug>.toml`` predicts
   every point with the model at ``HEAD`` and writes ``preregistered/<slug>.json``: the source,
   the commit whose model made the predictions, the date, and per point its id, scenario,
   metric, published value, predicted value, the 80% interval the model printed and whether the
   run was predicted to fit.

The JSON is written once and never edited (``tests/test_published_preregistered.py`` checks that
each file appears in exactly one commit).  A later model change shows its effect on these points
as ``now`` beside the frozen ``first_seen`` (:mod:`zero_sim.published.first_seen`).

Each point is predicted as configured (every setting it states, its stack included), the way a
user who knows the run would ask; the metric's interval is the one ``simulate`` prints
(:mod:`zero_sim.intervals.speed`).
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import tomllib
from pathlib import Path

from zero_sim.published.fit import speed_error
from zero_sim.published.judge import PublishedError, load_points, metric_value
from zero_sim.scenario import ScenarioError, simulate

HERE = Path(__file__).parent
SOURCES_DIR = HERE / "sources"
FROZEN_DIR = HERE / "preregistered"
SOURCE_FIELDS = ("title", "url", "table")
# Paths whose uncommitted changes would make HEAD a false name for the model that predicted.
MODEL_PATHS = ("zero_sim", "sim2real")
NOT_MODEL = ("zero_sim/published/sources/", "zero_sim/published/preregistered/")


def read_source(path: str | Path) -> tuple[dict, list[dict]]:
    """A source file's ``[source]`` table (title, url, table) and its checked points."""
    path = Path(path)
    try:
        source = tomllib.loads(path.read_text()).get("source", {})
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise PublishedError(f"cannot read the source file {str(path)!r} ({exc})") from None
    missing = [f for f in SOURCE_FIELDS if not source.get(f)]
    if missing:
        raise PublishedError(f"{path.name} needs a [source] table with {', '.join(missing)} "
                             f"(title, url and the exact table the points come from)")
    points = load_points(path)
    if not all("scenario" in p for p in points):
        raise PublishedError(f"{path.name}: pre-registered points are training runs ([point.scenario])")
    return source, points


def metric_interval(metrics: dict, point: dict) -> tuple[float | None, float | None]:
    """The 80% interval ``simulate`` printed for the point's metric, or (None, None) where none applies."""
    metric = point["metric"]
    if metric == "tflops_per_gpu":
        band = metrics.get("tflops_per_gpu_interval")
        if band and point.get("flops") == "hardware":  # the same relative band on the recompute count
            scale = metrics["hardware_tflops_per_gpu"] / metrics["tflops_per_gpu"]
            band = [band[0] * scale, band[1] * scale]
    else:
        band = metrics.get(f"{metric}_interval")
    return (band[0], band[1]) if band else (None, None)


def predict_point(point: dict) -> dict:
    """One point's frozen record: the prediction as configured, the interval ``simulate`` printed for it
    and whether the run was predicted to fit; a refused scenario is recorded with its sentence."""
    record = {"id": point["id"], "metric": point["metric"], "published": point["value"], "predicted": None,
              "low": None, "high": None, "fits": None, "refusal": None}
    try:
        metrics = simulate(**point["scenario"]).metrics
        record["predicted"] = metric_value(point, metrics)
    except (ScenarioError, ValueError, KeyError, TypeError) as exc:  # as judge.predict reports a refusal
        record["refusal"] = f"{type(exc).__name__}: {exc}"
        return record
    record["fits"] = bool(metrics["memory"]["fits"])
    record["low"], record["high"] = metric_interval(metrics, point)
    record["speed_error"] = speed_error(point, record["predicted"])
    return record


def model_commit(root: Path) -> str:
    """HEAD, refused while the model's code has uncommitted changes (HEAD would not be the model)."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain", "--", *MODEL_PATHS], cwd=root,
                                capture_output=True, text=True, check=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        raise PublishedError("pre-registration names the commit whose model predicts; run it in a git "
                             "checkout") from None
    dirty = [line[3:] for line in status if not line[3:].startswith(NOT_MODEL)]
    if dirty:
        raise PublishedError(f"commit the model first: {', '.join(dirty[:3])} has uncommitted changes, so "
                             f"HEAD ({head[:10]}) is not the model that would predict")
    return head


def freeze(source_file: str | Path, commit: str, out_dir: Path = FROZEN_DIR) -> Path:
    """Predict a source's points and write ``<out_dir>/<slug>.json`` once; an existing file is never
    overwritten (a pre-registered prediction is not revised)."""
    source_file = Path(source_file)
    source, points = read_source(source_file)
    target = out_dir / f"{source_file.stem}.json"
    if target.exists():
        raise PublishedError(f"{target.name} is already registered and is never rewritten; a new table "
                             f"from the same source goes into a new source file")
    frozen = {"source": {f: source[f] for f in SOURCE_FIELDS} | {"slug": source_file.stem},
              "model_commit": commit, "date": datetime.datetime.now(datetime.UTC).date().isoformat(),
              "mode": "configured",
              "points": [predict_point(p) | {"point": p} for p in points]}
    out_dir.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(frozen, indent=1) + "\n")
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zero_sim.published.preregister",
                                     description="predict a new source's points with the committed model "
                                                 "and freeze the predictions")
    parser.add_argument("source", help="a TOML file of points (zero_sim/published/sources/<slug>.toml)")
    args = parser.parse_args(argv)
    try:
        target = freeze(args.source, model_commit(HERE.parent.parent))
    except PublishedError as exc:
        print(f"zero-sim: {exc}", file=sys.stderr)
        return 2
    frozen = json.loads(target.read_text())
    print(f"wrote {target}: {len(frozen['points'])} points predicted by {frozen['model_commit'][:10]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
