"""How long compute takes on a given accelerator.

A layer's time, in order of preference:

1. A calibration table of measured seconds per layer kind (``fwd``/``bwd`` per
   ``embedding``/``block``/``head``), scaled linearly by tokens from the tokens it was
   measured at.  Calibrated simulators reach a few percent of error; analytical ones
   rarely do.
2. ``efficiency`` given as a number: the flat roofline ``FLOPs / (peak * efficiency)``.
3. The layer's :class:`~zero_sim.system.workload.Work` (its FLOPs and bytes split by the
   kind of kernel that does them) on a GPU with a :class:`ComputeProfile`: the per-op model
   below.
4. Otherwise (a layer read off a torch module, or the ``CPU`` device) the flat roofline at
   the GPU's default efficiency: the GEMM efficiency of a 4096 x 4096 x 4096 matmul, or 0.5
   on the CPU.

The per-op model sums three kinds of kernels, run one after another on the compute stream:

* GEMMs: ``matmul_flops / (peak * e_gemm)``.  A GEMM reaches a fraction of peak that rises
  with its size and saturates below 1: ``e_gemm = e_max / (1 + (fill / t_ideal) ** 0.8)``,
  where ``t_ideal = 2MKN / (peak * e_max)`` is the GEMM's time at the saturated rate and
  ``fill`` the time scale over which the GPU fills its SMs.  ``e_max`` is the GPU's maximum
  achievable matmul FLOPs (MAMF); ``fill`` was fitted to published cuBLAS size sweeps.  A
  block's matmuls count as four GEMMs of ``M = tokens``, ``K = width`` and an equal share of
  the columns; a head's as one.  Backward is two GEMMs per forward GEMM (input and weight
  gradients) of the same size: twice the time.
* Attention: with FlashAttention, ``attention_flops`` (halved under a causal mask, as the
  kernel skips the masked half) at the implementation's efficiency, which rises with the
  sequence length as ``s / (s + s0)``; backward does 2.5x the forward FLOPs
  (FlashAttention-2's count) at 0.86 of the forward's efficiency.  ``flash`` is FlashAttention-2
  and later (torch SDPA's flash backend from torch 2.2); ``flash1`` is FlashAttention v1 or its
  Triton port, which reach about 0.41 of FA2's rate on the same figures; ``cudnn`` is cuDNN's
  fused attention (Transformer Engine), 1.6x FA2's rate on Hopper and FA2's elsewhere.  Eager
  attention runs the full ``attention_flops`` as two batched GEMMs (four in backward) that write and read the
  ``s x s`` scores through HBM; the softmax between them is in ``memory_bytes``.
* Memory-bound kernels (norms, activations, residuals, rotary, softmax over eager scores,
  loss): ``memory_bytes / (HBM bandwidth * elementwise fraction)``, the fraction eager PyTorch's
  element-wise and normalization kernels reach (measured per GPU, below a stream copy's);
  backward takes 2.6x the forward (the median of the same measurements).  Eager element-wise
  chains (the workload's ``elementwise`` setting) are in ``memory_bytes`` and take the same
  ratio.

Recompute re-runs the forward ("full") or, under "selective", the attention core alone.

Copies (FSDP's gradient copy-in, FSDP2's copy-out of gathered parameters) are memory-bound
kernels: the bytes they read and write at the stream-copy fraction of HBM bandwidth, as are
the scores eager attention's batched GEMMs write and read.

The optimizer step of mixed-precision Adam reads the bf16 gradient and the fp32 master
weights, momentum and variance, and writes the last three plus the bf16 parameters:
``2 + 12 + 12 + 2 = 28`` bytes of HBM traffic per parameter it owns, at the stream-copy
fraction of HBM bandwidth (its multi-tensor kernels stream large buffers; not measured).  A
per-parameter Python loop (``--optimizer-impl per-param``) moves 76 and launches 7 kernels a
tensor (:mod:`zero_sim.system.optimizer_kernels`).

Under ``--precision fp8`` the blocks' GEMMs take the GPU's FP8 peak on the same curve
(:meth:`ComputeModel.gemm_rate`; the model and its casts are :mod:`zero_sim.system.fp8`).

The GPUs' figures, with their sources, are in :mod:`zero_sim.system.gpus` and docs/compute.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from zero_sim.system.attention_kernels import (
    FLASH_BWD_FLOPS,
    FLASH_BWD_OVER_FWD,
    FLASH_CURVES,
    cudnn_over_fa2,
    flash_forward,
    head_dim_factor,
)
from zero_sim.system.elementwise import AUTOCAST_SCORE_BYTES
from zero_sim.system.gpus import GPU
from zero_sim.system.optimizer_kernels import OPTIMIZER_KERNELS

# --- the per-op model's shared constants --------------------------------------------------

# Exponent of the GEMM fill curve, fitted with the GPUs' fill times (gpus.py, ComputeProfile).
GEMM_FILL_EXPONENT = 0.8
# A transformer block's matmuls as separate GEMMs: QKV, output projection, MLP up, MLP down.
GEMMS_PER_BLOCK = 4
# The default GEMM efficiency (layers without a work breakdown) is the curve at this cube.
DEFAULT_GEMM_SIZE = 4096
# Backward of a GEMM: input gradient and weight gradient, each as many FLOPs as the forward.
GEMM_BWD_FLOPS = 2.0
# Backward of a memory-bound op takes this many times its forward: the median backward/forward
# time ratio of Liger-Kernel's PyTorch baselines at 16M-67M elements (benchmark/data/
# all_benchmark_data.csv; A100 Llama RMSNorm chain 2.60-2.61; H100 ReLU^2 2.37-2.44, add + RMSNorm
# chain 2.66-2.70, LayerNorm 2.09-2.70; docs/compute.md): autograd saves fp32 intermediates and
# launches more kernels backward than forward.
MEMORY_BWD_OVER_FWD = 2.6
# Eager attention's batched GEMMs move the s x s matrix through HBM: QK^T writes the bf16
# scores and scores.V reads the probabilities, 4 bytes per score element in forward (8 in
# backward).  The softmax between them (4 more bytes) is part of ``memory_bytes``.  With both,
# the FA2 benchmark's eager ("Pytorch") bars are reproduced within 8-25% (tests).
EAGER_BMM_SCORE_BYTES_FWD = 4
EAGER_SOFTMAX_SCORE_BYTES_FWD = 4

# The flat roofline's efficiency where no GPU profile applies (the CPU), as before.
FLAT_DEFAULT_EFFICIENCY = 0.5
FLAT_DEFAULT_MEMORY_EFFICIENCY = 0.8

ADAM_BYTES_PER_PARAM = OPTIMIZER_KERNELS["fused"].bytes_per_param


# Compute overlapped by a collective runs this much slower, for as long as the overlap lasts
# (engine rule 10).  NCCL's kernels hold SMs for as long as they run (about 16 on an 8-NIC DGX,
# NVIDIA/nccl issue 689; a GEMM sized for every SM then needs a second wave) and its NVLink
# traffic costs HBM bandwidth two to three times over (NVIDIA/nccl issue 1428).  The figure is
# PyTorch's for 8 x H100 over NVLink, "matmuls that are overlapped by them 30-40% slower"
# (pytorch/pytorch PR 179937), taken at its middle for every GPU: matmuls are most of a step's
# compute, and no per-generation figure of the same kind was found (docs/compute.md).
GPU_OVERLAP_SLOWDOWN = 0.35


def default_overlap_slowdown(gpu_name: str) -> float:
    """The stated slowdown of compute overlapped by communication: GPUs above, 0 for CPU ranks."""
    return 0.0 if gpu_name == "CPU" else GPU_OVERLAP_SLOWDOWN


@dataclass
class ComputeModel:
    """Seconds for each compute op: a calibration table, a flat roofline or the per-op model."""

    gpu: GPU
    # A number: the flat roofline at that fraction of peak.  None: the per-op model where a
    # layer has a work breakdown, else the GPU's default efficiency.
    efficiency: float | None = None
    # Fraction of HBM bandwidth memory-bound kernels and the optimizer reach (None: the GPU's).
    memory_efficiency: float | None = None
    # {"block": {"fwd": seconds, "bwd": seconds}, ...} measured at ``calibrated_tokens``.
    layer_seconds: dict[str, dict[str, float]] = field(default_factory=dict)
    calibrated_tokens: int = 0
    optimizer_seconds_per_param: float | None = None
    # Ranks are simulated alike, and a step waits on its slowest: every modelled time, and a
    # measured table (a rank's mean pace), is stretched by how much slower the slowest rank is
    # (measured by calibration, or ``gpu_spread.slowest_gpu_factor`` for the per-op model).
    slowest_rank_factor: float = 1.0
    # What whole runs lose that microbenchmarks do not see (zero_sim.system.run_overheads).
    run_overhead: float = 1.0
    # zero_sim.system.fp8.Fp8Training under --precision fp8: the blocks' GEMMs at its FP8 peak and
    # fraction of peak; None: every GEMM in bf16.
    fp8: Any = None
    # The step runs under torch.autocast (--precision amp): eager attention's softmax and dropout in
    # fp32 (zero_sim.system.elementwise.AUTOCAST_SCORE_BYTES).
    autocast: bool = False
    # HBM bytes of the optimizer's update per parameter (zero_sim.system.optimizer_kernels).
    optimizer_bytes_per_param: float = ADAM_BYTES_PER_PARAM

    @property
    def stretch(self) -> float:
        """Every modelled time is stretched by the slowest rank and the whole-run overhead."""
        return self.slowest_rank_factor * self.run_overhead

    # --- what applies ---------------------------------------------------------------------

    @property
    def hbm_efficiency(self) -> float:
        if self.memory_efficiency is not None:
            return self.memory_efficiency
        profile = self.gpu.profile
        return profile.hbm_efficiency if profile else FLAT_DEFAULT_MEMORY_EFFICIENCY

    @property
    def elementwise_efficiency(self) -> float:
        """Fraction of HBM bandwidth a layer's memory-bound kernels (norms, activations, adds, softmax,
        loss) reach; copies and the optimizer's multi-tensor kernels reach ``hbm_efficiency``."""
        if self.memory_efficiency is not None:
            return self.memory_efficiency
        profile = self.gpu.profile
        if profile is None:
            return FLAT_DEFAULT_MEMORY_EFFICIENCY
        return profile.elementwise_efficiency or profile.hbm_efficiency

    @property
    def default_efficiency(self) -> float:
        """Fraction of peak for a layer with no work breakdown (or any layer, given ``efficiency``)."""
        if self.efficiency is not None:
            return self.efficiency
        if self.gpu.profile is None:
            return FLAT_DEFAULT_EFFICIENCY
        n = DEFAULT_GEMM_SIZE
        return self.gemm_efficiency(n, n, n)

    def _table(self, kind: str, direction: str) -> float | None:
        table = self.layer_seconds.get(kind)
        if table and direction in table and self.calibrated_tokens:
            return table[direction]
        return None

    def per_op(self, kind: str, direction: str, work: Any) -> bool:
        """Whether the per-op model times this layer (no table, no flat efficiency, a breakdown)."""
        return (self._table(kind, direction) is None and self.efficiency is None
                and work is not None and self.gpu.profile is not None)

    # --- layers -----------------------------------------------------------------------------

    def layer_time(self, kind: str, direction: str, flops: float, tokens: int, work: Any = None) -> float:
        """Time of ``direction`` in {fwd, bwd} for a layer of ``kind`` on ``tokens`` tokens.

        ``flops`` are the layer's FLOPs in that direction (model FLOPs); ``work`` its forward
        :class:`~zero_sim.system.workload.Work`, when known."""
        measured = self._table(kind, direction)
        if measured is not None:
            seconds = measured * tokens / self.calibrated_tokens
        elif not self.per_op(kind, direction, work):
            seconds = flops / (self.gpu.peak_flops * self.default_efficiency)
        else:
            seconds = sum(self.op_seconds(kind, direction, work).values())
        return seconds * self.stretch

    def recompute_time(self, kind: str, mode: str, fwd_flops: float, flops: float, tokens: int,
                       work: Any = None) -> float:
        """Forward work re-run in backward: all of it ("full"), the attention core ("selective"),
        or, under op-level checkpointing ("op"), the dropped projections' GEMMs and every
        memory-bound op, the attention kernel's output being kept.

        ``flops`` are the recomputed FLOPs the workload counts; without the per-op model the
        time is the forward's, scaled by ``flops / fwd_flops``."""
        if not flops:
            return 0.0
        full = self.layer_time(kind, "fwd", fwd_flops, tokens, work)
        if mode == "full":
            return full
        if not self.per_op(kind, "fwd", work):
            return full * flops / max(fwd_flops, 1.0)
        if mode == "op":
            parts = self.op_seconds(kind, "fwd", work)
            return (parts["gemm"] * flops / max(work.matmul_flops, 1.0) + parts["memory"]) \
                * self.stretch
        seconds = self.attention_seconds("fwd", work)
        if work.attention == "eager":  # and the softmax over the scores
            softmax = EAGER_SOFTMAX_SCORE_BYTES_FWD * _score_elements(work)
            seconds += self._elementwise_seconds(min(work.memory_bytes, softmax))
        return seconds * self.stretch

    def op_seconds(self, kind: str, direction: str, work: Any) -> dict[str, float]:
        """The per-op model's seconds for ``gemm``, ``attention`` and ``memory`` kernels."""
        mult = 1.0 if direction == "fwd" else MEMORY_BWD_OVER_FWD
        dequantize = getattr(work, "dequantize_bytes", 0.0)  # quantized weights, once each way
        # kernels counted op by op in each direction (Hugging Face's chains), outside the rule above
        listed = getattr(work, "listed_bytes_fwd" if direction == "fwd" else "listed_bytes_bwd", 0.0)
        if self.autocast and work.attention == "eager":
            listed += AUTOCAST_SCORE_BYTES[0 if direction == "fwd" else 1] * _score_elements(work)
        return {"gemm": self.gemm_seconds(kind, direction, work),
                "attention": self.attention_seconds(direction, work),
                "memory": self._elementwise_seconds(work.memory_bytes) * mult
                + self._elementwise_seconds(dequantize) + self._elementwise_seconds(listed)}

    # --- kernels ----------------------------------------------------------------------------

    def gemm_efficiency(self, m: float, k: float, n: float) -> float:
        """Fraction of peak an ``m x k`` by ``k x n`` GEMM reaches on this GPU."""
        return self._gemm_efficiency_flops(2.0 * m * k * n)

    def _gemm_efficiency_flops(self, flops: float, peak: float | None = None, e_max: float | None = None
                               ) -> float:
        """The GEMM curve at ``peak`` and ``e_max`` (default: the GPU's bf16 ones)."""
        profile = self.gpu.profile
        if profile is None:
            return self.default_efficiency
        peak = peak or self.gpu.peak_flops
        e_max = e_max or profile.gemm_max
        if flops <= 0:
            return e_max
        ideal = flops / (peak * e_max)
        return e_max / (1.0 + (profile.gemm_fill_us * 1e-6 / ideal) ** GEMM_FILL_EXPONENT)

    def gemm_rate(self, kind: str) -> tuple[float, float | None]:
        """Peak FLOP/s and e_max of a layer's GEMMs: FP8's for the blocks under ``--precision fp8``
        (zero_sim.system.fp8), else the GPU's bf16 (None: the profile's)."""
        if self.fp8 is not None and self.fp8.runs_gemms(kind):
            return self.fp8.peak_flops, self.fp8.gemm_max
        return self.gpu.peak_flops, None

    def gemm_seconds(self, kind: str, direction: str, work: Any) -> float:
        flops = work.matmul_flops
        if not flops:
            return 0.0
        peak, e_max = self.gemm_rate(kind)
        m, k = work.tokens, work.width
        if m > 0 and k > 0:
            n = flops / (2.0 * m * k) / (1 if kind == "head" else GEMMS_PER_BLOCK)
            eff = self._gemm_efficiency_flops(2.0 * m * k * n, peak, e_max)
        else:
            eff = self.default_efficiency
        if direction != "fwd":  # dX and dW, but no dW for a frozen weight
            flops = GEMM_BWD_FLOPS * flops - work.frozen_matmul_flops
        return flops / (peak * eff)

    def flash_efficiency(self, direction: str, seq_len: int, head_dim: int, causal: bool = True,
                         impl: str = "flash") -> float:
        """Fraction of peak FlashAttention (``flash``: FA2 and later; ``flash1``: FA1 or its Triton
        port) reaches in ``direction`` at this shape."""
        profile = self.gpu.profile
        if profile is None:
            return self.default_efficiency
        curve, s = FLASH_CURVES[impl], max(seq_len, 1)
        s0 = curve.s0_causal if causal else curve.s0_noncausal
        both = profile.flash_max * curve.over_fa2 * (curve.causal_factor if causal else 1.0)
        if impl == "cudnn":
            both *= cudnn_over_fa2(self.gpu.name)
        both *= head_dim_factor(head_dim, curve.head_dim_64) * s / (s + s0)
        fwd = flash_forward(both)
        return fwd if direction == "fwd" else fwd * FLASH_BWD_OVER_FWD

    def kernel_ceilings(self, attention: str = "flash") -> dict[str, float]:
        """The most of the dense bf16 peak each kernel family doing model FLOPs reaches, at any
        size: ``gemm`` (the curve's saturation; FP8's under fp8) and ``attention`` (the forward at
        long sequences, best head dim, no mask; eager's batched GEMMs are GEMMs).  MFU, which counts
        no FLOP a kernel skips, stays below the larger (docs/compute.md)."""
        profile = self.gpu.profile
        if self.efficiency is not None or profile is None:
            return {"gemm": self.default_efficiency, "attention": self.default_efficiency}
        gemm = profile.gemm_max
        if self.fp8 is not None:
            gemm = max(gemm, self.fp8.gemm_max * self.fp8.peak_flops / self.gpu.peak_flops)
        if attention == "eager":
            return {"gemm": gemm, "attention": profile.gemm_max}
        curve = FLASH_CURVES[attention]
        both = profile.flash_max * curve.over_fa2 * max(1.0, curve.head_dim_64)
        if attention == "cudnn":  # cuDNN's fused attention outruns FA2 on Hopper, as its time does
            both *= cudnn_over_fa2(self.gpu.name)
        return {"gemm": gemm, "attention": flash_forward(both)}

    def attention_seconds(self, direction: str, work: Any) -> float:
        flops = work.attention_flops
        if not flops:
            return 0.0
        if work.attention == "eager":
            # QK^T and scores.V, each half the FLOPs, batched over micro-batch x heads, and their
            # s x s reads and writes; backward runs four such GEMMs.
            eff = self._gemm_efficiency_flops(flops / 2.0)
            mult = 1.0 if direction == "fwd" else GEMM_BWD_FLOPS
            scores = EAGER_BMM_SCORE_BYTES_FWD * _score_elements(work)
            return mult * (flops / (self.gpu.peak_flops * eff) + self._memory_seconds(scores))
        causal = work.causal
        done = flops * (0.5 if causal else 1.0)  # the kernel skips the masked half
        eff = self.flash_efficiency(direction, work.seq_len, work.head_dim, causal, work.attention)
        mult = 1.0 if direction == "fwd" else FLASH_BWD_FLOPS
        return mult * done / (self.gpu.peak_flops * eff)

    def _memory_seconds(self, nbytes: float) -> float:
        """A copy, a multi-tensor kernel or a GEMM's operand traffic moving ``nbytes``: the stream-copy
        fraction of HBM bandwidth."""
        if not nbytes:
            return 0.0
        return nbytes / (self.gpu.hbm_gbps * 1e9 * self.hbm_efficiency)

    def _elementwise_seconds(self, nbytes: float) -> float:
        """A layer's eager element-wise or normalization kernels moving ``nbytes``."""
        if not nbytes:
            return 0.0
        return nbytes / (self.gpu.hbm_gbps * 1e9 * self.elementwise_efficiency)

    # --- the rest ---------------------------------------------------------------------------

    def optimizer_time(self, params: int) -> float:
        if self.optimizer_seconds_per_param is not None:
            return params * self.optimizer_seconds_per_param
        return self._memory_seconds(params * self.optimizer_bytes_per_param) * self.stretch

    def copy_time(self, nbytes: float) -> float:
        """A memory-bound copy kernel that moves ``nbytes`` (reads plus writes) through HBM."""
        return self._memory_seconds(nbytes) * self.stretch

    def elementwise_time(self, nbytes: float) -> float:
        """A standalone element-wise kernel moving ``nbytes`` (reads plus writes), at the fraction of
        HBM bandwidth a layer's element-wise kernels reach (FP8's casts, ZeRO++'s quantize and dequantize)."""
        return self._elementwise_seconds(nbytes) * self.stretch

    @property
    def calibrated(self) -> bool:
        return bool(self.layer_seconds)


def _score_elements(work: Any) -> float:
    """Entries of the attention score matrices, b * heads * s * s_k: the attention FLOPs over 4d."""
    head_dim = work.head_dim or (work.width // work.heads if work.heads else 0)
    return work.attention_flops / (4.0 * head_dim) if head_dim else 0.0
