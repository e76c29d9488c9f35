"""The settings every simulation takes, whatever its strategy: the one schema of ``simulate()``.

Each :class:`~zero_sim.settings.Setting` is a ``simulate()`` keyword and a CLI flag; its
``section`` says where its resolved value lives in the typed scenario
(:mod:`zero_sim.scenario.types`): the workload (model and shape), the training loop, the
cluster, the hardware model, the simulation itself, or the input files.  A strategy's own knobs
are declared beside the strategy (:mod:`zero_sim.strategies`).
"""

from __future__ import annotations

import os

from zero_sim.settings import Setting, settings_record
from zero_sim.strategies import PRECISIONS, STRATEGIES
from zero_sim.strategies.base import DTYPE_BYTES
from zero_sim.system.collectives import ALGORITHMS, BACKENDS
from zero_sim.system.gpus import GPUS
from zero_sim.system.model_presets import parse_count
from zero_sim.system.optimizer_kernels import OPTIMIZER_IMPLS
from zero_sim.system.stacks import DEFAULT_STACK
from zero_sim.system.workload import ATTENTION_IMPLS, ELEMENTWISE_IMPLS, RECOMPUTE_MODES

# The size budget: at its edge a simulation takes about 20 s and 1.5 GB of memory on one core
# (docs/reliability.md), so beyond it a simulation runs only with --allow-huge.  Planning a
# collective costs time in proportion to its group's ranks; the engine costs time and memory
# in proportion to op instances (ops per step x steps x ranks simulated).
MAX_GPUS = 65_536
MAX_OP_INSTANCES = 1_000_000


def _path_text(value):
    # A path given as pathlib.Path is the same setting as its text.
    return os.fspath(value) if isinstance(value, os.PathLike) else value


COMMON: tuple[Setting, ...] = (
    Setting("model", "gpt2-124m", "model preset (see `zero-sim presets`); with shape flags, the preset "
            "their missing values come from", str, section="workload"),
    Setting("params", None, "synthesize a GPT of about this many parameters instead of a preset "
            "(7.5e9, 7.5B, 350M, 1.3b)", int, parse=parse_count, le=1e14, section="workload"),
    Setting("layers", None, "custom shape: transformer blocks (default: the preset's)", int, gt=0, le=2048,
            section="workload"),
    Setting("hidden", None, "custom shape: hidden size d_model (default: the preset's)", int, gt=0, le=2**20,
            section="workload"),
    Setting("heads", None, "custom shape: attention (query) heads (default: the preset's)", int,
            gt=0, le=2**16, section="workload"),
    Setting("kv_heads", None, "custom shape: key/value heads, fewer than heads for grouped-query "
            "attention (default: the preset's)", int, gt=0, le=2**16, section="workload"),
    Setting("ffn_hidden", None, "custom shape: MLP width (default: the preset's)", int, gt=0, le=2**22,
            section="workload"),
    Setting("vocab", None, "custom shape: vocabulary size (default: the preset's)", int, gt=0, le=2**24,
            section="workload"),
    Setting("seq_len", None, "sequence length (default: the preset's)", int, gt=0, le=2**24,
            section="workload"),
    Setting("micro_batch", 8, "sequences per rank per micro-step", int, gt=0, le=2**20, section="training"),
    Setting("grad_accum", 1, "micro-steps per optimizer step (no gradient sync until the last)", int,
            gt=0, le=100_000, section="training"),
    Setting("strategy", "ddp", " or ".join([", ".join(list(STRATEGIES)[:-1]), list(STRATEGIES)[-1]]), str,
            section="training"),
    Setting("gpus", 8, f"number of ranks N (above {MAX_GPUS:,} only with --allow-huge)", int,
            gt=0, le=2**24, section="cluster"),
    Setting("gpus_per_node", None, "ranks per node (default: the topology's node size)", int, gt=0, le=4096,
            section="cluster"),
    Setting("topology", "dgx-a100", "topology preset (see `zero-sim presets`), or 'calibrated' for the "
            "calibration file's imported topology", str, section="cluster"),
    Setting("gpu", None, "GPU model (default: the topology's)", str, tuple(GPUS), section="cluster"),
    Setting("bandwidth_gbps", None, "override each bottleneck link's bandwidth in Gbit/s: on a multi-NIC "
            "node each NIC's (dgx-a100: 8 NICs, so 400 here is 3,200 Gbit/s per node); the output's cluster "
            "line shows every link class as used", float, gt=0, le=1e7, section="cluster"),
    Setting("node_bandwidth_gbps", None, "override the network bandwidth of a whole node in Gbit/s, split "
            "evenly over its NICs (instead of --bandwidth-gbps)", float, gt=0, le=1e8, section="cluster"),
    Setting("backend", "nccl", "collective library", str, tuple(BACKENDS), section="cluster"),
    Setting("algorithm", "auto", "collective algorithm", str, ALGORITHMS, section="cluster"),
    Setting("precision", "mixed", "mixed (bf16 + fp32 Adam, K=12), fp32 (K=8), amp (torch.autocast: fp32 "
            "weights cast to bf16 each forward, fp32 gradients, K=8) or fp8 (mixed, with the "
            "blocks' linear GEMMs on FP8 tensor cores: torchao float8, tensorwise scaling; docs/fp8.md)", str,
            tuple(PRECISIONS), section="training"),
    Setting("fp8_all_gather", False, "with --precision fp8 and --strategy fsdp: FSDP2 gathers the float8 "
            "linear weights at 1 byte an element, scales precomputed once a step (torchtitan's "
            "enable_fsdp_float8_all_gather with precompute_float8_dynamic_scale_for_fsdp)", bool,
            section="training"),
    Setting("reduce_dtype", None, "dtype gradients are reduced in, any strategy (default: as held; fsdp: "
            "its param_dtype)", str, tuple(DTYPE_BYTES), section="training"),
    Setting("grad_accum_dtype", None, "dtype gradients are held and accumulated in (default: the "
            "precision's); fp32 under bf16 weights also keeps the bf16 gradients backward writes", str,
            ("bf16", "fp32"), section="training"),
    Setting("optimizer_impl", None, "how Adam's update runs: fused (one multi-tensor pass, 28 B a "
            "parameter) or per-param (a Python loop, 7 kernels a tensor, 76 B a parameter: transformers' "
            "own AdamW, torch.optim before foreach); default: the stack's, else fused", str, OPTIMIZER_IMPLS,
            section="training"),
    Setting("optimizer_k", None, "bytes of optimizer state per parameter (overrides the precision's K)", int,
            ge=0, le=1024, section="training"),
    Setting("lora_rank", None, "fine-tune with LoRA adapters of this rank: every model weight frozen, "
            "only the adapters train (gradients, optimizer state, communication)", int, ge=1, le=4096,
            section="training"),
    Setting("lora_targets", None, "with --lora-rank: the projections given adapters, peft's names or "
            "short ones (q,k,v,o,gate,up,down,fc) or all-linear (default: q,v, peft's for Llama)", str,
            section="training"),
    Setting("lora_base", None, "with --lora-rank: how the frozen base's block projections are stored: "
            "bf16, or nf4 (QLoRA: 4-bit NormalFloat, double quantization, 4.127 bits a weight, dequantized "
            "for each matmul; ddp, zero1, zero2)", str, ("bf16", "nf4"), section="training"),
    Setting("offload_optimizer", "none", "keep the optimizer state (fp32 master weights, Adam's moments) "
            "in host memory and update it on the CPU: ZeRO-Offload under zero1, zero2 or zero3 "
            "(docs/offload.md)",
            str, ("none", "cpu", "nvme"), section="training"),
    Setting("offload_params", "none", "keep the weight shards in host memory too, copied up before each "
            "gather: DeepSpeed offload_param under zero3, FSDP2's CPUOffloadPolicy under fsdp (which "
            "offloads the optimizer with them)", str, ("none", "cpu", "nvme"), section="training"),
    Setting("recompute", "none", "activation checkpointing: none, selective (Korthikanti et al.: attention's "
            "core recomputed), full (only each block's input kept) or op (torchtitan's op-level policy: "
            "every other matmul output and the attention output kept)", str, RECOMPUTE_MODES,
            section="training"),
    Setting("stack", DEFAULT_STACK, "software stack: the bundle of kernels and framework costs below that "
            "a named codebase runs (see `zero-sim stacks`; CPU ranks default to ideal); settings given "
            "explicitly win", str, section="training"),
    Setting("attention", None, "attention kernel: flash (FlashAttention-2 / SDPA: no s x s "
            "scores kept), flash1 (FlashAttention v1 or its Triton port: as flash, slower), cudnn "
            "(cuDNN's fused attention as Transformer Engine runs it: as flash, faster on Hopper) or eager "
            "(softmax over materialized scores); default: the stack's", str, ATTENTION_IMPLS,
            section="workload"),
    Setting("elementwise", None, "norms and rotary embeddings: fused (one HBM round trip "
            "each, as fused or compiled kernels), fused-norm (fused norms, eager rotary), eager (the "
            "chain of ATen kernels eager PyTorch runs), eager-fms (eager with foundation-model-stack's "
            "real-rotation rotary) or eager-hf (eager with Hugging Face code's separate attention-score "
            "kernels and GPT-2's gelu_new chain); default: the stack's", str, ELEMENTWISE_IMPLS,
            section="workload"),
    Setting("efficiency", None, "a flat fraction of peak FLOP/s for all compute (default: the GPU's per-op "
            "model)", float, gt=0, le=1, section="hardware"),
    Setting("run_overhead", None, "factor on modelled compute time for what whole runs lose that kernel "
            "microbenchmarks miss; 1: none (default: fitted per GPU generation to published runs, "
            "docs/validation.md; 1 with --efficiency, a calibration's layer table or CPU ranks)", float,
            gt=0, le=10, section="hardware"),
    Setting("cuda_context_gb", None, "GB per GPU outside the tensors: CUDA context, cuBLAS and NCCL buffers "
            "(default: by GPU, 1.1 on A100, 1.5 on H100/H200, 0 for CPU ranks)", float, ge=0, le=10_000,
            section="hardware"),
    Setting("allocator_reserve", None, "fraction of the tensors' peak the caching allocator holds reserved "
            "but unused (default: 0.10, or 1/3 when activations are recomputed)", float, ge=0, le=1,
            section="hardware"),
    Setting("host_overhead_us", 10.0, "host time to issue one simulated op that the stack's per-kernel "
            "figure does not price (collectives, syncs; every op on CPU ranks), microseconds", float,
            ge=0, le=1e6, section="hardware"),
    Setting("kernel_host_us", None, "host CPU time per op eager PyTorch dispatches (Python, autograd, "
            "dispatcher, kernel launch), microseconds; 0: not modelled (default: the stack's)", float,
            ge=0, le=1e6, section="hardware"),
    Setting("step_host_ms", None, "the training loop's own host work per step (clipping, scheduler, "
            "logging), ending in a host-device sync, milliseconds (default: the stack's)", float,
            ge=0, le=1e6, section="hardware"),
    Setting("overlap_slowdown", None, "compute slows by this fraction while a collective runs (default: 0.35 "
            "on GPUs, for the overlapped part of each op; on CPU ranks the calibration's figure, else 0)",
            float, ge=0, le=100, section="hardware"),
    Setting("gpu_spread", None, "relative standard deviation of GPU speed; each step runs at the expected "
            "slowest of the N GPUs (default: 0.0175 under the per-op GPU model; 0 with --efficiency, a "
            "calibration table or CPU ranks)", float, ge=0, le=0.2, section="hardware"),
    Setting("host_memory_gb", None, "RAM per node that offloaded states must fit in (default: the "
            "topology's)", float, gt=0, le=1e7, section="cluster"),
    Setting("host_cores", None, "physical CPU cores per node, shared by its ranks' CPU optimizers (default: "
            "the topology's)", int, gt=0, le=10**6, section="cluster"),
    Setting("host_link_gbps", None, "GB/s per direction of each GPU's link to host memory (default: the "
            "topology's PCIe figures)", float, gt=0, le=1e4, section="cluster"),
    Setting("cpu_adam_rate", None, "million parameters per second per core the CPU optimizer updates "
            "(default: DeepSpeed's CPU Adam 29.5, torch's AdamW 4.3 under fsdp; DeepSpeed PR #735)", float,
            gt=0, le=1e6, section="hardware"),
    Setting("straggler_prob", 0.0, "chance that a rank stalls before a collective", float, ge=0, le=1,
            section="cluster"),
    Setting("straggler_ms", 0.0, "length of such a stall, milliseconds", float, ge=0, le=1e6,
            section="cluster"),
    Setting("seed", 0, "seed for straggler draws", int, ge=0, le=2**63 - 1, section="cluster"),
    Setting("steps", 2, "steps to simulate (the last is reported)", int, gt=0, le=100, section="simulation"),
    Setting("explicit_ranks", None, "simulate every rank (default: when N <= 8 and the ranks may differ, "
            "docs/engine.md)", bool, section="simulation"),
    Setting("calibration", None,
            "calibration file (`zero-sim calibrate`): measured collective fits and layer times", str,
            parse=_path_text, section="inputs"),
    Setting("deepspeed_config", None, "a DeepSpeed JSON configuration: its ZeRO stage, batch sizes, "
            "precision and ZeRO settings (flags given beside it win)", str, parse=_path_text,
            section="inputs"),
    Setting("fsdp_config", None, "a JSON or YAML file of FSDP2 fully_shard arguments and mesh "
            "(docs/configs.md)", str, parse=_path_text, section="inputs"),
    Setting("torchtitan_config", None, "a torchtitan job configuration (TOML)", str, parse=_path_text,
            section="inputs"),
    Setting("peft_config", None, "a peft LoRA adapter_config.json: its rank and target modules (beside "
            "a run configuration or flags; docs/fine-tuning.md)", str, parse=_path_text, section="inputs"),
    Setting("allow_huge", False, f"simulate beyond the size budget ({MAX_GPUS:,} ranks, "
            f"{MAX_OP_INSTANCES:,} ops): may take minutes and GBs of memory", bool, section="simulation"),
)
# Custom-shape settings and the GPTShape fields they set.
SHAPE_SETTINGS = {"layers": "n_layer", "hidden": "d_model", "heads": "n_head", "kv_heads": "kv_heads",
                  "ffn_hidden": "ffn_hidden", "vocab": "vocab"}
COMMON_NAMES = {s.name for s in COMMON}
# The strategy simulated when none is named: the schema's one default, read where a panel starts.
DEFAULT_STRATEGY = next(s.default for s in COMMON if s.name == "strategy")



# Every common setting as given or defaulted, before the simulator resolves what was left to
# it; read by attribute (``settings.gpus``).
CommonSettings = settings_record("CommonSettings", COMMON, module=__name__)
