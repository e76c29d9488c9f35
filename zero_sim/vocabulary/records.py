"""The records a step leaves behind, defined once for the simulator, the real runs and the overlay.

* :class:`OpRecord`: one op on one rank's stream, as the engine writes it (``SimResult.ops``
  holds its :meth:`~OpRecord.to_dict` form).  A real run records the same fields but
  ``kind`` and ``algorithm`` (:data:`OP_FIELDS`); the overlay derives ``kind`` from the name.
* :class:`RecordedOp`, :class:`MemorySample` and :class:`RankFile`: ``rank<r>.json``, one
  file per rank of a real run (``real_runs.record.Recorder`` fills it).
* :class:`RunFile`: ``run.json``, the run as a whole, written last by rank 0
  (``real_runs.train``) and read back by the overlay.

The engine makes hundreds of thousands of op records, so :class:`OpRecord` is a slotted
dataclass; files are read through pydantic models that check every field they declare.
Reading is strict (a string where a number belongs is a damaged file, not something to
convert) and lets extra fields through (the emulated cluster stamps ``run.json`` with its
links, for instance).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from zero_sim.vocabulary import MEMORY_CATEGORIES


@dataclass(slots=True)
class OpRecord:
    """One op as it ran: times in seconds of simulated (or measured) time."""

    rank: int
    stream: str
    name: str
    start_s: float
    end_s: float
    bytes: float
    layer: int | None
    phase: str
    step: int
    kind: str  # compute, collective, sync, host or stall (the simulator's; real runs derive it)
    algorithm: str = ""  # the collective algorithm the simulator planned (ring, tree, ...)

    def to_dict(self) -> dict[str, Any]:
        # Spelled out, not dataclasses.asdict (which deep-copies) nor a loop over the fields: a
        # run makes hundreds of thousands of records.  A test checks it names every field.
        return {"rank": self.rank, "stream": self.stream, "name": self.name, "start_s": self.start_s,
                "end_s": self.end_s, "bytes": self.bytes, "layer": self.layer, "phase": self.phase,
                "step": self.step, "kind": self.kind, "algorithm": self.algorithm}


RECORD_FIELDS = tuple(f.name for f in fields(OpRecord))
# Fields of an op that real runs record too, in order: every OpRecord field but the simulator's own.
SIMULATOR_ONLY_FIELDS = ("kind", "algorithm")
OP_FIELDS = tuple(name for name in RECORD_FIELDS if name not in SIMULATOR_ONLY_FIELDS)

Finite = Annotated[float, Field(allow_inf_nan=False)]
Seconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Bytes = Annotated[int, Field(ge=0)]
RankKey = Annotated[str, Field(pattern=r"^(0|[1-9][0-9]{0,5})$")]


class _Record(BaseModel):
    # run.json has a field named model_config: no namespace is protected.
    model_config = ConfigDict(strict=True, extra="allow", protected_namespaces=())


class RecordedOp(_Record):
    """One op of a rank file; ``end_s`` is None for an op still open when the step ended."""

    rank: int
    stream: str
    name: str
    start_s: Finite
    end_s: Finite | None
    bytes: Bytes
    layer: int | None
    phase: str | None
    step: int


class MemorySample(_Record):
    """A memory category's new total, at ``t_s`` seconds into step ``step``."""

    step: int
    t_s: Finite
    category: Literal[MEMORY_CATEGORIES]
    bytes: Bytes


class RankFile(_Record):
    """``rank<r>.json``: one rank's ops, memory over time, step times and losses."""

    rank: int
    world_size: int
    strategy: str | None = None
    device: str | None = None
    ops: list[RecordedOp]
    memory_timeline: list[MemorySample]
    memory: dict[str, Bytes] | None = None  # peaks and held model states by category
    step_times_s: list[Seconds]
    losses: list[float] | None = None  # a diverged run's NaN is a result, not a damaged file


class RunFile(_Record):
    """``run.json``: what ran, how long each step took (the slowest rank's), losses, memory per
    rank, and the versions, in the order the file lists them.  The overlay needs ``strategy``,
    ``world_size``, ``step_times_s`` and ``memory``; the rest describe the run."""

    strategy: str
    world_size: int = Field(ge=1)
    backend: str | None = None
    device: str | None = None
    model: str | None = None
    model_config_: dict[str, Any] | None = Field(None, alias="model_config")
    params: int | None = None
    precision: str | None = None
    dtype: str | None = None
    global_batch: int | None = None
    seq_len: int | None = None
    steps: int | None = None
    seed: int | None = None
    bucket_mb: float | None = None
    lr: float | None = None
    # LoRA fine-tuning (real_runs.lora): adapters' rank, the projections they sit on (the simulator's
    # short names, q,v), alpha, and the parameters that trained; absent for full training.
    lora_rank: int | None = None
    lora_targets: str | None = None
    lora_alpha: float | None = None
    trainable_params: int | None = None
    step_times_s: list[Seconds] = []
    median_step_s: Seconds | None = None
    losses: list[float] | None = None
    final_loss: float | None = None
    param_l2: float | None = None
    memory: dict[RankKey, dict[str, Bytes]] | None = None
    model_states_formula: dict[str, Any] | None = None
    versions: dict[str, Any] | None = None
    files: list[str] | None = None
    gpu: dict[str, Any] | None = None  # CUDA runs: the device stamp (real_runs.gpu_stamp)
    cores: int | None = None  # CPU cores the ranks could run on: ranks beyond them share cores


# run.json's keys in the order the writer lists them: the fields above, by their names in the file.
RUN_FILE_KEYS = tuple(f.alias or name for name, f in RunFile.model_fields.items())


def run_file(**values: Any) -> dict[str, Any]:
    """``run.json``'s content from its fields, checked against :class:`RunFile` (lax, as the writer
    holds Python numbers), in :data:`RUN_FILE_KEYS` order; None fields are left out."""
    unknown = set(values) - set(RUN_FILE_KEYS)
    if unknown:
        raise ValueError(f"run.json has no field {sorted(unknown)[0]!r}; RunFile declares its fields")
    RunFile.model_validate(values, strict=False)
    return {k: values[k] for k in RUN_FILE_KEYS if values.get(k) is not None}


def rank_file(**values: Any) -> dict[str, Any]:
    """``rank<r>.json``'s content from its fields, which must be :class:`RankFile`'s."""
    unknown = set(values) - set(RankFile.model_fields)
    if unknown:
        raise ValueError(f"a rank file has no field {sorted(unknown)[0]!r}; RankFile declares its fields")
    return values
