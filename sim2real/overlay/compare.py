"""Predicted against measured, side by side: phase, category, memory and op tables with
their errors, and :func:`overlay`, which loads, predicts and compares in one call.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import pandas as pd

from sim2real.overlay.base import CATEGORIES, PHASE_ROWS, OverlayError, op_kind
from sim2real.overlay.measured import (
    MeasuredStep,
    measured_memory,
    measured_step,
    measured_timing,
    records,
    step_timing,
)
from sim2real.overlay.runs import MeasuredRun, load_run
from sim2real.replay import REAL_TO_SIM, ReplayError, predict_run
from zero_sim.breakdown import clip, length, union
from zero_sim.vocabulary import (
    ACTIVATIONS,
    BUFFERS,
    GRADS,
    OPTIMIZER_STATE,
    PARAMS,
)


def _err(pred, meas):
    if pred is None or meas is None or (isinstance(meas, float) and math.isnan(meas)):
        return float("nan")
    if meas == 0:
        return 0.0 if pred == 0 else float("nan")
    return (pred - meas) / meas


@dataclass
class Comparison:
    """A measured step next to its prediction: tables (pandas) and a summary dict.

    ``phases`` / ``categories`` columns: ``predicted_s, measured_s, error`` (relative,
    ``(predicted - measured) / measured``); ``memory``: ``predicted_bytes,
    measured_bytes, error``; ``ops``: one row per op, both sides' start and end."""

    run: MeasuredRun
    sim: Any
    step: MeasuredStep
    rank: int
    phases: pd.DataFrame
    categories: pd.DataFrame
    memory: pd.DataFrame
    ops: pd.DataFrame
    summary: dict[str, Any]

    def measured_ops(self, rank: int) -> list[dict]:
        return records(self.step.ops[self.step.ops["rank"] == rank])

    def predicted_ops(self, rank: int) -> list[dict]:
        return [dict(op, rank=rank) for op in self.sim.step_ops(self.sim.rank_of_lane(rank))]

    def timing(self, rank: int) -> tuple[dict, dict]:
        """(predicted, measured) :func:`step_timing` of one rank: phases, compute, exposed comm,
        backward end."""
        pred = step_timing(self.predicted_ops(rank), self.sim.metrics["step_time_s"])
        return pred, step_timing(self.measured_ops(rank), self.step.step_time_s[rank])

    def pretty(self, table: str) -> pd.DataFrame:
        """A table in reader's units: ms, MB and signed percentages (for notebooks and panels)."""
        frame = getattr(self, table)
        if table == "ops":
            return frame
        out = pd.DataFrame(index=frame.index)
        for col in frame.columns:
            if col.endswith("_s"):
                out[col[:-2] + " (ms)"] = frame[col].map(lambda v: _fmt(v * 1e3, ".2f"))
            elif col.endswith("_bytes"):
                out[col[:-6] + " (MB)"] = frame[col].map(lambda v: _fmt(v / 1e6, ".3f"))
            elif col == "error":
                out["error"] = frame[col].map(_pct)
            else:
                out[col] = frame[col]
        return out

    def to_markdown(self) -> str:
        """Summary lines and the phase, category and memory tables as GitHub markdown (for reports)."""
        s = self.summary
        lines = [
            f"### {s['strategy']} on {s['world_size']} ranks ({s['model']}): measured {s['measured_step']} "
            f"vs predicted",
            "",
            f"* simulated as `{s['simulated_strategy']}`"
            + (f": {s['mapping_note']}" if s["mapping_note"] else ""),
            f"* step time: predicted {s['predicted_step_s'] * 1e3:.2f} ms, "
            f"measured {s['measured_step_s'] * 1e3:.2f} ms"
            f" ({_pct(s['step_error'])})",
            f"* ops paired: {s['ops_matched']} of {s['ops_predicted']} predicted and "
            f"{s['ops_measured']} measured",
            f"* calibration: {s['calibration'] or 'none (analytical compute and network models)'}",
        ]
        lines += [f"* note: {n}" for n in s["notes"]]
        for title, table in (("Phases", "phases"), (f"Op categories (rank {self.rank})", "categories"),
                             (f"Memory (rank {self.rank})", "memory")):
            lines += ["", f"#### {title}", "", markdown_table(self.pretty(table))]
        return "\n".join(lines) + "\n"

    def _repr_markdown_(self) -> str:
        return self.to_markdown()


def _fmt(v, spec: str) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def _pct(v) -> str:
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v * 100:+.1f}%"


def markdown_table(frame: pd.DataFrame) -> str:
    """A DataFrame as a GitHub markdown table (pandas' to_markdown needs tabulate, which we do not
    require)."""
    header = [str(frame.index.name or ""), *map(str, frame.columns)]
    rows = [[str(i), *("" if v is None else str(v) for v in row)]
            for i, row in zip(frame.index, frame.values, strict=True)]
    widths = [max(len(r[c]) for r in [header, *rows]) for c in range(len(header))]

    def line(cells):
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    return "\n".join([line(header), "| " + " | ".join("-" * w for w in widths) + " |", *map(line, rows)])


def compare(run: MeasuredRun, sim, step: int | None = None, rank: int = 0) -> Comparison:
    """Put a measured step next to a prediction of the same scenario (see the module docstring)."""
    sim_world, sim_params = sim.scenario.cluster.gpus, sim.scenario.workload.params
    if int(sim_world) != run.world_size:
        raise OverlayError(f"The run has {run.world_size} ranks but the prediction simulates {sim_world}; "
                           f"predict the run's own scenario (sim2real.replay.predict_run(run.run)).")
    if int(sim_params) != int(run.run.get("params", -1)):
        raise OverlayError(f"The run trained the {run.run.get('model')} model "
                           f"({int(run.run.get('params', 0)):,} "
                           f"parameters) but the prediction is for {sim.scenario.workload.model} "
                           f"({int(sim_params):,} parameters).")
    if not 0 <= rank < run.world_size:
        raise OverlayError(f"Rank {rank} is out of range: the run has ranks 0 to {run.world_size - 1}.")
    ms = measured_step(run, step)
    measured = measured_timing(ms, rank)
    predicted = step_timing(sim.step_ops(sim.rank_of_lane(rank)), sim.metrics["step_time_s"])
    phases = _phase_table(sim.metrics, measured)
    categories = _category_table(sim.step_ops(sim.rank_of_lane(rank)), sim.metrics["step_time_s"],
                                 records(ms.ops[ms.ops["rank"] == rank]), ms.step_time_s[rank])
    memory = _memory_table(sim.metrics["memory"], run, ms.step, rank)
    ops = _ops_table(sim, ms, run.world_size)
    _, _, note = REAL_TO_SIM.get(run.strategy, (sim.scenario.training.strategy, {}, ""))
    matched = int(ops["matched_by"].notna().sum())
    calibration = sim.scenario.inputs.calibration
    summary = {
        "strategy": run.strategy,
        "simulated_strategy": sim.scenario.training.strategy,
        "mapping_note": note,
        "model": run.run.get("model"),
        "world_size": run.world_size,
        "step": ms.step,
        "measured_step": ms.chosen,
        "rank": rank,
        "predicted_step_s": sim.metrics["step_time_s"],
        "measured_step_s": measured["step_time_s"],
        "measured_wall_s": ms.wall_s,
        "step_error": _err(sim.metrics["step_time_s"], measured["step_time_s"]),
        "compute_error": phases.loc["compute", "error"],
        "exposed_comm_error": phases.loc["exposed comm", "error"],
        "predicted_backward_end_s": predicted["backward_end_s"],
        "measured_backward_end_s": measured["backward_end_s"],
        "ops_predicted": int(ops["predicted_start_s"].notna().sum()),
        "ops_measured": int(ops["measured_start_s"].notna().sum()),
        "ops_matched": matched,
        "model_states_equal": bool(memory.loc["model states", "error"] == 0),
        "calibration": _calibration_label(calibration),
        "notes": list(run.notes),
    }
    return Comparison(run=run, sim=sim, step=ms, rank=rank, phases=phases, categories=categories,
                      memory=memory, ops=ops, summary=summary)


def _calibration_label(cal) -> str | None:
    """What the prediction was calibrated with, in words (None: the analytical models)."""
    if cal is None:
        return None
    return cal.describe() if hasattr(cal, "describe") else str(cal)


def _phase_table(m: dict, meas: dict) -> pd.DataFrame:
    # Row name -> key of the step breakdown (``zero_sim.breakdown``), the same on both sides.
    keys = {"step time": "step_time_s", "compute": "compute_time_s", "exposed comm": "exposed_comm_s",
            "forward": "forward_s", "backward": "backward_s", "optimizer": "optimizer_s",
            "optimizer wait": "optimizer_wait_s", "optimizer update": "optimizer_update_s"}
    pred = {row: m["phases"][key] if key in m["phases"] else m[key] for row, key in keys.items()}
    got = {row: meas[key] for row, key in keys.items()}
    frame = pd.DataFrame({"predicted_s": pred, "measured_s": got}).loc[list(PHASE_ROWS)]
    frame["error"] = [_err(p, q) for p, q in zip(frame["predicted_s"], frame["measured_s"], strict=True)]
    frame.index.name = "phase"
    return frame


def _category_totals(ops: list[dict], step_time_s: float) -> tuple[dict, dict]:
    """Per category: seconds during which at least one of its ops runs (clipped to the step), and op count.

    A union, not a sum: a measured collective spans from its launch to its completion,
    so collectives launched together (ZeRO-2's step variant) overlap on the record."""
    spans, counts = defaultdict(list), defaultdict(int)
    for op in ops:
        kind = op_kind(op["name"])
        if kind is None:
            continue
        spans[kind].append((op["start_s"], op["end_s"]))
        counts[kind] += 1
    seconds = {k: length(union(clip(v, 0.0, step_time_s))) for k, v in spans.items()}
    return seconds, counts


def _category_table(pred_ops, pred_step, meas_ops, meas_step) -> pd.DataFrame:
    ps, pc = _category_totals(pred_ops, pred_step)
    qs, qc = _category_totals(meas_ops, meas_step)
    rows = [c for c in CATEGORIES if c in pc or c in qc]
    frame = pd.DataFrame({
        "predicted_s": [ps.get(c, 0.0) for c in rows],
        "measured_s": [qs.get(c, 0.0) for c in rows],
        "predicted_count": [pc.get(c, 0) for c in rows],
        "measured_count": [qc.get(c, 0) for c in rows],
    }, index=pd.Index(rows, name="category"))
    frame["error"] = [_err(p, q) if qc.get(c) else float("nan")
                      for c, p, q in zip(rows, frame["predicted_s"], frame["measured_s"], strict=True)]
    return frame


def _memory_table(mem: dict, run: MeasuredRun, step: int, rank: int) -> pd.DataFrame:
    got = measured_memory(run, step, rank)
    pred = {PARAMS: mem["params_bytes"], GRADS: mem["grads_bytes"], OPTIMIZER_STATE: mem["optimizer_bytes"],
            "model states": mem["model_states_bytes"], ACTIVATIONS: mem["activations_bytes"],
            BUFFERS: mem["buffers_bytes"], "peak total": mem["peak_bytes"]}
    rows = list(pred)
    frame = pd.DataFrame({"predicted_bytes": [int(pred[r]) for r in rows],
                          "measured_bytes": [int(got[r]) for r in rows]},
                         index=pd.Index(rows, name="category"))
    frame["error"] = [_err(p, q)
                      for p, q in zip(frame["predicted_bytes"], frame["measured_bytes"], strict=True)]
    return frame


def _ops_table(sim, ms: MeasuredStep, world: int) -> pd.DataFrame:
    rows = []
    for rank in range(world):
        pred = sorted((dict(op, rank=rank) for op in sim.step_ops(sim.rank_of_lane(rank))),
                      key=lambda o: (o["start_s"], o["end_s"]))
        meas = sorted(records(ms.ops[ms.ops["rank"] == rank]), key=lambda o: (o["start_s"], o["end_s"]))
        rows += _pair(pred, meas)
    frame = pd.DataFrame(rows, columns=["rank", "stream", "name", "kind", "layer", "predicted_start_s",
                                        "predicted_end_s", "measured_start_s", "measured_end_s",
                                        "measured_name", "matched_by"])
    return frame.sort_values(["rank", "stream", "predicted_start_s", "measured_start_s"],
                             na_position="last").reset_index(drop=True)


def _pair(pred: list[dict], meas: list[dict]) -> list[dict]:
    """Pair ops by (stream, name, occurrence), then the leftovers by (stream, kind, layer, occurrence)."""
    pairs: list[tuple[dict | None, dict | None, str | None]] = []
    left_p, left_m = _match(pred, meas, lambda o: (o["stream"], o["name"]), "name", pairs)
    left_p, left_m = _match(left_p, left_m,
                            lambda o: (o["stream"], op_kind(o["name"]), _layer(o.get("layer"))),
                            "kind+layer", pairs)
    pairs += [(p, None, None) for p in left_p] + [(None, q, None) for q in left_m]
    rows = []
    for p, q, how in pairs:
        any_op = p or q
        rows.append({
            "rank": any_op["rank"], "stream": any_op["stream"], "name": (p or q)["name"],
            "kind": op_kind(any_op["name"]), "layer": _layer(any_op.get("layer")),
            "predicted_start_s": p["start_s"] if p else float("nan"),
            "predicted_end_s": p["end_s"] if p else float("nan"),
            "measured_start_s": q["start_s"] if q else float("nan"),
            "measured_end_s": q["end_s"] if q else float("nan"),
            "measured_name": q["name"] if q else None, "matched_by": how,
        })
    return rows


def _layer(v):
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else int(v)


def _match(pred, meas, key, how, pairs):
    """Pair the k-th predicted op of each ``key`` with the k-th measured one; return the leftovers."""
    groups: dict[Any, list[dict]] = defaultdict(list)
    for q in meas:
        groups[key(q)].append(q)
    taken: dict[Any, int] = defaultdict(int)
    left_p, used = [], set()
    for p in pred:
        k = key(p)
        if taken[k] < len(groups[k]):
            q = groups[k][taken[k]]
            taken[k] += 1
            used.add(id(q))
            pairs.append((p, q, how))
        else:
            left_p.append(p)
    return left_p, [q for q in meas if id(q) not in used]


def overlay(run_dir, calibration=None, step: int | None = None) -> Comparison:
    """Load a run directory, predict its scenario and compare: the one-call version."""
    run = load_run(run_dir)
    try:
        sim = predict_run(run.run, calibration)
    except ReplayError as exc:
        raise OverlayError(str(exc).rstrip(".") + ".") from None
    return compare(run, sim, step)
