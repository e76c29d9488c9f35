"""FlashAttention-style fused attention kernels: how fast each implementation runs, relative to the GPU.

The compute model (:mod:`zero_sim.system.hardware`) times an attention kernel as its FLOPs over the
GPU's dense peak times an efficiency; this module holds that efficiency's shape for each
implementation (FlashAttention-2, FlashAttention v1 and its Triton port, cuDNN's fused attention):
its saturation with sequence length, the causal mask's and head dimension's effect, the backward's
FLOPs and rate relative to the forward.  Each figure names the benchmark it was read from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from zero_sim.system.gpus import GENERATIONS

# FlashAttention's backward does 2.5x its forward's FLOPs (five matmuls to the forward's two;
# FlashAttention-2 paper, Sec. 4.1, and benchmarks/benchmark_flash_attention.py: bwd = 2.5 fwd).
FLASH_BWD_FLOPS = 2.5
# Backward over forward efficiency of FlashAttention: 63% vs 73% of A100 peak at best
# (FlashAttention-2 paper, abstract and Sec. 4.1); 264 vs 308 TFLOP/s on an H100 at seqlen 2k,
# head dim 64 (Dao-AILab/flash-attention PR #2688's benchmark_flash_attention.py output).
FLASH_BWD_OVER_FWD = 0.86
@dataclass(frozen=True)
class FlashCurve:
    """One FlashAttention implementation's forward+backward rate: ``over_fa2`` x the GPU's
    ``flash_max`` at long sequences, times ``causal_factor`` under a causal mask and the head-dim
    factor (``head_dim_64`` at 64, linear in log2 up to 1 at 128), times ``s / (s + s0)``."""

    over_fa2: float
    s0_noncausal: float
    s0_causal: float
    causal_factor: float
    head_dim_64: float


FLASH_CURVES = {
    # FlashAttention-2, fitted to its forward+backward figures (A100 80GB SXM4 and H100 SXM5, head
    # dim 64 and 128, seqlen 512..16k; flash-attention README, assets/flash2_{a100,h100}_fwd_bwd_
    # benchmark.png): s0 with rms error 0.8% without and 1.1% with a causal mask; causal kernels
    # reach 0.94-0.97 of the non-causal rate at long sequences; head dim 64 reaches 0.87 of head dim
    # 128's rate (A100 0.868, H100 0.874).
    "flash": FlashCurve(1.0, 190.0, 520.0, 0.95, 0.87),
    # FlashAttention v1 (flash-attn 1.x) and its Triton port (flash_attn_triton.py, which
    # llm-foundry ran as attn_impl "triton"), the kernels of 2022-23, fitted the same way to the
    # "FlashAttention" bars of the same two figures (rms error 5% over 48 bars): at long sequences
    # 0.41 of FlashAttention-2's rate on both GPUs (A100 84/205, H100 139/344, head dim 128, no
    # mask), saturating at shorter sequences and faster at head dim 64 than at 128.  The A100
    # figure's Triton bars lie within 15% of FA1's; the H100 figure has none, so the port takes
    # FA1's rate there.
    "flash1": FlashCurve(0.41, 60.0, 270.0, 0.946, 1.197),
    # cuDNN's fused attention (Transformer Engine's FusedAttention, what Megatron-LM and NeMo run):
    # FlashAttention-2's curve, times :func:`cudnn_over_fa2` for the GPU's generation.
    "cudnn": FlashCurve(1.0, 190.0, 520.0, 0.95, 0.87),
}
# cuDNN's fused attention over FlashAttention-2 on Hopper, forward and backward alike: FlashAttention-3
# paper (Shah et al. 2024, arXiv 2407.08608), Figs. 5-6, H100 80GB SXM5, BF16, head dim 128, sequence
# 4k-16k: forward FA2 319-370 vs cuDNN 518-609 TFLOP/s (1.61-1.65x), backward FA2 310-322 vs cuDNN
# 499-518 (1.60-1.63x).  Its kernels use Hopper's TMA and warpgroup MMA, which FA2 does not; on
# other generations no comparison was found and cuDNN is taken at FA2's rate (Blackwell's
# ``flash_max`` is already FlashAttention-4's, a Blackwell-native kernel).  At head dim 64 cuDNN's
# lead is smaller (forward 1.27x in the same paper); FA2's head-dim curve is kept.
CUDNN_OVER_FA2 = {"hopper": 1.6}


def flash_forward(both: float) -> float:
    """FlashAttention's forward efficiency from its forward+backward one: fwd + 2.5 x bwd FLOPs at
    efficiencies e and 0.86 e take as long as 3.5 at ``both``."""
    return both * (1.0 + FLASH_BWD_FLOPS / FLASH_BWD_OVER_FWD) / (1.0 + FLASH_BWD_FLOPS)


def cudnn_over_fa2(gpu_name: str) -> float:
    """How many times FlashAttention-2's rate cuDNN's fused attention reaches on this GPU's generation."""
    return CUDNN_OVER_FA2.get(GENERATIONS.get(gpu_name, ""), 1.0)


def head_dim_factor(head_dim: int, at_64: float) -> float:
    """FlashAttention's rate relative to head dim 128: ``at_64`` at 64, linear in log2 between."""
    if head_dim <= 0 or head_dim >= 128:
        return 1.0
    return max(0.5, 1.0 + (at_64 - 1.0) * math.log2(128 / head_dim))
