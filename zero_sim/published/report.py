"""``zero-sim validate --published``: accuracy as users meet it, in one report.

First the pre-registered sources (:mod:`zero_sim.published.first_seen`): runs the model was frozen
on before it saw them, as first seen and now.  Then three ways of predicting each published run
of the table (:data:`zero_sim.published.judge.MODES`): as a user who knows nothing of its software
would (default stack), as one who knows its stack, and with every setting the source states.  For
each, the median and 90th percentile of |error| and how many runs were predicted too fast or too
slow; then the headline, the same three with the whole-run overhead fitted **leave one source
out** (:mod:`zero_sim.published.fit`); the 80% intervals and their coverage; whether pairs of runs
are ordered as published (:mod:`zero_sim.published.ranking`); memory; and the per-point table.
"""

from __future__ import annotations

from zero_sim.published.first_seen import format_block, preregistered_block
from zero_sim.published.fit import refit, speed_error, summary
from zero_sim.published.judge import MODES, OUTLIER, POINTS_FILE, format_table, judge, load_points
from zero_sim.published.ranking import format_ranking, load_pairs, rank_pairs


def _runs(verdict) -> dict:
    """Training runs' time points only (collectives do not depend on the mode), as speed errors."""
    return summary([speed_error(j.point, j.predicted) for j in verdict.judged
                    if j.family == "time" and "scenario" in j.point and j.predicted is not None])


def published_report(path=None) -> dict:
    """Every mode judged, the leave-one-source-out fit, intervals, coverage and ranking."""
    points = load_points(path or POINTS_FILE)
    verdicts = {mode: judge(points, mode) for mode in MODES}
    fit = refit(points)
    pairs = load_pairs(path or POINTS_FILE)
    report = verdicts["configured"].to_dict()
    report["modes"] = {mode: v.summary | {"runs": _runs(v)} for mode, v in verdicts.items()}
    report["leave_one_source_out"] = fit["leave_one_source_out"]
    report["overheads"] = {"by_generation": fit["overheads"], "pooled": fit["pooled"]}
    report["intervals"], report["coverage"] = fit["intervals"], fit["coverage"]
    report["propagated_coverage"] = fit["propagated_coverage"]
    report["ranking"] = {mode: rank_pairs(pairs, verdicts[mode].judged) for mode in ("stack", "configured")}
    report["by_mode"] = {mode: {j.id: j.error for j in v.judged} for mode, v in verdicts.items()}
    report["preregistered"] = preregistered_block()
    report["_verdict"] = verdicts["configured"]
    return report


def _line(name: str, s: dict) -> str:
    if s["median_abs_error"] is None:
        return f"  {name:40} no training run predicted"
    return (f"  {name:40} median |error| {s['median_abs_error']:5.1%}, 90th percentile "
            f"{s['p90_abs_error']:5.1%}; {s['too_fast']} of {s['points']} too fast, {s['too_slow']} too slow")


def format_report(report: dict) -> str:
    """The report for a terminal: pre-registered sources first, then the table's headline, the
    per-point table last."""
    words = {"default": "default stack (nothing of its software)", "stack": "its stack named",
             "configured": "as configured (every stated setting)"}
    loso = report["leave_one_source_out"]
    lines = format_block(report["preregistered"])
    lines.append("training runs' speed, overhead fitted leave-one-source-out (over the table's runs):")
    lines += [_line(words[m], loso[m]) for m in MODES]
    lines.append("training runs' speed, with the shipped fit (in-sample):")
    lines += [_line(words[m], report["modes"][m]["runs"]) for m in MODES]
    overheads = ", ".join(f"{g} {f:.3f}" for g, f in report["overheads"]["by_generation"].items())
    lines.append(f"whole-run overhead on compute: {overheads} (pooled {report['overheads']['pooled']:.3f}, "
                 f"for generations with no published run)")
    for group, band in report["intervals"].items():
        if band["low"] is None:
            continue
        lines.append(f"published errors, 80% range, {group}: predicted speed {band['low']:+.0%} to "
                     f"{band['high']:+.0%} of published; coverage without each point's source "
                     f"{report['coverage'][group]:.0%}")
    held = report["propagated_coverage"]
    lines.append("80% intervals the predictions carry (propagated through the simulator), overhead fitted "
                 "without each point's source: " + ", ".join(
                     f"{words[m].split(' (')[0]} {held[m]:.0%}" for m in MODES if held.get(m) is not None)
                 + " of runs inside")
    for mode in ("stack", "configured"):
        lines.append(f"ranking, {words[mode]}:")
        lines += ["  " + line for line in format_ranking(report["ranking"][mode])]
    time = report["modes"]["configured"]["time"]
    if time["median_abs_error"] is not None:
        lines.append(f"every time point (collectives too), as configured: {time['predicted']} points, median "
                     f"|error| {time['median_abs_error']:.1%}, 90th percentile {time['p90_abs_error']:.1%}")
    memory = report["modes"]["configured"]["memory"]
    if memory["median_abs_error"] is not None:
        lines.append(f"memory, as configured: {memory['predicted']} points, median |error| "
                     f"{memory['median_abs_error']:.1%}, 90th percentile {memory['p90_abs_error']:.1%}")
    lines.append("")
    lines.append("per point, as configured (default and stack errors beside; beyond "
                 f"{OUTLIER:.0%} a point carries a written cause):")
    by_mode, beside = report["by_mode"], {}
    for j in report["_verdict"].judged:
        default, stack = by_mode["default"].get(j.id), by_mode["stack"].get(j.id)
        if "scenario" in j.point and default is not None and stack is not None:
            beside[j.id] = f"  [default {default:+.1%}, stack {stack:+.1%}]"
    lines.append(format_table(report["_verdict"], beside))
    return "\n".join(lines)


def report_json(report: dict) -> dict:
    return {k: v for k, v in report.items() if not k.startswith("_")}
