"""A real run directory loaded whole: ``run.json`` and every rank's ops and memory.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from sim2real.overlay.base import OverlayError, op_kind
from sim2real.overlay.traces import collectives_from_trace
from zero_sim.vocabulary import (
    COMM,
    OP_FIELDS,
)


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
    ops_df = pd.DataFrame(ops, columns=[*OP_FIELDS, "source"])
    ops_df["kind"] = [op_kind(n) for n in ops_df["name"]]
    memory_df = pd.DataFrame(memory, columns=["rank", "step", "t_s", "category", "bytes"])
    peaks = {int(r): {c: int(v) for c, v in m.items()} for r, m in (run.get("memory") or {}).items()}
    if world > 1 and not ops_df["stream"].astype(str).str.startswith(COMM).any():
        notes.append("the run recorded no collectives (fsdp-torch records compute only; run it with --trace "
                     "to read them from the profiler)")
    return MeasuredRun(run=run, ops=ops_df, memory=memory_df, peaks=peaks, world_size=world,
                       strategy=strategy, path=path, step_times_s=step_times, notes=notes)
