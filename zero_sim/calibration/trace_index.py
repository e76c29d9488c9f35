"""One profiler trace, indexed for a calibration: its kernels, their launches, steps, phases, layers.

A Kineto trace is a flat list of events on CPU threads and GPU streams.  What a calibration needs
is their relations: each GPU kernel's launch (the shared ``correlation`` id of a ``cudaLaunchKernel``
or, for cuBLAS on Hopper, ``cuLaunchKernelEx``), the phase and layer each launch ran in (annotated
regions on the launching thread: autograd launches backward from a thread of its own, where only
its ``evaluate_function`` ops mark it), and the profiler steps.  :class:`TraceIndex` builds them once;
the readers below turn them into per-step, per-layer and per-update figures for
:mod:`zero_sim.calibration.from_traces`.
"""

from __future__ import annotations

import bisect
import re
import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from zero_sim.breakdown import length as busy
from zero_sim.breakdown import union

# Kernel kinds by name, first match wins: communication before the rest (an NCCL kernel is not a GEMM).
KERNEL_KINDS = (
    ("communication", re.compile(r"^nccl", re.I)),
    ("copies", re.compile(r"^Memcpy|^Memset|copy_kernel|CatArrayBatchedCopy", re.I)),
    ("attention", re.compile(r"flash|fmha|attention|sdpa", re.I)),
    ("GEMM and convolution", re.compile(r"gemm|xmma|cutlass|cublas|conv|dgrad|wgrad|fprop|scudnn|"
                                        r"implicit_gemm", re.I)),
    ("optimizer", re.compile(r"multi_tensor_apply|adam|sgd|fused_optimizer", re.I)),
    ("normalisation", re.compile(r"norm|bn_", re.I)),
    ("element-wise and other", re.compile(r".")),
)
# Zeroing the gradients (``Optimizer.zero_grad``, at a step's start) is not the update.
PHASES = (("optimizer", re.compile(r"^(?!.*zero_grad).*optimizer|^opt ", re.I)),
          ("backward", re.compile(r"backward|^bwd L\d+$|^autograd::engine::evaluate_function", re.I)),
          ("forward", re.compile(r"forward|^fwd L\d+$", re.I)))
# Kernels are launched by cudaLaunchKernel (runtime) or cuLaunchKernelEx (driver: cuBLAS on Hopper).
LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")
# Layer spans as this project's real runs label them (``fwd L3``, ``bwd L3``) or as a user can with
# ``torch.profiler.record_function``; layer 0 is the embedding, the last the head, the rest blocks.
LAYER_LABEL = re.compile(r"^(fwd|bwd) L(\d+)$")
MODULE_CALL = re.compile(r"^nn\.Module: (.+)_(\d+)$")  # with_modules: a module's forward


def kind_of(name: str) -> str:
    return next(kind for kind, pattern in KERNEL_KINDS if pattern.search(name))


class TraceIndex:
    """One trace's events as the readers below need them, built once: kernels, the launch of each
    kernel (by ``correlation``), profiler steps, and annotated regions sorted for lookups by time."""

    def __init__(self, data: dict):
        events = [e for e in data["traceEvents"] if isinstance(e, dict) and e.get("ph") == "X"]
        self.kernels = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
        launch_of = {e["args"]["correlation"]: e for e in events
                     if e.get("cat") in LAUNCH_CATEGORIES and "correlation" in e.get("args", {})}
        self.launches = [launch_of.get(k.get("args", {}).get("correlation")) for k in self.kernels]
        annotations = [e for e in events if e.get("cat") == "user_annotation"]
        self.steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in annotations
                            if str(e.get("name", "")).startswith("ProfilerStep#"))
        # A launch's phase is the innermost phase region on its own thread (autograd launches backward
        # kernels from a thread of its own), else the innermost on any thread (a user's "## backward ##"
        # on the main thread while autograd's thread launches).
        marked = [(e["ts"], e["ts"] + e["dur"], phase, e.get("tid"))
                  for e in events if e.get("cat") in ("user_annotation", "cpu_op")
                  and not str(e.get("name", "")).startswith("ProfilerStep#")
                  for phase in [phase_of(str(e.get("name", "")))] if phase]
        self.phases = Regions((lo, hi, phase) for lo, hi, phase, _ in marked)
        self.phases_by_thread = by_thread(marked)
        self.layers = [(m.group(1), int(m.group(2)), e) for e in annotations
                       for m in [LAYER_LABEL.match(str(e.get("name", "")))] if m]
        # Without labels, the layers the module annotations show (forward only), and their class.
        self.block_class: str | None = None
        if not self.layers:
            self.block_class, self.layers = module_layers(events)
        self.comms = by_thread((e["ts"], e["ts"] + e["dur"], e.get("args", {}), e.get("tid"))
                                for e in events if e.get("name") == "record_param_comms")

    def phase_of_launch(self, launch: dict | None) -> str:
        if launch is None:
            return "other"
        own = self.phases_by_thread.get(launch.get("tid"))
        return (own.at(launch["ts"]) if own else None) or self.phases.at(launch["ts"], "other")

    def nccl_kernels(self) -> list[dict]:
        """The NCCL kernels, each with its collective's sizes: from its own arguments (newer PyTorch)
        or, where it has none, from c10d's ``record_param_comms`` op around its launch (older PyTorch)."""
        found = []
        for k, launch in zip(self.kernels, self.launches, strict=True):
            if not str(k.get("name", "")).startswith("nccl"):
                continue
            if "Collective name" not in k.get("args", {}) and launch is not None:
                comms = self.comms.get(launch.get("tid"))
                sizes = comms.at(launch["ts"]) if comms else None
                if sizes:
                    k = {**k, "args": {**sizes, **k.get("args", {})}}
            found.append(k)
        return found


def module_layers(events: list[dict]) -> tuple[str | None, list[tuple[str, int, dict]]]:
    """The model's forward layers from ``nn.Module: <Class>_<i>`` events (``with_modules=True``):
    the blocks are the outermost class with two instances or more (a decoder layer, not the
    linears inside it); per call of the module around them, layer 0 is from its start to the
    first block, the last layer from the last block to its end.  Returns the block class and the
    spans as ``(direction, layer, event)``; (None, []) where no repeated module is found."""
    calls = [(m.group(1), int(m.group(2)), e) for e in events if e.get("cat") == "python_function"
             for m in [MODULE_CALL.match(str(e.get("name", "")))] if m]
    instances: dict[str, set[int]] = defaultdict(set)
    for cls, i, _ in calls:
        instances[cls].add(i)
    repeated = [cls for cls, seen in sorted(instances.items(), key=lambda kv: -len(kv[1])) if len(seen) >= 2]

    def first(cls: str) -> dict:
        return next(e for c, _, e in calls if c == cls)

    def holds(outer: dict, inner: dict) -> bool:
        return (outer is not inner and outer.get("tid") == inner.get("tid") and outer["ts"] <= inner["ts"]
                and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"])

    outermost = [cls for cls in repeated
                 if not any(holds(e, first(cls)) for c, _, e in calls if c in repeated and c != cls)]
    if not outermost:
        return None, []
    blocks_class = outermost[0]
    blocks = sorted((e for c, _, e in calls if c == blocks_class), key=lambda e: e["ts"])
    tops = [e for c, _, e in calls if c not in repeated and any(holds(e, b) for b in blocks[:1])]
    layers: list[tuple[str, int, dict]] = []
    for top in sorted({id(t): t for t in tops}.values(), key=lambda e: e["ts"]) or []:
        inside = [b for b in blocks if holds(top, b)]
        if not inside:
            continue
        end = top["ts"] + top["dur"]
        layers.append(("fwd", 0, _span(top["ts"], inside[0]["ts"], top)))
        layers += [("fwd", n + 1, b) for n, b in enumerate(inside)]
        layers.append(("fwd", len(inside) + 1, _span(inside[-1]["ts"] + inside[-1]["dur"], end, top)))
    return blocks_class, layers


def _span(start: float, end: float, like: dict) -> dict:
    return {"ts": start, "dur": max(0.0, end - start), "tid": like.get("tid"), "name": "module span"}


def phase_of(name: str) -> str | None:
    return next((phase for phase, pattern in PHASES if pattern.search(name)), None)


def by_thread(regions: Iterable[tuple[float, float, object, object]]) -> dict[object, Regions]:
    """(start, end, label, thread) -> one :class:`Regions` per thread."""
    grouped: dict[object, list] = defaultdict(list)
    for lo, hi, label, tid in regions:
        grouped[tid].append((lo, hi, label))
    return {tid: Regions(r) for tid, r in grouped.items()}


class Regions:
    """Time regions, each with a label; :meth:`at` is the innermost one holding a time."""

    LOOK_BACK = 16  # regions started before the nearest one that may still enclose the time

    def __init__(self, regions: Iterable[tuple[float, float, object]]):
        self.regions = sorted(regions, key=lambda r: r[0])
        self.starts = [r[0] for r in self.regions]

    def at(self, t: float | None, default=None):
        if t is None:
            return default
        i = bisect.bisect_right(self.starts, t) - 1
        for start, end, label in reversed(self.regions[max(0, i - self.LOOK_BACK):i + 1]):
            if start <= t <= end:
                return label
        return default


def per_step(index: TraceIndex) -> list[dict]:
    """Per profiler step: kernel time by phase and by kind, idle compute, the step's length."""
    kernels = index.kernels
    rows: list[dict] = []
    for lo, hi in index.steps or [(min((k["ts"] for k in kernels), default=0), float("inf"))]:
        phases: dict[str, float] = defaultdict(float)
        kinds: dict[str, float] = defaultdict(float)
        compute = []
        for k, launch in zip(kernels, index.launches, strict=True):
            if not lo <= k["ts"] < hi:
                continue
            kind = kind_of(str(k.get("name", "")))
            kinds[kind] += k["dur"] / 1e3
            phases[index.phase_of_launch(launch)] += k["dur"] / 1e3
            if kind != "communication":
                compute.append((k["ts"], k["ts"] + k["dur"]))
        length = (hi - lo) / 1e3 if hi != float("inf") else None
        idle = length - busy(union(compute)) / 1e3 if length and kernels else None
        rows.append({"phases": dict(phases), "kinds": dict(kinds), "idle": idle, "length": length})
    return rows


def layer_seconds(index: TraceIndex) -> tuple[dict, dict]:
    """Two maps (direction, layer index) -> seconds of each labelled span: the layer's compute (on a
    GPU the kernels launched inside the span from its thread, on a CPU the span itself, as the host
    thread computes) and, on a GPU, the host's (the span: the time to issue those kernels)."""
    compute: dict[tuple[str, int], list[float]] = defaultdict(list)
    host: dict[tuple[str, int], list[float]] = defaultdict(list)
    if not index.kernels:
        for direction, layer, e in index.layers:
            compute[(direction, layer)].append(e["dur"] * 1e-6)
        return compute, host
    # Each span's kernels: those whose launch falls inside it on the span's own thread.
    regions = by_thread((e["ts"], e["ts"] + e["dur"], n, e.get("tid"))
                         for n, (_, _, e) in enumerate(index.layers))
    kernel_s = [0.0] * len(index.layers)
    for k, launch in zip(index.kernels, index.launches, strict=True):
        if launch is not None and launch.get("tid") in regions:
            n = regions[launch["tid"]].at(launch["ts"])
            if n is not None:
                kernel_s[n] += k["dur"] * 1e-6
    for (direction, layer, e), seconds in zip(index.layers, kernel_s, strict=True):
        compute[(direction, layer)].append(seconds)
        host[(direction, layer)].append(e["dur"] * 1e-6)
    return compute, host


@dataclass(frozen=True)
class StepParts:
    """One profiler step's optimizer and training-loop figures (seconds)."""

    optimizer_gpu: float  # the update's kernels
    optimizer_host: float  # the host inside the optimizer's regions, issuing them
    optimizer_wall: float  # from the update's start on the host to its last kernel's end
    loop_host: float  # the loop's own host work: before the first layer, after the last kernel


def step_parts(index: TraceIndex) -> list[StepParts]:
    """Per profiler step with an optimizer region: what the update and the loop around it cost."""
    found = []
    layer_starts = sorted(e["ts"] for _, _, e in index.layers)
    for lo, hi in index.steps:
        regions = [(a, b) for a, b, phase in index.phases.regions if phase == "optimizer" and lo <= a < hi]
        if not regions:
            continue
        first, last = min(a for a, _ in regions), max(b for _, b in regions)
        gpu, last_kernel = 0.0, 0.0
        for k, launch in zip(index.kernels, index.launches, strict=True):
            if launch is None or not lo <= launch["ts"] < hi:
                continue
            last_kernel = max(last_kernel, k["ts"] + k["dur"])
            if index.phase_of_launch(launch) == "optimizer":
                gpu += k["dur"]
                last = max(last, k["ts"] + k["dur"])
        starts = layer_starts[bisect.bisect_left(layer_starts, lo):bisect.bisect_left(layer_starts, hi)]
        before = (starts[0] - lo) if starts else 0.0
        after = max(0.0, hi - max(last, last_kernel, max(b for _, b in regions)))
        found.append(StepParts(gpu * 1e-6, busy(union(regions)) * 1e-6, (last - first) * 1e-6,
                                (before + after) * 1e-6))
    return found




# Fewer launch configurations seen both alone and beside NCCL than this give no slowdown figure.
MIN_PAIRED_CONFIGS = 5


def slowdown_beside_nccl(kernels: list[dict]) -> tuple[float, int] | None:
    """How much slower compute kernels run while an NCCL kernel runs beside them, and on how many
    launch configurations that was seen; None where too few were seen both ways.

    Rule: the same kernel with the same grid and block is the same work, so its median duration
    while overlapping an NCCL kernel over its median alone is the slowdown that communication
    costs it (NCCL's kernels hold SMs and HBM bandwidth).  Configurations are weighted by the
    time they would have taken alone, as a step's lost time is."""
    nccl = sorted((k["ts"], k["ts"] + k["dur"]) for k in kernels if str(k.get("name", "")).startswith("nccl"))
    starts = [a for a, _ in nccl]
    groups: dict[tuple, tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
    for k in kernels:
        if k.get("cat") != "kernel" or str(k.get("name", "")).startswith("nccl") or not k.get("dur"):
            continue
        lo, hi = k["ts"], k["ts"] + k["dur"]
        i = bisect.bisect_left(starts, hi)
        beside = any(a < hi and b > lo for a, b in nccl[max(0, i - 4):i])
        args = k.get("args", {})
        groups[(k.get("name"), str(args.get("grid")), str(args.get("block")))][beside].append(k["dur"])
    weighted = total = 0.0
    paired = 0
    for alone, beside in groups.values():
        if len(alone) >= 2 and beside:
            typical = statistics.median(alone)
            weight = typical * len(beside)
            weighted += statistics.median(beside) / typical * weight
            total += weight
            paired += 1
    if paired < MIN_PAIRED_CONFIGS or total <= 0:
        return None
    return max(0.0, weighted / total - 1.0), paired


__all__ = ["KERNEL_KINDS", "LAYER_LABEL", "PHASES", "Regions", "StepParts", "TraceIndex", "by_thread",
           "kind_of", "layer_seconds", "module_layers", "per_step", "slowdown_beside_nccl", "step_parts"]
