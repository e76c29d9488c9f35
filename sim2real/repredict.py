"""Predict the cases of kept validations again with the code as it is now: what did a change move?

``zero-sim validate --keep`` leaves, for every case, its run directory and beside it the
calibration its prediction was made from (``calibration_<run directory>.json``); its JSON
(``--json``, or the report's ``validation.json``) lists the cases with what was measured.
``zero-sim validate --repredict FILE...`` predicts each of those cases again from the same
inputs, the run's own ``run.json`` and that calibration, and puts the errors of the
prediction written down before the run (``old``) beside those of this code (``new``), with
the headline medians and the split by strategy, shape, N and model of both.

Nothing runs and no measurement enters a prediction.  But whoever changed the model has
seen these cases, so a re-prediction screens a change; only a sample drawn afterwards
judges it (docs/validation.md).
"""

from __future__ import annotations

import json
from pathlib import Path

from sim2real.replay import predict_run
from sim2real.validate_report import SPLIT_BY, STEP_PARTS, error_summary, percent
from zero_sim.calibration import Calibration, CalibrationError


class RepredictError(ValueError):
    """A kept validation that cannot be predicted again; one sentence saying why."""


def kept_cases(path: str | Path) -> list[dict]:
    """The case rows of one validation's JSON, each with its run directory still on disk."""
    path = Path(path)
    which = "pass the JSON that `zero-sim validate --json --keep` printed, or a report's validation.json"
    try:
        summary = json.loads(path.read_text())
    except OSError as exc:
        raise RepredictError(f"cannot read {str(path)!r} ({exc.strerror}); {which}") from None
    except ValueError:
        raise RepredictError(f"{str(path)!r} is not JSON; {which}") from None
    cases = summary.get("cases") if isinstance(summary, dict) else None
    if not isinstance(cases, list) or not cases:
        raise RepredictError(f"{str(path)!r} lists no validation cases; pass the JSON of a "
                             f"`zero-sim validate` run")
    for row in cases:
        if not isinstance(row, dict) or not all(isinstance(row.get(k), (int, float))
                                                for k in ("predicted_step_s", "measured_step_s", "error")):
            raise RepredictError(f"{str(path)!r} has a case without its predicted and measured step "
                                 f"times; pass the JSON of a `zero-sim validate` run as it was written")
        run_dir = row.get("run_dir")
        if not run_dir or not (Path(run_dir) / "run.json").is_file():
            raise RepredictError(f"{str(path)!r} names no run directory that still exists for its "
                                 f"{row.get('strategy')} case; only a validation run with --keep "
                                 f"leaves its runs to predict again")
    return cases


def repredict_case(row: dict) -> dict:
    """One case predicted again: its properties, measured figures and old and new errors."""
    run_dir = Path(row["run_dir"])
    cal_file = run_dir.parent / f"calibration_{run_dir.name}.json"
    try:
        cal = Calibration.load(cal_file)
    except CalibrationError as exc:
        raise RepredictError(f"the calibration of {run_dir.name} cannot be read: {exc}") from None
    sim = predict_run(json.loads((run_dir / "run.json").read_text()), cal)
    measured, predicted = row["measured_step_s"], sim.metrics["step_time_s"]
    kept = ("strategy", "gpus", "model", "shape", "global_batch", "bandwidth_gbps", "bucket_mb", "run_dir",
            "noise_band", "exposed_comm_noise_band", "compute_noise_band", "measured_step_s",
            "measured_exposed_comm_s", "measured_compute_s")
    new = {key: row.get(key) for key in kept} | {
        "old_predicted_step_s": row["predicted_step_s"], "old_error": row["error"],
        "predicted_step_s": predicted, "error": (predicted - measured) / measured}
    # Validations written before compute was measured have no compute figures: None, not a guess.
    for figure, metric in STEP_PARTS.items():
        meas, pred = row.get(f"measured_{figure}_s"), sim.metrics[metric]
        new |= {f"old_{figure}_error": row.get(f"{figure}_error"), f"predicted_{figure}_s": pred,
                f"{figure}_error": (pred - meas) / meas if meas else None}
    return new


def repredict(paths) -> dict:
    """Every kept case of ``paths`` predicted again: the rows and both summaries."""
    rows = [repredict_case(row) for path in paths for row in kept_cases(path)]
    old = [{**r, "error": r["old_error"], **{f"{part}_error": r[f"old_{part}_error"] for part in STEP_PARTS}}
           for r in rows]
    return {"sources": [str(p) for p in paths], "cases": rows,
            "old": error_summary(old), "new": error_summary(rows)}


def format_repredicted(result: dict) -> str:
    """A line per case, then both headlines and the split, old beside new."""
    lines = []
    for r in result["cases"]:
        lines.append(f"{r['strategy']:10} N={r['gpus']} {r['model'] or '-':6} {r['shape'] or '-':10} "
                     f"{r['bandwidth_gbps'] or '-':>5} Gbit/s  step {r['old_error']:+7.1%} -> "
                     f"{r['error']:+7.1%}  exposed {_signed(r['old_exposed_comm_error'])} -> "
                     f"{_signed(r['exposed_comm_error'])}  (noise band {percent(r['noise_band'])})")
    old, new = result["old"], result["new"]
    step, comm, cpt = "median_abs_error", "median_abs_exposed_comm_error", "median_abs_compute_error"
    compute = "" if new[cpt] is None else f", compute {percent(old[cpt])} -> {percent(new[cpt])}"
    lines += ["", f"{len(result['cases'])} cases: median |error| of step time {percent(old[step])} -> "
                  f"{percent(new[step])}, exposed communication {percent(old[comm])} -> {percent(new[comm])}"
                  f"{compute}"]
    for key in SPLIT_BY:
        cells = ", ".join(f"{value} {percent(g['median_abs_error'])} -> "
                          f"{percent(new['by'][key][value]['median_abs_error'])} ({g['cases']})"
                          for value, g in old["by"][key].items())
        lines.append(f"  {key}: {cells}")
    return "\n".join(lines)


def _signed(x) -> str:
    return "   -   " if x is None else f"{x:+7.1%}"
