"""Fitting calibration figures from measurements: a collective sweep, nccl-tests output,
``nvidia-smi topo -m`` and per-layer timings become the records of
:mod:`zero_sim.calibration.format`.

Pure arithmetic on numbers already measured; measuring itself (launching ranks) is
:mod:`sim2real.measure`'s job.
"""

from __future__ import annotations

import statistics
from dataclasses import replace

from zero_sim.calibration.format import (
    BANDWIDTH_MIN_BYTES,
    FITTED_COLLECTIVES,
    LATENCY_MAX_BYTES,
    LAYER_KINDS,
    CalibrationError,
    CollectiveFit,
    ComputeCalibration,
    CpuCalibration,
)
from zero_sim.system.collectives import BACKENDS, CollectiveError
from zero_sim.system.nccl_tests import (
    LatencyBandwidthFit,
    NcclTestsRow,
    NcclTestsTable,
    fit_nccl_tests,
    parse_nccl_tests,
)
from zero_sim.system.topology import TopologyError, TopologySpec, parse_nvidia_smi_topo
from zero_sim.vocabulary import ALL_REDUCE
from zero_sim.vocabulary.collectives import SMALL_CALL_MAX_BYTES, bus_factor


def fit_sweep(rows: list[dict], world_size: int, min_bytes: int = 0) -> dict[str, CollectiveFit]:
    """Fit latency and busbw per collective from a microbenchmark sweep (rows as
    ``real_runs.microbench`` writes them).

    ``latency`` is the time of the sizes up to 32 KB less their bytes' share, averaged over
    those sizes less the slowest and the fastest: a step pays the sum of its small calls, so
    the mean is the figure, and slow spells on a shared machine fill whole rows now and then,
    so a median over rows would miss them while a plain mean would follow one disturbed row;
    ``busbw`` minimises the relative error of ``latency + factor*S/busbw`` over the sizes
    from 1 MB up; the two are refined in turn.  ``queued_latency`` is the same trimmed mean
    over the small sizes timed queued back to back (``queued_time_us``, when the sweep has
    it): what a call costs behind another of its kind.  A sweep
    that lacks either regime falls back to one relative least-squares fit over every
    size from ``min_bytes`` (:func:`zero_sim.system.nccl_tests.fit_nccl_tests`)."""

    fits = {}
    for kind in FITTED_COLLECTIVES:
        mine = sorted((r for r in rows if r["collective"] == kind), key=lambda r: r["size_bytes"])
        factor = bus_factor(kind, world_size)
        fit = _two_regime_fit(kind, world_size, mine, factor)
        if fit is None:
            wide = [r for r in mine if r["size_bytes"] >= min_bytes]
            fit = _single_line_fit(kind, world_size, wide, factor)
        if fit is not None:
            fits[kind] = fit
    if not fits:
        raise CalibrationError("the sweep has fewer than two sizes of any collective; "
                               "sweep a wider size range")
    return fits


def _two_regime_fit(kind: str, world_size: int, mine: list[dict], factor: float) -> CollectiveFit | None:
    """Latency from the small sizes, busbw from the large ones, refined in turn (see
    :func:`fit_sweep`); None when the sweep lacks either regime."""
    small = [(r["size_bytes"], r["time_us"] * 1e-6) for r in mine if r["size_bytes"] <= LATENCY_MAX_BYTES]
    large = [(r["size_bytes"], r["time_us"] * 1e-6) for r in mine if r["size_bytes"] >= BANDWIDTH_MIN_BYTES]
    if len(small) < 2 or len(large) < 2 or factor <= 0:
        return None
    # Alternate: latency is what the small sizes take beyond their bytes; 1/busbw then
    # minimises sum(((latency + factor*S/busbw) - t) / t)^2 over the large sizes (closed form).
    inv_bw = 0.0
    for _ in range(3):
        latency = max(0.0, _trimmed_mean([t - factor * sz * inv_bw for sz, t in small]))
        num = sum(factor * sz / t * (1.0 - latency / t) for sz, t in large)
        den = sum((factor * sz / t) ** 2 for sz, t in large)
        inv_bw = num / den if num > 0 else 0.0
    if inv_bw <= 0:
        return None
    queued = [(r["size_bytes"], r["queued_time_us"] * 1e-6) for r in mine
              if r["size_bytes"] <= LATENCY_MAX_BYTES and "queued_time_us" in r]
    queued_latency = (max(0.0, _trimmed_mean([t - factor * sz * inv_bw for sz, t in queued]))
                      if len(queued) >= 2 else None)
    fit = CollectiveFit(kind, world_size, latency, 1.0 / inv_bw, 0.0, tuple(r["size_bytes"] for r in mine),
                        tuple(r["time_us"] * 1e-6 for r in mine), queued_latency)
    worst = max(abs(fit.time(r["size_bytes"]) / (r["time_us"] * 1e-6) - 1) for r in mine)
    return replace(fit, max_rel_error=worst)


def _single_line_fit(kind: str, world_size: int, mine: list[dict], factor: float) -> CollectiveFit | None:
    """One relative least-squares line over every size (nccl-tests' fit); None below two sizes."""
    if len(mine) < 2:
        return None
    table = NcclTestsTable(tuple(NcclTestsRow(int(r["size_bytes"]), float(r["time_us"]),
                                              float(r["algbw_gbps"]), float(r["busbw_gbps"]) or 1e-12)
                                 for r in mine),
                           world_size, factor)
    try:
        return _from_lbfit(kind, world_size, fit_nccl_tests(table), table)
    except CollectiveError as exc:  # a sweep that no line fits: say which collective, in one sentence
        largest = max(r["size_bytes"] for r in mine)
        if largest < BANDWIDTH_MIN_BYTES:  # only latency-bound sizes: no bandwidth to read
            raise CalibrationError(f"the {kind} sweep reaches only {largest:,} bytes, where a call costs "
                                   f"its latency alone; sweep up to at least 1M (--max-bytes)") from None
        raise CalibrationError(f"the {kind} sweep cannot be fitted: {exc}") from None


def _trimmed_mean(values: list[float]) -> float:
    """The mean without the largest and the smallest value (all of them when there are fewer than four)."""
    values = sorted(values)
    if len(values) >= 4:
        values = values[1:-1]
    return sum(values) / len(values)


def _from_lbfit(kind: str, n: int, fit: LatencyBandwidthFit, table: NcclTestsTable) -> CollectiveFit:
    return CollectiveFit(kind, n, fit.latency_s, fit.busbw, fit.max_rel_error,
                         tuple(r.size_bytes for r in table.rows), tuple(r.time_us * 1e-6 for r in table.rows))


def cpu_from_sweep(rows: list[dict], world_size: int, cores: int, under_compute: list[dict] | None = None,
                   fits: dict[str, CollectiveFit] | None = None) -> CpuCalibration:
    """What communication takes from compute, from the CPU time per call of an idle sweep
    (rows with ``cpu_us``) on ``world_size`` ranks sharing ``cores`` cores.

    ``c``: the median CPU per call up to 64 KB, where a call is nearly all per-call work.
    ``f``: from 1 MB up, the median of (CPU per call - ``c``) / its time, the fraction of a
    core a rank's threads keep busy while bytes stream.  Every rank computes on one thread,
    so ``min(N, C)`` cores compute; communication first takes the ``C - N`` idle ones, and
    what it needs beyond them comes out of compute, shared by all ``N`` ranks:

    * per call: each rank's compute loses ``c * N / C`` (nothing when ``N < C``);
    * while streaming: compute gets ``min(N, C) - max(0, N f p_b - max(0, C - N))`` cores
      instead of ``min(N, C)``; ``overlap_slowdown`` is the ratio less one (at most 1: a
      fair scheduler leaves compute at least half of the cores it shares).

    While every rank computes, a collective's two parts slow differently
    (:func:`streaming_pace`, :func:`per_call_pace`): its bytes need ``f`` of a core, which a
    fair scheduler grants up to an equal share, so they stream at ``p_b`` (1 unless ``f``
    exceeds that share); its per-call work waits for a core at every hand-off, which only
    a measurement shows.  With ``under_compute`` rows (a queue timed idle and while every
    rank computes), the queue's slowdown beyond its bytes' gives that per-call pace ``p``
    (the median over the collectives), ``comm_rate_while_computing``; ``p_b`` is
    ``comm_bytes_rate_while_computing``.  Where the sweep also timed a queue of large calls
    (``queue: large``), ``p`` and ``p_b`` are both measured (:func:`paces_under_compute`):
    a fair share is what a thread that runs whenever it likes would get, but gloo's
    threads need a core every time a socket's buffer fills or drains, and with more ranks
    than cores they wait for one each time.  The CPU communication takes while the ranks
    compute is its part's pace times the idle figures: ``c p`` per call, as above, and
    ``f p_b`` while streaming (see the module docstring).  ``fits``: the sweep's own
    :func:`fit_sweep`, where the caller has it already."""
    timed = [r for r in rows if r.get("cpu_us") is not None and r["time_us"] > 0]
    small = [r["cpu_us"] * 1e-6 for r in timed if r["size_bytes"] <= SMALL_CALL_MAX_BYTES]
    if not small or not any(r["size_bytes"] >= BANDWIDTH_MIN_BYTES for r in timed):
        raise CalibrationError("the sweep has no CPU time per call at sizes up to 64 KB and from 1 MB; rerun "
                               "`real_runs.microbench collectives` from 1K to at least 1M")
    n, c_cores = world_size, max(1, int(cores))
    per_call = statistics.median(small)
    streaming = statistics.median(max(0.0, r["cpu_us"] * 1e-6 - per_call) / (r["time_us"] * 1e-6)
                                  for r in timed if r["size_bytes"] >= BANDWIDTH_MIN_BYTES)
    bytes_pace = streaming_pace(n, c_cores, streaming)
    pace = 1.0
    if under_compute:
        fits = fit_sweep(rows, n) if fits is None else fits
        mixed = {r["collective"]: r for r in under_compute if r.get("queue", "mixed") == "mixed"}
        large = {r["collective"]: r for r in under_compute if r.get("queue") == "large"}
        both = [k for k in mixed if k in large]
        if both:
            paces = [paces_under_compute(mixed[k], large[k], fits.get(k)) for k in both]
            pace = statistics.median(p for p, _ in paces)
            bytes_pace = statistics.median(b for _, b in paces)
        else:
            pace = statistics.median(per_call_pace(r, fits.get(r["collective"]), bytes_pace)
                                     for r in mixed.values())
    computing = min(n, c_cores)
    left = computing - max(0.0, n * streaming * bytes_pace - max(0, c_cores - n))
    return CpuCalibration(per_call * pace * n / c_cores if n >= c_cores else 0.0, computing / left - 1.0, n,
                          c_cores, per_call, streaming, pace, bytes_pace)


def streaming_pace(ranks: int, cores: int, streaming_cores: float) -> float:
    """The pace of a rank's bytes while every rank computes: its threads need ``f`` =
    ``streaming_cores`` of a core to stream at the idle rate.  Idle cores go to them first;
    beyond those, a fair scheduler gives each of the ``2N`` runnable threads (a compute and
    a communication thread per rank) an equal share ``C / 2N``, and a thread that needs less
    than its share gets what it needs."""
    if streaming_cores <= 0:
        return 1.0
    share = max((cores - ranks) / ranks, cores / (2 * ranks))
    return min(1.0, share / streaming_cores)


def per_call_pace(row: dict, fit: CollectiveFit | None, bytes_pace: float) -> float:
    """The pace of a collective's per-call work while every rank computes, from a queue timed
    idle and loaded (``under_compute`` rows): its ``calls`` latencies (the fit's) are the
    per-call part of the idle time, the rest its bytes, which take ``1 / bytes_pace`` times
    as long loaded; what the loaded queue took beyond that is the per-call part slowed.
    Without a fit, the whole queue's ratio.  Between 0.02 and 1."""
    idle, loaded = row["idle_s"], row["loaded_s"]
    if fit is None:
        pace = idle / loaded
    else:
        per_call = min(idle, row["calls"] * fit.latency_s)
        left = loaded - (idle - per_call) / bytes_pace
        pace = per_call / left if left > per_call else 1.0
    return _clamped(pace)


def _clamped(pace: float) -> float:
    """A pace under compute: at most its idle pace, and never quite stopped."""
    return min(1.0, max(0.02, pace))


def paces_under_compute(mixed: dict, large: dict, fit: CollectiveFit | None) -> tuple[float, float]:
    """The pace of a collective's per-call work and of its bytes while every rank computes,
    from two queues timed idle and loaded: ``mixed`` (mostly per-call work) and ``large``
    (mostly bytes).  Each queue's idle time is its ``calls`` latencies (the fit's) plus its
    bytes; loaded, each part takes ``1 / pace`` times as long: two equations for the two
    paces.  Where they put a pace above 1, it is 1 and the other is read from the queue it
    dominates.  Without a fit, each queue's own ratio.  Each between 0.02 and 1."""
    if fit is None:
        return _clamped(mixed["idle_s"] / mixed["loaded_s"]), _clamped(large["idle_s"] / large["loaded_s"])
    lm, ll = (min(q["idle_s"], q["calls"] * fit.latency_s) for q in (mixed, large))
    bm, bl = mixed["idle_s"] - lm, large["idle_s"] - ll
    tm, tl = mixed["loaded_s"], large["loaded_s"]
    # Slowdowns (1 / pace) of the per-call part and of the bytes: lm x + bm y = tm, ll x + bl y = tl.
    det = lm * bl - ll * bm
    x, y = ((tm * bl - tl * bm) / det, (lm * tl - ll * tm) / det) if det > 0 else (1.0, 1.0)
    if y < 1 or det <= 0:  # bytes at full pace: the per-call part takes the mixed queue's slowdown
        y = 1.0
        x = (tm - bm) / lm if lm > 0 else 1.0
    elif x < 1:  # per-call work at full pace: the bytes take the large queue's slowdown
        x = 1.0
        y = (tl - ll) / bl if bl > 0 else 1.0
    return _clamped(1 / max(x, 1.0)), _clamped(1 / max(y, 1.0))


def fit_nccl_tests_text(text: str, collective: str = ALL_REDUCE) -> CollectiveFit:
    """One fit from pasted nccl-tests output (``all_reduce_perf`` and friends)."""
    if collective not in FITTED_COLLECTIVES:
        raise CalibrationError(f"cannot fit {collective!r}; choose one of {', '.join(FITTED_COLLECTIVES)}")
    try:
        table = parse_nccl_tests(text, collective)
        return _from_lbfit(collective, table.n_ranks, fit_nccl_tests(table), table)
    except CollectiveError as exc:
        raise CalibrationError(str(exc)) from None


def topology_from_imports(nvidia_smi_text: str, fits: dict[str, CollectiveFit]) -> TopologySpec:
    """A real box's topology: the GPU layout of ``nvidia-smi topo -m``, its link figures set from
    the nccl-tests all_reduce fit when there is one (otherwise the layout's defaults stay).

    On NVLink/NVSwitch each ring edge has a GPU port to itself, so the port rate is the
    measured busbw.  On PCIe every edge of a ring of n GPUs crosses their shared bus once,
    so the bus carries n times the busbw; across subgroups the host bridge is the limit.
    The per-hop latency is the fitted latency spread over the ring's 2(n-1) steps."""
    try:
        spec = parse_nvidia_smi_topo(nvidia_smi_text, name="calibrated")
    except TopologyError as exc:
        raise CalibrationError(str(exc)) from None
    fit = fits.get(ALL_REDUCE)
    if fit is None:
        return spec
    n, bw = fit.world_size, fit.busbw / 1e9
    hop_us = max(0.0, fit.latency_s - BACKENDS["nccl"].launch_latency_s) / max(1, 2 * (n - 1)) * 1e6
    fab = spec.fabric
    if fab.kind == "nvswitch":
        fab = replace(fab, port_gbps=bw, port_latency_us=hop_us)
    elif fab.subgroups > 1 and n > spec.gpus_per_node // fab.subgroups:
        fab = replace(fab, bridge_gbps=bw, bridge_latency_us=hop_us)
    else:
        fab = replace(fab, bus_gbps=bw * n, bus_latency_us=hop_us)
    return replace(spec, fabric=fab,
                   source=f"nvidia-smi topo -m; links fitted to nccl-tests all_reduce on {n} GPUs "
                          f"({fit.latency_s * 1e6:.0f} us + {bw:.2f} GB/s busbw)")


def compute_from_layers(layers: dict, alone: dict | None = None) -> ComputeCalibration:
    """Compute calibration from ``real_runs.microbench layers`` output (taken with all ranks
    at once); ``alone`` is the same measurement on one rank, to report the sharing factor."""
    by_kind = layers["by_kind"]
    missing = [k for k in LAYER_KINDS if k not in by_kind]
    if missing:
        raise CalibrationError(f"the layer timings lack the {missing[0]!r} layer kind; "
                               "rerun the layers benchmark")
    sharing = None
    if alone is not None:
        sharing = by_kind["block"]["fwd"] / alone["by_kind"]["block"]["fwd"]
    return ComputeCalibration({k: dict(by_kind[k]) for k in LAYER_KINDS}, int(layers["tokens"]),
                              layers.get("optimizer_s_per_param"), int(layers.get("world_size", 1)),
                              layers.get("cores"), sharing, layers.get("model"),
                              float(layers.get("slowest_rank_factor", 1.0)))


