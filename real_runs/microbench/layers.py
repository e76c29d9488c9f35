"""Per-layer forward and backward times, and the optimizer's, of the real model on every rank.

Every rank runs forward and backward of each layer of the real model (``real_runs.model``)
on its micro-batch, all ranks at once and pass after pass with no barrier between passes,
so that every rank stays busy as in training; the table keeps each rank's mean over
iterations, averaged over the ranks.  The mean, not the median: a step pays every op's
time, the occasional stall of a few milliseconds included (on a CPU that several ranks
share, an op now and then waits that long for its core), so its expected time is the sum
of the ops' means; a median drops those stalls and predicts steps too fast, most where
ops are short.  Then whole passes are timed from a barrier each, as steps start together, and
``slowest_rank_factor`` says how much later than the mean rank the slowest one ends a
pass (the step waits on it).  The AdamW step is timed on the whole model, the mean
over iterations, and reported per parameter.

On a GPU (``bench`` on CUDA) the model lives there, in the run's precision (bf16 weights
for ``--precision bf16``, as the real runs train), and each timing ends once the device has
finished (:class:`.device.Bench`).
"""

from __future__ import annotations

import statistics

import torch
import torch.distributed as dist

from ..model import PRESETS, build_model, global_batch, rank_shard
from ..strategies import AdamW
from ..strategies.base import AdamState
from .device import CPU, Bench

LAYER_KINDS = ("embedding", "block", "head")


def _pass(layers, x, y, bench: Bench, times: dict | None) -> None:
    """One forward and backward, layer by layer; each layer's times appended to ``times`` if given."""
    inputs, outputs = [], []
    h = x
    for i, layer in enumerate(layers):
        h = h.detach().requires_grad_(h.is_floating_point())
        inputs.append(h)
        t0 = bench.now()
        h = layer(h, y) if i == len(layers) - 1 else layer(h)
        if times is not None:
            times[i]["fwd"].append(bench.now() - t0)
        outputs.append(h)
    grad = None
    for i in reversed(range(len(layers))):
        t0 = bench.now()
        outputs[i].backward(grad)
        if times is not None:
            times[i]["bwd"].append(bench.now() - t0)
        grad = inputs[i].grad


def _slowest_rank_factor(layers, x, y, bench: Bench, iters: int, world: int) -> float:
    """A step waits on its slowest rank, and ranks that share cores do not finish a pass together
    even when they start it together, as every step does after its last collective.  So whole
    passes are timed from a barrier, and the median over passes of (slowest rank's pass / the
    mean rank's) is kept: the per-layer mean is a rank's pace, this ratio is how much later than
    that pace the last rank ends."""
    passes = []
    for _ in range(iters):
        dist.barrier()
        t0 = bench.now()
        _pass(layers, x, y, bench, None)
        passes.append(bench.now() - t0)
    gathered = [torch.zeros(iters, dtype=torch.float64, device=bench.device) for _ in range(world)]
    dist.all_gather(gathered, torch.tensor(passes, dtype=torch.float64, device=bench.device))
    by_pass = torch.stack(gathered)  # ranks x passes
    return float((by_pass.max(0).values / by_pass.mean(0)).median())


def _optimizer_times(model, precision: str, bench: Bench, iters: int) -> list[float]:
    """The update's time, each from a barrier, after one update that creates the moments."""
    params = list(model.parameters())
    if precision == "bf16":
        # The update bf16 runs make: fp32 masters and moments of one flat buffer (AdamState).
        flat = torch.cat([p.detach().flatten() for p in params])
        state, grad = AdamState(flat, AdamW()), torch.full_like(flat, 1e-3)
        update = lambda: state.update(flat, grad)  # noqa: E731
    else:
        update = AdamW().torch_optimizer(params).step
    update()
    times = []
    for _ in range(iters):
        dist.barrier()
        t0 = bench.now()
        update()
        times.append(bench.now() - t0)
    return times


def layer_timings(model_name: str, micro_batch: int, seq_len: int, iters: int, bench: Bench = CPU,
                  precision: str = "fp32") -> dict:
    cfg = PRESETS[model_name]
    model = build_model(cfg, seed=0, device=bench.device)
    if precision == "bf16":
        model.to(torch.bfloat16)
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = global_batch(cfg, 0, 0, micro_batch * world, seq_len)
    x, y = rank_shard(x, rank, world).to(bench.device), rank_shard(y, rank, world).to(bench.device)
    layers = list(model.layers)
    times: dict[int, dict[str, list[float]]] = {i: {"fwd": [], "bwd": []} for i in range(len(layers))}
    # One barrier, then back-to-back passes: every rank stays busy, as in a training step,
    # instead of the fastest ones idling at a per-pass barrier and leaving the others more cores.
    dist.barrier()
    for it in range(iters + 1):  # the first pass warms up allocations and is dropped
        _pass(layers, x, y, bench, times if it > 0 else None)
    slowest_rank_factor = _slowest_rank_factor(layers, x, y, bench, iters, world)
    opt_times = _optimizer_times(model, precision, bench, iters)
    n_params = sum(p.numel() for p in model.parameters())
    kinds = ["embedding", *["block"] * cfg.n_layer, "head"]
    # Each rank's mean (module docstring), averaged over the ranks: ranks that share cores do
    # not share them evenly over one short measurement, and a step waits on all of them.
    mine = torch.tensor([statistics.fmean(t[d]) for t in times.values() for d in ("fwd", "bwd")]
                        + [statistics.fmean(opt_times)], dtype=torch.float64, device=bench.device)
    dist.all_reduce(mine)
    mean = (mine / world).tolist()
    per_layer = [{"layer": i, "kind": kinds[i], "fwd_s": mean[2 * i], "bwd_s": mean[2 * i + 1]}
                 for i in range(len(layers))]
    by_kind = {}
    for kind in LAYER_KINDS:
        rows = [r for r in per_layer if r["kind"] == kind]
        # Layers of one kind are the same computation: their mean is one such layer's expected time.
        by_kind[kind] = {d: statistics.fmean(r[f"{d}_s"] for r in rows) for d in ("fwd", "bwd")}
    return {"model": model_name, "model_config": cfg.to_dict(), "micro_batch": micro_batch,
            "seq_len": seq_len, "tokens": micro_batch * seq_len, "world_size": world, "layers": per_layer,
            "device": bench.device.type, "precision": precision,
            "by_kind": by_kind, "optimizer_s_per_param": mean[-1] / n_params, "params": n_params,
            "slowest_rank_factor": slowest_rank_factor}
