"""The collective sweep: an nccl-tests-style table of each collective's time per size.

For every size (doubling from ``--min-bytes`` to ``--max-bytes``) and collective, every rank
launches a queue of asynchronous calls back to back and waits for them (up to 16 while they
fit in ``--budget-s``), three times; the time of a call is the slowest rank's median of queue
time / queue length.  Queued calls are how training issues large ones (a bucket at a time)
and how nccl-tests times them.

Calls up to ``SMALL_CALL_MAX_BYTES`` (64 KB) are timed alone, one after the other: there a
call's time is its latency, which a per-parameter strategy pays between other work, whereas
identical small calls queued back to back pipeline through gloo's worker threads and look
cheaper than any one of them is.  Their time is the mean of thirty in a row, because a step
pays the sum of its small calls and their times have a long tail (a median would miss it).
Training also issues small calls back to back (a per-parameter strategy's calls at the end
of backward or in the optimizer step), so an idle sweep times each small size a second way
too: thirty calls queued at once, their mean per call (``queued_time_us``).

Small calls between ranks that share a few cores go through spells, fast or several times
slower, that last seconds; a training run of many steps pays their mean.  So an idle sweep
times its small sizes in passes spread over the whole sweep, one before each collective's
large sizes and one at the end, and each small row is the mean over its passes
(``passes``).

Each row also says how much CPU time the rank's threads used per call (``cpu_us``, the mean
over ranks): on a CPU machine that is what communication takes from compute.  ``size`` is
the whole buffer S (the gathered output for all_gather, the input for reduce_scatter), so
``algbw = S / t`` and ``busbw = algbw * factor`` use nccl-tests' factors.

With ``load`` (``--under-load``) every rank computes in the background throughout (see
:mod:`.under_compute`), and each row says how much slower that compute ran instead.
"""

from __future__ import annotations

import contextlib
import statistics
import time

import torch
import torch.distributed as dist

from zero_sim.vocabulary import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER
from zero_sim.vocabulary.collectives import SMALL_CALL_MAX_BYTES, bus_factor

from ..options import BadInput
from .calls import launcher
from .device import CPU, Bench
from .under_compute import ComputeLoad

SWEEP_COLLECTIVES = (ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER)
SMALL_CALLS_IN_TURN = 30  # small calls timed one after the other: their mean is the row's time


def parse_bytes(text: str) -> int:
    """``64M`` -> 67108864; plain integers are bytes."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper().removesuffix("B")
    try:
        if t and t[-1] in units:
            return int(float(t[:-1]) * units[t[-1]])
        return int(t)
    except ValueError:
        raise BadInput(f"Cannot read {text!r} as a size; write e.g. 4096, 64K, 16M or 1G.") from None


def sizes(lo: int, hi: int, world: int) -> list[int]:
    """Doubling sizes, each a multiple of ``4 * world`` bytes so every rank gets whole fp32 elements."""
    step = 4 * world
    out, s = [], lo
    while s <= hi:
        out.append(max(step, s // step * step))
        s *= 2
    return sorted(set(out))


def _time_collective(kind: str, nbytes: int, world: int, iters: int, queue: int = 1,
                     in_turn: int = 1, bench: Bench = CPU) -> tuple[float, float]:
    """Seconds per call, wall and CPU: ``queue`` calls launched back to back and then waited
    for, as a training step issues them (and as nccl-tests times them), ``in_turn`` such
    rounds one after the other per timing; the median of ``iters`` timings of the mean per
    call.  Wall time is the slowest rank's (every rank waits for it); CPU time is what this
    process's threads used per call (gloo's workers, the kernel's TCP path on their behalf,
    the launching thread), averaged over the ranks.  On a GPU the clock is read once the
    device has finished (:class:`.device.Bench`)."""
    call = launcher(kind, nbytes, world, queue, bench.device)
    call().wait()  # warm-up: connection setup, first-touch allocation
    bench.sync()
    dist.barrier()
    walls, cpus = [], []
    for _ in range(iters):
        c0, t0 = time.process_time(), bench.now()
        for _ in range(in_turn):
            works = [call() for _ in range(queue)]
            for w in works:
                w.wait()
        walls.append((bench.now() - t0) / (queue * in_turn))
        cpus.append((time.process_time() - c0) / (queue * in_turn))
    # The median shrugs off a queue that lost the CPU to something else on a shared machine.
    slowest = torch.tensor([statistics.median(walls)], dtype=torch.float64, device=bench.device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    cpu = torch.tensor([statistics.median(cpus)], dtype=torch.float64, device=bench.device)
    dist.all_reduce(cpu, op=dist.ReduceOp.SUM)
    return float(slowest), float(cpu) / world


def collective_sweep(kinds, lo: int, hi: int, budget_s: float, load: bool = False,
                     bench: Bench = CPU) -> dict:
    """One row per (collective, size).  With ``load`` every rank computes in the background
    throughout, and each row also says how much slower that compute ran (``compute_slowdown``).
    ``bench`` says where the buffers live and how the clock is read (CPU, or this rank's GPU)."""
    world = dist.get_world_size()
    rows = []
    small_passes: dict[tuple[str, int], list[tuple[float, float, float]]] = {}
    with ComputeLoad() if load else contextlib.nullcontext() as busy:
        if busy is not None:
            dist.barrier()
            alone = busy.rate(0.5)
        for kind in kinds:
            if busy is None:  # idle: small sizes in passes spread over the sweep (module docstring)
                _small_call_pass(kinds, lo, hi, world, bench, small_passes)
            for s in sizes(lo, hi, world):
                if busy is None and s <= SMALL_CALL_MAX_BYTES:
                    continue
                probe, _ = _time_collective(kind, s, world, 1, bench=bench)
                if s <= SMALL_CALL_MAX_BYTES:
                    # Under load: small calls one at a time, thirty in a row, and their mean.
                    queue, in_turn = 1, SMALL_CALLS_IN_TURN
                else:
                    # Enough calls to see past timer noise, few enough to keep big sizes short.
                    queue = int(max(1, min(16, budget_s / 3 / max(probe, 1e-6), (64 << 20) // s)))
                    in_turn = 1
                fewest = 3 if in_turn == 1 else 1  # thirty small calls in a row are already a mean
                # Under load a row must last long enough (0.1 s) to read the compute rate from it.
                per_timing = queue * in_turn * max(probe, 1e-6)
                iters = fewest if busy is None else int(max(fewest, min(50, 0.1 / per_timing)))
                before, t0 = (busy.done if busy else 0), time.perf_counter()
                t, cpu = _time_collective(kind, s, world, iters, queue, in_turn, bench)
                row = _row(kind, s, world, t, iters, queue, in_turn)
                if busy is None:
                    row["cpu_us"] = cpu * 1e6  # under load the process's time includes the load itself
                else:
                    during = (busy.done - before) / (time.perf_counter() - t0)
                    row["compute_slowdown"] = max(0.0, alone / max(during, 1e-9) - 1.0)
                rows.append(row)
        if busy is None:
            _small_call_pass(kinds, lo, hi, world, bench, small_passes)
    rows += [_small_row(kind, s, world, timings) for (kind, s), timings in small_passes.items()]
    rows.sort(key=lambda r: (list(kinds).index(r["collective"]), r["size_bytes"]))
    return {"world_size": world, "backend": dist.get_backend(), "rows": rows, "under_load": load}


def _small_call_pass(kinds, lo: int, hi: int, world: int, bench: Bench,
                     timings: dict[tuple[str, int], list[tuple[float, float, float]]]) -> None:
    """One pass over every small size of every collective: thirty calls in a row (wall and
    CPU per call) and thirty queued at once, appended to ``timings[(kind, size)]``."""
    for kind in kinds:
        for s in sizes(lo, hi, world):
            if s <= SMALL_CALL_MAX_BYTES:
                t, cpu = _time_collective(kind, s, world, 1, in_turn=SMALL_CALLS_IN_TURN, bench=bench)
                queued, _ = _time_collective(kind, s, world, 1, queue=SMALL_CALLS_IN_TURN, bench=bench)
                timings.setdefault((kind, s), []).append((t, cpu, queued))


def _small_row(kind: str, s: int, world: int, timings: list[tuple[float, float, float]]) -> dict:
    """A small size's row: the mean over its passes, which is what many steps pay."""
    t, cpu, queued = (statistics.fmean(x) for x in zip(*timings, strict=True))
    return _row(kind, s, world, t, len(timings), 1, SMALL_CALLS_IN_TURN) | {
        "cpu_us": cpu * 1e6, "queued_time_us": queued * 1e6, "passes": len(timings)}


def _row(kind: str, s: int, world: int, t: float, iters: int, queue: int, in_turn: int) -> dict:
    """A sweep row as nccl-tests names its columns: ``s`` bytes in ``t`` seconds per call."""
    return {"collective": kind, "size_bytes": s, "count": s // 4, "type": "float", "time_us": t * 1e6,
            "algbw_gbps": s / t / 1e9, "busbw_gbps": s / t * bus_factor(kind, world) / 1e9,
            "iters": iters, "queue": queue, "in_turn": in_turn}


def format_table(sweep: dict) -> str:
    """The sweep as nccl-tests prints it (out-of-place columns only), one block per collective."""
    lines = []
    loaded = sweep.get("under_load")
    for kind in dict.fromkeys(r["collective"] for r in sweep["rows"]):
        lines.append(f"# {kind}_perf  nranks {sweep['world_size']}  backend {sweep['backend']}"
                     + ("  (every rank computing meanwhile)" if loaded else ""))
        lines.append(f"# {'size':>12} {'count':>12} {'type':>6} {'time':>10} {'algbw':>8} {'busbw':>8} "
                     f"{'queue':>6}" + (f" {'compute':>8}" if loaded else ""))
        lines.append(f"# {'(B)':>12} {'(elements)':>12} {'':>6} {'(us)':>10} {'(GB/s)':>8} {'(GB/s)':>8} "
                     f"{'(ops)':>6}" + (f" {'slowed':>8}" if loaded else ""))
        for r in sweep["rows"]:
            if r["collective"] == kind:
                lines.append(f"  {r['size_bytes']:>12} {r['count']:>12} {r['type']:>6} {r['time_us']:>10.1f} "
                             f"{r['algbw_gbps']:>8.3f} {r['busbw_gbps']:>8.3f} {r.get('queue', 1):>6}"
                             + (f" {r['compute_slowdown']:>8.0%}" if loaded else ""))
    what = {"mixed": "of 1 MB and 4 KB alternating", "large": "of 4 MB"}
    for r in sweep.get("under_compute", ()):
        lines.append(f"# {r['collective']}: {r['calls']} calls {what[r.get('queue', 'mixed')]}, queued: "
                     f"{r['idle_s'] * 1e3:.1f} ms idle, {r['loaded_s'] * 1e3:.1f} ms while every rank "
                     f"computes (which ran {r['compute_slowdown']:.0%} slower)")
    return "\n".join(lines)
