"""Train the small GPT under one strategy and record what happened.

Two CPU ranks on gloo, the ``tiny`` model, five steps::

    torchrun --nproc_per_node 2 -m real_runs.train --strategy zero2-hook --steps 5 --out out/z2h

The same without torchrun (this process starts it, and stops every rank if one fails)::

    python -m real_runs.train --nproc 2 --strategy zero2-hook --steps 5 --out out/z2h

The global batch (sequences per step) is split evenly across ranks, so any number of
ranks trains the same model on the same data.  The backend follows the device: nccl on
CUDA, gloo on CPU, where each rank uses one thread.  ``--precision bf16`` trains in bf16
with fp32 master weights and Adam state (:mod:`real_runs.precision`), as GPU runs do.

Output, in ``--out``: ``rank<r>.json`` per rank (ops and memory over time),
``traces/rank<r>.pt.trace.json`` with ``--trace`` (a torch.profiler trace per rank, in a
folder of their own so that HTA and TensorBoard find nothing else there; see
:func:`profiler_schedule`), ``state.pt`` with ``--save-state`` (whole parameters and Adam
moments, for tests), and last, written by rank 0 only once every rank's file is in place,
``run.json``.  Every file is written to a temporary name and
renamed.  Rank 0 clears a previous run's outputs before the ranks connect, a run that
fails never writes ``run.json``, and a rank that fails leaves ``failed.json`` saying why.

Under torchrun every rank dies with its torchrun (a parent-death signal), so a stopped
run stops: see :mod:`real_runs.launch`.
"""

# ruff: noqa: E402 (a rank ties its life to torchrun's before the imports below)
from __future__ import annotations

import os

if __name__ == "__main__" and "TORCHELASTIC_RUN_ID" in os.environ:
    # Before importing torch, which takes seconds: a torchrun killed meanwhile would leave
    # this rank orphaned and training, since nothing would yet tie its life to torchrun's.
    from real_runs.processes import die_with_torchrun

    die_with_torchrun()

import contextlib
import datetime
import math
import platform
import signal
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from zero_sim.vocabulary.files import write_json_atomic
from zero_sim.vocabulary.model_states import formula, model_state_bytes
from zero_sim.vocabulary.records import rank_file, run_file

from .allocator import allocator_in_use
from .gpu_stamp import gpu_stamp
from .launch import (
    FAILED_FILE,
    INTERRUPTED,
    RunFailed,
    clear_outputs,
    launch_argv,
    mark_failed,
    progress_line,
)
from .lora import add_lora, count_trainable
from .model import PRESETS, build_model, count_params, global_batch, rank_shard
from .options import BadInput, make_parser, validate
from .precision import PRECISIONS
from .processes import leave_rank
from .record import Recorder, cuda_memory_peaks
from .strategies import STRATEGIES, AdamW


def _init_distributed(args) -> tuple[int, int, torch.device]:
    timeout = datetime.timedelta(seconds=args.timeout_s)
    if args.device == "cuda":
        local = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local)
        device, backend = torch.device("cuda", local), "nccl"
    else:
        torch.set_num_threads(1)
        device, backend = torch.device("cpu"), "gloo"
    if "RANK" in os.environ:
        dist.init_process_group(backend, timeout=timeout, device_id=device if device.type == "cuda" else None)
    else:  # a single process without torchrun
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    return dist.get_rank(), dist.get_world_size(), device


def _inject_fault(args, rank: int, step: int) -> None:
    if args.fail_rank == rank and args.fail_at_step == step:
        if args.fail_mode == "stall":
            time.sleep(args.stall_s)
            return
        if args.fail_mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if args.fail_mode == "abort":
            os.abort()
        raise RuntimeError(f"injected fault at step {step}")


TRACES = "traces"  # the folder under --out that holds the profiler traces, and nothing else


def profiler_schedule(steps: int) -> dict[str, int]:
    """``torch.profiler.schedule``'s wait, warmup and active steps for a run of ``steps``.

    Rule: step 0 warms the profiler up and every later step is recorded, because the overlay
    compares steps 1 and later only (step 0 pays one-off costs; see
    :func:`sim2real.overlay.measured_step`); a one-step run records its only step."""
    warmup = 1 if steps > 1 else 0
    return {"wait": 0, "warmup": warmup, "active": steps - warmup}


def _start_profiler(args, out: Path, rank: int, device: torch.device):
    """A started torch.profiler whose trace lands in ``traces/rank<r>.pt.trace.json`` at the last step."""
    traces = out / TRACES
    traces.mkdir(exist_ok=True)

    def save(prof) -> None:  # written to a temporary name and renamed, as every output is
        tmp = traces / f".rank{rank}.pt.trace.json.{os.getpid()}.tmp"
        prof.export_chrome_trace(str(tmp))
        os.replace(tmp, traces / f"rank{rank}.pt.trace.json")

    acts = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    # Created after init_process_group, so torch writes distributedInfo (rank, world size) into the trace.
    profiler = torch.profiler.profile(
        activities=acts, schedule=torch.profiler.schedule(**profiler_schedule(args.steps), repeat=1),
        on_trace_ready=save, profile_memory=args.profile_memory, record_shapes=args.profile_memory)
    profiler.start()
    return profiler


def _outputs(out: Path) -> list[str]:
    """What the run left in ``out``, the traces folder by its files (``traces/rank0.pt.trace.json``)."""
    names = []
    for f in out.iterdir():
        if f.name.startswith("."):
            continue
        if f.is_dir() and f.name == TRACES:
            names += [f"{TRACES}/{t.name}" for t in f.iterdir() if not t.name.startswith(".")]
        else:
            names.append(f.name)
    return sorted(names)


def _versions() -> dict:
    return {"torch": torch.__version__, "python": platform.python_version(), "allocator": allocator_in_use(),
            "cuda": torch.version.cuda, "nccl": ".".join(map(str, torch.cuda.nccl.version()))
            if torch.cuda.is_available() else None}


def _clear_previous_run(out: Path) -> None:
    """Before the ranks connect: a run that fails to start must not leave an old run looking complete."""
    if int(os.environ.get("RANK", 0)) == 0:
        clear_outputs(out)
        with contextlib.suppress(OSError):  # the emptied traces folder of a previous run goes too
            (out / TRACES).rmdir()


def _run_steps(args, cfg, strategy, rec: Recorder, rank: int, world: int, device, profiler):
    """Every training step, timed and recorded; returns (losses, step times in seconds)."""
    losses, step_times = [], []
    for step in range(args.steps):
        x, y = global_batch(cfg, args.seed, step, args.global_batch, args.seq_len)
        x, y = rank_shard(x, rank, world).to(device), rank_shard(y, rank, world).to(device)
        _inject_fault(args, rank, step)
        rec.begin_step(step)
        t0 = time.perf_counter()
        loss = strategy.train_step(x, y)
        if device.type == "cuda":
            torch.cuda.synchronize()
        step_times.append(time.perf_counter() - t0)
        rec.end_step()
        losses.append(loss.item())
        if rank == 0:
            print(progress_line(step + 1, args.steps, losses[-1], step_times[-1]), flush=True)
        if profiler is not None:
            profiler.step()  # ends ProfilerStep#<step>; after the last step the trace is written
    if profiler is not None:
        profiler.stop()
    return losses, step_times


def _save_state(out: Path, full: dict, moments: dict) -> None:
    tmp = out / f".state.pt.{os.getpid()}.tmp"
    torch.save({"params": {k: v.cpu() for k, v in full.items()},
                "exp_avg": {k: m.cpu() for k, (m, _) in moments.items()},
                "exp_avg_sq": {k: v.cpu() for k, (_, v) in moments.items()}}, tmp)
    os.replace(tmp, out / "state.pt")


def train(args) -> dict | None:
    out = Path(args.out)
    _clear_previous_run(out)
    rank, world, device = _init_distributed(args)
    dist.barrier()

    cfg = PRESETS[args.model]
    model = build_model(cfg, args.seed, device)
    if args.lora_rank is not None:
        add_lora(model, args.lora_rank, tuple(args.lora_targets.split(",")), args.lora_alpha, args.seed)
    n_params = count_params(model)
    rec = Recorder(rank, device, labels=args.trace)
    strategy = STRATEGIES[args.strategy](model, rec, AdamW(lr=args.lr), args.bucket_mb, args.precision)
    strategy.record_model_states()
    profiler = _start_profiler(args, out, rank, device) if args.trace else None
    losses, step_times = _run_steps(args, cfg, strategy, rec, rank, world, device, profiler)

    # Everything below is collective: gather the whole model back and agree on figures.
    full = strategy.full_params()
    param_l2 = math.sqrt(sum(float(t.double().pow(2).sum()) for t in full.values()))
    moments = strategy.full_optimizer_state() if args.save_state else None
    mean_loss = torch.tensor(losses, dtype=torch.float64, device=device)
    dist.all_reduce(mean_loss)
    mean_loss /= world
    times = torch.tensor(step_times, dtype=torch.float64, device=device)
    dist.all_reduce(times, op=dist.ReduceOp.MAX)  # a step lasts until its slowest rank is done

    memory = dict(rec.peaks)
    memory.update(strategy.model_state_bytes())  # what is held between steps
    memory.update(cuda_memory_peaks(device))
    write_json_atomic(out / f"rank{rank}.json", rank_file(
        rank=rank, world_size=world, strategy=args.strategy, device=str(device),
        ops=rec.op_records(), memory_timeline=rec.memory, memory=memory,
        step_times_s=step_times, losses=losses))
    per_rank = [None] * world
    dist.all_gather_object(per_rank, memory)
    rec.shutdown()

    if rank != 0:
        return None
    if args.save_state:
        _save_state(out, full, moments)
    missing = [r for r in range(world) if not (out / f"rank{r}.json").exists()]
    if missing:
        raise RuntimeError(f"rank files missing for ranks {missing}")
    run = _run_record(args, cfg, n_params, count_trainable(model), world, device, out, times.tolist(),
                      mean_loss.tolist(), param_l2, per_rank)
    write_json_atomic(out / "run.json", run)
    return run


def _model_states_formula(stage: int, n_params: int, trainable: int, world: int, precision) -> dict:
    """The ZeRO formula for the run; with frozen weights (LoRA) gradients and optimizer state count
    the ``trainable`` parameters only, weights all of them (``psi_trainable`` says how many trained)."""
    b, k = precision.param_bytes, precision.optimizer_bytes
    states = formula(stage, n_params, world, elem_bytes=b, k=k)
    if trainable != n_params:
        held = model_state_bytes(stage, n_params, world, b, b, k, trainable=trainable)
        states.update(bytes=int(round(sum(held.values()))), psi_trainable=trainable)
    return states


def _run_record(args, cfg, n_params: int, trainable: int, world: int, device, out: Path, times: list[float],
                losses: list[float], param_l2: float, per_rank: list[dict]) -> dict:
    """``run.json``: the run's settings, the slowest rank's step times, mean losses, memory per rank
    and the ZeRO formula's model states beside the measured ones."""
    precision = PRECISIONS[args.precision]
    stage = STRATEGIES[args.strategy].stage
    model_states = _model_states_formula(stage, n_params, trainable, world, precision)
    model_states["measured"] = {
        str(r): m["params"] + m["grads"] + m["optimizer"] for r, m in enumerate(per_rank)}
    return run_file(
        strategy=args.strategy, world_size=world, backend=dist.get_backend(),
        device=device.type, model=args.model, model_config=cfg.to_dict(), params=n_params,
        precision=precision.name, dtype=precision.dtype,
        global_batch=args.global_batch, seq_len=args.seq_len,
        steps=args.steps, seed=args.seed, bucket_mb=args.bucket_mb, lr=args.lr,
        lora_rank=args.lora_rank, lora_targets=args.lora_targets,
        lora_alpha=args.lora_alpha if args.lora_rank is not None else None, trainable_params=trainable,
        step_times_s=times, median_step_s=statistics.median(times),
        losses=losses, final_loss=float(losses[-1]), param_l2=param_l2,
        memory={str(r): m for r, m in enumerate(per_rank)}, model_states_formula=model_states,
        versions=_versions(), files=_outputs(out),
        gpu=gpu_stamp() if device.type == "cuda" else None, cores=len(os.sched_getaffinity(0)))


def _lost_peer(e: Exception) -> bool:
    """A collective that failed because another rank went away (not this rank's fault)."""
    text = str(e)
    return isinstance(e, RuntimeError) and any(
        s in text for s in ("Connection closed by peer", "Connection reset", "remote worker", "Broken pipe",
                            "Timed out", "timeout", "NCCL communicator was aborted"))


def _say_line(line: str) -> None:
    """One line on stderr in a single write: the ranks and torchrun share one pipe, and
    ``print`` writes the text and its newline separately, so another process's line
    could land in between and hide this one from the launcher."""
    os.write(sys.stderr.fileno(), (line + "\n").encode())


def _finish() -> None:
    # Tear down only once every rank is done with every collective: a process group
    # destroyed while a peer still talks to it can abort the process.
    dist.barrier()
    dist.destroy_process_group()


def _leave_failed(out: str, sentence: str, overwrite: bool = True) -> None:
    """Write the failure down; a rank that only lost a peer does not hide the cause another rank wrote."""
    if overwrite or not (Path(out) / FAILED_FILE).exists():
        mark_failed(out, sentence)


def main(argv: list[str] | None = None) -> int:
    world = int(os.environ.get("WORLD_SIZE", 1))
    rank = int(os.environ.get("RANK", 0))
    args = None
    try:
        args = make_parser().parse_args(argv)
        validate(args, world if "RANK" in os.environ else args.nproc)
    except BadInput as e:
        _say_line(f"error: {e}")
        # Under torchrun this is a run that failed to start: its folder must say so.
        if "RANK" in os.environ and rank == 0 and args is not None:
            with contextlib.suppress(OSError):
                clear_outputs(args.out)
            mark_failed(args.out, f"Bad input: {e}")
        return 2
    if "RANK" not in os.environ and args.nproc > 1:
        try:
            launch_argv(list(argv if argv is not None else sys.argv[1:]), args.nproc, on_line=print)
        except RunFailed as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print(f"error: {INTERRUPTED}", file=sys.stderr)
            return 128 + signal.SIGINT
        return 0
    try:
        train(args)
        _finish()
    except Exception as e:
        # One line naming the rank: the launcher lifts it into its error message.  A rank
        # that only lost a peer says so, so the launcher can name the rank that failed first.
        if _lost_peer(e):
            _say_line(f"[rank {rank}] lost a peer: {type(e).__name__}")
            _leave_failed(args.out, f"Rank {rank} lost a peer ({type(e).__name__}) and the run failed.",
                          overwrite=False)
        else:
            said = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            _say_line(f"[rank {rank}] error: {said}")
            _leave_failed(args.out, f"The run failed: rank {rank} raised {said}.")
        # Leave at once: a clean interpreter exit would wait on, or tear down mid-call,
        # threads still parked in collectives that can never complete.
        leave_rank(1)
    if "RANK" in os.environ:
        leave_rank(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
