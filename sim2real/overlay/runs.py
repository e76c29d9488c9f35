"""A real run directory loaded whole: ``run.json`` and every rank's ops and memory.

Everything :func:`load_run` uses is checked before it is used (the file models of
:mod:`zero_sim.vocabulary.records`, where both files are defined):
types, finite times and sizes, a world size of at least one, every rank's file present and
no other, and the same number of steps on every rank.  A directory that fails a check is
refused with one :class:`OverlayError` sentence naming the file and the field; so is one
holding ``failed.json`` (a run that failed, whose sentence is quoted).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import BaseModel, ValidationError

from real_runs.launch import FAILED_FILE
from sim2real.overlay.base import OverlayError, op_kind
from sim2real.overlay.traces import collectives_from_trace, trace_file
from zero_sim.vocabulary import COMM
from zero_sim.vocabulary.records import OP_FIELDS, RankFile, RunFile


@dataclass
class MeasuredRun:
    """What a real run recorded, every rank in one place.

    ``ops`` has one row per op with the fields of :data:`zero_sim.vocabulary.records.OP_FIELDS`
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


# --- what the files must hold -------------------------------------------------------------

def _where(loc: tuple) -> str:
    """A pydantic location as a field path: ``ops[3].start_s``, ``memory.0.params``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f"{'.' if out else ''}{part}"
    return out


def _checked(model: type[BaseModel], data: Any, file: Path) -> BaseModel:
    """``data`` as ``model``, or OverlayError naming ``file`` and the first field that is wrong."""
    if not isinstance(data, dict):
        raise OverlayError(f"{file} holds a JSON {type(data).__name__}, not an object, "
                           f"so it was not written by real_runs.train.")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        first = e.errors(include_url=False)[0]
        where = _where(first["loc"])
        if first["type"] == "missing":
            raise OverlayError(f"{file} has no {where} field, so it was not written by "
                               f"real_runs.train.") from None
        msg = " ".join(str(first["msg"]).split()).rstrip(".")
        raise OverlayError(f"{file} has a bad {where}: {msg[:1].lower()}{msg[1:]}.") from None


def _read_json(file: Path) -> Any:
    try:
        return json.loads(file.read_text())
    except (ValueError, RecursionError):
        raise OverlayError(f"{file} is not valid JSON; the run was probably cut short.") from None
    except OSError as e:
        raise OverlayError(f"{file} cannot be read: {e.strerror or e}.") from None


# --- loading ------------------------------------------------------------------------------

def load_run(path) -> MeasuredRun:
    """Read a run directory written by ``real_runs.train``; OverlayError (one sentence) if it is not one."""
    path = Path(path)
    _refuse_failed(path)
    run_file = path / "run.json"
    if not path.is_dir() or not run_file.is_file():
        raise OverlayError(f"{path} has no run.json: the run did not finish, or this is not a run directory.")
    run = _read_json(run_file)
    header = _checked(RunFile, run, run_file)
    world = header.world_size
    _refuse_other_ranks(path, run_file, header)
    ops, memory, step_times, notes = [], [], {}, []
    for rank in range(world):
        record = _rank_record(path, rank, world)
        rank_ops = [dict(op, source="record") for op in record["ops"] if op.get("end_s") is not None]
        step_times[rank] = list(record["step_times_s"])
        trace = trace_file(path, rank)
        has_comm = any(str(op.get("stream", "")).startswith(COMM) for op in rank_ops)
        if not has_comm and trace is not None:
            traced = _traced(trace, rank, rank_ops, step_times[rank])
            rank_ops += traced
            notes.append(f"rank {rank}'s {len(traced)} collectives were read from "
                         f"{trace.relative_to(path).as_posix()}")
        ops += rank_ops
        memory += [dict(m, rank=rank) for m in record["memory_timeline"]]
    _refuse_uneven_steps(run_file, header, step_times)
    ops_df = pd.DataFrame(ops, columns=[*OP_FIELDS, "source"])
    ops_df["kind"] = [op_kind(n) for n in ops_df["name"]]
    memory_df = pd.DataFrame(memory, columns=["rank", "step", "t_s", "category", "bytes"])
    peaks = {int(r): dict(m) for r, m in (header.memory or {}).items()}
    if world > 1 and not ops_df["stream"].astype(str).str.startswith(COMM).any():
        notes.append("the run recorded no collectives (fsdp-torch records compute only; run it with --trace "
                     "to read them from the profiler)")
    return MeasuredRun(run=run, ops=ops_df, memory=memory_df, peaks=peaks, world_size=world,
                       strategy=header.strategy, path=path, step_times_s=step_times, notes=notes)


def _refuse_failed(path: Path) -> None:
    """A run that failed left ``failed.json``: say so, in its own words."""
    marker = path / FAILED_FILE
    if not marker.is_file():
        return
    try:
        reason = json.loads(marker.read_text())["reason"]
        reason = " ".join(str(reason).split())[:400].rstrip(".")
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        raise OverlayError(f"The run in {path} failed ({FAILED_FILE} is there but unreadable), "
                           f"so it cannot be overlaid.") from None
    raise OverlayError(f'The run in {path} failed and cannot be overlaid; it said "{reason}".')


def _refuse_other_ranks(path: Path, run_file: Path, header: RunFile) -> None:
    """Rank files and memory entries beyond the world size are another run's, mixed in."""
    world = header.world_size
    extra = sorted(int(m[1]) for f in path.glob("rank*.json")
                   if (m := re.fullmatch(r"rank(\d+)\.json", f.name)) and int(m[1]) >= world)
    if extra:
        raise OverlayError(f"{path} holds rank{extra[0]}.json but {run_file.name} says the run had {world} "
                           f"rank{'s' if world > 1 else ''}, so files of another run are mixed in.")
    beyond = sorted(int(r) for r in (header.memory or {}) if int(r) >= world)
    if beyond:
        raise OverlayError(f"{run_file} has a bad memory.{beyond[0]}: the run had {world} "
                           f"rank{'s' if world > 1 else ''}.")


def _rank_record(path: Path, rank: int, world: int) -> dict:
    """``rank<rank>.json``, checked: its fields, and that it is this rank's of this run."""
    rank_file = path / f"rank{rank}.json"
    if not rank_file.is_file():
        raise OverlayError(f"{path} has no rank{rank}.json, so rank {rank}'s record is missing "
                           f"and the run cannot be overlaid.")
    record = _read_json(rank_file)
    checked = _checked(RankFile, record, rank_file)
    if checked.rank != rank or checked.world_size != world:
        raise OverlayError(f"{rank_file} has a bad rank or world_size: it says rank {checked.rank} of "
                           f"{checked.world_size}, not rank {rank} of {world}.")
    wrong = next((i for i, op in enumerate(checked.ops) if op.rank != rank), None)
    if wrong is not None:
        raise OverlayError(f"{rank_file} has a bad ops[{wrong}].rank: {checked.ops[wrong].rank} "
                           f"in the file of rank {rank}.")
    return record


def _refuse_uneven_steps(run_file: Path, header: RunFile, step_times: dict[int, list[float]]) -> None:
    counts = {r: len(t) for r, t in step_times.items()}
    if len(set(counts.values())) > 1:
        said = ", ".join(f"rank {r} {n}" for r, n in counts.items())
        raise OverlayError(f"The ranks of {run_file.parent} recorded different numbers of steps ({said}), "
                           f"so they cannot be overlaid.")
    n = next(iter(counts.values()))
    if header.step_times_s and len(header.step_times_s) != n:
        raise OverlayError(f"{run_file} has a bad step_times_s: {len(header.step_times_s)} steps, "
                           f"but every rank recorded {n}.")


def _traced(trace: Path, rank: int, rank_ops: list[dict], step_times: list[float]) -> list[dict]:
    """Collectives read from a rank's profiler trace; a trace of the wrong shape is refused."""
    try:
        return collectives_from_trace(trace, rank, rank_ops, step_times)
    except OverlayError:
        raise
    except (KeyError, TypeError, AttributeError, IndexError, ValueError, RecursionError, OSError) as e:
        raise OverlayError(f"{trace} is not a torch.profiler trace the overlay can read "
                           f"({type(e).__name__}).") from None
