"""FP8 training of the blocks' linear layers: what it speeds up, what it costs, what it sends.

``--precision fp8`` simulates torchao's float8 training as torchtitan applies it (its float8
converter swaps each ``nn.Linear`` for ``torchao.float8.Float8Linear``): bf16 mixed precision
everywhere, fp32 master weights and Adam state (K = 12, as ``mixed``), except that the three GEMMs
of every linear layer of every transformer block (forward, input gradient, weight gradient) run
on FP8 tensor cores.  The recipe is torchao's **tensorwise dynamic scaling**, torchtitan's
default while its jobs were TOML files (``[float8] recipe_name`` unset; torchtitan's later
Python configs default to rowwise, which is not modelled): each GEMM operand gets one scale,
``max_fp8 / amax(|x|)``, computed from the tensor itself every time it is cast.  By these rules:

* **which GEMMs**: the block projections (Llama's ``wq``, ``wk``, ``wv``, ``wo``, ``w1``, ``w2``,
  ``w3``; GPT-2's ``c_attn``, ``c_proj``, ``c_fc``); the LM head stays bf16, as torchtitan's train
  configs filter it (``filter_fqns = ["output"]``); attention's core (FlashAttention), norms,
  rotary, activations and the loss stay bf16.
* **how fast**: a GEMM's time is the per-op model's GEMM curve (:mod:`zero_sim.system.hardware`)
  with the GPU's dense FP8 peak (``GPU.fp8_tflops``, vendor data sheets) in place of its bf16 peak,
  at the same fraction of peak (``e_max``) and the same fill time.  The fraction is an assumption
  that PyTorch's own float8 roofline makes (pytorch/ao ``torchao/testing/training/roofline_utils.py``
  takes one ``pct_achievable_gemm_tops``, 0.78 measured on H100, for bf16 and float8 GEMMs alike),
  and FBGEMM's H100 (500 W) figures bear out at large shapes (pytorch/FBGEMM PR 2546: bf16 546-585
  TFLOP/s, fp8 row-scaled GEMM alone 1,083-1,141, 1.88-2.09x); a large GEMM then runs 2x faster, a
  small one less, since its fixed fill time weighs more.
* **what the casts cost** (:data:`CAST_BYTES`): every cast of an operand to float8 is a
  memory-bound kernel chain charged as simulated ``fp8_cast L<i>`` ops on the compute stream, one
  before each block's forward and one before its backward, at the element-wise fraction of HBM
  bandwidth (the existing model of a layer's memory-bound kernels, :mod:`zero_sim.system.hardware`).
  Compiled (``elementwise`` fused, as torchtitan's float8 guide requires "for competitive
  performance"), the bytes are those of torchao's roofline for the tensorwise recipe (an amax read,
  then one kernel writing the row- and column-major float8 copies); eager, the chain of ATen
  kernels torchao's code runs for each cast (``abs``, ``max``, ``to(float32)``, ``* scale``,
  ``clamp``, ``to(float8)``: 33 bytes an element) and the transposed copies ``torch._scaled_mm``
  needs.  Full recompute casts the forward's operands again.
* **FSDP's float8 all-gather** (``--fp8-all-gather``, torchtitan's ``enable_fsdp_float8_all_gather``
  with ``precompute_float8_dynamic_scale_for_fsdp``): FSDP2 casts each linear weight's fp32 shard to
  float8 before gathering it (torchao ``WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather``), so
  those weights are gathered (and held gathered) at 1 byte an element instead of 2; norms and the
  root's embedding and head stay bf16.  The weights' amaxes are computed once per step after the
  optimizer (``torch._foreach_norm(ord=inf)`` over the fp32 shards) and reduced across the shard
  group in one all-reduce of one fp32 value per linear weight (``all_reduce amax``); the forward
  then needs no weight cast, and backward's input-gradient GEMM needs the gathered float8 weight
  transposed (one byte read and one written an element).

Not modelled: the rowwise recipes, delayed scaling, float8 for the LM head or attention, per-weight
amax all-reduces (fp8 all-gather without precomputed scales), saved activations held in float8
under compile (activations are counted as bf16), the host cost of the extra eager kernels, and
Transformer Engine's recipes (delayed scaling with amax histories).
"""

from __future__ import annotations

from dataclasses import dataclass

from zero_sim.system.gpus import GPU, GPUS
from zero_sim.system.lora import projections
from zero_sim.system.workload import Layer, Workload, WorkloadError

RECIPE = "tensorwise"
# FP8 GEMMs reach this fraction of the GPU's bf16 GEMM e_max, as a fraction of the FP8 peak:
# pytorch/ao roofline_utils uses one pct_achievable_gemm_tops for both dtypes, and pytorch/FBGEMM
# PR 2546 measured fp8 GEMMs at 1.88-2.09x bf16's TFLOP/s on an H100 at large shapes (no published
# fp8 MAMF sweep over sizes was found; docs/fp8.md gives a cuBLAS check that reached less).
FP8_GEMM_MAX_OVER_BF16 = 1.0
AMAX_BYTES = 4  # one fp32 amax per linear weight in the precomputed-scale all-reduce
FP32_SHARD_BYTES = 4  # FSDP2's sharded parameter under bf16 mixed precision is the fp32 master

# HBM bytes per element of each GEMM operand to get it into float8, forward and backward, for one
# linear layer.  "compiled": torchao roofline_utils get_tensor_memory_traffic_ovhd_s, tensorwise,
# not fused with the previous op: input and grad_output an amax read (2) and one kernel reading
# bf16 (2) and writing row- and column-major float8 (1 + 1); the weight an amax read (2), a forward
# cast (2 + 1) and a backward cast (2 + 1).  "eager": one hp_tensor_to_float8_dynamic per operand
# use, as torchao's Float8Linear autograd function calls it (forward: input, weight; backward:
# grad_output twice, weight, input), each abs (2+2), max (2), to(float32) (2+4), * scale (4+4),
# clamp (4+4), to(float8) (4+1) = 33 bytes; plus the copy to the layout torch._scaled_mm takes
# (1+1) for the weight and both weight-gradient operands in backward.
EAGER_CAST = 33
CAST_BYTES = {
    "compiled": {"input": (6, 0), "weight": (5, 3), "grad_output": (0, 6)},
    "eager": {"input": (EAGER_CAST, EAGER_CAST + 2), "weight": (EAGER_CAST, EAGER_CAST + 2),
              "grad_output": (0, 2 * EAGER_CAST + 2)},
}
# With the float8 all-gather the weight arrives in float8: no cast in the layer forward; backward's
# input-gradient GEMM reads it transposed (1 + 1).  The cast itself runs on each fp32 shard before
# each gather (read 4, write 1), and the precomputed amax reads each shard once a step.
GATHERED_WEIGHT_BWD_BYTES = 2
SHARD_CAST_BYTES = FP32_SHARD_BYTES + 1


def fp8_gpus() -> tuple[str, ...]:
    """The GPU presets with FP8 tensor cores."""
    return tuple(name for name, gpu in GPUS.items() if gpu.fp8_tflops is not None)


@dataclass(frozen=True)
class BlockLinears:
    """One block's float8 linear layers on one micro-batch: elements of their inputs, outputs
    (the gradients backward casts) and weights, and how many there are."""

    inputs: int
    outputs: int
    weights: int
    count: int


@dataclass(frozen=True)
class Fp8Training:
    """The FP8 model of one run: which layers' GEMMs run in FP8 and at what rate, the casts each
    block pays, and the float8 all-gather's bytes (module docstring)."""

    gpu: GPU
    linears: BlockLinears
    compiled: bool  # casts fused by torch.compile (elementwise "fused"), else torchao's eager chains
    all_gather: bool = False  # FSDP2's float8 all-gather with precomputed scales
    recipe: str = RECIPE

    @property
    def peak_flops(self) -> float:
        return self.gpu.fp8_peak_flops

    @property
    def gemm_max(self) -> float:
        return self.gpu.profile.gemm_max * FP8_GEMM_MAX_OVER_BF16

    @staticmethod
    def runs_gemms(kind: str) -> bool:
        """Whether a layer of ``kind`` runs its GEMMs in FP8: the blocks, not the head."""
        return kind == "block"

    def cast_bytes(self, layer: Layer, direction: str, shard_ranks: int = 1, full_recompute: bool = False
                   ) -> float:
        """HBM bytes of the float8 casts before ``layer``'s ``direction`` ("fwd" or "bwd"); with the
        float8 all-gather, the cast of this rank's shard (1/``shard_ranks`` of the weights) before the
        gather, once per pass.  Full recompute casts the forward's operands again in backward."""
        if not self.runs_gemms(layer.kind):
            return 0.0
        table, lin = CAST_BYTES["compiled" if self.compiled else "eager"], self.linears
        k = 0 if direction == "fwd" else 1
        weight = table["weight"][k]
        if self.all_gather:
            weight = (GATHERED_WEIGHT_BWD_BYTES if k else 0) + SHARD_CAST_BYTES / shard_ranks
        nbytes = (table["input"][k] * lin.inputs + table["grad_output"][k] * lin.outputs
                  + weight * lin.weights)
        if k and full_recompute:
            nbytes += self.cast_bytes(layer, "fwd", shard_ranks)
        return float(nbytes)

    def gathered_bytes(self, layers: list[Layer], param_bytes: int) -> int:
        """Bytes a unit holding ``layers`` gathers: float8 linear weights at 1 byte under the float8
        all-gather, everything else at ``param_bytes``."""
        numel = sum(layer.numel for layer in layers)
        if not self.all_gather:
            return numel * param_bytes
        fp8 = sum(self.linears.weights for layer in layers if self.runs_gemms(layer.kind))
        return fp8 + (numel - fp8) * param_bytes

    def amax_bytes(self, workload: Workload) -> tuple[int, int]:
        """With precomputed scales: (bytes the per-step amax all-reduce sends, the count of weights)."""
        blocks = sum(1 for layer in workload.layers if self.runs_gemms(layer.kind))
        return AMAX_BYTES * blocks * self.linears.count, blocks * self.linears.count

    def record(self) -> dict:
        """What the JSON output says of FP8: what ran in float8, at what peak, the casts and the source."""
        return {"summary": self.describe(), "recipe": self.recipe, "fp8_layers": "block linear layers",
                "bf16_layers": "LM head, attention core, norms, embedding", "fp8_tflops": self.gpu.fp8_tflops,
                "gemm_max": self.gemm_max, "casts": "compiled" if self.compiled else "eager",
                "fp8_all_gather": self.all_gather,
                "source": "GEMM fraction of peak: pytorch/ao torchao/testing/training/roofline_utils.py; "
                          "cast bytes: its tensorwise roofline (compiled) or torchao.float8's code (eager)"}

    def describe(self) -> str:
        gather = "; FSDP all-gathers the linear weights in float8 (scales precomputed once a step)" \
            if self.all_gather else ""
        casts = "compiled casts (torchao roofline bytes)" if self.compiled else \
            "eager casts (torchao's ATen chain per cast, torch.compile fuses them)"
        return (f"fp8: block linear GEMMs on FP8 tensor cores ({self.gpu.fp8_tflops:,.0f} TFLOP/s dense, "
                f"same fraction of peak as bf16: pytorch/ao roofline_utils), {self.recipe} dynamic scaling, "
                f"{casts}; LM head, attention, norms in bf16{gather}; MFU counts against the bf16 peak")


def block_linears(workload: Workload) -> BlockLinears:
    """The float8 linears of one block of ``workload``: one per projection (lora.projections),
    each casting its own input, as torchtitan's Llama has separate ``wq``, ``wk``, ``wv``."""
    shape = workload.shape
    if shape is None:
        raise WorkloadError("--precision fp8 needs a model built from its shape (a preset, --params or shape "
                            "flags); a model read off a module has no named linear layers to run in FP8")
    if shape.cross_attention:
        raise WorkloadError("--precision fp8 is not modelled for encoder-decoder models (cross-attention "
                            "blocks); use a decoder-only model or --precision mixed")
    tokens = workload.tokens_per_micro_batch
    table = projections(shape).values()
    return BlockLinears(inputs=tokens * sum(d_in for _, d_in, _ in table),
                        outputs=tokens * sum(d_out for _, _, d_out in table),
                        weights=sum(d_in * d_out for _, d_in, d_out in table), count=len(table))


def fp8_training(gpu: GPU, workload: Workload, all_gather: bool = False) -> Fp8Training:
    """The FP8 model for ``workload`` on ``gpu``; a GPU without FP8 tensor cores is one sentence."""
    if gpu.fp8_tflops is None or gpu.profile is None:
        raise WorkloadError(f"--precision fp8 needs FP8 tensor cores, which the {gpu.name} does not have "
                            f"(NVIDIA's from Ada and Hopper on, AMD's from the MI300); use one of "
                            f"{', '.join(fp8_gpus())} or --precision mixed")
    return Fp8Training(gpu, block_linears(workload), compiled=workload.elementwise == "fused",
                       all_gather=all_gather)


__all__ = ["CAST_BYTES", "RECIPE", "BlockLinears", "Fp8Training", "block_linears", "fp8_gpus", "fp8_training"]
