"""What a calibration from profiler traces found: the calibration and the report of how.

:func:`zero_sim.calibration.from_traces.calibration_from_traces` returns a :class:`TraceFindings`:
the :class:`~zero_sim.calibration.format.Calibration` the simulator reads, the figures it was
fitted from (per-layer times, the median step's phases and kernel mix, the collectives seen) and
what could not be found, which :meth:`TraceFindings.report` puts in words, one line each.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from zero_sim.calibration.format import Calibration


@dataclass
class TraceFindings:
    """What the traces gave: a calibration for the simulator and the report of how it was found."""

    calibration: Calibration
    gpu: str | None
    ranks: list[int]
    steps: int
    layer_ms: dict[str, dict[str, float]] = field(default_factory=dict)  # kind -> {"fwd", "bwd"} ms
    # The step of median length (of every rank's profiler steps): GPU kernel time per phase, per
    # kernel kind, and the time no compute kernel ran.
    phases_ms: dict[str, float] = field(default_factory=dict)
    kernel_mix_ms: dict[str, float] = field(default_factory=dict)
    idle_compute_ms: float | None = None
    step_ms: float | None = None
    collectives: dict[str, dict] = field(default_factory=dict)  # kind -> count, sizes, group size
    not_found: list[str] = field(default_factory=list)
    device_note: str = "not recognised (the simulator keeps the GPU you give it)"
    host_layer_ms: dict[str, dict[str, float]] = field(default_factory=dict)  # the host's part, GPU traces
    optimizer_ms: float | None = None  # the update's wall time per step (host start to last kernel)
    host_note: str | None = None  # how the host's times were taken: with the profiler's cost or without
    overlap_configs: int = 0  # launch configurations seen both alone and beside NCCL kernels
    layers_note: str | None = None  # where the layers were found other than by their labels, and how

    def report(self) -> str:
        lines = [f"traces of rank(s) {', '.join(map(str, self.ranks))}: {self.steps} profiler step(s)"
                 + (f"; the median one, {self.step_ms:.2f} ms, below" if self.step_ms else ""),
                 f"device: {self.gpu or self.device_note}"]
        if self.layers_note:
            lines.append(f"layers: {self.layers_note}")
        if self.layer_ms:
            lines.append(("per layer, GPU kernels: " if self.host_layer_ms else "per layer: ") + ", ".join(
                f"{kind} fwd {t['fwd']:.3f} ms / bwd {t['bwd']:.3f} ms" for kind, t in self.layer_ms.items()))
        if self.host_layer_ms:
            lines.append("per layer, host issuing them: " + ", ".join(
                f"{kind} fwd {t['fwd']:.3f} ms / bwd {t['bwd']:.3f} ms"
                for kind, t in self.host_layer_ms.items()))
        if self.host_note:
            lines.append(f"host: {self.host_note}")
        if self.optimizer_ms is not None:
            lines.append(f"optimizer: {self.optimizer_ms:.2f} ms per step (from its start on the host to its "
                         f"last kernel)")
        if self.phases_ms:
            lines.append("GPU time per step by phase: " + ", ".join(
                f"{p} {ms:.2f} ms" for p, ms in self.phases_ms.items()))
        if self.kernel_mix_ms:
            total = sum(self.kernel_mix_ms.values()) or 1.0
            lines.append("kernel mix per step: " + ", ".join(
                f"{k} {ms:.2f} ms ({ms / total:.0%})" for k, ms in self.kernel_mix_ms.items()))
        if self.idle_compute_ms is not None:
            lines.append(f"no compute kernel running: {self.idle_compute_ms:.2f} ms per step (launch gaps "
                         f"and waits for communication together)")
        if self.overlap_configs:
            lines.append(f"compute beside NCCL kernels: {self.calibration.overlap_slowdown:.1%} slower (the "
                         f"same kernels alone and beside a collective, {self.overlap_configs} launch "
                         f"configurations)")
        for kind, c in self.collectives.items():
            lines.append(f"{kind}: {c['calls']} NCCL kernels over {c['group_size']} ranks, "
                         f"{c['sizes']} sizes from {c['min_bytes']:,} to {c['max_bytes']:,} bytes")
        lines.append(self.calibration.describe())
        lines += [f"not found: {why}" for why in self.not_found]
        return "\n".join(lines)


__all__ = ["TraceFindings"]
