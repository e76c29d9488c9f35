"""Measure what the simulator needs as inputs: collective times and per-layer compute times.

Two measurements, both run under ``torchrun`` on the ranks (and the network) that the
real training runs will use, so that whatever those ranks share (cores, a shaped link)
is part of what is measured::

    # the collective sweep: an nccl-tests-style table per collective, on 2 gloo ranks
    python -m real_runs.microbench --nproc 2 collectives --max-bytes 64M --out out/coll.json

    # per-layer forward/backward and optimizer times of the real model
    python -m real_runs.microbench --nproc 2 layers --model small --micro-batch 4 --out out/layers.json

**Collectives.**  For every size (doubling from ``--min-bytes`` to ``--max-bytes``) and
collective, every rank launches a queue of asynchronous calls back to back and waits for
them (up to 16 while they fit in ``--budget-s``), three times; the time of a call is the
slowest rank's median of queue time / queue length.  Queued calls are how training issues
large ones (a bucket at a time) and how nccl-tests times them.  Up to 64 KB calls are
timed alone, one after the other: there a call's time is its latency, which a
per-parameter strategy pays between other work, whereas identical small calls queued back
to back pipeline through gloo's two worker threads and look cheaper than any one of them
is.  Their time is the mean of thirty in a row, because a step pays the sum of its small
calls and their times have a long tail: on gloo between two ranks sharing two cores, timed
call by call, half of them took 0.5-0.9 ms and one in ten about 4 ms, and slow spells last
long enough to fill a whole row now and then.  Each row also
says how much CPU time the rank's threads used per call (``cpu_us``, the mean over ranks):
on a CPU machine that is what communication takes from compute.
``size`` is the whole buffer S (the gathered output for all_gather, the input for
reduce_scatter), so ``algbw = S / t`` and ``busbw = algbw * factor`` use nccl-tests' factors.

Last, for each collective, a queue of 1 MB and 4 KB calls alternating (``under_compute``)
is timed with every rank idle and while every rank's main thread computes: how fast
collectives progress while the cores compute, and how much slower that compute runs.  With
more ranks than cores, gloo's threads barely get a core while the ranks compute.

``--under-load`` keeps every rank computing in a background thread during the sweep.
On a CPU machine the collectives of backward run while the ranks compute, and gloo's
threads then wait for a core at every step of the ring; the loaded sweep measures that,
and each row says how much slower the background compute ran meanwhile.

**Layers.**  Every rank runs forward and backward of each layer of the real model
(``real_runs.model``) on its micro-batch, all ranks at once and pass after pass with no
barrier between passes, so that every rank stays busy as in training;
the table keeps each rank's median over iterations, averaged over the ranks.  Then whole
passes are timed from a barrier each, as steps start together, and ``slowest_rank_factor``
says how much later than the mean rank the slowest one ends a pass (the step waits on it).
The AdamW step is timed on the whole model and reported per parameter.  ``cores`` and ``threads``
are recorded with the figures, because on a CPU they decide how much each rank gets.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from zero_sim.vocabulary import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER
from zero_sim.vocabulary.collectives import SMALL_CALL_MAX_BYTES, bus_factor

from .model import PRESETS, build_model, global_batch, rank_shard
from .strategies import AdamW
from .strategies.base import _all_gather, _reduce_scatter
from .train import BadInput, _Parser, _write_json

SWEEP_COLLECTIVES = (ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER)
SMALL_CALLS_IN_TURN = 30  # small calls timed one after the other: their mean is the row's time
LAYER_KINDS = ("embedding", "block", "head")


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


def _launcher(kind: str, nbytes: int, world: int, slots: int):
    """A function that launches one asynchronous ``kind`` of ``nbytes`` on the next of
    ``slots`` buffer pairs (so ops queued together never share a buffer) and returns its work."""
    numel = nbytes // 4
    if kind == ALL_REDUCE:
        bufs = [(torch.ones(numel),) for _ in range(slots)]
        launch = lambda b: dist.all_reduce(b[0], async_op=True)  # noqa: E731
    elif kind == REDUCE_SCATTER:
        bufs = [(torch.empty(numel // world), torch.ones(numel)) for _ in range(slots)]
        launch = lambda b: _reduce_scatter(b[0], b[1], async_op=True)  # noqa: E731
    else:
        bufs = [(torch.empty(numel), torch.ones(numel // world)) for _ in range(slots)]
        launch = lambda b: _all_gather(b[0], b[1], async_op=True)  # noqa: E731
    turns = itertools.cycle(bufs)
    return lambda: launch(next(turns))


def _time_collective(kind: str, nbytes: int, world: int, iters: int, queue: int = 1,
                     in_turn: int = 1) -> tuple[float, float]:
    """Seconds per call, wall and CPU: ``queue`` calls launched back to back and then waited
    for, as a training step issues them (and as nccl-tests times them), ``in_turn`` such
    rounds one after the other per timing; the median of ``iters`` timings of the mean per
    call.  Wall time is the slowest rank's (every rank waits for it); CPU time is what this
    process's threads used per call (gloo's workers, the kernel's TCP path on their behalf,
    the launching thread), averaged over the ranks."""
    call = _launcher(kind, nbytes, world, queue)
    call().wait()  # warm-up: connection setup, first-touch allocation
    dist.barrier()
    walls, cpus = [], []
    for _ in range(iters):
        c0, t0 = time.process_time(), time.perf_counter()
        for _ in range(in_turn):
            works = [call() for _ in range(queue)]
            for w in works:
                w.wait()
        walls.append((time.perf_counter() - t0) / (queue * in_turn))
        cpus.append((time.process_time() - c0) / (queue * in_turn))
    # The median shrugs off a queue that lost the CPU to something else on a shared machine.
    slowest = torch.tensor([statistics.median(walls)], dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    cpu = torch.tensor([statistics.median(cpus)], dtype=torch.float64)
    dist.all_reduce(cpu, op=dist.ReduceOp.SUM)
    return float(slowest), float(cpu) / world


class ComputeLoad:
    """A thread that keeps this rank's core busy with matrix products, as a rank's
    forward or backward does, and counts how many it finished.

    Timing collectives with the load on says what they cost while every rank computes
    (on a shared CPU their threads must wait for a core); the load's rate with and without
    collectives running says how much compute loses to communication."""

    def __init__(self, dim: int = 128):
        # Small products (about 0.1 ms each here) so that even a short window counts hundreds.
        import threading

        self.a, self.b = torch.randn(dim, dim), torch.randn(dim, dim)
        self.out = torch.empty(dim, dim)
        self.done, self._stop = 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            torch.mm(self.a, self.b, out=self.out)  # releases the GIL: the main thread keeps launching
            self.done += 1

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def rate(self, seconds: float) -> float:
        """Products per second over the next ``seconds`` (nothing else running on this rank)."""
        start, t0 = self.done, time.perf_counter()
        time.sleep(seconds)
        return (self.done - start) / (time.perf_counter() - t0)


def collective_sweep(kinds, lo: int, hi: int, budget_s: float, load: bool = False) -> dict:
    """One row per (collective, size).  With ``load`` every rank computes in the background
    throughout, and each row also says how much slower that compute ran (``compute_slowdown``)."""
    import contextlib

    world = dist.get_world_size()
    rows = []
    with ComputeLoad() if load else contextlib.nullcontext() as busy:
        if busy is not None:
            dist.barrier()
            alone = busy.rate(0.5)
        for kind in kinds:
            for s in sizes(lo, hi, world):
                probe, _ = _time_collective(kind, s, world, 1)
                if s <= SMALL_CALL_MAX_BYTES:
                    # Small calls one at a time: their time is a call's own latency, as a
                    # per-parameter strategy pays it between other work.  Queued back to back,
                    # identical small calls pipeline through gloo's threads and look cheaper.
                    # Thirty in a row, and their mean: a step pays the sum of its small calls,
                    # and their times have a long tail (a median would miss it).
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
                t, cpu = _time_collective(kind, s, world, iters, queue, in_turn)
                row = {"collective": kind, "size_bytes": s, "count": s // 4, "type": "float",
                       "time_us": t * 1e6, "algbw_gbps": s / t / 1e9,
                       "busbw_gbps": s / t * bus_factor(kind, world) / 1e9, "iters": iters, "queue": queue,
                       "in_turn": in_turn}
                if busy is None:
                    row["cpu_us"] = cpu * 1e6  # under load the process's time includes the load itself
                else:
                    during = (busy.done - before) / (time.perf_counter() - t0)
                    row["compute_slowdown"] = max(0.0, alone / max(during, 1e-9) - 1.0)
                rows.append(row)
    return {"world_size": world, "backend": dist.get_backend(), "rows": rows, "under_load": load}


# The queue timed with and without every rank computing: large and small calls alternating,
# as a training step mixes bucket-sized and parameter-sized ones.
MIXED_QUEUE = (1 << 20, 4 << 10) * 8


def queue_under_compute(kinds, repeats: int = 3) -> list[dict]:
    """Per collective: the mixed queue's time with every rank idle, and while every rank's main
    thread computes (matrix products the size of a small model's, as forward and backward run
    them), plus how much slower that compute ran.  One row per collective, medians of ``repeats``.

    The two sides of ranks sharing cores with their communication: how fast collectives
    progress while the cores compute (``idle_s / loaded_s``), and how much compute they take."""
    import threading

    world = dist.get_world_size()
    a, b = torch.randn(512, 256), torch.randn(256, 1024)
    out = torch.empty(512, 1024)

    def product_rate(seconds: float) -> float:
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            torch.mm(a, b, out=out)
            n += 1
        return n / (time.perf_counter() - t0)

    def one_queue(calls, loaded: bool) -> tuple[float, float]:
        dist.barrier()
        finished = []
        t0 = time.perf_counter()
        works = [call() for call in calls]

        def watch():  # waits in launch order, as a training step does, off the computing thread
            for w in works:
                w.wait()
            finished.append(time.perf_counter())

        watcher = threading.Thread(target=watch)
        watcher.start()
        products, c0 = 0, time.perf_counter()  # the compute's own window: launching is not computing
        while loaded and not finished:
            torch.mm(a, b, out=out)
            products += 1
        c1 = time.perf_counter()
        watcher.join()
        return finished[0] - t0, products / max(c1 - c0, 1e-9)

    rows = []
    for kind in kinds:
        probe = [_launcher(kind, size, world, 1) for size in MIXED_QUEUE]
        one_queue(probe, False)  # warm-up: connections
        # Long enough (0.15 s idle) that the compute rate under it is not a handful of products.
        reps = torch.tensor([math.ceil(0.15 / max(one_queue(probe, False)[0], 1e-3))], dtype=torch.float64)
        dist.all_reduce(reps, op=dist.ReduceOp.MAX)  # every rank must launch the same calls
        reps = int(min(8, reps.item()))
        # Each launcher cycles over ``reps`` buffers: no two calls in flight share one.
        launchers = [_launcher(kind, size, world, reps) for size in MIXED_QUEUE]
        calls = launchers * reps
        one_queue(calls, False)  # warm-up: first touch of the buffers
        alone = product_rate(0.3)
        idle = [one_queue(calls, False)[0] for _ in range(repeats)]
        loaded = [one_queue(calls, True) for _ in range(repeats)]
        times = torch.tensor([statistics.median(idle), statistics.median(t for t, _ in loaded)], dtype=torch.float64)
        dist.all_reduce(times, op=dist.ReduceOp.MAX)  # every rank waits for the slowest
        slowdown = torch.tensor([max(0.0, alone / max(statistics.median(r for _, r in loaded), 1e-9) - 1.0)],
                                dtype=torch.float64)
        dist.all_reduce(slowdown)
        rows.append({"collective": kind, "calls": len(calls), "bytes": sum(MIXED_QUEUE) * reps,
                     "idle_s": float(times[0]), "loaded_s": float(times[1]),
                     "compute_slowdown": float(slowdown) / world})
    return rows


def format_table(sweep: dict) -> str:
    """The sweep as nccl-tests prints it (out-of-place columns only), one block per collective."""
    lines = []
    for kind in dict.fromkeys(r["collective"] for r in sweep["rows"]):
        loaded = sweep.get("under_load")
        lines.append(f"# {kind}_perf  nranks {sweep['world_size']}  backend {sweep['backend']}"
                     + ("  (every rank computing meanwhile)" if loaded else ""))
        lines.append(f"# {'size':>12} {'count':>12} {'type':>6} {'time':>10} {'algbw':>8} {'busbw':>8} {'queue':>6}"
                     + (f" {'compute':>8}" if loaded else ""))
        lines.append(f"# {'(B)':>12} {'(elements)':>12} {'':>6} {'(us)':>10} {'(GB/s)':>8} {'(GB/s)':>8} {'(ops)':>6}"
                     + (f" {'slowed':>8}" if loaded else ""))
        for r in sweep["rows"]:
            if r["collective"] == kind:
                lines.append(f"  {r['size_bytes']:>12} {r['count']:>12} {r['type']:>6} {r['time_us']:>10.1f} "
                             f"{r['algbw_gbps']:>8.3f} {r['busbw_gbps']:>8.3f} {r.get('queue', 1):>6}"
                             + (f" {r['compute_slowdown']:>8.0%}" if loaded else ""))
    for r in sweep.get("under_compute", ()):
        lines.append(f"# {r['collective']}: {r['calls']} calls of 1 MB and 4 KB alternating, queued: {r['idle_s'] * 1e3:.1f} ms idle, "
                     f"{r['loaded_s'] * 1e3:.1f} ms while every rank computes (which ran "
                     f"{r['compute_slowdown']:.0%} slower)")
    return "\n".join(lines)


def layer_timings(model_name: str, micro_batch: int, seq_len: int, iters: int) -> dict:
    cfg = PRESETS[model_name]
    model = build_model(cfg, seed=0)
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = global_batch(cfg, 0, 0, micro_batch * world, seq_len)
    x, y = rank_shard(x, rank, world), rank_shard(y, rank, world)
    layers = list(model.layers)
    times: dict[int, dict[str, list[float]]] = {i: {"fwd": [], "bwd": []} for i in range(len(layers))}
    def one_pass(record: bool) -> None:
        inputs, outputs = [], []
        h = x
        for i, layer in enumerate(layers):
            h = h.detach().requires_grad_(h.is_floating_point())
            inputs.append(h)
            t0 = time.perf_counter()
            h = layer(h, y) if i == len(layers) - 1 else layer(h)
            if record:
                times[i]["fwd"].append(time.perf_counter() - t0)
            outputs.append(h)
        grad = None
        for i in reversed(range(len(layers))):
            t0 = time.perf_counter()
            outputs[i].backward(grad)
            if record:
                times[i]["bwd"].append(time.perf_counter() - t0)
            grad = inputs[i].grad

    # One barrier, then back-to-back passes: every rank stays busy, as in a training step,
    # instead of the fastest ones idling at a per-pass barrier and leaving the others more cores.
    dist.barrier()
    for it in range(iters + 1):  # the first pass warms up allocations and is dropped
        one_pass(record=it > 0)
    # A step waits on its slowest rank, and ranks that share cores do not finish a pass
    # together even when they start it together, as every step does after its last
    # collective.  So whole passes are also timed from a barrier, and the median over
    # passes of (slowest rank's pass / the mean rank's) is kept: the mean above is a rank's
    # pace, this ratio is how much later than that pace the last rank ends.
    passes = []
    for _ in range(iters):
        dist.barrier()
        t0 = time.perf_counter()
        one_pass(record=False)
        passes.append(time.perf_counter() - t0)
    gathered = [torch.zeros(iters, dtype=torch.float64) for _ in range(world)]
    dist.all_gather(gathered, torch.tensor(passes, dtype=torch.float64))
    by_pass = torch.stack(gathered)  # ranks x passes
    slowest_rank_factor = float((by_pass.max(0).values / by_pass.mean(0)).median())
    params = [p for p in model.parameters()]
    opt = AdamW().torch_optimizer(params)
    opt.step()  # creates the moments
    opt_times = []
    for _ in range(iters):
        dist.barrier()
        t0 = time.perf_counter()
        opt.step()
        opt_times.append(time.perf_counter() - t0)
    n_params = sum(p.numel() for p in params)
    kinds = ["embedding", *["block"] * cfg.n_layer, "head"]
    # Each rank's median, averaged over the ranks: ranks that share cores do not share them
    # evenly over one short measurement, and a step waits on all of them, not on rank 0.
    mine = torch.tensor([statistics.median(t[d]) for t in times.values() for d in ("fwd", "bwd")]
                        + [statistics.median(opt_times)], dtype=torch.float64)
    dist.all_reduce(mine)
    mean = (mine / world).tolist()
    per_layer = [{"layer": i, "kind": kinds[i], "fwd_s": mean[2 * i], "bwd_s": mean[2 * i + 1]}
                 for i in range(len(layers))]
    by_kind = {}
    for kind in LAYER_KINDS:
        rows = [r for r in per_layer if r["kind"] == kind]
        by_kind[kind] = {d: statistics.median(r[f"{d}_s"] for r in rows) for d in ("fwd", "bwd")}
    return {"model": model_name, "model_config": cfg.to_dict(), "micro_batch": micro_batch, "seq_len": seq_len,
            "tokens": micro_batch * seq_len, "world_size": world, "layers": per_layer, "by_kind": by_kind,
            "optimizer_s_per_param": mean[-1] / n_params, "params": n_params,
            "slowest_rank_factor": slowest_rank_factor}


def make_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m real_runs.microbench", description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc", type=int, default=1, help="ranks to start when not already under torchrun")
    p.add_argument("--timeout-s", type=float, default=600.0)
    sub = p.add_subparsers(dest="what", required=True, parser_class=_Parser)
    c = sub.add_parser("collectives", help="nccl-tests-style sweep of all_reduce, reduce_scatter, all_gather")
    c.add_argument("--min-bytes", default="1K")
    c.add_argument("--max-bytes", default="256M")
    c.add_argument("--collectives", default=",".join(SWEEP_COLLECTIVES))
    c.add_argument("--budget-s", type=float, default=0.2, help="time to spend per size and collective")
    c.add_argument("--under-load", action="store_true",
                   help="keep every rank computing in the background while timing (collectives as they run "
                        "during backward), and report how much that compute slowed")
    c.add_argument("--out", default=None, help="write the sweep as JSON here")
    la = sub.add_parser("layers", help="per-layer forward/backward and optimizer times of the real model")
    la.add_argument("--model", default="small", help=", ".join(PRESETS))
    la.add_argument("--micro-batch", type=int, default=4, help="sequences per rank")
    la.add_argument("--seq-len", type=int, default=None)
    la.add_argument("--iters", type=int, default=5)
    la.add_argument("--out", default=None)
    return p


def validate(args) -> None:
    if args.what == "collectives":
        args.min_bytes, args.max_bytes = parse_bytes(args.min_bytes), parse_bytes(args.max_bytes)
        if not 0 < args.min_bytes <= args.max_bytes:
            raise BadInput("--min-bytes must be positive and no larger than --max-bytes.")
        kinds = [k.strip() for k in args.collectives.split(",") if k.strip()]
        bad = [k for k in kinds if k not in SWEEP_COLLECTIVES]
        if bad or not kinds:
            raise BadInput(f"Unknown collective {bad[0] if bad else '(none)'}; choose from "
                           f"{', '.join(SWEEP_COLLECTIVES)}.")
        args.collectives = kinds
    else:
        if args.model not in PRESETS:
            raise BadInput(f"Unknown model preset {args.model!r}; choose one of {', '.join(PRESETS)}.")
        cfg = PRESETS[args.model]
        args.seq_len = args.seq_len or cfg.max_seq
        if not 1 <= args.seq_len <= cfg.max_seq:
            raise BadInput(f"--seq-len must be between 1 and {cfg.max_seq} for the {args.model} preset.")
        if args.micro_batch < 1 or args.iters < 1:
            raise BadInput("--micro-batch and --iters must be positive.")


def run(args) -> dict:
    torch.set_num_threads(1)  # as the training ranks do: one thread per rank
    if "RANK" in os.environ:
        dist.init_process_group("gloo")
    else:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        if args.what == "collectives":
            result = collective_sweep(args.collectives, args.min_bytes, args.max_bytes, args.budget_s,
                                      args.under_load)
            if not args.under_load:
                result["under_compute"] = queue_under_compute(args.collectives)
            text = format_table(result)
        else:
            result = layer_timings(args.model, args.micro_batch, args.seq_len, args.iters)
            text = json.dumps(result["by_kind"])
        result["cores"] = os.cpu_count()
        result["threads_per_rank"] = torch.get_num_threads()
        if dist.get_rank() == 0:
            print(text, flush=True)
            if args.out:
                _write_json(Path(args.out), result)
        dist.barrier()
        return result
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = make_parser().parse_args(argv)
        validate(args)
        if args.nproc < 1:
            raise BadInput("--nproc must be at least 1.")
    except BadInput as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if "RANK" not in os.environ and args.nproc > 1:
        from .launch import RunFailed, run_module
        try:
            run_module("real_runs.microbench", argv, args.nproc, on_line=print, timeout_s=args.timeout_s)
        except RunFailed as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        return 0
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
