"""FSDP with int8 weight gathers: ZeRO++'s quantized weight communication (qwZ).

ZeRO++ (Wang et al. 2023, "ZeRO++: Extremely Efficient Collective Communication for Giant
Model Training", arXiv 2306.10209) cuts ZeRO-3's weight all-gather to int8: each rank
quantizes its own shard before sending it, every rank dequantizes what arrives, and the
shards themselves (the master weights Adam updates) never lose precision.  This file is
:mod:`~real_runs.strategies.fsdp` (the hand-written ZeRO-3) with that one change; the
schedule, prefetching, reduce-scatters and update are FSDP's, unchanged.

**Block-based symmetric int8**, as the paper's qwZ and DeepSpeed's quantizer do it: the shard
is cut into blocks of :data:`BLOCK` elements (the last one shorter), and each block gets one
fp32 scale, ``s = max|x| / 127`` over the block; a weight travels as ``q = round(x / s)`` in
[-127, 127] and arrives as ``q * s``.  One scale per block, not per tensor, keeps a single
large weight from flattening every other weight of the tensor to zero.  The error is at most
half a step, ``|x - q s| <= s / 2 = max|x_block| / 254``.  Block size: DeepSpeed's ZeRO++
quantizer (``CUDAQuantizer`` in ``deepspeed/runtime/zero/partition_parameters.py``) splits
each tensor into groups of under 8,000 elements, its comment saying that the best size is
about 4k; we take 4,096.

Communication, for each ``all_gather L<i>`` (forward, and backward's re-gather alike, as
DeepSpeed's quantized fetch without hpZ's secondary copy does):

1. this rank's shard of ``c`` elements becomes ``c`` int8 values and ``ceil(c / BLOCK)``
   fp32 scales, packed end to end in one byte buffer;
2. one all-gather of those bytes: ``N * (c + 4 * ceil(c / BLOCK))`` bytes instead of
   ``N * c * b`` (a quarter of fp32's, a half of bf16's, plus the scales);
3. ``copy_out L<i>``: every rank's int8 values times their block's scale, into the layer's
   full parameters in their dtype.

The gradients' reduce-scatter stays full precision (ZeRO++'s qgZ is not modelled here), and
so does the optimizer: forward and backward compute with the dequantized weights, Adam updates
the exact shard.  Model states per rank are FSDP's, ``16Ψ/N`` in fp32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .fsdp import FSDP, Unit

BLOCK = 4096  # elements per quantization block (module docstring)
QMAX = 127  # symmetric int8: -128 is left out so that q and -q are both representable
SCALE_BYTES = 4  # one fp32 scale per block


def quantize(x: torch.Tensor, block: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` (1-D) as int8 values and one fp32 scale per block of ``block`` elements."""
    blocks = F.pad(x.float(), (0, -x.numel() % block)).view(-1, block)
    scales = blocks.abs().amax(dim=1) / QMAX
    # An all-zero block has scale 0; dividing by 1 instead sends its zeros as zeros.
    q = torch.round(blocks / torch.where(scales > 0, scales, 1.0)[:, None]).clamp_(-QMAX, QMAX)
    return q.to(torch.int8).flatten()[:x.numel()], scales


def dequantize(q: torch.Tensor, scales: torch.Tensor, block: int = BLOCK) -> torch.Tensor:
    """Rows of int8 values (``(rows, c)``) times their block's scale (``(rows, blocks)``), in fp32."""
    rows, c = q.shape
    blocks = F.pad(q.float(), (0, -c % block)).view(rows, -1, block)
    return (blocks * scales[:, :, None]).view(rows, -1)[:, :c]


class FSDPQwZ(FSDP):
    name = "fsdp-qwz"
    stage = 3

    def outgoing(self, u: Unit) -> torch.Tensor:
        """This rank's shard, quantized: int8 values then fp32 scales, as one byte buffer."""
        q, scales = quantize(u.shard)
        return torch.cat([q.view(torch.uint8), scales.view(torch.uint8)])

    def gathers_in_place(self, u: Unit) -> bool:
        return False  # bytes arrive; weights are made of them

    def unpack(self, u: Unit, gathered: torch.Tensor) -> None:
        (f,) = u.flats  # fine-tuning with frozen weights is refused for this strategy (real_runs.options)
        c = f.chunk
        rows = gathered.view(self.world, -1)
        q = rows[:, :c].view(torch.int8)
        scales = rows[:, c:].contiguous().view(torch.float32)
        f.data.view(self.world, c).copy_(dequantize(q, scales))
