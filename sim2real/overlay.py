"""Lay a measured step from ``real_runs`` over the simulator's prediction, and say how far apart they are.

What is compared
----------------
A run directory written by ``real_runs.train`` (``run.json`` and one ``rank<r>.json`` per
rank) against a :class:`~zero_sim.results.SimResult` of the same scenario, usually
``sim2real.replay.predict_run(run)``.  Both speak the vocabulary of
:mod:`zero_sim.vocabulary` (streams ``host`` / ``compute`` / ``comm``, ops ``fwd L3``,
``reduce_scatter L5`` ...), so :func:`compare` can put them side by side as tables:

* ``phases``: step time, compute, exposed communication, forward, backward, optimizer,
  computed for the measured step with the *same* functions and definitions as
  :func:`zero_sim.results.compute_metrics` uses for the simulated one (interval union,
  clipping to the step, comm-minus-compute);
* ``categories``: per op category (fwd, bwd, opt, each collective, wait) on one rank, the
  time at least one of its ops runs and how many ran;
* ``memory``: bytes per memory category: resident model states (these must agree
  *exactly* for ddp, zero1, zero2 and fsdp: both sides count the same tensors) and the
  peaks of activations, buffers and their total;
* ``ops``: every op of the step on every rank, predicted and measured start and end side by side.

How the two timelines are aligned
---------------------------------
Every time is seconds from the start of the step on *that rank*.  The recorder
(:mod:`real_runs.record`) already makes measured times step-relative per rank: t = 0 is
the instant the rank entered the step (``Recorder.begin_step``).  "Aligned" means
exactly that, and no more: ranks are not synchronised at the step start, so two ranks'
zeros differ by the skew between their step starts (on one machine usually well under a
millisecond, since the previous step ended in a collective every rank waited on).  The
simulated step is the last one simulated (the steady state), shifted so that it starts
at 0 on rank 0 (``SimResult.window``).  The measured step is chosen by
:func:`measured_step`: by default the step of median duration among steps >= 1 (step 0
pays one-off costs: allocator growth, first-touch pages, lazy initialisation).

Ops are paired by (rank, stream, name) and occurrence: the k-th ``all_gather L3`` on
rank 0's comm stream predicted goes with the k-th measured one.  Where the two sides
name an op differently (the real ZeRO-2 numbers its per-parameter collectives
``reduce_scatter B17``, the simulator names them after their layer,
``reduce_scatter L5``), the leftovers are paired by (rank, stream, kind, layer) and
occurrence; the ``matched_by`` column says which rule paired a row.

Runs that recorded no collectives: profiler traces
--------------------------------------------------
``fsdp-torch`` runs FSDP2's collectives inside torch, so its rank files hold compute
ops only.  When such a rank has a ``trace_rank<r>.json`` (``train.py --trace``), the
collectives are read from the torch.profiler Chrome trace:

* gloo runs each collective on a worker thread as a ``gloo:all_gather`` /
  ``gloo:all_reduce`` span (gloo's reduce-scatter *is* an all-reduce, so the kind comes
  from the launching op on the training thread: ``c10d::_allgather_base_``,
  ``c10d::_reduce_scatter_base_``, ``c10d::allreduce_`` ...).  Launches and worker spans
  are paired in order (gloo's work queue is first-in, first-out) and every pair must
  agree on its kind, or nothing is taken;
* the layer comes from the FSDP annotation around the launch
  (``FSDP::all_gather (layers.3)`` -> ``all_gather L3``); the root unit (embeddings and
  head, no suffix) is named after layer 0, as the simulator names its root unit; with no
  annotation the op has no layer (``all_gather``);
* the trace's clock is tied to the rank file's by one anchor per step: the optimizer's
  ``Optimizer.step#...`` span and the recorded ``opt all`` span time the same call.  If
  their durations disagree by more than 2 ms + 10 %, or any pairing fails, loading stops
  with an :class:`OverlayError` instead of guessing.

Host ``wait`` spans and bytes are not recovered from traces (the gloo spans carry no
sizes); those rows stay empty.  Only gloo traces are read; CUDA (NCCL) traces have
kernels whose times are on another clock and are refused with one sentence.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from sim2real.replay import REAL_TO_SIM
from zero_sim.results import _clip, _length, _subtract, _union
from zero_sim.vocabulary import (
    ACTIVATIONS,
    ALL_GATHER,
    ALL_REDUCE,
    BACKWARD,
    BROADCAST,
    BUFFERS,
    COLLECTIVES,
    COMM,
    COMPUTE,
    GRADS,
    MEMORY_CATEGORIES,
    OPTIMIZER_STATE,
    PARAMS,
    REDUCE_SCATTER,
    parse_op_name,
)


class OverlayError(ValueError):
    """A run that cannot be overlaid on this prediction; the message is one sentence saying why."""


# Op categories in the order tables list them.
CATEGORIES = ("fwd", "bwd", "recompute", "opt", *COLLECTIVES, "wait")
PHASE_ROWS = ("step time", "compute", "exposed comm", "forward", "backward", "optimizer")


def op_kind(name: str) -> str | None:
    """``fwd``, ``bwd``, ``opt``, a collective or ``wait`` (None for a name outside the vocabulary)."""
    try:
        return parse_op_name(name).kind
    except ValueError:
        return None


# ----------------------------------------------------------------------------- loading


@dataclass
class MeasuredRun:
    """What a real run recorded, every rank in one place.

    ``ops`` has one row per op with the fields of :data:`zero_sim.vocabulary.OP_FIELDS`
    plus ``kind`` and ``source`` (``record`` or ``trace``); ``memory`` one row per memory
    sample (``rank, step, t_s, category, bytes``); ``peaks`` maps rank -> category ->
    bytes as ``run.json`` reports them (resident model states, peak activations and
    buffers); ``step_times_s`` maps rank -> that rank's duration of each step."""

    run: dict[str, Any]
    ops: pd.DataFrame
    memory: pd.DataFrame
    peaks: dict[int, dict[str, int]]
    world_size: int
    strategy: str
    path: Path
    step_times_s: dict[int, list[float]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def load_run(path) -> MeasuredRun:
    """Read a run directory written by ``real_runs.train``; OverlayError (one sentence) if it is not one."""
    path = Path(path)
    run_file = path / "run.json"
    if not path.is_dir() or not run_file.is_file():
        raise OverlayError(f"{path} has no run.json: the run did not finish, or this is not a run directory.")
    try:
        run = json.loads(run_file.read_text())
        world, strategy = int(run["world_size"]), str(run["strategy"])
    except (ValueError, KeyError, TypeError):
        raise OverlayError(f"{run_file} is not a run.json written by real_runs.train.") from None
    ops, memory, step_times, notes = [], [], {}, []
    for rank in range(world):
        rank_file = path / f"rank{rank}.json"
        if not rank_file.is_file():
            raise OverlayError(f"{path} has no rank{rank}.json, so rank {rank}'s record is missing "
                               f"and the run cannot be overlaid.")
        try:
            record = json.loads(rank_file.read_text())
        except ValueError:
            raise OverlayError(f"{rank_file} is not valid JSON; the run was probably cut short.") from None
        rank_ops = [dict(op, source="record") for op in record.get("ops", []) if op.get("end_s") is not None]
        step_times[rank] = list(record.get("step_times_s", []))
        trace = path / f"trace_rank{rank}.json"
        has_comm = any(str(op.get("stream", "")).startswith(COMM) for op in rank_ops)
        if not has_comm and trace.is_file():
            traced = collectives_from_trace(trace, rank, rank_ops, step_times[rank])
            rank_ops += traced
            notes.append(f"rank {rank}'s {len(traced)} collectives were read from {trace.name}")
        ops += rank_ops
        memory += [dict(m, rank=rank) for m in record.get("memory_timeline", [])]
    ops_df = pd.DataFrame(ops, columns=[*_OP_COLUMNS, "source"])
    ops_df["kind"] = [op_kind(n) for n in ops_df["name"]]
    memory_df = pd.DataFrame(memory, columns=["rank", "step", "t_s", "category", "bytes"])
    peaks = {int(r): {c: int(v) for c, v in m.items()} for r, m in (run.get("memory") or {}).items()}
    if world > 1 and not ops_df["stream"].astype(str).str.startswith(COMM).any():
        notes.append("the run recorded no collectives (fsdp-torch records compute only; run it with --trace "
                     "to read them from the profiler)")
    return MeasuredRun(run=run, ops=ops_df, memory=memory_df, peaks=peaks, world_size=world, strategy=strategy,
                       path=path, step_times_s=step_times, notes=notes)


_OP_COLUMNS = ("rank", "stream", "name", "start_s", "end_s", "bytes", "layer", "phase", "step")

# torch.distributed launch ops on the training thread -> the collective they start.
_LAUNCH_KINDS = {
    "c10d::_allgather_base_": ALL_GATHER, "c10d::allgather_": ALL_GATHER,
    "c10d::allgather_into_tensor_coalesced_": ALL_GATHER,
    "c10d::_reduce_scatter_base_": REDUCE_SCATTER, "c10d::reduce_scatter_": REDUCE_SCATTER,
    "c10d::reduce_scatter_tensor_coalesced_": REDUCE_SCATTER,
    "c10d::allreduce_": ALL_REDUCE, "c10d::allreduce_coalesced_": ALL_REDUCE,
    "c10d::broadcast_": BROADCAST,
}
# gloo worker-thread spans -> the launch kinds they can carry out (gloo reduce-scatters by all-reducing).
_GLOO_SPANS = {
    "gloo:all_gather": {ALL_GATHER}, "gloo:allgather": {ALL_GATHER},
    "gloo:all_reduce": {ALL_REDUCE, REDUCE_SCATTER}, "gloo:allreduce": {ALL_REDUCE, REDUCE_SCATTER},
    "gloo:reduce_scatter": {REDUCE_SCATTER}, "gloo:broadcast": {BROADCAST},
}
_FSDP_ANNOTATION = re.compile(r"^FSDP::(all_gather|post_backward_reduce)(?: \(layers\.(\d+)\))?$")


def collectives_from_trace(trace_path, rank: int, rank_ops: list[dict], step_times: list[float]) -> list[dict]:
    """The collectives of a gloo torch.profiler trace as comm-stream ops in step-relative seconds.

    See the module docstring for the pairing and clock rules; anything that does not hold
    raises OverlayError rather than producing a guess."""
    trace_path = Path(trace_path)
    try:
        events = json.loads(trace_path.read_text()).get("traceEvents", [])
    except (ValueError, AttributeError):
        raise OverlayError(f"{trace_path.name} is not a Chrome trace written by torch.profiler.") from None
    spans = [e for e in events if e.get("ph") == "X" and "ts" in e and "dur" in e]
    if any(e.get("cat") in ("kernel", "gpu_memcpy") for e in spans):
        raise OverlayError(f"{trace_path.name} is a CUDA trace; only gloo (CPU) traces can be read for "
                           f"collectives so far.")
    launches = sorted((e for e in spans if e.get("name") in _LAUNCH_KINDS), key=lambda e: e["ts"])
    workers = sorted((e for e in spans if e.get("name") in _GLOO_SPANS), key=lambda e: e["ts"])
    if len(launches) != len(workers):
        raise OverlayError(f"{trace_path.name} launched {len(launches)} collectives but gloo ran {len(workers)}, "
                           f"so they cannot be paired reliably and are not guessed.")
    annotations = [e for e in spans if _FSDP_ANNOTATION.match(e.get("name", ""))]

    # One clock anchor per step: the optimizer's span in the trace and ``opt ...`` in the record.
    anchors = sorted((e for e in spans if str(e.get("name", "")).startswith("Optimizer.step#")),
                     key=lambda e: e["ts"])
    recorded = {}
    for op in rank_ops:
        if op["stream"] == COMPUTE and op_kind(op["name"]) == "opt":
            recorded.setdefault(op["step"], op)
    steps = sorted(recorded)
    if len(anchors) != len(steps) or not steps:
        raise OverlayError(f"{trace_path.name} has {len(anchors)} optimizer steps but rank{rank}.json recorded "
                           f"{len(steps)}, so the trace's clock cannot be tied to the record's.")
    offsets = {}
    for step, anchor in zip(steps, anchors, strict=True):
        op = recorded[step]
        rec_dur, trace_dur = op["end_s"] - op["start_s"], anchor["dur"] / 1e6
        if abs(rec_dur - trace_dur) > 2e-3 + 0.1 * rec_dur:
            raise OverlayError(f"{trace_path.name}'s optimizer step {step} lasted {trace_dur * 1e3:.1f} ms but the "
                               f"record says {rec_dur * 1e3:.1f} ms, so the two clocks cannot be tied together.")
        offsets[step] = anchor["ts"] / 1e6 - op["start_s"]  # trace seconds at the step's t = 0

    ops = []
    for launch, work in zip(launches, workers, strict=True):
        kind = _LAUNCH_KINDS[launch["name"]]
        if kind not in _GLOO_SPANS[work["name"]] or work["ts"] + 1e3 < launch["ts"]:
            raise OverlayError(f"{trace_path.name}: a {kind} launch pairs with a {work['name']} span, so the "
                               f"collectives cannot be paired reliably and are not guessed.")
        start = work["ts"] / 1e6
        step = _step_of(start, offsets, step_times)
        if step is None:
            continue  # outside every recorded step (setup or teardown)
        layer = _layer_of(launch, annotations)
        t0 = offsets[step]
        name = f"{kind} L{layer}" if layer is not None else kind
        ops.append({"rank": rank, "stream": COMM, "name": name, "start_s": start - t0,
                    "end_s": start + work["dur"] / 1e6 - t0, "bytes": None, "layer": layer,
                    "phase": None, "step": step, "source": "trace"})
    return ops


def _step_of(t: float, offsets: dict[int, float], step_times: list[float]) -> int | None:
    for step, t0 in offsets.items():
        length = step_times[step] if step < len(step_times) else math.inf
        if t0 - 1e-4 <= t <= t0 + length:
            return step
    return None


def _layer_of(launch: dict, annotations: list[dict]) -> int | None:
    inside = [a for a in annotations if a.get("tid") == launch.get("tid")
              and a["ts"] <= launch["ts"] <= a["ts"] + a["dur"]]
    if not inside:
        return None
    m = _FSDP_ANNOTATION.match(max(inside, key=lambda a: a["ts"])["name"])
    return int(m[2]) if m[2] is not None else 0  # the root unit: named after layer 0, as the simulator does


# ----------------------------------------------------------------------------- the measured step


@dataclass
class MeasuredStep:
    """One measured step, every rank's times from that rank's own step start (t = 0).

    ``step_time_s`` maps rank -> its duration of the step (``Recorder`` clock);
    ``wall_s`` is ``run.json``'s figure for the step: the slowest rank's."""

    step: int
    ops: pd.DataFrame
    step_time_s: dict[int, float]
    wall_s: float
    chosen: str


def measured_step(run: MeasuredRun, step: int | None = None) -> MeasuredStep:
    """The step to compare: ``step`` if given, else the one of median duration among steps >= 1.

    With an even number of candidates the shorter of the two middle steps is taken
    (``statistics.median_low``), so the choice is always a step that really happened."""
    walls = list(run.run.get("step_times_s") or [])
    n = len(walls) or max((len(v) for v in run.step_times_s.values()), default=0)
    if n == 0:
        raise OverlayError(f"{run.path} recorded no steps, so there is nothing to compare.")
    if step is None:
        candidates = list(range(1, n)) or [0]
        if walls:
            median = statistics.median_low([walls[s] for s in candidates])
            step = next(s for s in candidates if walls[s] == median)
            chosen = f"step {step}: median duration of steps {candidates[0]}-{candidates[-1]}"
        else:
            step, chosen = candidates[-1], f"step {candidates[-1]}: the last"
    else:
        if not isinstance(step, int) or not 0 <= step < n:
            raise OverlayError(f"Step {step} is out of range: the run recorded steps 0 to {n - 1}.")
        chosen = f"step {step}: as asked"
    ops = run.ops[run.ops["step"] == step].copy()
    for rank in range(run.world_size):
        mine = ops[(ops["rank"] == rank) & (ops["stream"] == COMPUTE)]
        if not mine["name"].astype(str).str.startswith("fwd L").any():
            raise OverlayError(f"rank{rank}.json has no 'fwd L<i>' compute ops in step {step}, so its record "
                               f"is empty or was not written by real_runs.train.")
    times = {r: (t[step] if step < len(t) else float(ops[ops["rank"] == r]["end_s"].max()))
             for r, t in run.step_times_s.items()}
    wall = walls[step] if walls else max(times.values())
    return MeasuredStep(step=step, ops=ops.sort_values(["rank", "start_s"]).reset_index(drop=True),
                        step_time_s=times, wall_s=wall, chosen=chosen)


# ----------------------------------------------------------------------------- shared definitions


def step_timing(ops, step_time_s: float) -> dict[str, float]:
    """Step metrics of one rank's ops (times from the step start) by :func:`zero_sim.results.compute_metrics`'s rules.

    ``compute_s``: union of compute-stream spans clipped to the step; ``exposed_comm_s``:
    collective time not under compute; phases split at the first and last backward
    compute op.  Applied to a SimResult's own step ops it gives back its metrics."""
    ops = list(ops)
    lo, hi = 0.0, step_time_s
    compute = _union(_clip([(o["start_s"], o["end_s"]) for o in ops if o["stream"] == COMPUTE], lo, hi))
    comm = _union(_clip([(o["start_s"], o["end_s"]) for o in ops if op_kind(o["name"]) in COLLECTIVES], lo, hi))
    bwd_ops = [o for o in ops if o["stream"] == COMPUTE and _is_backward(o)]
    first_bwd = min((o["start_s"] for o in bwd_ops), default=hi)
    last_bwd = max((o["end_s"] for o in bwd_ops), default=hi)
    return {
        "step_time_s": hi - lo,
        "compute_time_s": _length(compute),
        "comm_time_s": _length(comm),
        "exposed_comm_s": _subtract(comm, compute),
        "forward_s": max(0.0, min(first_bwd, hi) - lo),
        "backward_s": max(0.0, min(last_bwd, hi) - max(first_bwd, lo)),
        "optimizer_s": max(0.0, hi - max(last_bwd, lo)),
        "backward_end_s": min(last_bwd, hi),
    }


def steady_timing(run: MeasuredRun, first_step: int = 1) -> dict[str, float]:
    """:func:`step_timing` of a whole run: per step the mean over ranks, then the median over
    steps from ``first_step`` (step 0 pays one-off costs).

    One step on one rank is a noisy measurement: exposed communication in particular is a
    difference of two longer spans, and from step to step it moves by tens of percent on a
    shared CPU.  The simulator runs its ranks alike, so the ranks' mean is what it predicts,
    and the median over steps is how validation reads step time too."""
    per_step = []
    for step in sorted(s for s in set(run.ops["step"]) if s >= first_step):
        ops = run.ops[run.ops["step"] == step]
        ranks = [step_timing(_records(ops[ops["rank"] == r]), run.step_times_s[r][step])
                 for r in range(run.world_size) if step < len(run.step_times_s.get(r, ()))]
        if ranks:
            per_step.append({k: statistics.fmean(t[k] for t in ranks) for k in ranks[0]})
    if not per_step:
        raise OverlayError(f"{run.path} recorded no steps from step {first_step} on, so there is nothing to compare; "
                           f"run more steps.")
    return {k: statistics.median(t[k] for t in per_step) for k in per_step[0]}


def _is_backward(op) -> bool:
    # The simulator tags ops with their phase; the recorder tags compute ops too, but a
    # trace-derived op has none, so fall back to the name (``bwd L3``, ``recompute L3``).
    phase = op.get("phase")
    if phase is not None and not (isinstance(phase, float) and math.isnan(phase)):
        return phase == BACKWARD
    return op_kind(op["name"]) in ("bwd", "recompute")


def _records(frame: pd.DataFrame) -> list[dict]:
    return [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}
            for r in frame.to_dict("records")]


# ----------------------------------------------------------------------------- the comparison


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
        return _records(self.step.ops[self.step.ops["rank"] == rank])

    def predicted_ops(self, rank: int) -> list[dict]:
        return [dict(op, rank=rank) for op in self.sim.step_ops(self.sim.rank_of_lane(rank))]

    def timing(self, rank: int) -> tuple[dict, dict]:
        """(predicted, measured) :func:`step_timing` of one rank: phases, compute, exposed comm, backward end."""
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
            f"* simulated as `{s['simulated_strategy']}`" + (f": {s['mapping_note']}" if s["mapping_note"] else ""),
            f"* step time: predicted {s['predicted_step_s'] * 1e3:.2f} ms, measured {s['measured_step_s'] * 1e3:.2f} ms"
            f" ({_pct(s['step_error'])})",
            f"* ops paired: {s['ops_matched']} of {s['ops_predicted']} predicted and {s['ops_measured']} measured",
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
    """A DataFrame as a GitHub markdown table (pandas' to_markdown needs tabulate, which we do not require)."""
    header = [str(frame.index.name or ""), *map(str, frame.columns)]
    rows = [[str(i), *("" if v is None else str(v) for v in row)] for i, row in zip(frame.index, frame.values, strict=True)]
    widths = [max(len(r[c]) for r in [header, *rows]) for c in range(len(header))]

    def line(cells):
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    return "\n".join([line(header), "| " + " | ".join("-" * w for w in widths) + " |", *map(line, rows)])


def compare(run: MeasuredRun, sim, step: int | None = None, rank: int = 0) -> Comparison:
    """Put a measured step next to a prediction of the same scenario (see the module docstring)."""
    sim_world, sim_params = sim.scenario.get("gpus"), sim.scenario.get("params")
    if int(sim_world) != run.world_size:
        raise OverlayError(f"The run has {run.world_size} ranks but the prediction simulates {sim_world}; "
                           f"predict the run's own scenario (sim2real.replay.predict_run(run.run)).")
    if int(sim_params) != int(run.run.get("params", -1)):
        raise OverlayError(f"The run trained the {run.run.get('model')} model ({int(run.run.get('params', 0)):,} "
                           f"parameters) but the prediction is for {sim.scenario.get('model')} "
                           f"({int(sim_params):,} parameters).")
    if not 0 <= rank < run.world_size:
        raise OverlayError(f"Rank {rank} is out of range: the run has ranks 0 to {run.world_size - 1}.")
    ms = measured_step(run, step)
    measured = measured_timing(ms, rank)
    predicted = step_timing(sim.step_ops(sim.rank_of_lane(rank)), sim.metrics["step_time_s"])
    phases = _phase_table(sim.metrics, measured)
    categories = _category_table(sim.step_ops(sim.rank_of_lane(rank)), sim.metrics["step_time_s"],
                                 _records(ms.ops[ms.ops["rank"] == rank]), ms.step_time_s[rank])
    memory = _memory_table(sim.metrics["memory"], run, ms.step, rank)
    ops = _ops_table(sim, ms, run.world_size)
    sim_strategy, _, note = REAL_TO_SIM.get(run.strategy, (sim.scenario.get("strategy"), {}, ""))
    matched = int(ops["matched_by"].notna().sum())
    calibration = sim.scenario.get("calibration")
    summary = {
        "strategy": run.strategy,
        "simulated_strategy": sim.scenario.get("strategy", sim_strategy),
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
    return Comparison(run=run, sim=sim, step=ms, rank=rank, phases=phases, categories=categories, memory=memory,
                      ops=ops, summary=summary)


def _calibration_label(cal) -> str | None:
    """What the prediction was calibrated with, in words (None: the analytical models)."""
    if cal is None:
        return None
    return cal.describe() if hasattr(cal, "describe") else str(cal)


def measured_timing(ms: MeasuredStep, rank: int = 0) -> dict[str, float]:
    """:func:`step_timing` of one rank of a measured step."""
    return step_timing(_records(ms.ops[ms.ops["rank"] == rank]), ms.step_time_s[rank])


def _phase_table(m: dict, meas: dict) -> pd.DataFrame:
    pred = {"step time": m["step_time_s"], "compute": m["compute_time_s"], "exposed comm": m["exposed_comm_s"],
            "forward": m["phases"]["forward_s"], "backward": m["phases"]["backward_s"],
            "optimizer": m["phases"]["optimizer_s"]}
    got = {"step time": meas["step_time_s"], "compute": meas["compute_time_s"],
           "exposed comm": meas["exposed_comm_s"], "forward": meas["forward_s"], "backward": meas["backward_s"],
           "optimizer": meas["optimizer_s"]}
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
    seconds = {k: _length(_union(_clip(v, 0.0, step_time_s))) for k, v in spans.items()}
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


def measured_memory(run: MeasuredRun, step: int, rank: int = 0) -> dict[str, int]:
    """Resident model states and this step's peaks of activations, buffers and the total, on ``rank``.

    The timeline is replayed from the run's start, so the state at the step's start is
    known; the peak total is the largest sum of all categories at any sample of the step."""
    current = dict.fromkeys(MEMORY_CATEGORIES, 0)
    peaks = dict.fromkeys(MEMORY_CATEGORIES, 0)
    peak_total = 0
    samples = run.memory[run.memory["rank"] == rank]
    started = False
    for s, cat, nbytes in zip(samples["step"], samples["category"], samples["bytes"], strict=True):
        if s > step:
            break
        if s == step and not started:
            started = True
            peaks = dict(current)
            peak_total = sum(current.values())
        current[cat] = int(nbytes)
        if s == step:
            peaks[cat] = max(peaks[cat], int(nbytes))
            peak_total = max(peak_total, sum(current.values()))
    held = run.peaks.get(rank, {})
    out = {c: int(held.get(c, current[c])) for c in (PARAMS, GRADS, OPTIMIZER_STATE)}
    out["model states"] = sum(out.values())
    out[ACTIVATIONS] = peaks[ACTIVATIONS] if started else int(held.get(ACTIVATIONS, 0))
    out[BUFFERS] = peaks[BUFFERS] if started else int(held.get(BUFFERS, 0))
    out["peak total"] = peak_total if started else sum(out[c] for c in (PARAMS, GRADS, OPTIMIZER_STATE,
                                                                         ACTIVATIONS, BUFFERS))
    return out


def _memory_table(mem: dict, run: MeasuredRun, step: int, rank: int) -> pd.DataFrame:
    got = measured_memory(run, step, rank)
    pred = {PARAMS: mem["params_bytes"], GRADS: mem["grads_bytes"], OPTIMIZER_STATE: mem["optimizer_bytes"],
            "model states": mem["model_states_bytes"], ACTIVATIONS: mem["activations_bytes"],
            BUFFERS: mem["buffers_bytes"], "peak total": mem["peak_bytes"]}
    rows = list(pred)
    frame = pd.DataFrame({"predicted_bytes": [int(pred[r]) for r in rows],
                          "measured_bytes": [int(got[r]) for r in rows]}, index=pd.Index(rows, name="category"))
    frame["error"] = [_err(p, q) for p, q in zip(frame["predicted_bytes"], frame["measured_bytes"], strict=True)]
    return frame


def _ops_table(sim, ms: MeasuredStep, world: int) -> pd.DataFrame:
    rows = []
    for rank in range(world):
        pred = sorted((dict(op, rank=rank) for op in sim.step_ops(sim.rank_of_lane(rank))),
                      key=lambda o: (o["start_s"], o["end_s"]))
        meas = sorted(_records(ms.ops[ms.ops["rank"] == rank]), key=lambda o: (o["start_s"], o["end_s"]))
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
    left_p, left_m = _match(left_p, left_m, lambda o: (o["stream"], op_kind(o["name"]), _layer(o.get("layer"))),
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
    from sim2real.replay import ReplayError, predict_run

    run = load_run(run_dir)
    try:
        sim = predict_run(run.run, calibration)
    except ReplayError as exc:
        raise OverlayError(str(exc).rstrip(".") + ".") from None
    return compare(run, sim, step)


__all__ = ["CATEGORIES", "Comparison", "MeasuredRun", "MeasuredStep", "OverlayError", "collectives_from_trace",
           "compare", "load_run", "markdown_table", "measured_memory", "measured_step", "measured_timing",
           "op_kind", "overlay", "step_timing"]
