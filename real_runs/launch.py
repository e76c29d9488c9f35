"""Start a real run from Python (a notebook, a test) and get its ``run.json`` back.

::

    from real_runs.launch import launch
    run = launch("fsdp", nproc=2, out="out/fsdp", steps=5, on_line=print)
    run["step_times_s"], run["param_l2"]

The launcher owns every process a run starts (:mod:`real_runs.processes`): on a timeout, a
failure, or SIGINT/SIGTERM/SIGHUP every process of the run, at any depth, is stopped, and a
run whose launcher is killed outright dies with it.  :class:`RunFailed` is raised with one
sentence, naming the failing rank and its error when a rank said what went wrong, or the
signal that stopped the run (SIGTERM, SIGHUP; SIGINT stays Python's KeyboardInterrupt,
raised once the run is stopped).

The run directory is complete or visibly not: :func:`launch_argv` clears a previous run's
outputs before starting anything, ``run.json`` is written last and atomically by rank 0,
and a run that fails leaves ``failed.json`` holding its one sentence
(:func:`mark_failed`), which :func:`sim2real.overlay.load_run` refuses, quoting it.

:func:`supervise` does the watching for any number of ``torchrun`` processes at once,
so :mod:`real_runs.cluster` (one ``torchrun`` per emulated node) fails the same way.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from zero_sim.vocabulary.files import write_json_atomic

from .allocator import allocator_env
from .options import train_argv
from .processes import Family, StopRequested, StopSignals, adopting_orphans, start


class RunFailed(RuntimeError):
    """One sentence in ``str()``; everything the ranks printed in ``output``."""

    def __init__(self, sentence: str, output: list[str] | None = None):
        super().__init__(sentence)
        self.output = output or []


# --- the run directory --------------------------------------------------------------------

FAILED_FILE = "failed.json"
INTERRUPTED = "The run was stopped by SIGINT before it finished."
# Everything a run writes into --out; a previous run's copies go before a new run starts.
RUN_OUTPUTS = ("run.json", "rank*.json", "trace_rank*.json", "traces/rank*.pt.trace.json", "traces/.*.tmp",
               "state.pt", FAILED_FILE, ".*.tmp")


def out_of(argv: Sequence[str]) -> Path:
    """The ``--out`` folder of a training command line."""
    argv = list(argv)
    return Path(argv[argv.index("--out") + 1]) if "--out" in argv else Path("out/real_run")


def clear_outputs(out: str | os.PathLike) -> None:
    """Remove a previous run's outputs, so nothing of it can pass for the new run's result."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for pattern in RUN_OUTPUTS:
        for f in out.glob(pattern):
            f.unlink(missing_ok=True)


def mark_failed(out: str | os.PathLike, sentence: str) -> None:
    """Leave ``failed.json`` holding the run's one sentence in ``out`` (if the folder takes it)."""
    with contextlib.suppress(OSError):
        write_json_atomic(Path(out) / FAILED_FILE, {"reason": sentence})


# --- starting runs ----------------------------------------------------------------------

def launch(strategy: str, nproc: int = 2, out: str | os.PathLike = "out/real_run",
           on_line: Callable[[str], None] | None = None, timeout_s: float = 600.0, **flags) -> dict:
    """Run ``real_runs.train`` on ``nproc`` ranks and return its parsed ``run.json``.

    ``flags`` are train.py's options with underscores (``global_batch=16``,
    ``save_state=True``).  Bad input raises ValueError before anything starts."""
    argv = train_argv(strategy, nproc, out, flags)
    return launch_argv(argv, nproc, on_line=on_line, timeout_s=timeout_s)


def launch_argv(argv: list[str], nproc: int, on_line: Callable[[str], None] | None = None,
                timeout_s: float = 600.0) -> dict:
    """Run ``real_runs.train <argv>`` on ``nproc`` ranks; a failure leaves ``failed.json`` in ``--out``."""
    out = out_of(argv)
    with run_outputs(out):
        run_module("real_runs.train", argv, nproc, on_line=on_line, timeout_s=timeout_s)
        try:
            with open(out / "run.json") as f:
                return json.load(f)
        except (OSError, ValueError) as e:
            why = getattr(e, "strerror", None) or e
            raise RunFailed(f"The run ended but its run.json cannot be read: {why}.") from None


@contextlib.contextmanager
def run_outputs(out: str | os.PathLike) -> Iterator[Path]:
    """The run directory of one run: a previous run's outputs cleared before the with-block, and
    ``failed.json`` left with the reason if the block ends in any exception."""
    out = Path(out)
    try:
        clear_outputs(out)
    except OSError as e:
        raise RunFailed(f"--out {out} cannot be cleared of the previous run: {e.strerror or e}; "
                        f"choose another folder.") from None
    try:
        yield out
    except RunFailed as e:
        mark_failed(out, str(e))
        raise
    except KeyboardInterrupt:
        mark_failed(out, INTERRUPTED)
        raise
    except BaseException as e:
        mark_failed(out, f"The launcher stopped the run: {type(e).__name__}.")
        raise


def without_nproc(argv: list[str]) -> list[str]:
    """``--nproc N`` asks a module to start torchrun itself; under torchrun it means nothing."""
    return [a for i, a in enumerate(argv) if a != "--nproc" and (i == 0 or argv[i - 1] != "--nproc")]


def rank_env(**extra: str) -> dict[str, str]:
    # One thread per rank: ranks share the machine's cores, as they would share a node's.
    # faulthandler: a rank killed by a signal (a native abort) prints every thread's stack.
    # The allocator: one that keeps and reuses freed memory, as a GPU's caching allocator
    # does and the simulator assumes (:mod:`real_runs.allocator`).
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1",
            **allocator_env(), **extra}


def run_module(module: str, argv: list[str], nproc: int, on_line: Callable[[str], None] | None = None,
               timeout_s: float = 600.0) -> None:
    """``python -m <module> <argv>`` on ``nproc`` ranks of this machine under one torchrun."""
    with torchrun_log_dir() as logs:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               "--monitor-interval=0.5", f"--log-dir={logs}", "-m", module, *without_nproc(argv)]
        supervise([start(cmd, rank_env())], on_line=on_line, timeout_s=timeout_s)


@contextlib.contextmanager
def torchrun_log_dir() -> Iterator[str]:
    """A folder for torchrun's per-launch log folders, removed when the launch ends: left to
    itself, torchrun makes one in the temp dir for every launch and never removes it."""
    with tempfile.TemporaryDirectory(prefix="zero-sim-torchrun-") as logs:
        yield logs


# --- owning every process of a run (Linux; a no-op elsewhere) ---------------------------------

def supervise(procs: Sequence[subprocess.Popen], on_line: Callable[[str], None] | None = None,
              timeout_s: float = 600.0, grace_s: float = 5.0) -> None:
    """Stream every line of ``procs`` to ``on_line`` until all have ended; RunFailed if one fails.

    When one process fails the others get ``grace_s`` to end by themselves (their ranks
    lost a peer) and to print why: the rank that raised may live in a process that ends
    second.  Then, or at the deadline, on SIGINT/SIGTERM/SIGHUP (:class:`StopSignals`) or on
    any exception, every process the run started is stopped (:class:`Family`)."""
    family = Family(procs)
    output: list[str] = []
    with adopting_orphans(), StopSignals() as signals:
        try:
            failed_rc, errors = _watch(procs, family, output, on_line, timeout_s, grace_s)
        except StopRequested as e:
            raise RunFailed(f"The run was stopped by {e.name} before it finished.", output) from None
        finally:
            signals.hold()
            family.stop()
    if failed_rc is not None:
        raise RunFailed(_failure_sentence(failed_rc, errors, output), output)


def _watch(procs, family: Family, output: list[str], on_line, timeout_s: float,
           grace_s: float) -> tuple[int | None, list[str]]:
    """Follow ``procs`` until all end, one fails (plus ``grace_s``), or the deadline passes."""
    lines: queue.Queue = queue.Queue()
    for i, proc in enumerate(procs):
        threading.Thread(target=_pump, args=(i, proc, lines), daemon=True).start()
    timed_out = f"The run did not finish within {timeout_s:.0f} s and was stopped."
    errors: list[str] = []
    failed_rc = None
    failed_at = 0.0
    open_ = len(procs)
    deadline = time.monotonic() + timeout_s
    scanned = 0.0
    while open_:
        # Twice a second, lines or not, note new processes while their parents still live:
        # one that ends after its parent can then still be found, and reaped.
        if time.monotonic() - scanned >= 0.5:
            family.refresh()
            scanned = time.monotonic()
        until = deadline if failed_rc is None else min(deadline, failed_at + grace_s)
        try:
            i, line = lines.get(timeout=max(0.0, min(until - time.monotonic(), 0.5)))
        except queue.Empty:
            if time.monotonic() < until:
                continue
            if failed_rc is not None:
                break
            raise RunFailed(timed_out, output) from None
        if line is None:
            open_ -= 1
            try:
                rc = procs[i].wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise RunFailed(timed_out, output) from None
            if rc != 0 and failed_rc is None:
                failed_rc, failed_at = rc, time.monotonic()
            continue
        line = line.rstrip("\n")
        output.append(line)
        # Searched, not matched at the start: a line another process left unfinished
        # may precede a rank's error on the same pipe.
        if m := re.search(r"\[rank \d+\] error: .*", line):
            errors.append(m[0])
        if on_line is not None:
            on_line(line)
    return failed_rc, errors


def _pump(i: int, proc: subprocess.Popen, lines: queue.Queue) -> None:
    for line in proc.stdout:
        lines.put((i, line))
    lines.put((i, None))


def _torchrun_failures(output: list[str]) -> list[tuple[str, str]]:
    """torchrun's failure report: (rank, how it ended) for every rank, cause first."""
    found, rank = [], None
    for line in output:
        if m := re.match(r"\s*rank\s*:\s*(\d+)", line):
            rank = m[1]
        elif rank is not None and (m := re.match(r"\s*exitcode\s*:\s*(-?\d+)", line)):
            sig = re.search(r"\((SIG\w+)\)\s*$", line)
            found.append((rank, sig[1] if sig else f"exit status {m[1]}"))
            rank = None
    return found


def _failure_sentence(rc: int, errors: list[str], output: list[str]) -> str:
    # A rank that raised is the cause; so is one that died of a signal torchrun did not
    # send (it stops the survivors with SIGTERM); ranks that only lost a peer are not.
    if errors:
        first = errors[0]
        rank = first[len("[rank "):first.index("]")]
        return f"The run failed: rank {rank} raised {first.split('error: ', 1)[1]}."
    for rank, how in _torchrun_failures(output):
        if how.startswith("SIG") and how != "SIGTERM":
            said = _native_abort(output)
            return (f"The run failed: rank {rank} died ({how}{': ' + said if said else ''}) "
                    "and the other ranks were stopped.")
    # A rank whose exception escaped (a module without the "error:" line, or an error raised
    # in native code) still left Python's last traceback line, prefixed with its rank by torchrun.
    raised = next((m for line in output
                   if (m := re.match(r"\[rank(\d+)\]: (\w+(?:Error|Exception)): (.*)", line))), None)
    if raised:
        said = re.sub(r"^\[rank\d+\]:\[\w\d+ [\d:.]+ [^\]]*\] ", "", raised[3]).strip()
        return f"The run failed: rank {raised[1]} raised {raised[2]}: {said.rstrip('.')}."
    # Ranks refuse bad input (exit status 2) with one "error: ..." line before they connect;
    # two ranks saying the same at once may share a line.
    refused = next((m[1] for line in output if (m := re.search(r"\berror: (.*?)(?=error: |$)", line))), None)
    if refused:
        return f"The run failed to start: {refused.strip().rstrip('.')}."
    return f"The run failed with torchrun exit status {rc} and no rank said why."


def progress_line(step: int, steps: int, loss: float, seconds: float) -> str:
    """Rank 0's line after each step (train.py prints it; the launcher streams it to callers)."""
    return f"step {step}/{steps} loss {loss:.4f} time {seconds:.3f}s"


# Ranks share one pipe, and faulthandler writes its message in pieces, so a progress line can
# land inside it; it is cut out before reading.
_PROGRESS = re.compile(r"step \d+/\d+ loss \S+ time [\d.]+s\n?")


def _native_abort(output: list[str]) -> str | None:
    """What a native abort printed before its signal: the C++ exception it threw, or
    where faulthandler found the aborting thread (``File ..., line N in f``)."""
    text = _PROGRESS.sub("", "\n".join(output))
    if m := re.search(r"terminate called after throwing an instance of '([^']+)'", text):
        what = re.search(r"what\(\):\s*(.+)", text)
        return f"{m[1]}: {what[1].strip()}" if what else m[1]
    if m := re.search(r"Fatal Python error: [^\n]+", text):
        where = re.search(r"Current thread [^\n]*\n\s*(File [^\n]+)", text[m.end():])
        return f"{m[0]}, {where[1]}" if where else m[0]
    return None
