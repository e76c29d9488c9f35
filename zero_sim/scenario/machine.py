"""The machine a scenario runs on, resolved from its settings: topology, GPU speed spread, compute
model, who prices the host's launches, precision and FP8.

Each function takes the checked settings (and the calibration, when one was given) and returns
one piece :func:`zero_sim.scenario.pipeline` assembles, or refuses a combination it cannot
simulate with one :class:`~zero_sim.settings.ScenarioError` sentence.
"""

from __future__ import annotations

from zero_sim.calibration import Calibration
from zero_sim.scenario.settings import CommonSettings
from zero_sim.settings import ScenarioError
from zero_sim.strategies.base import Strategy
from zero_sim.strategies.capabilities import FP8_ALL_GATHER
from zero_sim.system.fp8 import Fp8Training, fp8_training
from zero_sim.system.gpu_spread import GPU_SPEED_SIGMA, slowest_gpu_factor
from zero_sim.system.hardware import ComputeModel
from zero_sim.system.host_costs import MeasuredHostCosts, host_costs
from zero_sim.system.optimizer_kernels import optimizer_kernels
from zero_sim.system.run_overheads import run_overhead
from zero_sim.system.topology import Topology, build_topology
from zero_sim.system.workload import Workload, WorkloadError


def topology_for(s: CommonSettings, calibration: Calibration | None) -> Topology:
    """The topology preset (or the calibration's imported one) at ``--gpus``, with ``--bandwidth-gbps``."""
    spec = s.topology
    if spec == "calibrated":
        if calibration is None or calibration.topology is None:
            raise ScenarioError("--topology calibrated needs --calibration with an imported topology; "
                                "make one with "
                                "`zero-sim calibrate --nccl-tests FILE --nvidia-smi-topo FILE --out FILE`")
        spec = calibration.topology
    try:
        topo = build_topology(spec, s.gpus, s.gpus_per_node)
    except ValueError as exc:
        raise ScenarioError(str(exc)) from None
    if s.bandwidth_gbps is not None and s.node_bandwidth_gbps is not None:
        raise ScenarioError("--bandwidth-gbps sets each NIC and --node-bandwidth-gbps the whole node's; "
                            "give one of them")
    if s.bandwidth_gbps is not None:
        topo = topo.with_bandwidth(s.bandwidth_gbps)
    elif s.node_bandwidth_gbps is not None:
        # A node's bandwidth is shared evenly by its NICs (one rail each on a rail-optimised fabric).
        nics = topo.nics if topo.bottleneck_kind() == "nic" else 1
        topo = topo.with_bandwidth(s.node_bandwidth_gbps / nics)
    return topo


def gpu_spread(s: CommonSettings, gpu, calibration: Calibration | None) -> float:
    """The spread of GPU speeds a step pays for: as given, else by what the compute model is.

    The per-op model is one benchmarked GPU's; a step runs at the slowest of N (gpu_spread.py).
    A flat ``--efficiency``, CPU ranks and a measured layer table (which timed its own slowest
    rank) take none."""
    measured = calibration is not None and calibration.compute is not None
    if s.gpu_spread and measured:
        raise ScenarioError("--gpu-spread applies to modelled compute, but the calibration's layer table "
                            "measured its own slowest rank; drop --gpu-spread or the calibration")
    if s.gpu_spread is not None:
        return s.gpu_spread
    modelled = gpu.profile is not None and s.efficiency is None and not measured
    return GPU_SPEED_SIGMA if modelled else 0.0


def compute_model(s: CommonSettings, gpu, calibration: Calibration | None) -> ComputeModel:
    """The GPU's per-op model (``efficiency`` None), a flat roofline at ``efficiency``, or the
    calibration's measured layer table."""
    if calibration is not None and calibration.backend and calibration.backend != s.backend:
        raise ScenarioError(f"the calibration was measured with {calibration.backend} but --backend is "
                            f"{s.backend}; use --backend {calibration.backend} or another calibration")
    if calibration is not None and calibration.compute is not None:
        c = calibration.compute
        shared = cores_shared(s.gpus, c.ranks, c.cores) if gpu.name == "CPU" else 1.0
        per_param = c.optimizer_seconds_per_param
        return ComputeModel(gpu, efficiency=s.efficiency,
                            layer_seconds={kind: {d: t * shared for d, t in times.items()}
                                           for kind, times in c.layer_seconds.items()},
                            calibrated_tokens=c.tokens,
                            optimizer_seconds_per_param=None if per_param is None else per_param * shared,
                            slowest_rank_factor=c.slowest_rank_factor)
    return ComputeModel(gpu, efficiency=s.efficiency,
                        slowest_rank_factor=slowest_gpu_factor(s.gpus, s.gpu_spread),
                        run_overhead=run_overhead_for(s, gpu), autocast=s.precision == "amp",
                        optimizer_bytes_per_param=optimizer_kernels(s.optimizer_impl).bytes_per_param)


def cores_shared(ranks: int, measured_ranks: int, cores: int | None) -> float:
    """How much slower each CPU rank computes with ``ranks`` on the machine than the calibration's
    ``measured_ranks`` did on its ``cores``: every rank runs one thread (as the real runs do), so
    beyond one rank per core the ranks take turns, ``ranks / cores`` of them to a core.  Without
    the cores measured, the calibration is taken as it is."""
    if not cores:
        return 1.0
    return max(1.0, ranks / cores) / max(1.0, measured_ranks / cores)


def run_overhead_for(s: CommonSettings, gpu) -> float:
    """As given, else the fitted factor for the per-op GPU model; a flat ``--efficiency`` is the
    user's own figure and takes none."""
    if s.run_overhead is not None:
        return s.run_overhead
    return run_overhead(gpu.name) if gpu.profile is not None and s.efficiency is None else 1.0


def is_modelled_gpu(gpu, calibration: Calibration | None) -> bool:
    """Whether compute is the GPU model's: eager host costs price modelled kernels (CPU ranks' host
    *is* their compute; a measured layer table holds what the host cost when it was timed), and
    the published runs' residuals describe only the model."""
    return gpu.name != "CPU" and not (calibration is not None and calibration.compute is not None)


def host_pricing(workload, s: CommonSettings, calibration: Calibration | None, modelled_gpu: bool):
    """Who prices the host's issuing of each layer: the per-op model for modelled GPU compute, the
    host times a trace measured beside its kernel times, else nobody (a layer table timed end to end
    already holds them; CPU ranks' host *is* their compute)."""
    if modelled_gpu:
        return host_costs(workload, s.kernel_host_us, optimizer_kernels(s.optimizer_impl).kernels_per_tensor)
    measured = measured_figure(calibration, "host_seconds")
    return MeasuredHostCosts(measured) if measured else None


def measured_figure(calibration: Calibration | None, name: str):
    """A figure of the calibration's compute block, None where it has none."""
    return getattr(calibration.compute, name) if calibration and calibration.compute else None


def step_host_s(s: CommonSettings, calibration: Calibration | None, modelled_gpu: bool) -> float:
    """The training loop's host work per step: the stack's for modelled compute, a trace's measure."""
    if modelled_gpu:
        return (s.step_host_ms or 0.0) * 1e-3
    return measured_figure(calibration, "step_host_s") or 0.0


def fp8_for(s: CommonSettings, gpu, workload: Workload, calibration: Calibration | None,
         strategy: Strategy) -> Fp8Training | None:
    """The FP8 model under ``--precision fp8`` (zero_sim.system.fp8), None otherwise; what it does not
    model is refused in one sentence rather than simulated as something else."""
    if s.fp8_all_gather and s.precision != "fp8":
        raise ScenarioError("--fp8-all-gather gathers the float8 weights of --precision fp8; add "
                            "--precision fp8 or drop --fp8-all-gather")
    if s.fp8_all_gather and not strategy.can.accepts(FP8_ALL_GATHER):
        raise ScenarioError(f"--fp8-all-gather is FSDP2's float8 all-gather of sharded weights, which "
                            f"{strategy.name} does not gather; use --strategy fsdp or drop --fp8-all-gather")
    if s.precision != "fp8":
        return None
    if s.efficiency is not None:
        raise ScenarioError("--precision fp8 times the blocks' GEMMs at the FP8 peak with the per-op "
                            "model, which --efficiency replaces with one fraction of the bf16 peak; drop "
                            "--efficiency")
    if calibration is not None and calibration.compute is not None:
        raise ScenarioError("--precision fp8 is modelled on the GPU's figures, but the calibration's layer "
                            "table holds measured times of another precision; drop the calibration's compute "
                            "or --precision fp8")
    if s.lora_rank is not None:
        raise ScenarioError("--lora-rank with --precision fp8 (float8 GEMMs beside frozen weights and "
                            "adapters) is not modelled; use --precision mixed for LoRA")
    try:
        return fp8_training(gpu, workload, s.fp8_all_gather)
    except WorkloadError as exc:
        raise ScenarioError(str(exc)) from None
