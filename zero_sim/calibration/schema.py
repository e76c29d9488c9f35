"""What a calibration file may hold: a strict pydantic schema, and one sentence per violation.

Every field has a type, numbers are finite and within physical bounds, names (collectives,
layer kinds, backend, fabric and network kinds, GPU) are one of those the simulator knows,
and a field the format does not have is refused rather than ignored: a misspelt field
silently falling back to its default would be a wrong prediction nobody notices.
:mod:`zero_sim.calibration.format` reads and writes files through it.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from zero_sim.system.collectives import BACKENDS
from zero_sim.system.gpus import GPUS
from zero_sim.system.specs import FABRIC_KINDS, NETWORK_KINDS
from zero_sim.system.topology import Fabric, Network, TopologySpec
from zero_sim.vocabulary import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER

FORMAT = "zero-sim-calibration/1"
FITTED_COLLECTIVES = (ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER)
LAYER_KINDS = ("embedding", "block", "head")


# ----------------------------------------------------------------------------- the file's schema
# Bounds are physical, wide enough for any machine and narrow enough that arithmetic on them
# stays finite: a bandwidth between 1 KB/s and 100 TB/s, a latency under a minute, a measured
# time under an hour, counts that fit in memory.

def _number(lo: float | None = None, hi: float | None = None, above: float | None = None,
            below: float | None = None):
    return Annotated[float, Field(ge=lo, le=hi, gt=above, lt=below, allow_inf_nan=False)]


def _count(hi: int):
    return Annotated[int, Field(ge=1, le=hi)]


Bandwidth = _number(lo=1e-6, hi=1e5)  # GB/s
LatencyS = _number(lo=0.0, hi=60.0)
LatencyUs = _number(lo=0.0, hi=60e6)
MeasuredS = _number(above=0.0, hi=3600.0)
Fraction = _number(lo=0.0, hi=1.0)
Ratio = _number(lo=0.0, hi=1e6)
Ranks = _count(1 << 20)


class _Strict(BaseModel):
    # strict: "2" is not a number and 2.0 not a count; forbid: a misspelt field is an error, not a default.
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class CollectiveFitFile(_Strict):
    world_size: Ranks
    latency_s: LatencyS
    busbw_gbps: Bandwidth
    max_rel_error: _number(lo=0.0) = 0.0
    sizes: list[Annotated[int, Field(ge=1, le=1 << 50)]] = []
    times_s: list[MeasuredS] = []
    queued_latency_s: LatencyS | None = None

    @model_validator(mode="after")
    def _times_match_sizes(self):
        if self.times_s and len(self.times_s) != len(self.sizes):
            raise ValueError(f"has {len(self.times_s)} times_s for {len(self.sizes)} sizes; "
                             f"they go one for one")
        return self


class LayerTimesFile(_Strict):
    fwd: MeasuredS
    bwd: MeasuredS


class ComputeFile(_Strict):
    layer_seconds: dict[Literal[LAYER_KINDS], LayerTimesFile]
    tokens: Annotated[int, Field(ge=1, le=1 << 40)]
    optimizer_seconds_per_param: _number(lo=0.0, hi=1.0) | None = None
    ranks: Ranks = 1
    cores: Ranks | None = None
    sharing_factor: _number(above=0.0, hi=1e6) | None = None
    model: str | None = None
    slowest_rank_factor: _number(lo=1.0, below=10.0) = 1.0
    host_seconds: dict[Literal[LAYER_KINDS], LayerTimesFile] | None = None
    optimizer_host_seconds_per_param: _number(lo=0.0, hi=1.0) | None = None
    step_host_s: _number(lo=0.0, hi=3600.0) | None = None


class CpuFile(_Strict):
    collective_cpu_s: LatencyS
    overlap_slowdown: _number(lo=0.0, hi=100.0)
    ranks: Ranks = 1
    cores: Ranks | None = None
    call_cpu_s: LatencyS | None = None
    streaming_cores: Ratio | None = None
    comm_rate_while_computing: _number(above=0.0, hi=1.0) = 1.0
    comm_bytes_rate_while_computing: _number(above=0.0, hi=1.0) | None = None


class FabricFile(_Strict):
    kind: Literal[FABRIC_KINDS]
    port_gbps: Bandwidth
    port_latency_us: LatencyUs
    subgroups: _count(64) = 1
    bus_gbps: _number(lo=0.0, hi=1e5) = 0.0
    bus_latency_us: LatencyUs = 0.0
    bridge_gbps: _number(lo=0.0, hi=1e5) = 0.0
    bridge_latency_us: LatencyUs = 0.0
    nvls_efficiency: Fraction = 0.0
    protocol_us: Annotated[list[LatencyUs], Field(max_length=4)] = []  # LL, LL128, Simple, NVLS
    pipeline_mb: Ratio = 0.0

    @model_validator(mode="after")
    def _links_carry_bytes(self):
        # Every transfer inside a PCIe or loopback node crosses its bus, and between subgroups the
        # bridge: a link of no capacity would take forever, so a fabric that has one is refused.
        if self.kind != "nvswitch" and self.bus_gbps <= 0:
            raise ValueError(f"is a {self.kind} fabric with bus_gbps {self.bus_gbps}; "
                             f"its shared bus needs a positive bandwidth")
        if self.kind != "nvswitch" and self.subgroups > 1 and self.bridge_gbps <= 0:
            raise ValueError(f"has {self.subgroups} subgroups and bridge_gbps {self.bridge_gbps}; "
                             f"the host bridge between them needs a positive bandwidth")
        return self


class NetworkFile(_Strict):
    kind: Literal[NETWORK_KINDS]
    nic_gbps: Bandwidth
    latency_us: LatencyUs
    nics: _count(4096) = 1
    ll_protocols: bool = True
    line_gbit: _number(lo=1e-6, hi=1e7) | None = None  # each NIC's line rate, where a preset gave it
    achieved: Fraction | None = None  # the fraction of it achieved (nic_gbps = line x nics / 8 x this)
    beyond_two_nodes: Fraction = 1.0  # what a collective over more than two nodes reaches of nic_gbps


class TopologyFile(_Strict):
    name: str
    description: str
    gpus_per_node: _count(4096)
    fabric: FabricFile
    network: NetworkFile | None
    gpu: Literal[tuple(GPUS)]
    source: str

    @model_validator(mode="after")
    def _subgroups_divide_the_node(self):
        if self.gpus_per_node % self.fabric.subgroups:
            raise ValueError(f"splits {self.gpus_per_node} GPUs per node into {self.fabric.subgroups} "
                             f"subgroups; gpus_per_node must be a multiple of subgroups")
        return self


class CalibrationFile(_Strict):
    format: Literal[FORMAT]
    backend: Literal[tuple(BACKENDS)] | None = None
    measured_on: dict[str, Any] | None = None  # for the reader only: anything JSON holds
    collectives: dict[Literal[FITTED_COLLECTIVES], CollectiveFitFile] | None = None
    compute: ComputeFile | None = None
    topology: TopologyFile | None = None
    cpu: CpuFile | None = None
    overlap_slowdown: _number(lo=0.0, hi=100.0) | None = None


def topology_dict(spec: TopologySpec) -> dict:
    """The spec as JSON holds it: lists, not tuples, so the dict reads back as the file would."""
    d = asdict(spec)
    d["fabric"]["protocol_us"] = list(spec.fabric.protocol_us)
    return d


def topology_spec(t: TopologyFile | None) -> TopologySpec | None:
    if t is None:
        return None
    fabric = Fabric(**{**t.fabric.model_dump(), "protocol_us": tuple(t.fabric.protocol_us)})
    network = None if t.network is None else Network(**t.network.model_dump())
    return TopologySpec(t.name, t.description, t.gpus_per_node, fabric, network, t.gpu, t.source)


# What a field means, added to the sentence about it where the name alone does not say.
FIELD_MEANING = {
    "slowest_rank_factor": "the slowest rank's pass over the mean rank's, at least 1 and below 10",
    "comm_rate_while_computing": "the pace of the collectives' per-call work while the ranks compute as a "
                                 "fraction of the idle pace, above 0 and at most 1",
    "comm_bytes_rate_while_computing": "the pace of the collectives' bytes while the ranks compute as a "
                                       "fraction of the idle pace, above 0 and at most 1",
    "busbw_gbps": "the fitted bus bandwidth in GB/s",
    "latency_s": "the fitted latency of one call in seconds",
    "queued_latency_s": "the fitted latency of a call queued behind another, in seconds (or null)",
    "world_size": "the group size the fit was measured on",
    "tokens": "tokens per rank the layer times were measured at",
    "nics": "NICs per node",
    "gpu": "the GPU model, a name from `zero-sim presets`",
}
_RULES = {
    "missing": "is missing",
    "finite_number": "must be a finite number",
    "int_type": "must be a whole number", "int_parsing": "must be a whole number",
    "int_from_float": "must be a whole number",
    "float_type": "must be a number", "float_parsing": "must be a number",
    "bool_type": "must be true or false", "string_type": "must be a string",
    "list_type": "must be a list", "dict_type": "must be an object", "model_type": "must be an object",
    "model_attributes_type": "must be an object",
}
_BOUNDS = {"greater_than_equal": ("ge", "at least"), "greater_than": ("gt", "above"),
           "less_than_equal": ("le", "at most"), "less_than": ("lt", "below")}
FIX = "fix it or regenerate the file with `zero-sim calibrate`"


def _where(loc: tuple) -> str:
    """``('collectives', 'all_reduce', 'sizes', 3)`` -> ``collectives.all_reduce.sizes[3]``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def sentence(source: str, err: dict) -> str:
    """One sentence for pydantic's first error: which field, what it holds, what it must be."""
    loc, kind, ctx = tuple(err["loc"]), err["type"], err.get("ctx") or {}
    if loc and loc[-1] == "[key]":  # a name used as a key: a collective or a layer kind
        return (f"{source} has {_where(loc[:-2])} entry {_shown(loc[-2])}, which is not one of "
                f"{ctx.get('expected', 'the known names')}; {FIX}")
    where = _where(loc)
    meaning = FIELD_MEANING.get(str(loc[-1])) if loc else None
    about = f" ({meaning})" if meaning else ""
    if kind == "missing":
        return f"{source} lacks {where}{about}; {FIX}"
    if kind == "extra_forbidden":
        return (f"{source} has {where}, which is not a field of a calibration file; remove it or regenerate "
                f"the file with `zero-sim calibrate`")
    if kind == "literal_error":
        return (f"{source} has {where} {_shown(err['input'])}, which is not one of {ctx['expected']}; {FIX}")
    if kind == "value_error":  # a rule across fields, worded where it is checked
        return f"{source}: {where} {ctx.get('error', err['msg'])}; {FIX}"
    if kind in _BOUNDS:
        key, words = _BOUNDS[kind]
        rule = f"must be {words} {ctx.get(key):g}"
    elif kind == "too_long":
        rule = f"must have at most {ctx.get('max_length')} entries"
    else:
        rule = _RULES.get(kind, err["msg"][0].lower() + err["msg"][1:])
    return f"{source} has {where} {_shown(err['input'])}, which {rule}{about}; {FIX}"
