"""Measuring calibration on this machine: launch ``real_runs.microbench`` on gloo ranks
(plain loopback, or an emulated cluster), or on this machine's GPUs over NCCL
(``device="cuda"``: one GPU per rank, layers timed in the given precision), and fit what
it reports.  A GPU calibration carries the GPU's stamp (name, driver, NCCL, link matrix)
and no CPU figures: what gloo's threads take from compute is a CPU question.

``measure()`` is what ``zero-sim calibrate --nproc N`` runs; :mod:`sim2real.validate`
calls :func:`measure_compute` and :func:`measure_network` per case.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from tqdm import tqdm

from real_runs.allocator import ranks_allocator
from real_runs.cluster import ClusterShape, EmulatedCluster
from real_runs.launch import run_module
from zero_sim.calibration.fit import compute_from_layers, cpu_from_sweep, fit_sweep
from zero_sim.calibration.format import Calibration, CollectiveFit, ComputeCalibration, CpuCalibration


def machine_facts(**extra) -> dict:
    import torch  # here, not at the top: the CLI imports this module and simulate never needs torch

    # The ranks' allocator decides how much a step's allocations cost (real_runs.allocator).
    return {"host": platform.node(), "cores": os.cpu_count(), "torch": torch.__version__,
            "python": platform.python_version(),
            "rank_allocator": ranks_allocator(), **extra}


# ---------------------------------------------------------------------- measuring here


def measure_compute(nproc: int, model: str, micro_batch: int, seq_len: int | None, workdir: Path,
                    timeout_s: float = 300.0, on_line=None, label: str = "",
                    alone: ComputeCalibration | None = None, device: str = "cpu",
                    precision: str = "fp32") -> ComputeCalibration:
    """Per-layer times of the real model with ``nproc`` ranks computing at once, and one alone
    (files kept in ``workdir``, named by ``label``).  Given ``alone`` (an earlier measurement of
    one rank alone), only the ``nproc`` ranks are measured and the sharing factor is read against it."""
    found = {}
    if alone is not None and nproc > 1:
        found[1] = {"by_kind": alone.layer_seconds}
    for ranks in sorted({1, nproc} - set(found)):
        path = Path(workdir) / f"layers_{model}_mb{micro_batch}_r{ranks}{label and '_' + label}.json"
        # Ten iterations, each rank's median, then the mean over ranks: ranks that share cores
        # get them unevenly over any one pass, and a step waits on all of them.
        argv = ["--device", device, "layers", "--model", model, "--micro-batch", str(micro_batch),
                "--iters", "10", "--precision", precision, "--out", str(path)]
        if seq_len:
            argv += ["--seq-len", str(seq_len)]
        run_module("real_runs.microbench", argv, ranks, on_line=on_line, timeout_s=timeout_s)
        found[ranks] = json.loads(path.read_text())
    return compute_from_layers(found[nproc], found[1] if nproc > 1 else None)


def measure_network(runner, nproc: int, workdir: Path, max_bytes: str = "32M", budget_s: float = 0.15,
                    timeout_s: float = 300.0, on_line=None, label: str = "", device: str = "cpu"
                    ) -> tuple[dict[str, CollectiveFit], CpuCalibration | None, dict]:
    """Sweep collectives on ``runner`` (an EmulatedCluster, or anything with its ``run_module``);
    returns the fits, what the calls' CPU time says communication costs compute, and the raw
    sweep (kept in ``workdir``, named by ``label``).  From 1 KB, so that the sizes up to
    32 KB give the latency (their trimmed mean, see :func:`zero_sim.calibration.fit_sweep`)."""
    path = Path(workdir) / f"sweep_n{nproc}{label and '_' + label}_{os.getpid()}.json"
    runner.run_module("real_runs.microbench", ["--device", device, "collectives", "--min-bytes", "1K",
                                               "--max-bytes", max_bytes, "--budget-s", str(budget_s),
                                               "--out", str(path)],
                      on_line=on_line, timeout_s=timeout_s)
    sweep = json.loads(path.read_text())
    cores = sweep.get("cores") or os.cpu_count() or 1
    fits = fit_sweep(sweep["rows"], nproc)
    if device != "cpu":
        return fits, None, sweep
    return fits, cpu_from_sweep(sweep["rows"], nproc, cores, sweep.get("under_compute"), fits), sweep


class Loopback:
    """``nproc`` ranks of this machine on plain loopback: the runner when nothing is emulated."""

    def __init__(self, nproc: int):
        self.nproc = nproc

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def describe(self) -> str:
        return f"{self.nproc} rank(s) on plain loopback (not shaped)"

    def run_module(self, module: str, argv: list[str], on_line=None, timeout_s: float = 600.0) -> None:
            run_module(module, argv, self.nproc, on_line=on_line, timeout_s=timeout_s)

    def cluster_record(self) -> None:
        return None


def lines_above(bar, say: Callable[[str], None]) -> Callable[[str], None]:
    """``say`` with each line written above ``bar`` (a tqdm bar), which is redrawn below it."""
    def say_above(line: str) -> None:
        with bar.external_write_mode(file=sys.stderr):
            say(line)

    return say_above


def measure(nproc: int, model: str = "small", micro_batch: int = 4, seq_len: int | None = None,
            shape: str | None = None, bandwidth_gbps: float | None = None, max_bytes: str = "32M",
            workdir: Path | None = None, on_line=None, device: str = "cpu",
            precision: str = "fp32") -> Calibration:
    """Calibrate this machine: compute with ``nproc`` ranks, and the network they use (an
    emulated cluster of ``shape`` at ``bandwidth_gbps`` when given, else plain loopback).
    The runs write into ``workdir``, or into a temporary folder removed when measuring ends."""
    with contextlib.ExitStack() as cleanup:
        if workdir is None:
            workdir = cleanup.enter_context(tempfile.TemporaryDirectory(prefix="zero-sim-calibrate-"))
        workdir = Path(workdir)
        # Compute, then the network: a bar over the two on a terminal, the ranks' lines above it.
        bar = cleanup.enter_context(tqdm(total=2, desc="calibrating", unit="phase", file=sys.stderr,
                                         disable=None))
        on_line = lines_above(bar, on_line) if on_line is not None else None
        compute = measure_compute(nproc, model, micro_batch, seq_len, workdir, on_line=on_line,
                                  device=device, precision=precision)
        bar.update(1)
        if shape is not None:
            runner = EmulatedCluster(nproc, ClusterShape(shape, float(bandwidth_gbps)))
        else:
            runner = Loopback(nproc)
        with runner as r:
            where = r.describe()
            fits, cpu, sweep = (measure_network(r, nproc, workdir, max_bytes, on_line=on_line, device=device)
                                if nproc > 1 else ({}, None, {}))
        bar.update(1)
    facts = machine_facts(ranks=nproc, network=where, model=model, micro_batch=micro_batch,
                          device=device, precision=precision)
    if device == "cuda":
        from real_runs.gpu_stamp import gpu_stamp

        facts["gpu"] = sweep.get("gpu") or gpu_stamp()
    return Calibration(fits, compute, "nccl" if device == "cuda" else "gloo", facts, cpu=cpu)
