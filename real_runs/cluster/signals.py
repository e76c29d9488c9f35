"""Tearing every emulated cluster down however the interpreter ends.

A cluster's ``__exit__`` deletes its namespaces and kills every process left in them, also
after an exception or a Ctrl-C in the with-block; a Ctrl-C during that teardown is held back
until it is done (:func:`sigint_held`), since it would leave half a cluster behind.  Every
cluster that is up is tracked here: an ``atexit`` hook tears down whatever is still up when
the interpreter ends, and while any cluster is up SIGTERM ends the interpreter through
Python (so those hooks run) instead of killing it outright.  Namespaces left by a process
that was killed outright are deleted by the next cluster's ``__enter__``
(:func:`~real_runs.cluster.namespaces.cleanup_stale`).
"""

from __future__ import annotations

import atexit
import contextlib
import signal
import threading
from typing import Protocol


class TearsDown(Protocol):
    def teardown(self) -> None: ...


_live: set[TearsDown] = set()
_live_lock = threading.Lock()
_sigterm_before = None


def track_live(cluster: TearsDown) -> None:
    """Tear ``cluster`` down if the interpreter ends while it is up."""
    with _live_lock:
        _live.add(cluster)
    _watch_sigterm(True)


def untrack_live(cluster: TearsDown) -> None:
    """``cluster`` is torn down; with no cluster left up, SIGTERM goes back to what it was."""
    with _live_lock:
        _live.discard(cluster)
        if not _live:
            _watch_sigterm(False)


def teardown_all() -> None:
    for cluster in list(_live):
        cluster.teardown()


atexit.register(teardown_all)


def _on_sigterm(signum, frame):
    # SystemExit unwinds the with-blocks (their __exit__ tears down); atexit catches the rest.
    raise SystemExit(128 + signum)


def _watch_sigterm(on: bool) -> None:
    """While a cluster is up, SIGTERM ends the interpreter through Python (so teardown runs)
    instead of killing it outright; only where nobody else has claimed SIGTERM."""
    global _sigterm_before
    if threading.current_thread() is not threading.main_thread():
        return
    if on and _sigterm_before is None and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        _sigterm_before = signal.signal(signal.SIGTERM, _on_sigterm)
    elif not on and _sigterm_before is not None and signal.getsignal(signal.SIGTERM) is _on_sigterm:
        signal.signal(signal.SIGTERM, _sigterm_before)
        _sigterm_before = None


@contextlib.contextmanager
def sigint_held():
    """A Ctrl-C during teardown would leave half a cluster behind: hold it until teardown is done."""
    old = signal.getsignal(signal.SIGINT) if threading.current_thread() is threading.main_thread() else None
    if old is None:
        yield
        return
    caught = []
    signal.signal(signal.SIGINT, lambda *_: caught.append(True))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
        if caught:
            raise KeyboardInterrupt
