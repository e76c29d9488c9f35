"""Shared by the real-runs tests: a single-process reference and a cached launcher."""

from __future__ import annotations

import functools
import os
import tempfile

import torch

from real_runs.launch import launch
from real_runs.model import PRESETS, build_model, global_batch
from real_runs.strategies import AdamW

# Small enough that four ranks on two cores finish a run in a few seconds.
RUN = dict(model="nano", global_batch=8, seq_len=32, steps=2, seed=3, lr=1e-3)


@functools.cache
def reference(model: str, global_batch_: int, seq_len: int, steps: int, seed: int, lr: float) -> dict:
    """Plain single-process training on the whole global batch: the ground truth."""
    torch.set_num_threads(1)
    cfg = PRESETS[model]
    net = build_model(cfg, seed)
    opt = AdamW(lr=lr).torch_optimizer(net.parameters())
    for step in range(steps):
        x, y = global_batch(cfg, seed, step, global_batch_, seq_len)
        opt.zero_grad()
        net(x, y).backward()
        opt.step()
    names = {p: n for n, p in net.named_parameters()}
    return {
        "params": {n: p.detach().clone() for n, p in net.named_parameters()},
        "exp_avg": {names[p]: s["exp_avg"] for p, s in opt.state.items()},
        "exp_avg_sq": {names[p]: s["exp_avg_sq"] for p, s in opt.state.items()},
    }


def reference_for(run: dict) -> dict:
    return reference(run["model"], run["global_batch"], run["seq_len"], run["steps"], run["seed"], run["lr"])


@functools.cache
def real_run(strategy: str, nproc: int, **overrides) -> tuple[dict, str]:
    """One torchrun per (strategy, ranks, options) for the whole test session."""
    flags = {**RUN, **overrides}
    out = tempfile.mkdtemp(prefix=f"rr-{strategy}-{nproc}-")
    run = launch(strategy, nproc=nproc, out=out, save_state=True, timeout_s=240, **flags)
    return run, out


def load_state(out: str) -> dict:
    return torch.load(os.path.join(out, "state.pt"))


def max_rel_err(a: dict, b: dict) -> float:
    """Worst tensor's ``|a - b| / |b|`` in the L2 norm.

    Norm-wise rather than element-wise: where a gradient is zero up to rounding, Adam
    turns the rounding noise of a different reduction order into a full step in that
    one element, so single elements may differ by a sizeable fraction of the learning
    rate even though the runs agree to fp32 precision everywhere else."""
    worst = 0.0
    for name, ref in b.items():
        got = a[name].to(ref.dtype)
        worst = max(worst, float((got - ref).norm() / ref.norm().clamp_min(1e-30)))
    return worst
