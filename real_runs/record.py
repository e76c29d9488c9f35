"""What really happened on one rank, written in the simulator's vocabulary.

Three streams per rank, as in the simulator:

- ``compute``: ``fwd L<i>``, ``bwd L<i>`` and ``opt ...`` spans;
- ``comm``: each collective from its launch to the completion of its work handle;
- ``host``: time the host thread spends blocked in ``wait <collective>``.

Times are seconds from the start of the step on that rank.  On CUDA, compute spans and
collectives are timed with CUDA events (a collective ends with an event recorded from
its future's callback, which runs on a stream ordered after the NCCL kernel).  On CPU
the host thread *is* the compute stream, so wall clocks are exact for compute; a
collective's end is stamped by a watcher thread that blocks on its work handle (gloo
reduce-scatter work has no future to attach a callback to).

Memory is tracked per category (:data:`zero_sim.vocabulary.MEMORY_CATEGORIES`): each
strategy reports the exact bytes of the tensors it allocates and frees, activations
are the bytes autograd saves for backward, and every change is a sample
``{step, t_s, category, bytes}`` holding the category's new total.  Activations are
counted tensor by tensor in the run's first forward only, by the compute span that saved
them; later forwards add each span's bytes when it closes (see :meth:`Recorder.saved_activations`).

With ``labels=True`` (``train.py --trace``) every recorded span is also a
``torch.profiler.record_function`` span of the same name, so a profiler trace speaks the
shared vocabulary: ``fwd L3``, ``bwd L3``, ``opt B0`` and ``wait all_reduce B2`` around
the work itself, and ``all_reduce B2`` around a collective's launch on the host (the
collective runs on after the launch: gloo's worker-thread span, or NCCL's kernel, times it).
Each label opens just before its record starts and closes just after it ends, so a label's
own cost falls outside its record (a launch labelled inside ``bwd L3`` adds its few
microseconds to that span, as the launch itself does).
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from contextlib import contextmanager

import torch

from zero_sim.vocabulary import (
    ACTIVATIONS,
    COMM,
    COMPUTE,
    FORWARD,
    HOST,
    MEMORY_CATEGORIES,
    wait,
)


class Recorder:
    def __init__(self, rank: int, device: torch.device, enabled: bool = True, labels: bool = False):
        self.rank = rank
        self.cuda = device.type == "cuda"
        self.enabled = enabled
        self.labels = labels
        self._labels: dict[str, torch.profiler.record_function] = {}
        self.step = -1
        self.phase = FORWARD
        self.ops: list[dict] = []
        self.memory: list[dict] = []
        self.totals = dict.fromkeys(MEMORY_CATEGORIES, 0)
        self.peaks = dict.fromkeys(MEMORY_CATEGORIES, 0)
        self._t0 = time.perf_counter()
        self._step_event = None
        self._cuda_ops: list[tuple[dict, object, object]] = []
        self._open: dict[str, dict] = {}
        # Bytes autograd saved during each compute span of the first forward (None: not yet
        # counted), and whether a later forward is charging them span by span.
        self._saved_by_span: dict[str | None, int] | None = None
        self._charging = False
        self._watch: queue.Queue | None = None
        if not self.cuda:
            self._watch = queue.Queue()
            self._watcher_thread = threading.Thread(target=self._watcher, daemon=True,
                                                    name=f"comm-watch-{rank}")
            self._watcher_thread.start()

    # --- clocks ---------------------------------------------------------------

    def now(self) -> float:
        return time.perf_counter() - self._t0

    def _event(self):
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def begin_step(self, step: int) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            self._step_event = self._event()
        self.step = step
        self.phase = FORWARD
        self._t0 = time.perf_counter()

    def end_step(self) -> None:
        """Settle this step's timestamps: every collective has finished by now."""
        if self._watch is not None:
            self._watch.join()
        if self.cuda:
            torch.cuda.synchronize()
            for op, start, end in self._cuda_ops:
                op["start_s"] = self._step_event.elapsed_time(start) / 1e3
                op["end_s"] = self._step_event.elapsed_time(end) / 1e3
            self._cuda_ops.clear()
        self._open.clear()
        for name in reversed(list(self._labels)):  # a span left open ends with its step
            self._end_label(name)

    def _new_op(self, stream: str, name: str, layer: int | None, nbytes: int) -> dict:
        op = {"rank": self.rank, "stream": stream, "name": name, "start_s": self.now(), "end_s": None,
              "bytes": int(nbytes), "layer": layer, "phase": self.phase, "step": self.step}
        if self.enabled:
            self.ops.append(op)
        return op

    # --- profiler labels ------------------------------------------------------

    def label(self, name: str):
        """A ``record_function`` span named ``name`` when labelling, else nothing."""
        return torch.profiler.record_function(name) if self.labels else contextlib.nullcontext()

    def _begin_label(self, name: str) -> None:
        if self.labels:
            self._end_label(name)  # reopening a name ends its previous span, as ``_open`` forgets it
            self._labels[name] = fn = torch.profiler.record_function(name)
            fn.__enter__()

    def _end_label(self, name: str) -> None:
        fn = self._labels.pop(name, None)
        if fn is not None:
            fn.__exit__(None, None, None)

    # --- ops ------------------------------------------------------------------

    def open(self, name: str, layer: int | None = None, nbytes: int = 0, stream: str = COMPUTE) -> None:
        self._begin_label(name)
        op = self._new_op(stream, name, layer, nbytes)
        if self.cuda and stream != HOST:
            op["_start"] = self._event()
        self._open[name] = op

    def close(self, name: str) -> None:
        op = self._open.pop(name, None)
        if op is None:
            return
        if "_start" in op:
            self._cuda_ops.append((op, op.pop("_start"), self._event()))
        else:
            op["end_s"] = self.now()
        if self._charging and self._saved_by_span.get(name):
            self.add_memory(ACTIVATIONS, self._saved_by_span[name])
        self._end_label(name)

    def is_open(self, name: str) -> bool:
        return name in self._open

    @contextmanager
    def span(self, name: str, layer: int | None = None, nbytes: int = 0, stream: str = COMPUTE):
        self.open(name, layer, nbytes, stream)
        try:
            yield
        finally:
            self.close(name)

    def comm(self, work, name: str, nbytes: int, layer: int | None = None) -> Pending:
        """Record a launched collective; returns a handle whose ``wait`` is timed on the host."""
        op = self._new_op(COMM, name, layer, nbytes)
        if self.cuda:
            start, end = self._event(), torch.cuda.Event(enable_timing=True)
            try:
                work.get_future().then(lambda _fut: end.record())
            except RuntimeError:
                end = None  # no future: the end is stamped after wait() instead
            self._cuda_ops.append((op, start, end))
        else:
            self._watch.put((work, op))
        return Pending(self, work, op)

    def shutdown(self) -> None:
        """Stop the watcher thread.  Left running at interpreter exit, a thread parked in
        C++ can be torn down mid-call and abort the process."""
        if self._watch is not None:
            self._watch.put(None)
            self._watcher_thread.join()
            self._watch = None

    def _watcher(self) -> None:
        while True:
            item = self._watch.get()
            if item is None:
                return
            work, op = item
            try:
                work.wait()
            except Exception:  # the host thread's own wait() reports the failure
                pass
            op["end_s"] = self.now()
            self._watch.task_done()

    # --- memory ---------------------------------------------------------------

    def set_memory(self, category: str, nbytes: int) -> None:
        nbytes = int(nbytes)
        if self.totals[category] == nbytes:
            return
        self.totals[category] = nbytes
        self.peaks[category] = max(self.peaks[category], nbytes)
        if self.enabled:
            self.memory.append({"step": self.step, "t_s": self.now(), "category": category, "bytes": nbytes})

    def add_memory(self, category: str, delta: int) -> None:
        self.set_memory(category, self.totals[category] + delta)

    @contextmanager
    def saved_activations(self):
        """Count the bytes autograd keeps for backward, by storage.  Parameters (and views
        of them, such as a transposed weight), frozen ones included, are model state, not activations.

        Counting runs a Python hook on every tensor autograd saves, a hundred or more per
        forward at a few microseconds each: enough to slow a small model's measured forward
        by several percent, which no run outside this recorder pays.  A step's forward saves
        the same tensors every time (same model, same shapes), so only the first forward
        counts them, and by the compute span that was open when each was saved; every later
        forward runs with no hook and adds a span's bytes when that span closes (bytes saved
        outside any span, when the forward ends).  Within a layer, activations therefore
        appear as one step at the layer's end instead of a staircase through it."""
        if self._saved_by_span is not None:
            self._charging = True
            try:
                yield
            finally:
                self._charging = False
                if self._saved_by_span.get(None):
                    self.add_memory(ACTIVATIONS, self._saved_by_span[None])
            return
        seen: set[int] = set()
        by_span: dict[str | None, int] = {}

        def pack(t: torch.Tensor):
            owner = t if t._base is None else t._base
            # A weight autograd keeps for its input's gradient is model state; a frozen one (LoRA)
            # needs no grad, so it is known as a parameter rather than as a leaf that wants one.
            if not (owner.is_leaf and owner.requires_grad) and not isinstance(owner, torch.nn.Parameter):
                storage = t.untyped_storage()
                if storage.data_ptr() not in seen:
                    seen.add(storage.data_ptr())
                    span = next((name for name, op in reversed(self._open.items())
                                 if op["stream"] == COMPUTE), None)
                    by_span[span] = by_span.get(span, 0) + storage.nbytes()
                    self.add_memory(ACTIVATIONS, storage.nbytes())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield
        self._saved_by_span = by_span

    # --- output ---------------------------------------------------------------

    def op_records(self) -> list[dict]:
        return [{k: v for k, v in op.items() if not k.startswith("_")} for op in self.ops]


class Pending:
    """A launched collective.  ``wait`` blocks the host and records how long."""

    def __init__(self, rec: Recorder, work, op: dict):
        self.rec, self.work, self.op = rec, work, op

    def wait(self) -> None:
        rec = self.rec
        with rec.label(wait(self.op["name"])):
            host = rec._new_op(HOST, wait(self.op["name"]), self.op["layer"], self.op["bytes"])
            self.work.wait()
            host["end_s"] = rec.now()
        if rec.cuda:
            for i, (op, start, end) in enumerate(rec._cuda_ops):
                if op is self.op and end is None:
                    rec._cuda_ops[i] = (op, start, rec._event())


def cuda_memory_peaks(device: torch.device) -> dict[str, int]:
    """The CUDA caching allocator's peaks on ``device``: what tensors held at most
    (``peak_allocated``) and what the allocator held from the driver (``peak_reserved``,
    its cached and fragmented blocks included).  Empty on the CPU."""
    if device.type != "cuda":
        return {}
    return {"peak_allocated": int(torch.cuda.max_memory_allocated(device)),
            "peak_reserved": int(torch.cuda.max_memory_reserved(device))}
