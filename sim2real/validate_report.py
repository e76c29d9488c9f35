"""How a validation's cases are summed up: headline errors beside the machine's own noise, the
errors split by what the cases vary, and the markdown report with one overlay per case.

The headline is two medians side by side: the median absolute error of the predicted step
time, and the median **noise band**, how far the same run's step time moved between its
first and second half of steps (see :func:`noise_band`).  An error no larger than the band
is what re-running the case would give; the model is only to blame for the rest.  The same
pair is given for exposed communication and for compute (time the compute stream is busy),
so that a step-time error can be read as the compute the model got wrong or the
communication it did not hide.

The split (``by``) gives, for each value of strategy, shape, N and model, the median
absolute step-time error and how many cases had it, so a systematic cause shows as one
value whose median stands out.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from zero_sim.vocabulary.files import write_bytes_atomic

SPLIT_BY = ("strategy", "shape", "gpus", "model")
# The parts of a step each case compares besides its step time: name in the case's fields
# (``predicted_<name>_s``, ``<name>_error``, ...) -> the metric both sides report (results.py's).
STEP_PARTS = {"exposed_comm": "exposed_comm_s", "compute": "compute_time_s"}


def noise_band(first: float, second: float) -> float:
    """How much a measurement moved when taken twice: ``|first - second|`` over their mean."""
    mean = (first + second) / 2
    return abs(first - second) / mean if mean > 0 else 0.0


def _median(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def error_summary(rows: list[dict]) -> dict:
    """The headline medians and the split by case property (see the module docstring)."""
    summary = {
        "median_abs_error": _median(abs(r["error"]) for r in rows),
        "median_noise_band": _median(r.get("noise_band") for r in rows),
        "by": {},
    }
    for part in STEP_PARTS:  # None where no case measured the part (older validations)
        summary[f"median_abs_{part}_error"] = _median(
            abs(r[f"{part}_error"]) for r in rows if r.get(f"{part}_error") is not None)
        summary[f"median_{part}_noise_band"] = _median(r.get(f"{part}_noise_band") for r in rows)
    for key in SPLIT_BY:
        groups: dict = {}
        for r in rows:
            groups.setdefault(str(r.get(key)), []).append(abs(r["error"]))
        summary["by"][key] = {value: {"median_abs_error": statistics.median(errs), "cases": len(errs)}
                              for value, errs in sorted(groups.items())}
    return summary


def overlay_png(run_dir: Path, sim, report_dir: Path, row: dict) -> None:
    """Draw the case's measured step over its prediction into ``report_dir``; the row names it."""
    # Drawing code is loaded here, with a file-only backend, so validating never opens a window.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from sim2real.overlay import compare, load_run
    from zero_sim.ui.plots import plot_overlay

    report_dir.mkdir(parents=True, exist_ok=True)
    name = Path(row["run_dir"]).name + ".png"
    fig = plt.figure(figsize=(12, 5))
    plot_overlay(compare(load_run(run_dir), sim), fig=fig)
    fig.savefig(report_dir / name, dpi=90, bbox_inches="tight")
    plt.close(fig)
    row["figure"] = name


def headline(summary: dict) -> str:
    """The result in one line: each median error beside its median noise band (compute only
    where the cases measured it: validations written before it was added have none)."""
    compute = ("" if summary.get("median_abs_compute_error") is None else
               f"; compute {percent(summary['median_abs_compute_error'])} "
               f"(noise band {percent(summary.get('median_compute_noise_band'))})")
    return (f"median |error| of step time {percent(summary['median_abs_error'])} "
            f"(noise band {percent(summary.get('median_noise_band'))}); exposed communication "
            f"{percent(summary['median_abs_exposed_comm_error'])} "
            f"(noise band {percent(summary.get('median_exposed_comm_noise_band'))}){compute} "
            f"over {len(summary['cases'])} cases")


def _pair(row: dict, figure: str) -> str:
    """``predicted / measured`` seconds of one of a case's figures, ``-`` for one not measured."""
    p, m = row.get(f"predicted_{figure}_s"), row.get(f"measured_{figure}_s")
    return " / ".join("-" if x is None else f"{x:.4f}" for x in (p, m))


def write_report(summary: dict, report_dir: Path) -> Path:
    report_dir.mkdir(parents=True, exist_ok=True)
    sample = summary.get("sample")
    drawn = (f"Cases drawn at random: `--sample {sample['k']} --seed {sample['seed']}` "
             f"({sample['latency']})." if sample else "Cases: a fixed grid.")
    lines = ["# zero-sim validation", "",
             f"{drawn} Defaults for what a case leaves open: model `{summary['model']}`, global batch "
             f"{summary['global_batch']}, shape {summary['shape'] or '-'}; {summary['steps']} steps per "
             f"run; emulated cluster: {_emulated(summary)}.",
             "",
             f"**{headline(summary)}.** Measured figures are medians over the steps after the first: step "
             f"time the slowest rank's, compute and exposed communication the ranks' mean. The noise "
             f"band is how far the same run's figure moved between the first and the second half of "
             f"those steps.", "",
             _files_line(summary), "",
             "## What was calibrated, and on what", "", summary["calibrated_inputs"], ""]
    for key, cal in summary["calibrations"].items():
        lines.append(f"- `{key}`: {cal['summary']}")
    lines += ["", "## Cases (each predicted before it ran)", "",
              "| strategy | N | model | shape | batch | Gbit/s | latency ms | bucket MB "
              "| block fwd ms (calibrated) | predicted s | measured s | error | noise band "
              "| compute pred / meas s | error | exposed comm pred / meas s | error | noise band "
              "| model states exact |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in summary["cases"]:
        block = ((r.get("compute") or {}).get("layer_seconds") or {}).get("block", {}).get("fwd")
        lines.append(f"| {r['strategy']} | {r['gpus']} | {r.get('model') or summary['model']} | "
                     f"{r.get('shape') or summary['shape'] or '-'} | "
                     f"{r.get('global_batch') or summary['global_batch']} | {r['bandwidth_gbps'] or '-'} | "
                     f"{r.get('latency_ms') or '-'} | {r['bucket_mb'] or '-'} | "
                     f"{'-' if block is None else f'{block * 1e3:.2f}'} | "
                     f"{r['predicted_step_s']:.4f} | {r['measured_step_s']:.4f} | {r['error']:+.1%} | "
                     f"{percent(r.get('noise_band'))} | {_pair(r, 'compute')} | "
                     f"{_signed(r.get('compute_error'))} | {_pair(r, 'exposed_comm')} | "
                     f"{_signed(r.get('exposed_comm_error'))} | "
                     f"{percent(r.get('exposed_comm_noise_band'))} | "
                     f"{'yes' if r['model_states_exact'] else 'NO'} |")
    lines += ["", "## Median |error| of step time, split by what the cases vary", ""]
    for key, groups in summary.get("by", {}).items():
        cells = ", ".join(f"{value}: {percent(g['median_abs_error'])} ({g['cases']})"
                          for value, g in groups.items())
        lines.append(f"- **{key}**: {cells}")
    figures = [r for r in summary["cases"] if r.get("figure")]
    if figures:
        lines += ["", "## Overlays (measured bars over predicted bars)", ""]
        for r in figures:
            lines += [f"### {r['strategy']}, N={r['gpus']}, {r['bandwidth_gbps'] or '-'} Gbit/s, "
                      f"bucket {r['bucket_mb'] or '-'}", "", f"![]({r['figure']})", ""]
    path = report_dir / "report.md"
    write_bytes_atomic(path, ("\n".join(lines) + "\n").encode())
    write_bytes_atomic(report_dir / "validation.json", json.dumps(summary, indent=1, default=str).encode())
    return path


def _emulated(summary: dict) -> str:
    return "yes" if summary["emulated"] else f"no ({summary['emulation_note']})"


def _files_line(summary: dict) -> str:
    if summary.get("files"):
        return f"The runs' files (run directories, calibrations, sweeps) are kept in `{summary['files']}`."
    return "The runs' files were in a temporary folder, removed at the end (`--keep` keeps them)."


def percent(x) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def _signed(x) -> str:
    return "-" if x is None else f"{x:+.1%}"
