"""Calibration: measured inputs that replace the simulator's analytical guesses.

Simulators that reach a few percent of error are fed measurements; ours takes two kinds,
saved together in one JSON file that ``zero-sim simulate --calibration FILE`` loads:

* **collectives**: for each of all_reduce, reduce_scatter and all_gather, a latency and a
  bus bandwidth fitted to a sweep of sizes (``real_runs.microbench collectives``, or an
  nccl-tests table).  The model is ``t(S) = latency + factor(n) * S / busbw`` with
  nccl-tests' bus factors; :func:`fit_sweep` says how each parameter is read.  The
  latency is that of a small call made alone (the sweep times those one at a time, and
  takes their mean, as a step pays the sum of its small calls, long tail included), the
  per-call work the engine makes a process group pay one call at a time; a call that
  queues behind another of its group pays ``queued_latency`` instead, the same fit on the
  small sizes timed queued back to back (gloo's two worker threads overlap consecutive
  calls' hand-offs, so a queue of small calls costs less per call).  The swept
  times are kept beside the fit: from 1 MB up, where they are reliable, a collective
  alone takes the measured time (interpolated between sizes), not the line's.  A fit
  holds for the group size and the links it was measured on; the simulator uses it for
  collectives over groups of exactly that size and plans any other with its topology model.
* **compute**: seconds of forward and backward per layer kind (embedding, block, head) at
  a given number of tokens, and optimizer seconds per parameter
  (``real_runs.microbench layers``).  Times scale linearly with tokens.  The table is a
  rank's mean pace; ``slowest_rank_factor`` (passes started together from a barrier, the
  median of slowest rank / mean rank) stretches forward and backward, because the
  simulator runs its ranks alike and a step waits on the slowest one.

* **cpu** (a CPU machine, where ranks compute on the cores that also move their bytes):
  what communication takes from compute, read from the CPU time the sweep's calls used
  (``cpu_us``: gloo's threads and the kernel's TCP path, measured per call, not inferred
  from how long anything took).  Two figures come out of it, for ``N`` ranks of one
  compute thread each on ``C`` cores (:func:`cpu_from_sweep`):

  - ``collective_cpu_s``: the per-call CPU of a small call times ``N / C`` (every rank's
    threads take it from the same ``C`` cores the ``N`` ranks compute on); none when
    ``N < C``, where idle cores absorb it.  The engine takes it once per collective from
    the first compute op that runs while the collective is in flight (nothing if none does),
    at most that op's own time (a fair scheduler leaves compute half its core);
  - ``overlap_slowdown``: a large call's CPU beyond that per-call part, as the fraction
    ``f`` of a core a rank's threads keep busy while its bytes stream; what ``N`` ranks
    need beyond the idle cores comes out of compute, which the engine stretches by that
    ratio while a collective is in flight.

  - ``comm_bytes_rate_while_computing``: the pace of a rank's bytes while every rank
    computes, measured where the sweep timed a queue of large calls idle and while every
    rank computes (``under_compute`` rows with ``queue: large``), together with the per-call
    pace below.  Older sweeps lack that queue; there it is what a fair scheduler would grant
    the ``streaming_cores`` they need (idle cores first, then an equal share): 1 unless they
    need more.  Measured, it is far lower with more ranks than cores: gloo's threads need a
    core every time a socket's buffer fills or drains, and wait for one each time.
  - ``comm_rate_while_computing``, where the sweep also timed a queue of collectives idle
    and while every rank computes (``under_compute``): the pace of the calls' per-call
    work, the queue's slowdown beyond what its bytes took (its latencies are the fit's),
    the median over the collectives.  With more ranks than cores it is small: every
    hand-off of a call waits for a core until the compute pauses, and per-call work that
    the analytical picture overlaps with backward in fact waits for it to end.  The engine
    runs a collective's latency at this pace and its bytes at the one above while a member
    rank computes.  Communication that moves at a fraction of its pace while the ranks
    compute also uses that fraction of its CPU meanwhile, so both figures above are scaled
    by their part's pace: compute loses what communication manages to take.  (The queue
    also says how much slower the compute ran meanwhile; that figure is kept for the
    reader but not used, because it comes from windows of a fraction of a second and
    swings between collectives, where the CPU time is integrated over the whole sweep.)

What the measurement includes is what the simulator then assumes.  On a CPU machine
the layer timings are taken with all N ranks computing at once, as they do in a
data-parallel step, so the share of the cores each rank gets (``cores`` / N, plus
whatever the ranks lose to each other's caches) is in the numbers; the file records
``cores``, ``ranks`` and ``sharing_factor`` (slowdown against one rank alone when both
were measured) so a reader sees how much of the time is contention.

The file also says what was measured where (``measured_on``): host, cores, torch,
backend, world size and, for an emulated cluster, its shape and bandwidth.

Reading a file is strict (:mod:`zero_sim.calibration.schema`, a pydantic schema): every field has a
type, numbers are finite and within physical bounds, names (collectives, layer kinds,
backend, fabric and network kinds, GPU) are one of those the simulator knows, and a field
the format does not have is refused rather than ignored (a misspelt field silently falling
back to its default would be a wrong prediction nobody notices).  Whatever is wrong, the
error is one :class:`CalibrationError` sentence naming the field.  :meth:`Calibration.save`
checks the same rules before writing, so a file this module writes is one it can read.
"""

from __future__ import annotations

import bisect
import json
import math
import os
from dataclasses import asdict, dataclass, field

from pydantic import ValidationError

# The format's names live with its schema; they are imported from here as well.
from zero_sim.calibration.schema import (  # noqa: F401
    FITTED_COLLECTIVES,
    FORMAT,
    LAYER_KINDS,
    CalibrationFile,
    sentence,
    topology_dict,
    topology_spec,
)
from zero_sim.system.topology import TopologySpec
from zero_sim.vocabulary.collectives import bus_factor
from zero_sim.vocabulary.files import InputPathError, read_text_input, write_json_atomic

# A sweep has two regimes: below ~32 KB a collective costs its latency and nothing else;
# from ~1 MB up it costs its bytes over the bus bandwidth.  Between them, shaped links let
# a burst through at memory speed and a shared machine adds noise, so each parameter is
# read where it is visible.
LATENCY_MAX_BYTES = 32 * 1024
BANDWIDTH_MIN_BYTES = 1 << 20


class CalibrationError(ValueError):
    """A calibration file or measurement that cannot be used; one sentence saying how to fix it."""


@dataclass(frozen=True)
class CollectiveFit:
    """``t = latency_s + factor(kind, world_size) * S / busbw`` for groups of ``world_size`` ranks."""

    kind: str
    world_size: int
    latency_s: float
    busbw: float  # bytes/s
    max_rel_error: float  # worst relative error of the fit over the measured sizes
    sizes: tuple[int, ...] = ()
    times_s: tuple[float, ...] = ()  # what each of ``sizes`` measured, when the sweep is at hand
    # A small call's latency when it queues behind another of its process group (a backend whose
    # worker threads overlap consecutive calls' hand-offs); None: as ``latency_s``.
    queued_latency_s: float | None = None

    def time(self, nbytes: float) -> float:
        return self.latency_s + bus_factor(self.kind, self.world_size) * nbytes / self.busbw

    def alone_time(self, nbytes: float) -> float:
        """What one collective of ``nbytes`` takes by itself: between two swept sizes from
        1 MB up, the measured times interpolated (log-log); elsewhere the fit.

        Large sizes are measured reliably, and a two-parameter line misses them where per-byte
        cost grows with size (socket buffers, caches); small sizes are noisy one by one, so
        there the fit's latency (a trimmed mean over the small sizes) is the better figure."""
        pts = _by_size([(s, t) for s, t in zip(self.sizes, self.times_s, strict=False)
                        if s >= BANDWIDTH_MIN_BYTES])
        if len(pts) < 2 or not pts[0][0] <= nbytes <= pts[-1][0]:
            return self.time(nbytes)
        i = min(max(bisect.bisect_left([s for s, _ in pts], nbytes), 1), len(pts) - 1)
        (s0, t0), (s1, t1) = pts[i - 1], pts[i]
        w = math.log(nbytes / s0) / math.log(s1 / s0)
        return math.exp(math.log(t0) + w * (math.log(t1) - math.log(t0)))


def _by_size(points: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """Points sorted by size, one per size (the mean time of a repeated size): the interpolation
    needs two distinct sizes either side, and a pasted table may repeat one (nccl-tests ``-d all``)."""
    times: dict[int, list[float]] = {}
    for size, t in points:
        times.setdefault(size, []).append(t)
    return [(size, sum(ts) / len(ts)) for size, ts in sorted(times.items())]


@dataclass(frozen=True)
class ComputeCalibration:
    layer_seconds: dict[str, dict[str, float]]  # kind -> {"fwd": s, "bwd": s} at ``tokens``
    tokens: int  # tokens per rank the layer times were measured at
    optimizer_seconds_per_param: float | None
    ranks: int  # ranks computing at once during the measurement
    cores: int | None
    sharing_factor: float | None = None  # block time with ``ranks`` at once / one rank alone
    model: str | None = None
    # the slowest rank's pass over the mean rank's, for passes started together (1: one rank)
    slowest_rank_factor: float = 1.0
    # Host seconds to issue each layer kind's kernels (fwd, bwd), where ``layer_seconds`` holds GPU
    # kernel time alone (a profiler trace's); None where the layer times already hold the host's part
    # (timed end to end).  Host time does not grow with the tokens, so it is kept apart.
    host_seconds: dict[str, dict[str, float]] | None = None
    # With ``host_seconds``: the host's time per parameter to issue the update (a per-parameter
    # Python loop is host-bound), and the training loop's own host work per step, which ends in a
    # sync (data to the GPU, the loss read).
    optimizer_host_seconds_per_param: float | None = None
    step_host_s: float | None = None


@dataclass(frozen=True)
class CpuCalibration:
    """What communication costs the compute it shares a CPU with (see the module docstring)."""

    collective_cpu_s: float  # compute seconds a rank loses per collective
    overlap_slowdown: float  # compute runs 1 + this times longer while a large collective streams
    ranks: int
    cores: int | None = None
    call_cpu_s: float | None = None  # measured: CPU seconds of one small call, per rank
    streaming_cores: float | None = None  # measured: cores a rank's threads keep busy while bytes stream
    comm_rate_while_computing: float = 1.0  # collectives' per-call work: its pace while every rank computes
    # their bytes' pace while every rank computes; None: the per-call pace (files before it was split)
    comm_bytes_rate_while_computing: float | None = None

    @property
    def bytes_pace(self) -> float:
        """The bytes' pace while the ranks compute (the per-call pace where it was not split)."""
        b = self.comm_bytes_rate_while_computing
        return self.comm_rate_while_computing if b is None else b


@dataclass(frozen=True)
class Calibration:
    collectives: dict[str, CollectiveFit] = field(default_factory=dict)
    compute: ComputeCalibration | None = None
    backend: str | None = None
    measured_on: dict = field(default_factory=dict)
    # a real box's, from nvidia-smi topo + nccl-tests (`--topology calibrated`)
    topology: TopologySpec | None = None
    cpu: CpuCalibration | None = None
    # GPU compute's slowdown while NCCL kernels run beside it (a fraction: 0.06 is 6% slower), as a
    # profiler trace measured it (the same kernels with and without a collective running)
    overlap_slowdown: float | None = None

    def fit_for(self, kind: str, world_size: int) -> CollectiveFit | None:
        fit = self.collectives.get(kind)
        return fit if fit is not None and fit.world_size == world_size else None

    def describe(self) -> str:
        parts = []
        for kind, f in self.collectives.items():
            queued = "" if f.queued_latency_s is None else f" ({f.queued_latency_s * 1e6:.0f} us queued)"
            parts.append(f"{kind} n={f.world_size}: {f.latency_s * 1e6:.0f} us{queued} + "
                         f"busbw {f.busbw / 1e9:.3f} GB/s (fit within {f.max_rel_error:.1%})")
        if self.compute:
            c = self.compute
            block = c.layer_seconds.get("block", {})
            parts.append(f"compute: block fwd {block.get('fwd', 0) * 1e3:.2f} ms / "
                         f"bwd {block.get('bwd', 0) * 1e3:.2f} ms "
                         f"at {c.tokens} tokens, {c.ranks} rank(s)"
                         f"{'' if c.cores is None else f' on {c.cores} core(s)'}, slowest rank "
                         f"{c.slowest_rank_factor:.3f}x the mean")
            if c.host_seconds:
                host = c.host_seconds.get("block", {})
                parts[-1] += (f"; GPU kernel time, issued by a host taking block fwd "
                              f"{host.get('fwd', 0) * 1e3:.2f} ms / bwd {host.get('bwd', 0) * 1e3:.2f} ms")
            if c.optimizer_seconds_per_param is not None:
                parts[-1] += f"; optimizer {c.optimizer_seconds_per_param * 1e9:.2f} ns per parameter"
        if self.overlap_slowdown is not None:
            parts.append(f"GPU compute {self.overlap_slowdown:.0%} slower beside NCCL kernels")
        if self.cpu:
            parts.append(f"cpu: {self.cpu.collective_cpu_s * 1e6:.0f} us of compute lost per collective, "
                         f"compute {self.cpu.overlap_slowdown:.0%} slower while a large collective streams, "
                         f"collectives' per-call work at {self.cpu.comm_rate_while_computing:.0%} "
                         f"and their bytes at {self.cpu.bytes_pace:.0%} of their pace "
                         f"while the ranks compute")
            u = self.cpu
            if u.call_cpu_s is not None and u.streaming_cores is not None:
                parts[-1] += (f" (measured: {u.call_cpu_s * 1e6:.0f} us of CPU per small call, "
                              f"{u.streaming_cores:.2f} of a core while streaming; "
                              f"{u.ranks} ranks on {u.cores} cores)")
        where = self.measured_on
        src = ", ".join(f"{k} {v}" for k, v in where.items() if v not in (None, "", {}))
        return "; ".join(parts) + (f" [measured on: {src}]" if src else "")

    # ------------------------------------------------------------------ files
    def to_dict(self) -> dict:
        return {
            "format": FORMAT,
            "backend": self.backend,
            "measured_on": self.measured_on,
            "collectives": {k: {"world_size": f.world_size, "latency_s": f.latency_s,
                                "busbw_gbps": f.busbw / 1e9,
                                "max_rel_error": f.max_rel_error, "sizes": list(f.sizes),
                                "times_s": list(f.times_s), "queued_latency_s": f.queued_latency_s}
                            for k, f in self.collectives.items()},
            "compute": None if self.compute is None else {
                "layer_seconds": self.compute.layer_seconds, "tokens": self.compute.tokens,
                "optimizer_seconds_per_param": self.compute.optimizer_seconds_per_param,
                "ranks": self.compute.ranks, "cores": self.compute.cores,
                "sharing_factor": self.compute.sharing_factor, "model": self.compute.model,
                "slowest_rank_factor": self.compute.slowest_rank_factor,
                "host_seconds": self.compute.host_seconds,
                "optimizer_host_seconds_per_param": self.compute.optimizer_host_seconds_per_param,
                "step_host_s": self.compute.step_host_s},
            "topology": None if self.topology is None else topology_dict(self.topology),
            "cpu": None if self.cpu is None else asdict(self.cpu),
            "overlap_slowdown": self.overlap_slowdown,
        }

    def save(self, path: str | os.PathLike) -> None:
        """Write the file whole or not at all; a calibration that :meth:`load` would refuse is
        refused here, before anything is written."""
        d = self.to_dict()
        Calibration.from_dict(d, "this calibration")
        write_json_atomic(path, d)

    @classmethod
    def from_dict(cls, d: dict, source: str = "the calibration") -> Calibration:
        """A calibration from a file's JSON object; anything malformed is one :class:`CalibrationError`."""
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise CalibrationError(f"{source} is not a zero-sim calibration file "
                                   f"(expected \"format\": \"{FORMAT}\"); "
                                   f"make one with `zero-sim calibrate`")
        try:
            f = CalibrationFile.model_validate(d)
        except ValidationError as exc:
            raise CalibrationError(sentence(source, exc.errors()[0])) from None
        fits = {kind: CollectiveFit(kind, v.world_size, v.latency_s, v.busbw_gbps * 1e9, v.max_rel_error,
                                    tuple(v.sizes), tuple(v.times_s), v.queued_latency_s)
                for kind, v in (f.collectives or {}).items()}
        c = f.compute
        compute = None if c is None else ComputeCalibration(
            {kind: {"fwd": t.fwd, "bwd": t.bwd} for kind, t in c.layer_seconds.items()}, c.tokens,
            c.optimizer_seconds_per_param, c.ranks, c.cores, c.sharing_factor, c.model, c.slowest_rank_factor,
            None if c.host_seconds is None else {kind: {"fwd": t.fwd, "bwd": t.bwd}
                                                 for kind, t in c.host_seconds.items()},
            c.optimizer_host_seconds_per_param, c.step_host_s)
        u = f.cpu
        cpu = None if u is None else CpuCalibration(u.collective_cpu_s, u.overlap_slowdown, u.ranks, u.cores,
                                                    u.call_cpu_s, u.streaming_cores,
                                                    u.comm_rate_while_computing,
                                                    u.comm_bytes_rate_while_computing)
        return cls(fits, compute, f.backend, f.measured_on or {}, topology_spec(f.topology), cpu,
                   f.overlap_slowdown)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Calibration:
        try:
            text = read_text_input(path, "calibration file")
        except InputPathError as exc:
            raise CalibrationError(str(exc)) from None
        try:
            d = json.loads(text)
        except (ValueError, RecursionError):  # JSONDecodeError, or a number too long to convert
            raise CalibrationError(f"{str(path)!r} is not JSON; "
                                   f"pass a file written by `zero-sim calibrate`") from None
        return cls.from_dict(d, f"{str(path)!r}")
