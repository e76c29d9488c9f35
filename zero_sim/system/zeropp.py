"""ZeRO++: what its three parts send, where, and what they compute and hold instead.

ZeRO++ (Wang et al. 2023, "ZeRO++: Extremely Efficient Collective Communication for Giant
Model Training", arXiv 2306.10209; DeepSpeed's ZeRO++ tutorial and blog) cuts ZeRO-3's
cross-node traffic, ``M`` per step for each of the forward weight all-gather, the backward
weight all-gather and the gradient reduce-scatter, to ``0.5M + 0 + 0.25M`` (the blog's table).
Each part is a DeepSpeed ``zero_optimization`` key, switchable on its own; the rules below are
DeepSpeed's code (commit 38327e0, ``deepspeed/runtime/zero/partition_parameters.py``,
``partitioned_param_coordinator.py``, ``stage3.py``, ``runtime/comm/coalesced_collectives.py``),
which is what runs when the keys are set:

* **qwZ** (``zero_quantized_weights``): every weight all-gather moves int8 instead of bf16,
  one byte an element, plus one fp32 scale per block (``CUDAQuantizer``: blocks of at most
  ``target_group_size`` = 8,000 elements, symmetric 8-bit), as a second all-gather of the
  scales.  The flag applies to every gather, forward and backward (``__all_gather_params``
  passes ``quantize=self.zero_quantized_weights`` whatever the pass).  A quantize kernel on the
  gather's stream reads the local shard and writes its int8 copy and scales; a dequantize
  kernel on the compute stream, when the gathered weights are first waited for, reads the
  int8 buffer and scales and writes bf16 (``AllGatherCoalescedHandle.wait``).
* **hpZ** (``zero_hpz_partition_size`` = ``k``): a second copy of the weights, each rank holding
  ``1/k`` of it (``2 Psi / k`` bytes, the weights' dtype: ``_partition_param_sec``), sharded over
  blocks of ``k`` consecutive ranks (``_create_zero_param_parallel_group``).  When a gathered
  layer is released its slice is copied into the secondary partition (a copy kernel on the
  compute stream, then ``current_stream().synchronize()``: the host waits).  While a weight has
  its secondary copy, its all-gathers run over the ``k`` ranks (NVLink) instead of all ``N``;
  the copy is dropped after each optimizer step (``invalidate_secondary_tensor``), so a step's
  first forward gathers across nodes and later passes (backward, and the next micro-steps'
  forwards) inside the node.  ``k`` must divide the ranks of a node here.
* **qgZ** (``zero_quantized_gradients``, more than one node): each gradient tensor of a bucket
  is reduced on its own by ``all_to_all_quant_reduce``: quantize to int4 (``swizzle_quant``,
  half a byte an element, one fp32 scale per group), all-to-all inside the node (data, then
  scales), dequantize and sum the node's ``r`` slices and quantize again
  (``quantized_reduction``), all-to-all across nodes among the ranks of the same local index
  (data, then scales), dequantize and average.  Cross-node bytes per rank: ``Psi_t / (2 r)``
  against a bf16 reduce-scatter's ``2 Psi_t (N-1)/N``, about 4x fewer per node (the blog: a
  rank's cross-node traffic falls from ``M/Z`` to ``M/(Z r)``, ``Z`` the quantization ratio).
  1-D tensors (norms, biases) and tensors whose size is not a multiple of ``2N`` fall back to
  a bf16 reduce-scatter of that tensor alone; on one node DeepSpeed reduce-scatters as usual.
  Groups: ``max(rows, cols, N)`` of them for a tensor, so ``d_model`` elements a group for a
  transformer's matrices (the workload's width; 4,096 for a workload without a shape).

Not modelled: ``zero_quantized_nontrainable_weights`` (frozen weights kept in int8), LoCo's
error feedback (``zeropp_loco_param``), and the paper's overlap of the two all-to-all hops
(DeepSpeed's code runs them one after the other on one stream, and so does the simulator).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

WEIGHT_GROUP = 8_000  # CUDAQuantizer.target_group_size: int8 blocks of at most this many elements
WEIGHT_BYTES = 1  # int8 (qwZ)
GRADIENT_BYTES = 0.5  # int4 (qgZ: swizzle_quant(..., 4, ...))
SCALE_BYTES = 4  # one fp32 scale per block or group (quant_scale_buffer: torch.float32)
DEFAULT_GRADIENT_GROUP = 4_096  # elements a qgZ group when the workload's width is unknown


@dataclass(frozen=True)
class ZeroPP:
    """Which parts of ZeRO++ run: ``hpz`` is the secondary partition's size, 1 for none."""

    quantized_weights: bool = False
    hpz: int = 1
    quantized_gradients: bool = False

    @classmethod
    def from_knobs(cls, knobs: Any) -> ZeroPP:
        """The parts a strategy's knobs turn on (none for a strategy without them)."""
        return cls(bool(getattr(knobs, "zero_quantized_weights", False)),
                   int(getattr(knobs, "zero_hpz_partition_size", 1) or 1),
                   bool(getattr(knobs, "zero_quantized_gradients", False)))

    @property
    def on(self) -> bool:
        return self.quantized_weights or self.hpz > 1 or self.quantized_gradients

    @property
    def quantizes(self) -> bool:
        return self.quantized_weights or self.quantized_gradients

    def describe(self, nodes: int, params: int = 0, param_bytes: int = 2) -> str:
        """What was assumed, in one line (empty when ZeRO++ is off)."""
        parts = []
        if self.quantized_weights:
            parts.append("qwZ: weight all-gathers in int8 + fp32 scales per 8,000 elements")
        if self.hpz > 1:
            held = params * param_bytes / self.hpz / 1e9
            parts.append(f"hpZ: secondary weight partition over {self.hpz} ranks, about {held:.2f} GB a GPU "
                         f"counted in weights from a layer's release to the optimizer (not in model states); "
                         f"gathers after a step's first forward stay among those ranks")
        if self.quantized_gradients:
            parts.append("qgZ: int4 all-to-all gradient reduction, inside the node then across" if nodes > 1
                         else "qgZ: on one node DeepSpeed reduce-scatters as without it")
        return "; ".join(parts)


def check(zpp: ZeroPP, world: int, ranks_per_node: int, cpu: bool) -> str | None:
    """The sentence refusing a combination that is not modelled, or None."""
    k = zpp.hpz
    if k > ranks_per_node:
        return (f"--zero-hpz-partition-size {k} is larger than a node's {ranks_per_node} ranks: the "
                f"secondary partition would span nodes, which the simulator does not model; use "
                f"{ranks_per_node} (ZeRO++'s choice: the GPUs of a node)")
    if k > 1 and ranks_per_node % k:
        return (f"--zero-hpz-partition-size {k} must divide a node's {ranks_per_node} ranks (DeepSpeed "
                f"groups consecutive ranks, so a group would straddle two nodes); use a divisor such as "
                f"{ranks_per_node}")
    if cpu and zpp.quantizes:
        return ("ZeRO++ quantization (--zero-quantized-weights, --zero-quantized-gradients) runs DeepSpeed's "
                "CUDA quantizer kernels, which CPU ranks do not have; drop it or simulate GPUs")
    return None


# --- qwZ ----------------------------------------------------------------------------------


def weight_scales(numel: int) -> int:
    """fp32 scales of ``numel`` quantized elements: one per block of at most 8,000."""
    return math.ceil(numel / WEIGHT_GROUP) if numel > 0 else 0


def quantized_gather_bytes(shard_numel: int, ranks: int) -> tuple[float, float]:
    """The two all-gathers of qwZ over ``ranks`` ranks, each holding ``shard_numel`` elements:
    (int8 data, fp32 scales), in bytes of the gathered buffer."""
    return (shard_numel * WEIGHT_BYTES * ranks, weight_scales(shard_numel) * SCALE_BYTES * ranks)


def quantize_weight_bytes(shard_numel: int, param_bytes: int) -> float:
    """HBM traffic of quantizing the local shard: read it, write int8 and the scales."""
    return shard_numel * (param_bytes + WEIGHT_BYTES) + weight_scales(shard_numel) * SCALE_BYTES


def dequantize_weight_bytes(numel: int, param_bytes: int) -> float:
    """HBM traffic of dequantizing a gathered buffer: read int8 and the scales, write the weights."""
    return numel * (WEIGHT_BYTES + param_bytes) + weight_scales(numel) * SCALE_BYTES


# --- hpZ ----------------------------------------------------------------------------------


def secondary_numel(numel: int, hpz: int) -> int:
    """Elements of a tensor's secondary partition on each rank (padded, as DeepSpeed aligns it)."""
    return math.ceil(numel / hpz)


# --- qgZ ----------------------------------------------------------------------------------


def is_vector(name: str) -> bool:
    """A 1-D parameter: a bias or a norm's weight (the simulator's tensor names, or torch's)."""
    last = name.rsplit(".", 2)
    owner = last[-2] if len(last) > 1 else ""
    return name.endswith(".bias") or owner.startswith("ln_") or "norm" in owner


@dataclass(frozen=True)
class Hop:
    """One all-to-all of qgZ: its process group, bytes of each rank's buffer, and the HBM bytes of
    the kernels DeepSpeed runs on the same stream around it."""

    group: str  # "intra" (the node's ranks) or "inter" (one rank per node, same local index)
    nbytes: float
    kernel_bytes: float
    scales: bool  # the all-to-all of the scales that follows the data's


def quantized_reduction(numel: int, world: int, ranks_per_node: int, grad_bytes: int,
                        width: int | None) -> tuple[Hop, ...]:
    """The four all-to-alls reducing one gradient tensor of ``numel`` elements under qgZ (see the
    module docstring), or () where DeepSpeed reduce-scatters it instead (not a multiple of
    ``2N`` elements, or a single node)."""
    r = ranks_per_node
    if world <= r or numel % (2 * world):
        return ()
    groups = max(numel // (width or DEFAULT_GRADIENT_GROUP), world)
    q, s = numel * GRADIENT_BYTES, groups * SCALE_BYTES  # int4 data and fp32 scales of the whole tensor
    # swizzle_quant: read the gradient, write int4 and scales.
    quantize = numel * grad_bytes + q + s
    # quantized_reduction: read the r slices received and their scales, write this rank's 1/r in int4.
    reduce = q + s + (q + s) / r
    # dequantize the g slices received (write 2 bytes an element), then average them into 1/N.
    finish = (q + s) / r + 2 * numel / r + 2 * numel / r + grad_bytes * numel / world
    return (Hop("intra", q, quantize, False), Hop("intra", s, reduce, True),
            Hop("inter", q / r, 0.0, False), Hop("inter", s / r, finish, True))


def reduction_buffers(numel: int, ranks_per_node: int) -> float:
    """Bytes qgZ allocates while one tensor is reduced: its int4 copy and what the first all-to-all
    receives (``q`` each), the re-quantized slice and what the second receives (``q / r`` each),
    and the dequantized slices (2 bytes an element of ``1/r``)."""
    q = numel * GRADIENT_BYTES
    return 2 * q + 2 * q / ranks_per_node + 2 * numel / ranks_per_node
