"""Shared by the real-runs tests: a single-process reference, a cached launcher, and a
watch over the processes a run starts."""

from __future__ import annotations

import atexit
import functools
import json
import os
import re
import shutil
import signal
import tempfile
import threading
import time
import warnings

import torch

from real_runs.launch import RunFailed, launch
from real_runs.model import PRESETS, build_model, global_batch
from real_runs.processes import process_table
from real_runs.strategies import AdamW

# Small enough that four ranks on two cores finish a run in a few seconds.
# Buckets of 0.1 MB split even this model into several, so bucketing is exercised.
RUN = dict(model="nano", global_batch=8, seq_len=32, steps=2, seed=3, lr=1e-3, bucket_mb=0.1)


@functools.cache
def reference(model: str, global_batch_: int, seq_len: int, steps: int, seed: int, lr: float,
              precision: str = "fp32") -> dict:
    """Plain single-process training on the whole global batch: the ground truth.  In bf16,
    the textbook recipe: a bf16 model, and torch's AdamW on fp32 master copies of its weights.
    Under amp, torch.amp's: an fp32 model whose forward runs under torch.autocast in bf16."""
    torch.set_num_threads(1)
    cfg = PRESETS[model]
    net = build_model(cfg, seed)
    if precision == "bf16":
        net.to(torch.bfloat16)
    weights = list(net.parameters())
    masters = [w.detach().float().requires_grad_() for w in weights] if precision == "bf16" else weights
    opt = AdamW(lr=lr).torch_optimizer(masters)
    for step in range(steps):
        x, y = global_batch(cfg, seed, step, global_batch_, seq_len)
        net.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "amp"):
            loss = net(x, y)
        loss.backward()
        for m, w in zip(masters, weights, strict=True):
            m.grad = w.grad.float()
        opt.step()
        with torch.no_grad():
            for m, w in zip(masters, weights, strict=True):
                w.copy_(m)
    names = {m: n for m, (n, _) in zip(masters, net.named_parameters(), strict=True)}
    return {
        "params": {n: p.detach().clone() for n, p in net.named_parameters()},
        "exp_avg": {names[p]: s["exp_avg"] for p, s in opt.state.items()},
        "exp_avg_sq": {names[p]: s["exp_avg_sq"] for p, s in opt.state.items()},
    }


def reference_for(run: dict) -> dict:
    return reference(run["model"], run["global_batch"], run["seq_len"], run["steps"], run["seed"], run["lr"],
                     run.get("precision", "fp32"))


def rank_record(out: str, rank: int) -> dict:
    with open(os.path.join(out, f"rank{rank}.json")) as f:
        return json.load(f)


@functools.cache
def real_run(strategy: str, nproc: int, **overrides) -> tuple[dict, str]:
    """One torchrun per (strategy, ranks, options) for the whole test session."""
    flags = {**RUN, **overrides}
    out = tempfile.mkdtemp(prefix=f"rr-{strategy}-{nproc}-")
    atexit.register(shutil.rmtree, out, ignore_errors=True)
    run = launch_retrying_native_abort(strategy, nproc, out=out, save_state=True, timeout_s=240, **flags)
    return run, out


def launch_retrying_native_abort(strategy: str, nproc: int, **kwargs) -> dict:
    """``launch``, with one more try when a rank died of a native abort (SIGABRT now and then in
    CI on a loaded 2-core machine, before ranks said where), said out loud with the abort's
    message; a second one, or any Python error, fails the test with the ranks' last lines."""
    for attempt in (1, 2):
        try:
            return launch(strategy, nproc=nproc, **kwargs)
        except RunFailed as e:
            native = re.search(r"died \((SIGABRT|SIGSEGV|SIGBUS)", str(e))
            if attempt == 1 and native:
                warnings.warn(f"{strategy} on {nproc} ranks: {e} Retried once.", stacklevel=2)
                continue
            tail = "\n".join(e.output[-80:])
            raise RunFailed(f"{strategy} on {nproc} ranks: {e}\n--- last lines the ranks printed ---\n{tail}",
                            e.output) from None
    raise AssertionError("unreachable")


def load_state(out: str) -> dict:
    return torch.load(os.path.join(out, "state.pt"))


def max_rel_err(a: dict, b: dict) -> float:
    """``|a - b| / |b|`` over the whole vector of every tensor laid end to end (L2 norm).

    Whole-vector, as ``param_l2`` is, rather than element by element: where a gradient
    is zero up to rounding (some biases), Adam divides the rounding noise of a different
    reduction order by its own square root and takes a full-size step, so one element may
    differ by a fraction of the learning rate while everything else agrees to fp32
    precision.  A real bug moves whole tensors by about the learning rate and still
    shows up here a hundredfold above the tolerance."""
    names = sorted(b)
    ref = torch.cat([b[n].flatten().double() for n in names])
    got = torch.cat([a[n].flatten().double() for n in names])
    return float((got - ref).norm() / ref.norm())


# --- the processes a run starts -------------------------------------------------------------

class Descendants:
    """Every process descended from ``root`` (this process by default) while the with-block
    runs, sampled from ``/proc`` every 50 ms and remembered by pid and start time, so one
    that outlives its parent (reparented to init) is still counted."""

    def __init__(self, root: int | None = None):
        self.root = os.getpid() if root is None else root
        self.seen: dict[int, str] = {}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> Descendants:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._done.is_set():
            self.sample()
            self._done.wait(0.05)

    def sample(self) -> None:
        table = process_table()
        children: dict[int, list[int]] = {}
        for pid, (ppid, _, _) in table.items():
            children.setdefault(ppid, []).append(pid)
        todo = list(children.get(self.root, ())) + [p for p, s in list(self.seen.items())
                                                    if table.get(p, (0, None))[1] == s]
        while todo:
            pid = todo.pop()
            if pid in table and pid != os.getpid():
                self.seen.setdefault(pid, table[pid][1])
                todo += [c for c in children.get(pid, ()) if c not in self.seen]

    def alive(self) -> list[int]:
        """Those seen that still run: the same pid and start time, and not a zombie."""
        table = process_table()
        running = {p for p, (_, _, state) in table.items() if state != "Z"}
        return sorted(p for p, s in self.seen.items() if p in running and table[p][1] == s)

    def gone_within(self, seconds: float) -> list[int]:
        """Wait up to ``seconds`` for every process seen to end; returns those still running."""
        deadline = time.monotonic() + seconds
        while (left := self.alive()) and time.monotonic() < deadline:
            time.sleep(0.05)
        return left

    def kill_survivors(self) -> None:
        """A test that failed must not leave its run training in the background."""
        for pid in self.alive():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
