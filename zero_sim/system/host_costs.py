"""The host side of eager training: how long the CPU thread takes to issue a layer's kernels.

A GPU runs a layer only as fast as its host thread hands it work.  In eager PyTorch every
tensor operation the model's Python code calls crosses the same path before a kernel is
queued: CPython, the pybind11 boundary, autograd recording a node, the ATen dispatcher, the
backend picking its kernel and ``cudaLaunchKernel``.  Walkthroughs of that path put it at about
5-25 us of CPU time per op, whatever the op's size (the "PyTorch op to kernel launch" lesson in
jiahuanglin's GPU-kernel course, per-layer costs 1-5 us each); PyTorch's own operator
microbenchmarks time an almost empty op (``split`` of an 8 x 8 tensor) at 3.3 us.  When a layer's
kernels are small (small micro-batches, fast GPUs) the host falls behind, the GPU waits, and the
step is *host-bound*: the regime in which published DDP runs of small models with high-level
trainers are 1.3-3x slower than their FLOPs imply.

The model: a layer's forward issues :func:`forward_ops` dispatched ops (counted from the
layer's structure and the element-wise implementation, below), each costing
``kernel_host_us``.  Backward is replayed by autograd's C++ engine: about twice as many kernels
as forward (each op's input and weight gradients) but no Python, so it is charged the same
host time as its forward.  A recompute re-runs the forward.  torch.compile's fused graphs
launch fewer kernels (the ``fused`` element-wise count) through a thinner wrapper; a stack says
its per-op figure (:mod:`zero_sim.system.stacks`).

Op counts per transformer block forward (a GPT-style block, counted from HF transformers'
Llama and GPT-2 modelling code and torchtitan's Llama):

==================== ========= =================================================================
part                 ops       what is dispatched
==================== ========= =================================================================
projections          3-4, 2-3  q, k, v separately when rotary (Llama), one fused c_attn (GPT-2);
                               the output projection; 2 MLP matmuls, 3 with SwiGLU
attention            1 / 6     SDPA or a flash kernel / eager: matmul, scale, mask, softmax,
                               dropout, matmul
layout               8         views, transposes and contiguous copies of q, k, v and the output
norms (x2)           1 / 8     LayerNorm is one kernel; eager RMSNorm: cast, pow, mean, add,
                               rsqrt, mul, cast, mul
rotary (q and k)     1 / 14    fused / eager rotate-half: two slices, neg, cat, two muls, add each
activation           1 / 2 / 8 GELU or fused SwiGLU / eager SiLU then multiply / Hugging Face's
                               GPT-2 gelu_new (pow, four scalar ops, tanh, add, multiply)
residuals, dropout   2 / 4     two adds; two dropouts when the model trains with dropout
==================== ========= =================================================================

The embedding issues 3 (lookup, position add, dropout) and the head 6 (final norm, matmul,
the cross-entropy's log-softmax, gather, mean, the norm's chain counted as above).
"""

from __future__ import annotations

from dataclasses import dataclass

# The backward of a layer costs the host this multiple of its forward's host time (see above).
BACKWARD_HOST_FACTOR = 1.0
# RMSNorm as eager PyTorch writes it (HF's LlamaRMSNorm, torchtitan's pre-fused RMSNorm).
EAGER_RMSNORM_OPS = 8
# Hugging Face's gelu_new, GPT-2's activation (the gelu_tanh MLP under "eager-hf"): eight kernels.
HF_GELU_NEW_OPS = 8
# Rotate-half rotary on one of q, k: two slices, negate, concatenate, two multiplies, add.
EAGER_ROTARY_OPS_EACH = 7
LAYOUT_OPS = 8


def block_forward_ops(shape, attention: str, elementwise: str) -> int:
    """Dispatched ops in one transformer block's forward (the table in the module docstring)."""
    fused_norm = elementwise in ("fused", "fused-norm")
    eager_chains = elementwise != "fused"  # rotary and the activation: fused only when all is fused
    projections = (4 if shape.positions == "rotary" else 2) + (3 if shape.mlp == "swiglu" else 2)
    core = 6 if attention == "eager" else 1
    if shape.norm == "rmsnorm":
        norms = 2 * (1 if fused_norm else EAGER_RMSNORM_OPS)
    else:
        norms = 2
    rotary = 0
    if shape.positions == "rotary":
        rotary = 2 * EAGER_ROTARY_OPS_EACH if eager_chains else 1
    activation = 2 if shape.mlp == "swiglu" and eager_chains else 1
    if shape.mlp == "gelu_tanh" and elementwise == "eager-hf":
        activation = HF_GELU_NEW_OPS
    residuals = 2 + (2 if shape.dropout else 0)
    return projections + core + LAYOUT_OPS + norms + rotary + activation + residuals


def layer_forward_ops(kind: str, shape, attention: str, elementwise: str) -> int:
    """Dispatched ops in a layer's forward: a block's count, or the embedding's or head's."""
    if kind == "block":
        return block_forward_ops(shape, attention, elementwise)
    if kind == "embedding":
        return 3
    if kind == "head":
        eager_norm = shape.norm == "rmsnorm" and elementwise not in ("fused", "fused-norm")
        return 5 + (EAGER_RMSNORM_OPS if eager_norm else 1)
    return 1


@dataclass(frozen=True)
class HostCosts:
    """Host seconds to issue each layer's compute; None where the host cost is not modelled
    (then the scenario's flat per-op ``host_overhead_us`` applies, as for CPU ranks)."""

    kernel_host_s: float  # host time per dispatched op
    shape: object  # the workload's GPTShape
    attention: str
    elementwise: str
    # The optimizer's launches per parameter tensor (zero_sim.system.optimizer_kernels; 0: a
    # multi-tensor pass, whose few launches are not counted).
    optimizer_kernels_per_tensor: int = 0

    def forward_s(self, kind: str) -> float:
        return self.kernel_host_s * layer_forward_ops(kind, self.shape, self.attention, self.elementwise)

    def backward_s(self, kind: str) -> float:
        return BACKWARD_HOST_FACTOR * self.forward_s(kind)

    def update_s(self, tensors: int) -> float | None:
        """Host time to launch the update of ``tensors`` parameter tensors; None for a multi-tensor pass."""
        if not self.optimizer_kernels_per_tensor:
            return None
        return self.kernel_host_s * self.optimizer_kernels_per_tensor * tensors


@dataclass(frozen=True)
class MeasuredHostCosts:
    """Host seconds per layer kind as a profiler trace measured them (the spans around each layer's
    launches, :mod:`zero_sim.calibration.from_traces`): the same host, model and stack, so no op count
    or per-op figure is needed."""

    seconds: dict[str, dict[str, float]]  # kind -> {"fwd": s, "bwd": s}

    def forward_s(self, kind: str) -> float:
        return self.seconds.get(kind, {}).get("fwd", 0.0)

    def backward_s(self, kind: str) -> float:
        return self.seconds.get(kind, {}).get("bwd", 0.0)

    def update_s(self, tensors: int) -> None:
        """A trace's update host time is the calibration's optimizer figure, not this."""
        return None


def host_costs(workload, kernel_host_us: float, optimizer_kernels_per_tensor: int = 0) -> HostCosts | None:
    """The host model for a GPT workload at ``kernel_host_us`` per op; None without a shape
    (a workload read off a module) or at zero cost."""
    if kernel_host_us <= 0 or workload.shape is None:
        return None
    return HostCosts(kernel_host_us * 1e-6, workload.shape, workload.attention or "flash",
                     workload.elementwise or "fused", optimizer_kernels_per_tensor)
