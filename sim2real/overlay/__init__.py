"""Lay a measured step from ``real_runs`` over the simulator's prediction, and say how far apart they are.

What is compared
----------------
A run directory written by ``real_runs.train`` (``run.json`` and one ``rank<r>.json`` per
rank) against a :class:`~zero_sim.results.SimResult` of the same scenario, usually
``sim2real.replay.predict_run(run)``.  Both speak the vocabulary of
:mod:`zero_sim.vocabulary` (streams ``host`` / ``compute`` / ``comm``, ops ``fwd L3``,
``reduce_scatter L5`` ...), so :func:`compare` can put them side by side as tables:

* ``phases``: step time, compute, exposed communication, forward, backward, optimizer,
  computed for the measured step with the *same* functions and definitions as
  :func:`zero_sim.results.compute_metrics` uses for the simulated one (interval union,
  clipping to the step, comm-minus-compute);
* ``categories``: per op category (fwd, bwd, opt, each collective, wait) on one rank, the
  time at least one of its ops runs and how many ran;
* ``memory``: bytes per memory category: resident model states (these must agree
  *exactly* for ddp, zero1, zero2 and fsdp: both sides count the same tensors) and the
  peaks of activations, buffers and their total;
* ``ops``: every op of the step on every rank, predicted and measured start and end side by side.

How the two timelines are aligned
---------------------------------
Every time is seconds from the start of the step on *that rank*.  The recorder
(:mod:`real_runs.record`) already makes measured times step-relative per rank: t = 0 is
the instant the rank entered the step (``Recorder.begin_step``).  "Aligned" means
exactly that, and no more: ranks are not synchronised at the step start, so two ranks'
zeros differ by the skew between their step starts (small, since the previous step ended
in a collective every rank waited on).  The
simulated step is the last one simulated (the steady state), shifted so that it starts
at 0 on rank 0 (``SimResult.window``).  The measured step is chosen by
:func:`measured_step`: by default the step of median duration among steps >= 1 (step 0
pays one-off costs: allocator growth, first-touch pages, lazy initialisation).

Ops are paired by (rank, stream, name) and occurrence: the k-th ``all_gather L3`` on
rank 0's comm stream predicted goes with the k-th measured one.  Where the two sides
name an op differently (the real ZeRO-2 numbers its per-parameter collectives
``reduce_scatter B17``, the simulator names them after their layer,
``reduce_scatter L5``), the leftovers are paired by (rank, stream, kind, layer) and
occurrence; the ``matched_by`` column says which rule paired a row.

Runs that recorded no collectives: profiler traces
--------------------------------------------------
``fsdp-torch`` runs FSDP2's collectives inside torch, so its rank files hold compute
ops only.  When such a rank has a profiler trace (``train.py --trace`` writes
``traces/rank<r>.pt.trace.json``; older runs ``trace_rank<r>.json``), the collectives are
read from it:

* gloo runs each collective on a worker thread as a ``gloo:all_gather`` /
  ``gloo:all_reduce`` span (gloo's reduce-scatter *is* an all-reduce, so the kind comes
  from the launching op on the training thread: ``c10d::_allgather_base_``,
  ``c10d::_reduce_scatter_base_``, ``c10d::allreduce_`` ...).  Launches and worker spans
  are paired in order (gloo's work queue is first-in, first-out) and every pair must
  agree on its kind, or nothing is taken;
* the layer comes from the FSDP annotation around the launch
  (``FSDP::all_gather (layers.3)`` -> ``all_gather L3``); the root unit (embeddings and
  head, no suffix) is named after layer 0, as the simulator names its root unit; with no
  annotation the op has no layer (``all_gather``);
* the trace's clock is tied to the rank file's by one anchor per profiled step
  (``ProfilerStep#n``): the recorder's own ``opt ...`` label in that step (torch's
  ``Optimizer.step#...`` span in traces without labels) and the recorded ``opt`` span time
  the same call.  If
  their durations disagree by more than 2 ms + 10 %, or any pairing fails, loading stops
  with an :class:`OverlayError` instead of guessing.

Host ``wait`` spans and bytes are not recovered from traces (the gloo spans carry no
sizes); those rows stay empty.  Only gloo traces are read; CUDA (NCCL) traces have
kernels whose times are on another clock and are refused with one sentence.
"""

from sim2real.overlay.base import CATEGORIES, PHASE_ROWS, OverlayError, op_kind
from sim2real.overlay.compare import Comparison, compare, markdown_table, overlay
from sim2real.overlay.measured import (
           MeasuredStep,
           measured_memory,
           measured_step,
           measured_timing,
           median_timing,
           steady_timing,
           step_timing,
           timing_per_step,
)
from sim2real.overlay.runs import MeasuredRun, load_run
from sim2real.overlay.traces import collectives_from_trace

__all__ = ["CATEGORIES", "PHASE_ROWS", "Comparison", "MeasuredRun", "MeasuredStep", "OverlayError",
           "collectives_from_trace", "compare", "load_run", "markdown_table", "measured_memory",
           "measured_step", "measured_timing",
           "median_timing", "op_kind", "overlay", "steady_timing", "step_timing",
           "timing_per_step"]
