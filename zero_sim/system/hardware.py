"""How long compute takes on a given accelerator.

Two ways to get a time for an op, in order of preference:

1. A calibration table of measured seconds per layer kind (``fwd``/``bwd`` per
   ``embedding``/``block``/``head``), scaled linearly by tokens from the tokens it was
   measured at.  Calibrated simulators reach a few percent of error; analytical ones
   rarely do.
2. A roofline with an efficiency knob: ``max(FLOPs / (peak * efficiency),
   bytes / (HBM bandwidth * memory_efficiency))``.  Matmul-heavy layers are FLOP-bound;
   the optimizer step is memory-bound (it streams every parameter's state once).

The optimizer step of mixed-precision Adam reads the bf16 gradient and the fp32 master
weights, momentum and variance, and writes the last three plus the bf16 parameters:
``2 + 12 + 12 + 2 = 28`` bytes of HBM traffic per parameter it owns.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class GPU:
    name: str
    peak_tflops: float  # dense bf16
    hbm_bytes: int
    hbm_gbps: float  # GB/s

    @property
    def peak_flops(self) -> float:
        return self.peak_tflops * 1e12


GiB = 1024**3
GB = 1e9

# Dense bf16 peak from the vendors' data sheets (no sparsity); HBM as sold.
GPUS: dict[str, GPU] = {
    "V100": GPU("V100", 125.0, 32 * GiB, 900.0),
    "A100-40GB": GPU("A100-40GB", 312.0, 40 * GiB, 1555.0),
    "A100-80GB": GPU("A100-80GB", 312.0, 80 * GiB, 2039.0),
    "H100": GPU("H100", 989.0, 80 * GiB, 3350.0),
    "H200": GPU("H200", 989.0, 141 * GiB, 4800.0),
    # One CPU process for gloo runs: an order-of-magnitude stand-in until calibrated.
    "CPU": GPU("CPU", 0.05, 24 * GiB, 10.0),
}

ADAM_BYTES_PER_PARAM = 28


def gpu_names() -> list[str]:
    return list(GPUS)


@dataclass
class ComputeModel:
    """Seconds for each compute op, from a roofline or from a calibration table."""

    gpu: GPU
    efficiency: float = 0.5  # fraction of peak FLOP/s that transformer matmuls reach
    memory_efficiency: float = 0.8  # fraction of HBM bandwidth elementwise kernels reach
    # {"block": {"fwd": seconds, "bwd": seconds}, ...} measured at ``calibrated_tokens``.
    layer_seconds: dict[str, dict[str, float]] = field(default_factory=dict)
    calibrated_tokens: int = 0
    optimizer_seconds_per_param: float | None = None
    # Ranks are simulated alike, and a step waits on its slowest: a measured table (a rank's
    # mean pace) is stretched by how much later the slowest rank ends a pass.
    slowest_rank_factor: float = 1.0

    def layer_time(self, kind: str, direction: str, flops: float, tokens: int) -> float:
        """Time of ``direction`` in {fwd, bwd} for a layer of ``kind`` on ``tokens`` tokens."""
        table = self.layer_seconds.get(kind)
        if table and direction in table and self.calibrated_tokens:
            return table[direction] * tokens / self.calibrated_tokens * self.slowest_rank_factor
        return flops / (self.gpu.peak_flops * self.efficiency)

    def optimizer_time(self, params: int) -> float:
        if self.optimizer_seconds_per_param is not None:
            return params * self.optimizer_seconds_per_param
        return params * ADAM_BYTES_PER_PARAM / (self.gpu.hbm_gbps * 1e9 * self.memory_efficiency)

    @property
    def calibrated(self) -> bool:
        return bool(self.layer_seconds)
