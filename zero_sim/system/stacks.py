"""Software stacks: the bundles of kernel and framework choices users recognise by name.

The same model on the same GPUs runs at very different speeds under different software: a
FlashAttention kernel or softmax over materialized scores, norms and rotary embeddings fused
by torch.compile or run as chains of eager ATen ops, FSDP1's or FSDP2's copies, gradients
reduced in bf16 or fp32, and the host time eager Python spends issuing each kernel.  A stack
names one such bundle; ``stack=`` (``--stack``) sets every knob it bundles, and a knob given
explicitly wins (noted as ``overridden: elementwise=fused (stack pytorch-eager)``).

**The default is ``pytorch-eager``**, what most people run today.  The four codebases most
training starts from all default to eager PyTorch with SDPA attention and no torch.compile:
torchtitan's job configs ship ``compile = false`` (its ``[compile]`` section) and its Llama RMSNorm
is an eager chain unless the fused Triton norm is asked for; Hugging Face transformers uses
``attn_implementation="sdpa"`` by default since v4.36 and its LlamaRMSNorm and rotary are eager
Python; Lightning's Trainer compiles nothing unless told; llm-foundry's MPT defaults to
``attn_impl: flash``.  For FSDP three of the four wrap with FSDP1 (Accelerate's default
``fsdp_version`` 1, Lightning's ``FSDPStrategy``, Composer in llm-foundry), so the default keeps
FSDP1's copies; ``torchtitan`` names FSDP2.  The fastest stack the kernels allow, what the
simulator assumed before stacks existed, is ``ideal``; CPU ranks (the emulated cluster, whose
costs come from their own calibration) use it unless a stack is named.

Every choice carries its source in ``sources``; docs/stacks.md tabulates them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from zero_sim.strategies.capabilities import PYTORCH
from zero_sim.system.names import NameError_, canonical

# Host time per dispatched op in eager PyTorch: the middle of the 5-25 us that walkthroughs of
# the Python -> dispatcher -> cudaLaunchKernel path give (zero_sim.system.host_costs).
EAGER_KERNEL_HOST_US = 10.0
# torch.compile's Inductor wrapper launches Triton kernels from generated Python with one autograd
# node per compiled region: about half the eager path (no per-op autograd or dispatcher walk).
COMPILED_KERNEL_HOST_US = 5.0


@dataclass(frozen=True)
class Stack:
    """One software stack: the settings it bundles (None: not part of this stack) and why."""

    name: str
    summary: str
    attention: str
    elementwise: str
    kernel_host_us: float  # host time per dispatched op (0: the flat per-op host_overhead_us only)
    step_host_ms: float  # the training loop's own host work per optimizer step, ending in a sync
    copies: str | None = None  # FSDP's compute-stream copies (fsdp strategy only)
    # The precision the trainer runs the model in where PyTorch runs it (ddp, fsdp): ``amp`` for a
    # trainer that wraps the step in torch.autocast; a DeepSpeed engine follows its own config's.
    precision: str | None = None
    param_dtype: str | None = None  # FSDP's MixedPrecision policy: gathered weights (fsdp only)
    reduce_dtype: str | None = None  # and reduced gradients (fsdp only)
    grad_accum_dtype: str | None = None  # what the trainer accumulates gradients in (every strategy)
    gradient_as_bucket_view: bool | None = None  # DDP reduces from the gradients' own buffer (ddp only)
    # How the trainer's own optimizer runs Adam (zero_sim.system.optimizer_kernels); a DeepSpeed engine
    # runs its own FusedAdam.
    optimizer_impl: str | None = None
    # Gradients accumulated in fp32 by the trainer's own hook, which adds each half-precision .grad
    # into the fp32 buffer and drops it (Megatron's main_grad): no copy kept beside them, whatever the
    # strategy (zero_sim.scenario.precision).
    hook_accumulates: bool = False
    sources: dict[str, str] = field(default_factory=dict)

    def settings(self) -> dict[str, object]:
        """Every setting the stack fills, by ``simulate()`` keyword."""
        values = {"attention": self.attention, "elementwise": self.elementwise,
                  "kernel_host_us": self.kernel_host_us, "step_host_ms": self.step_host_ms,
                  "copies": self.copies, "precision": self.precision, "param_dtype": self.param_dtype,
                  "reduce_dtype": self.reduce_dtype, "grad_accum_dtype": self.grad_accum_dtype,
                  "gradient_as_bucket_view": self.gradient_as_bucket_view,
                  "optimizer_impl": self.optimizer_impl}
        return {k: v for k, v in values.items() if v is not None}


_SDPA = ("Hugging Face transformers: attn_implementation='sdpa' is the default since v4.36; torch's "
         "scaled_dot_product_attention runs FlashAttention-2 kernels for bf16 on Ampere and newer")
_EAGER_CHAINS = ("norms and rotary as eager ATen chains (HF LlamaRMSNorm and apply_rotary_pos_emb; "
                 "torchtitan's RMSNorm without its fused Triton option)")
_HF_CHAINS = ("Hugging Face modelling code: norms and rotary as eager ATen chains, eager attention's scale, "
              "causal torch.where, padding mask and softmax as separate kernels (GPT2Attention._attn, "
              "BertSelfAttention), GPT-2's gelu_new as a Python chain (activations.NewGELUActivation)")
_EAGER_HOST = "eager PyTorch: 5-25 us of CPU per dispatched op (zero_sim.system.host_costs); 10 us taken"
_STEP = ("clip_grad_norm_, optimizer.step with foreach kernels, zero_grad and the LR scheduler: about "
         "a hundred Python calls and a loss read per step, taken as 1 ms")

_AMP_HF = ("Trainer's bf16=True / fp16=True: Accelerate wraps the forward in torch.autocast and the model "
           "keeps fp32 weights; DDP all-reduces their fp32 gradients (under DeepSpeed, its config decides)")
_ACCELERATE_FSDP = ("Accelerate's FullyShardedDataParallelPlugin.set_mixed_precision: "
                    "MixedPrecision(param_dtype=bf16, reduce_dtype=bf16, buffer_dtype=bf16) over fp32 "
                    "sharded weights")
_LIGHTNING_FSDP = ("Lightning's FSDPPrecision.mixed_precision_config for bf16-mixed: param_dtype float32, "
                   "reduce_dtype and buffer_dtype bfloat16")

STACKS: dict[str, Stack] = {s.name: s for s in (
    Stack("pytorch-eager", "eager PyTorch 2.x: SDPA (FlashAttention-2) attention, eager norms and rotary, "
          "no torch.compile, FSDP1 or DDP", "flash", "eager", EAGER_KERNEL_HOST_US, 1.0,
          sources={"attention": _SDPA, "elementwise": _EAGER_CHAINS, "kernel_host_us": _EAGER_HOST,
                   "step_host_ms": _STEP,
                   "default": "torchtitan (compile = false), HF Trainer, Lightning and llm-foundry all "
                              "default to eager PyTorch without torch.compile"}),
    Stack("torch-compile", "PyTorch 2.x with torch.compile on each block: SDPA attention, norms, rotary and "
          "activations fused by Inductor", "flash", "fused", COMPILED_KERNEL_HOST_US, 1.0,
          sources={"attention": _SDPA, "elementwise": "Inductor fuses the element-wise chains around each "
                   "GEMM into Triton kernels", "kernel_host_us": "Inductor's generated wrapper launches "
                   "each Triton kernel from Python, one autograd node per region: 5 us taken",
                   "step_host_ms": _STEP}),
    Stack("torchtitan", "torchtitan (2024-25) defaults: FSDP2 fully_shard with fp32 gradient reduction, SDPA "
          "attention, eager RMSNorm and rotary, compile off", "flash", "eager", EAGER_KERNEL_HOST_US, 1.0,
          copies="fsdp2", reduce_dtype="fp32",
          sources={"copies": "torchtitan shards with FSDP2 fully_shard (its copy-out of each gather and "
                   "copy-in of each gradient)",
                   "reduce_dtype": "torchtitan's training.mixed_precision_reduce defaults to float32",
                   "attention": "torchtitan's Llama uses F.scaled_dot_product_attention",
                   "elementwise": "torchtitan's default norm_type rmsnorm is an eager chain; compile = false",
                   "kernel_host_us": _EAGER_HOST, "step_host_ms": _STEP}),
    Stack("fsdp1-2023", "FSDP1-era code (2022-23): FSDP1, softmax attention over materialized scores, eager "
          "element-wise ops", "eager", "eager", EAGER_KERNEL_HOST_US, 1.0,
          sources={"attention": "before SDPA (torch 2.0, 2023) and HF's switch to it, model code computed "
                   "softmax(QK^T)V in torch ops (minGPT, HF modelling before v4.36)",
                   "elementwise": "no fused kernels in plain model code of the time",
                   "kernel_host_us": _EAGER_HOST, "step_host_ms": _STEP}),
    Stack("deepspeed-2021", "DeepSpeed (2021) ZeRO examples: softmax attention over scores, apex or "
          "DeepSpeed fused LayerNorm, eager training loop with fp16 overflow checks", "eager", "fused",
          EAGER_KERNEL_HOST_US, 2.0,
          sources={"attention": "HF BERT/GPT-2 modelling code of 2021 (no SDPA)",
                   "elementwise": "apex FusedLayerNorm / DeepSpeed transformer kernels",
                   "kernel_host_us": _EAGER_HOST,
                   "step_host_ms": "the DeepSpeed engine's step: gradient-overflow check read on the host, "
                                   "clipping and the optimizer's Python loop: 2 ms taken"}),
    Stack("deepspeed", "DeepSpeed (2023-25) under Hugging Face models: SDPA attention, eager norms and "
          "rotary, the DeepSpeed engine's step", "flash", "eager", EAGER_KERNEL_HOST_US, 2.0,
          sources={"attention": _SDPA, "elementwise": _EAGER_CHAINS, "kernel_host_us": _EAGER_HOST,
                   "step_host_ms": "the DeepSpeed engine's step: overflow and gradient-norm checks read on "
                                   "the host, clipping and the optimizer: 2 ms taken"}),
    Stack("megatron", "Megatron-LM / NeMo with Transformer Engine: fused attention (FlashAttention or "
          "cuDNN), fused norms, rotary and bias-activation kernels", "cudnn", "fused",
          EAGER_KERNEL_HOST_US, 1.0,
          sources={"attention": "Transformer Engine's DotProductAttention runs cuDNN's FusedAttention on "
                                "Hopper and newer: its backend selection disables FlashAttention 'to give "
                                "FusedAttention preference on Hopper+' (transformer_engine/pytorch/attention/"
                                "dot_product_attention/utils.py, get_attention_backend)",
                   "elementwise": "TE LayerNorm/RMSNorm kernels, apply_rope_fusion, bias-SwiGLU/GeLU fusion",
                   "kernel_host_us": "eager PyTorch launching fewer, fused kernels: 10 us per op taken",
                   "step_host_ms": _STEP,
                   "grad_accum_dtype": "Megatron-LM's validate_args sets "
                                       "accumulate_allreduce_grads_in_fp32 whenever --bf16 is given: "
                                       "main_grad buffers in fp32, reduced in fp32",
                   "gradient_as_bucket_view": "Megatron's DistributedDataParallel reduces its buckets "
                                              "straight from the contiguous main_grad buffer that the "
                                              "gradients are views of: no second copy"},
          grad_accum_dtype="fp32", gradient_as_bucket_view=True, hook_accumulates=True),
    Stack("hf-trainer", "Hugging Face Trainer or Accelerate: SDPA attention, eager norms and rotary, FSDP1, "
          "AMP (autocast over fp32 weights), a loss check read on the host every step", "flash", "eager-hf",
          12.0, 3.0,
          sources={"attention": _SDPA, "elementwise": _HF_CHAINS,
                   "kernel_host_us": "eager PyTorch (10 us) plus HF modules' keyword plumbing and the "
                                     "autocast dispatch key on every op: 12 us taken",
                   "step_host_ms": "Trainer's logging_nan_inf_filter (default True) reads torch.isnan(loss) "
                                   "on the host each step; callbacks, scheduler and clipping through "
                                   "Accelerate: 3 ms taken",
                   "copies": "Accelerate's FSDP plugin defaults to fsdp_version 1",
                   "precision": _AMP_HF, "param_dtype": _ACCELERATE_FSDP, "reduce_dtype": _ACCELERATE_FSDP},
          precision="amp", param_dtype="bf16", reduce_dtype="bf16"),
    Stack("hf-trainer-2021", "Hugging Face Trainer before SDPA (transformers before v4.36, 2020-23): softmax "
          "attention over materialized scores, eager norms, FSDP1, AMP, transformers' own AdamW", "eager",
          "eager-hf", 12.0, 3.0,
          sources={"attention": "HF modelling code computed softmax(QK^T)V in torch ops until SDPA became "
                                "the default in v4.36 (December 2023)",
                   "elementwise": _HF_CHAINS,
                   "kernel_host_us": "as hf-trainer: eager PyTorch plus HF modules' plumbing, 12 us taken",
                   "step_host_ms": "as hf-trainer: the Trainer's per-step loss check and callbacks, "
                                   "3 ms taken",
                   "precision": "the Trainer's fp16=True ran native AMP (torch.cuda.amp autocast and "
                                "GradScaler over fp32 weights) from transformers v4 on PyTorch 1.6+",
                   "optimizer_impl": "the Trainer's default optimizer was transformers' own AdamW "
                                     "(adamw_hf), a Python loop over the parameters"},
          precision="amp", optimizer_impl="per-param"),
    Stack("lightning", "PyTorch Lightning Trainer: the user's eager model with SDPA attention, FSDPStrategy "
          "(FSDP1), AMP (bf16-mixed: autocast over fp32 weights)", "flash", "eager",
          EAGER_KERNEL_HOST_US, 1.0,
          sources={"attention": _SDPA, "elementwise": _EAGER_CHAINS, "kernel_host_us": _EAGER_HOST,
                   "step_host_ms": "Lightning's parity benchmark against plain PyTorch finds its loop's "
                                   "overhead negligible per step: as plain PyTorch, 1 ms",
                   "precision": "Lightning's precision='bf16-mixed' (MixedPrecision plugin) runs the step "
                                "under torch.autocast over fp32 weights",
                   "param_dtype": _LIGHTNING_FSDP, "reduce_dtype": _LIGHTNING_FSDP},
          precision="amp", param_dtype="fp32", reduce_dtype="bf16"),
    Stack("llm-foundry", "MosaicML llm-foundry (2024-25) MPT: FlashAttention-2 (attn_impl flash), LayerNorm "
          "and GELU kernels, FSDP1 through Composer", "flash", "fused", EAGER_KERNEL_HOST_US, 1.0,
          sources={"attention": "llm-foundry's attn_config default attn_impl: flash (flash-attn 2)",
                   "elementwise": "MPT has LayerNorm (one kernel), GELU and ALiBi: nothing an eager chain "
                                  "would add", "kernel_host_us": _EAGER_HOST, "step_host_ms": _STEP}),
    Stack("llm-foundry-2023", "llm-foundry as its 2023 benchmark tables ran it: the Triton FlashAttention "
          "port (attn_impl triton)", "flash1", "fused", EAGER_KERNEL_HOST_US, 1.0,
          sources={"attention": "llm-foundry scripts/train/benchmarking README (2023): attn_impl triton",
                   "elementwise": "as llm-foundry", "kernel_host_us": _EAGER_HOST, "step_host_ms": _STEP}),
    Stack("fms-fsdp", "IBM foundation-model-stack fms-fsdp (2024): FSDP1, SDPA attention, eager RMSNorm and "
          "fms's real-rotation rotary, uncompiled", "flash", "eager-fms", EAGER_KERNEL_HOST_US, 1.0,
          sources={"attention": "fms uses F.scaled_dot_product_attention",
                   "elementwise": "fms LayerNormParameterized (RMSNorm) and its rotary, eager",
                   "kernel_host_us": _EAGER_HOST, "step_host_ms": _STEP}),
    Stack("ideal", "the fastest the kernels allow: FlashAttention-2, every element-wise chain fused, no host "
          "cost beyond a flat per-op issue time", "flash", "fused", 0.0, 0.0,
          sources={"why": "an upper bound for learners, and what CPU ranks use: their costs come from "
                          "their own calibration"}),
)}
DEFAULT_STACK = "pytorch-eager"
CPU_STACK = "ideal"
# Settings a stack fills only for some strategies: FSDP's knobs and its MixedPrecision policy
# (``copies`` and ``param_dtype`` are the fsdp strategy's knobs; a stack's ``reduce_dtype`` is that
# policy's, though --reduce-dtype applies to every strategy), DDP's bucket view, and autocast where
# PyTorch runs the model.
FSDP_SETTINGS = ("copies", "param_dtype", "reduce_dtype")
DDP_SETTINGS = ("gradient_as_bucket_view",)
PYTORCH_SETTINGS = ("precision", "optimizer_impl")
# A stack's FSDP dtypes are the policy of its precision: a run given another precision has its own.
POLICY_SETTINGS = ("param_dtype", "reduce_dtype")

class StackError(ValueError):
    """An unknown stack name; the message lists the known ones."""


def get_stack(name: str) -> Stack:
    """The stack called ``name`` (case-insensitive); one sentence naming the known ones otherwise."""
    try:
        return STACKS[canonical(name, STACKS, "stack")]
    except NameError_ as exc:
        raise StackError(str(exc)) from None


def apply_stack(stack: Stack, given: dict[str, object], strategy_knobs: set[str],
                library: str = PYTORCH) -> tuple[dict, list[str]]:
    """The settings with the stack's values filled in where none was given, and a note for each
    given value that contradicts the stack.  FSDP's and DDP's settings are filled only for a strategy
    with their knobs, the precision only for one whose library is PyTorch (``library``), and FSDP's
    dtypes only where the stack's precision is the one run."""
    filled, notes = dict(given), []
    other_precision = stack.precision is not None and given.get("precision") not in (None, stack.precision)
    for key, value in stack.settings().items():
        if key in FSDP_SETTINGS and "copies" not in strategy_knobs:
            continue
        if key in DDP_SETTINGS and key not in strategy_knobs:
            continue
        if (key in PYTORCH_SETTINGS and library != PYTORCH) or (key in POLICY_SETTINGS and other_precision):
            continue
        mine = given.get(key)
        if mine is None:
            filled[key] = value
        elif mine != value:
            notes.append(f"overridden: {key}={mine} (stack {stack.name} has {value})")
    return filled, notes
