"""Per-layer forward and backward times, and the optimizer's, of the real model on every rank.

Every rank runs forward and backward of each layer of the real model (``real_runs.model``)
on its micro-batch, all ranks at once and pass after pass with no barrier between passes,
so that every rank stays busy as in training; the table keeps each rank's median over
iterations, averaged over the ranks.  Then whole passes are timed from a barrier each, as
steps start together, and ``slowest_rank_factor`` says how much later than the mean rank
the slowest one ends a pass (the step waits on it).  The AdamW step is timed on the whole
model and reported per parameter.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from ..model import PRESETS, build_model, global_batch, rank_shard
from ..strategies import AdamW

LAYER_KINDS = ("embedding", "block", "head")


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
    return {"model": model_name, "model_config": cfg.to_dict(), "micro_batch": micro_batch,
            "seq_len": seq_len, "tokens": micro_batch * seq_len, "world_size": world, "layers": per_layer,
            "by_kind": by_kind, "optimizer_s_per_param": mean[-1] / n_params, "params": n_params,
            "slowest_rank_factor": slowest_rank_factor}
