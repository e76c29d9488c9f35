"""Tearing every emulated cluster down however the interpreter ends.

A cluster's ``__exit__`` deletes its namespaces and kills every process left in them, also
after an exception, a Ctrl-C or a stop signal in the with-block.  How each ending is met:

- **SIGINT** (Ctrl-C) raises KeyboardInterrupt, as Python always does, so the with-blocks
  unwind and tear down; ``python -m real_runs.cluster`` then says so in one line and exits
  with status 130 (128 + SIGINT), the shells' convention.
- **SIGTERM and SIGHUP** (a closed terminal or ssh session) would kill the interpreter
  outright and leave the cluster behind: while any cluster is up, and in the with-block of
  :func:`stopping_on_signals`, they raise :class:`Stopped` (a SystemExit with status 128 + the
  signal) instead, so the with-blocks unwind the same way.  Only where nobody else has
  claimed the signal (an ignored SIGHUP, as under ``nohup``, stays ignored), and only from
  the main thread, where Python runs signal handlers.
- **A signal during teardown** would leave half a cluster behind: :func:`signals_held` holds
  all three until teardown is done, then hands them on.
- **At exit**, an ``atexit`` hook tears down whatever cluster is still up.
- **SIGKILL** cannot be caught: what it leaves is named for the killed process, and the next
  cluster built on the machine deletes it
  (:func:`~real_runs.cluster.namespaces.cleanup_stale`).
"""

from __future__ import annotations

import atexit
import contextlib
import signal
import threading
from typing import Protocol

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class TearsDown(Protocol):
    def teardown(self) -> None: ...


class Stopped(SystemExit):
    """SIGTERM or SIGHUP arrived: unwind (tearing clusters down) and exit with 128 + the signal."""

    def __init__(self, signum: int):
        super().__init__(128 + signum)
        self.signum = signum

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name


_live: set[TearsDown] = set()
_live_lock = threading.Lock()
_claimed_while_live: dict[int, object] = {}


def track_live(cluster: TearsDown) -> None:
    """Tear ``cluster`` down if the interpreter ends while it is up."""
    with _live_lock:
        _live.add(cluster)
    # Claims only what is still at its default action, so claiming again changes nothing.
    _claimed_while_live.update(_claim_stop_signals())


def untrack_live(cluster: TearsDown) -> None:
    """``cluster`` is torn down; with no cluster left up, the stop signals go back to what they were."""
    with _live_lock:
        _live.discard(cluster)
        last = not _live
    if last:
        _release(_claimed_while_live)
        _claimed_while_live.clear()


def teardown_all() -> None:
    for cluster in list(_live):
        # The interpreter is ending anyway: a signal held during this teardown must not end it
        # with a traceback from inside atexit.
        with contextlib.suppress(KeyboardInterrupt, SystemExit):
            cluster.teardown()


atexit.register(teardown_all)


def _on_stop(signum, frame):
    raise Stopped(signum)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _claim_stop_signals() -> dict[int, object]:
    """Point SIGTERM and SIGHUP at :class:`Stopped` where they are at their default action
    (killing outright); returns what to restore."""
    if not _in_main_thread():
        return {}
    return {sig: signal.signal(sig, _on_stop) for sig in STOP_SIGNALS
            if signal.getsignal(sig) is signal.SIG_DFL}


def _release(claimed: dict[int, object]) -> None:
    """Restore what :func:`_claim_stop_signals` replaced, where nobody has replaced it since."""
    if not _in_main_thread():
        return
    for sig, before in claimed.items():
        if signal.getsignal(sig) is _on_stop:
            signal.signal(sig, before)


@contextlib.contextmanager
def stopping_on_signals():
    """In the with-block SIGTERM and SIGHUP raise :class:`Stopped` (where nobody else has claimed
    them), so ``finally`` blocks run: for a whole command, not only while a cluster is up."""
    claimed = _claim_stop_signals()
    try:
        yield
    finally:
        _release(claimed)


@contextlib.contextmanager
def signals_held():
    """SIGINT, SIGTERM and SIGHUP wait until the with-block is done, then go where they would
    have gone (an exception, most often): teardown stopped halfway would leave half a cluster."""
    if not _in_main_thread():
        yield
        return
    caught: list[int] = []
    held = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, *STOP_SIGNALS)}
    # A handler installed outside Python reads as None and cannot be put back: leave it be.
    held = {sig: before for sig, before in held.items() if before is not None}
    for sig in held:
        signal.signal(sig, lambda signum, _frame: caught.append(signum))
    try:
        yield
    finally:
        for sig, before in held.items():
            signal.signal(sig, before)
        for sig in dict.fromkeys(caught):
            signal.raise_signal(sig)
