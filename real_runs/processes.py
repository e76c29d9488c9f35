"""How a launcher owns every process of a run, on Linux: started, watched, and stopped.

``torchrun`` starts each rank in a session of its own, so killing torchrun's process group
does not stop its ranks.  The rules:

- :func:`start` runs a command in a session of its own, tagged with a value unique to the
  run in its environment (inherited by everything it starts), and with a parent-death signal
  (SIGTERM): when the launcher dies, even of SIGKILL, torchrun is told and stops its ranks;
- :func:`die_with_torchrun`, called by each rank before it imports torch, asks for SIGKILL
  when its torchrun ends, and leaves at once if torchrun is already gone;
- :func:`leave_rank` ends a rank without the interpreter's teardown: a failed rank's
  clean exit would wait on threads parked in collectives that can never complete, and a
  finished one has written its files and closed its process group, so unloading torch
  would only delay the moment torchrun sees every rank done;
- :func:`adopting_orphans` makes the launcher a child subreaper while it supervises a run,
  so a rank whose torchrun died is reparented to the launcher and can still be reaped;
- :class:`Family` finds every process of a run, remembered by pid and start time (so a pid
  the system reuses is not mistaken for it), and stops them: SIGTERM, a grace period, SIGKILL;
- :class:`StopSignals` turns SIGTERM and SIGHUP into an exception that unwinds to that
  cleanup, and holds every stop signal while it runs.

Without ``prctl`` or ``/proc`` (not Linux) these steps do nothing and process groups are
killed as before.  :mod:`real_runs.launch` uses them to supervise runs.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37
# Every process a run starts inherits this variable, with a value unique to the run.
RUN_TAG = "ZERO_SIM_RUN_TAG"
_tags = itertools.count()


def _load_prctl():
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


# Looked up once, here: a child between fork and exec should only call it, not load libraries.
_PRCTL = _load_prctl()


def prctl(option: int, arg: int | ctypes.c_int = 0) -> bool:
    """Call prctl(2); False where there is none (not Linux) or the call failed."""
    if _PRCTL is None:
        return False
    value = ctypes.byref(arg) if isinstance(arg, ctypes.c_int) else ctypes.c_ulong(arg)
    return _PRCTL(ctypes.c_int(option), value, ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)) == 0


def die_with_parent(parent: int, sig: int = signal.SIGKILL) -> None:
    """Have the kernel send ``sig`` to this process when its parent ends; exit at once if
    ``parent`` is already gone (it may die before the request is made, and then sends nothing)."""
    if prctl(PR_SET_PDEATHSIG, int(sig)) and os.getppid() != parent:
        os._exit(1)


def die_with_torchrun() -> None:
    """A rank of a run lives only as long as its torchrun: the kernel SIGKILLs it when torchrun ends.

    A torchrun that died before that was asked for has left this rank with another parent
    (init, or the launcher as subreaper), which is not a torchrun: then leave at once."""
    parent = os.getppid()
    die_with_parent(parent)
    try:
        with open(f"/proc/{parent}/cmdline", "rb") as f:
            cmdline = f.read()
    except OSError:
        return  # no /proc: nothing more to check
    if b"torch.distributed." not in cmdline and b"torchrun" not in cmdline:
        os._exit(1)


def leave_rank(status: int) -> None:
    """End this rank now with ``status``, output flushed, skipping the interpreter's teardown
    (module docstring): a rank under torchrun that failed, or that closed its process group."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def start(cmd: list[str], env: dict[str, str]) -> subprocess.Popen:
    """Start ``cmd`` in a session of its own, tagged as one run, ending if this process dies.

    The parent-death signal is SIGTERM: torchrun catches it and stops its ranks before it
    exits, whatever module they run, and a rank of ``real_runs.train`` also dies with its
    torchrun.  The signal is tied to the thread that starts the process: that thread must
    live until the run is over, as it does in :func:`supervise`."""
    launcher = os.getpid()
    tag = f"{launcher}.{next(_tags)}.{time.time_ns()}"
    lifeline = (lambda: die_with_parent(launcher, signal.SIGTERM)) if _PRCTL else None
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**env, RUN_TAG: tag}, start_new_session=True, preexec_fn=lifeline)
    proc.run_tag = tag
    return proc


def process_table() -> dict[int, tuple[int, str, str]]:
    """pid -> (parent pid, start time, state) of every process in ``/proc``; empty without it."""
    table = {}
    try:
        names = [n for n in os.listdir("/proc") if n.isdigit()]
    except OSError:
        return table
    for name in names:
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        table[int(name)] = (int(fields[1]), fields[19], fields[0])
    return table


def _has_tag(pid: int, tags: set[str]) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read().split(b"\0")
    except OSError:
        return False
    return any(f"{RUN_TAG}={tag}".encode() in env for tag in tags)


class Family:
    """Every process that the processes :func:`start` made have started, at any depth.

    Remembered by pid and start time, so a process whose parent died (and that was reparented
    here, or to init) is still known, and a pid the system reuses is not mistaken for it."""

    def __init__(self, procs: Sequence[subprocess.Popen]):
        self.procs = list(procs)
        self.known: dict[int, str] = {}

    def refresh(self) -> set[int]:
        """Look for new members; return those alive (neither gone nor a zombie)."""
        table = process_table()
        children: dict[int, list[int]] = {}
        for pid, (ppid, _, _) in table.items():
            children.setdefault(ppid, []).append(pid)
        # Orphans of the run reparented to this process (a subreaper) carry the run's tag.
        tags = {t for t in (getattr(p, "run_tag", None) for p in self.procs) if t}
        # A started process not yet reaped still owns its pid, even as a zombie.
        todo = [p.pid for p in self.procs if p.returncode is None]
        todo += [c for c in children.get(os.getpid(), ()) if c not in self.known and _has_tag(c, tags)]
        todo += [pid for pid, started in self.known.items() if table.get(pid, (0, None))[1] == started]
        seen = set()
        while todo:
            pid = todo.pop()
            if pid in seen or pid not in table:
                continue
            seen.add(pid)
            self.known.setdefault(pid, table[pid][1])
            todo += children.get(pid, ())
        return {pid for pid, started in self.known.items()
                if pid in table and table[pid][1] == started and table[pid][2] != "Z"}

    def signal(self, pids: set[int], sig: int) -> None:
        for proc in self.procs:  # without /proc, process groups are all there is
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, sig)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)

    def reap(self, wait_s: float = 0.0) -> None:
        """Collect the exit status of members that ended as children of this process, waiting
        up to ``wait_s`` for those not ready yet: a process shows as a zombie while its other
        threads are still exiting, and cannot be reaped until they are gone."""
        for proc in self.procs:
            proc.poll()
        started_here = {p.pid for p in self.procs}
        deadline = time.monotonic() + wait_s
        while True:
            me, table = os.getpid(), process_table()
            # Only a zombie child that is still this member: waiting on a reused pid could
            # take the exit status of a process someone else started.
            ready = [pid for pid, started in self.known.items()
                     if pid not in started_here and table.get(pid) == (me, started, "Z")]
            left = []
            for pid in ready:
                with contextlib.suppress(ChildProcessError):
                    if os.waitpid(pid, os.WNOHANG)[0] == 0:
                        left.append(pid)
            if not left or time.monotonic() >= deadline:
                return
            time.sleep(0.02)

    def stop(self, grace_s: float = 2.0) -> None:
        """SIGTERM every member, then after ``grace_s`` SIGKILL those left; return once all are gone."""
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            alive = self.refresh()
            alive |= {p.pid for p in self.procs if p.poll() is None}
            if not alive:
                break
            self.signal(alive, sig)
            deadline = time.monotonic() + wait_s
            while alive and time.monotonic() < deadline:
                time.sleep(0.02)
                self.reap()
                alive = self.refresh() | {p.pid for p in self.procs if p.poll() is None}
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        self.reap(wait_s=5.0)


def kill_group(proc: subprocess.Popen) -> None:
    """Stop a process :func:`start` started and every process it started, and reap it."""
    Family([proc]).stop(grace_s=0.0)


adopting_orphans_lock = threading.Lock()
adopting_orphans_users = 0
adopting_orphans_was = 0


@contextlib.contextmanager
def adopting_orphans() -> Iterator[None]:
    """While any run is supervised, this process adopts the orphans of its descendants."""
    global adopting_orphans_users, adopting_orphans_was
    with adopting_orphans_lock:
        if adopting_orphans_users == 0:
            was = ctypes.c_int(0)
            adopting_orphans_was = was.value if prctl(PR_GET_CHILD_SUBREAPER, was) else 1
            if not adopting_orphans_was:
                prctl(PR_SET_CHILD_SUBREAPER, 1)
        adopting_orphans_users += 1
    try:
        yield
    finally:
        with adopting_orphans_lock:
            adopting_orphans_users -= 1
            if adopting_orphans_users == 0 and not adopting_orphans_was:
                prctl(PR_SET_CHILD_SUBREAPER, 0)


class StopRequested(BaseException):
    """SIGTERM or SIGHUP asked the launcher to stop the run."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.name = signal.Signals(signum).name


def _signals(*names: str) -> tuple[int, ...]:
    return tuple(getattr(signal, n) for n in names if hasattr(signal, n))


class StopSignals:
    """How a supervised run meets SIGINT, SIGTERM and SIGHUP (main thread only, where Python
    runs handlers; a signal the caller ignores, as under ``nohup``, stays ignored):

    - SIGTERM and SIGHUP at their default action (ending the process outright, which would
      skip the cleanup) raise :class:`StopRequested`, which :func:`supervise` turns into RunFailed;
    - a handler the caller set (an emulated cluster's) and SIGINT's KeyboardInterrupt are
      left as they are: their exception stops the run the same way, then goes on up;
    - while the run's processes are being stopped every one of them is held, since raising
      would cut the cleanup short, and is handed on afterwards."""

    def __init__(self):
        self.main = threading.current_thread() is threading.main_thread()
        self.before: dict[int, object] = {}
        self.claimed: set[int] = set()
        self.noted: list[int] = []
        self.stopping = False

    def __enter__(self) -> StopSignals:
        if self.main:
            for sig in _signals("SIGTERM", "SIGHUP"):
                if signal.getsignal(sig) is signal.SIG_DFL:
                    self.before[sig] = signal.signal(sig, self._stop)
                    self.claimed.add(sig)
        return self

    def _stop(self, signum, frame) -> None:
        if self.stopping:  # a second one must not replace the first on its way to RunFailed
            self.noted.append(signum)
            return
        self.stopping = True
        raise StopRequested(signum)

    def _note(self, signum, frame) -> None:
        self.noted.append(signum)

    def hold(self) -> None:
        if not self.main:
            return
        for sig in _signals("SIGINT", "SIGTERM", "SIGHUP"):
            handler = signal.getsignal(sig)
            if handler not in (signal.SIG_IGN, None):
                self.before.setdefault(sig, handler)
                signal.signal(sig, self._note)

    def __exit__(self, exc_type, exc, tb) -> None:
        for sig, handler in self.before.items():
            signal.signal(sig, handler)
        for sig in self.noted:
            # Handed on to where it would have gone; one of ours is dropped if the run is
            # already ending with an exception, which says the run was stopped.
            if exc_type is None or sig not in self.claimed:
                signal.raise_signal(sig)
                break
