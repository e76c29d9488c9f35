"""The names shared by the simulator, the real runs, the traces and the notebooks.

A measured timeline can only be laid over a predicted one if both call the same
thing by the same name.  This module is the one place those names are written down:
streams, phases, memory categories, strategies, and the op names
(``fwd L3``, ``all_reduce B2``, ``reduce_scatter L5`` ...).

Both halves of the project build op names with these helpers and read them back with
:func:`parse_op_name`; neither invents its own spelling.

The records themselves (an op, a rank file, ``run.json``) are defined once in
:mod:`zero_sim.vocabulary.records`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Streams: a Chrome-trace ``tid`` each.  ``comm:<group>`` when several process groups
# run their collectives on separate streams at once (e.g. FSDP hybrid sharding).
HOST = "host"
COMPUTE = "compute"
COMM = "comm"
# Copies to and from host memory when model states are offloaded: CUDA's two copy engines.
D2H = "d2h"
H2D = "h2d"
STREAMS = (HOST, COMPUTE, COMM, D2H, H2D)

# Phases of a training step.  ``optimizer`` runs from the end of the last backward op
# to the point where the next forward may start.
FORWARD = "forward"
BACKWARD = "backward"
OPTIMIZER = "optimizer"
PHASES = (FORWARD, BACKWARD, OPTIMIZER)

# Memory categories.  ``buffers`` holds communication buffers: gradient buckets,
# gathered (unsharded) parameters, scratch space for collectives.
PARAMS = "params"
GRADS = "grads"
OPTIMIZER_STATE = "optimizer"
ACTIVATIONS = "activations"
BUFFERS = "buffers"
MEMORY_CATEGORIES = (PARAMS, GRADS, OPTIMIZER_STATE, ACTIVATIONS, BUFFERS)

# Strategies the simulator models, and the implementation variants real runs add.
SIM_STRATEGIES = ("ddp", "zero1", "zero2", "zero3", "fsdp")
REAL_STRATEGIES = (
    "ddp-torch", "ddp", "zero1", "zero2", "zero2-step", "zero2-hook", "fsdp", "fsdp-torch", "fsdp-qwz",
)

# Collective kinds, as nccl-tests and torch.distributed name them.
ALL_REDUCE = "all_reduce"
REDUCE_SCATTER = "reduce_scatter"
ALL_GATHER = "all_gather"
BROADCAST = "broadcast"
ALL_TO_ALL = "all_to_all"  # ZeRO++'s quantized gradient reduction (qgZ) exchanges slices pairwise
COLLECTIVES = (ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER, BROADCAST, ALL_TO_ALL)



def fwd(layer: int) -> str:
    return f"fwd L{layer}"


def bwd(layer: int) -> str:
    return f"bwd L{layer}"


def recompute(layer: int) -> str:
    return f"recompute L{layer}"


def opt(target: str | int) -> str:
    """Optimizer update of one parameter, one shard, or one layer (``opt L3``)."""
    return f"opt L{target}" if isinstance(target, int) else f"opt {target}"


def bucket_collective(kind: str, bucket: int) -> str:
    """A collective over gradient bucket ``bucket``: ``all_reduce B2``."""
    _check_kind(kind)
    return f"{kind} B{bucket}"


def layer_collective(kind: str, layer: int) -> str:
    """A collective over one layer's tensors: ``all_gather L5``, ``reduce_scatter L5``."""
    _check_kind(kind)
    return f"{kind} L{layer}"


def wait(what: str) -> str:
    return f"wait {what}"


def fetch(layer: int) -> str:
    """Host-side work deciding what to gather for layer ``layer`` (ZeRO-3's fetch decisions)."""
    return f"fetch L{layer}"


def copy_out(layer: int) -> str:
    """FSDP2's copy of a gathered unit out of the all-gather buffer into its parameters."""
    return f"copy_out L{layer}"


def copy_in(layer: int) -> str:
    """FSDP's copy of a unit's gradients into the buffer its reduce-scatter reads (FSDP1: the flat
    gradient; FSDP2: the reduce-scatter input, cast to the reduce dtype)."""
    return f"copy_in L{layer}"


def host_copy(direction: str, target: str | int) -> str:
    """A copy to host memory (``d2h B3``: a bucket's gradient slice) or from it (``h2d L5``)."""
    return f"{direction} L{target}" if isinstance(target, int) else f"{direction} {target}"


CPU_ADAM = "cpu_adam"  # the optimizer's update on the host's CPU (offloaded optimizer)


def fp8_cast(layer: int) -> str:
    """The casts of a layer's GEMM operands to float8 before its forward or backward (``--precision fp8``)."""
    return f"fp8_cast L{layer}"


def amp_cast(layer: int) -> str:
    """autocast's casts of a layer's fp32 weights to bf16 before its forward (``--precision amp``)."""
    return f"amp_cast L{layer}"


def dequantize(layer: int) -> str:
    """ZeRO++'s dequantize kernel: int8 weights gathered for layer ``layer`` back to bf16 (qwZ)."""
    return f"dequantize L{layer}"


def secondary(layer: int) -> str:
    """ZeRO++'s copy of a gathered layer's slice into its node-local secondary partition (hpZ)."""
    return f"secondary L{layer}"


def _check_kind(kind: str) -> None:
    if kind not in COLLECTIVES:
        raise ValueError(f"unknown collective {kind!r}; expected one of {', '.join(COLLECTIVES)}")


@dataclass(frozen=True)
class OpName:
    """An op name taken apart: ``kind`` is fwd/bwd/recompute/opt/wait/fetch, an FSDP
    copy (copy_out/copy_in), fp8_cast, amp_cast, a host copy (d2h/h2d), cpu_adam, a ZeRO++ kernel
    (dequantize/secondary) or a collective."""

    kind: str
    layer: int | None = None
    bucket: int | None = None
    target: str | None = None



_OP_RE = re.compile(
    r"^(?P<kind>fwd|bwd|recompute|opt|wait|fetch|copy_out|copy_in|fp8_cast|amp_cast|d2h|h2d|cpu_adam|dequantize|secondary"
    r"|all_reduce|reduce_scatter|all_gather|broadcast|all_to_all)"
    r"(?: (?P<rest>.+))?$"
)


def parse_op_name(name: str) -> OpName:
    """Read an op name back.  Raises ValueError naming the bad op if it is not ours."""
    m = _OP_RE.match(name)
    if not m:
        raise ValueError(f"op name {name!r} is not in the shared vocabulary (e.g. 'fwd L3', 'all_reduce B2')")
    kind, rest = m["kind"], m["rest"] or ""
    layer = bucket = None
    target = rest or None
    if re.fullmatch(r"L\d+", rest):
        layer, target = int(rest[1:]), None
    elif re.fullmatch(r"B\d+", rest):
        bucket, target = int(rest[1:]), None
    return OpName(kind=kind, layer=layer, bucket=bucket, target=target)
