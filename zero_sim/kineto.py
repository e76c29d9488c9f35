"""Per-rank traces in the PyTorch profiler's (Kineto's) layout, so that Holistic Trace Analysis,
Perfetto and TensorBoard's profiler plugin read a simulation as they read a measured run.

:func:`write_rank_traces` writes ``rank-<r>.pt.trace.json`` for every *simulated* rank into one
directory, the layout ``torch.profiler.tensorboard_trace_handler`` gives a distributed job.  When
ranks were collapsed (``explicit_ranks`` off, rank 0 standing for every rank) only rank 0's file
is written: the other ranks were never simulated, and copies would make cross-rank analyses
(stragglers, load balance) report agreement that nobody computed.  (``zero-sim simulate
--trace-dir`` therefore simulates every rank of a job of up to eight GPUs.)

What a file holds, and which reader needs it:

* ``schemaVersion``, ``distributedInfo`` (``rank``, ``world_size``, ``backend``),
  ``deviceProperties``, ``displayTimeUnit`` and ``baseTimeNanoseconds``: Kineto's header.  HTA
  finds a file's rank by the first ``"rank": N`` in the text, so ``distributedInfo`` comes before
  the events; it converts times to Unix time with ``baseTimeNanoseconds`` (0 here: simulated time
  has no date).
* Kernels (``cat: kernel``, ``ph: X``) on the GPU process (``pid = rank + 1``, because Perfetto's
  maintainers advise against pid 0), one ``tid`` per CUDA stream, ``args.stream`` the same integer
  (compute stream 7, communication streams from 20, as real traces number them) and
  ``args.device = rank``.  HTA takes every event with an integer ``args.stream`` for a GPU kernel
  and every other one for a host event.
* Copies to and from pinned host memory (offloading) are ``cat: gpu_memcpy`` events named as
  Kineto names them (``Memcpy DtoH (Device -> Pinned)``), launched by ``cudaMemcpyAsync``.
* Kernel names: HTA calls a kernel communication when its name matches ``^nccl.*Kernel``, memory
  when it starts with Memcpy/Memset, and computation otherwise; its straggler analysis looks only
  at names starting ``ncclKernel``.  Collectives are therefore named as NCCL before 2.19 named its
  kernels (``ncclKernel_AllGather_RING_SIMPLE(...)``, the algorithm the simulator chose; the
  protocol is not simulated and SIMPLE is written; gloo runs get the same names so that HTA still
  counts them as communication), and compute kernels keep the simulator's op names (``fwd L3``,
  a whole layer's work as one kernel).
* On the host thread (``pid = tid = 10000 + rank``): for each kernel a ``cpu_op`` named after the
  simulator's op enclosing a ``cudaLaunchKernel`` (``cat: cuda_runtime``) whose ``args.correlation``
  equals the kernel's, plus Kineto's ``ac2g`` flow from launch to kernel.  HTA maps kernels to
  iterations and drops kernels of unprofiled steps through these links.
* ``ProfilerStep#<n>`` (``cat: user_annotation``) on the host thread over each simulated step's
  host work: HTA's iterations.  HTA leaves out the last ProfilerStep unless
  ``TraceAnalysis(..., include_last_profiler_step=True)``; the simulator's last step is its
  reported one, so pass that flag to analyse it.
* Host waits the simulator models (``wait free all_gather L1``) as ``cpu_op``; straggler stalls
  as ``gpu_user_annotation`` on the stream that stalled, without ``args.stream`` so that HTA does
  not count them as kernels.
* CPU runs (gloo) keep this layout: the process named "GPU r" holds their compute and collectives.
* Flow arrows (:func:`collective_flows`) joining one collective across ranks: each file holds the
  endpoints on its own rank with ids shared across files, so traces merged into one show them.

Times are whole microseconds, as Kineto wrote them before nanosecond timestamps: HTA rounds
fractional times inwards (start up, end down), which would shorten every kernel by up to 2 us,
while rounding both ends of every span to the nearest microsecond keeps back-to-back kernels
back to back.  Launch times are not simulated (the engine records when ops ran, not when the host
issued them): each launch is drawn, 1 us long in a 2 us ``cpu_op``, as late as it can be before
its kernel starts, in step and start order, around the host's waits; launch-delay and queue-length
analyses of these files are therefore not meaningful.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from zero_sim.vocabulary import COMPUTE, D2H, H2D, HOST, parse_op_name
from zero_sim.vocabulary.files import write_json_atomic

COMPUTE_STREAM = 7  # the stream id PyTorch's default stream gets in real traces
FIRST_OTHER_STREAM = 20  # NCCL's and side streams are numbered after the default one
HOST_PID_BASE = 10_000  # host processes apart from the GPU ones (pid = rank + 1)
CPU_OP_US, LAUNCH_US = 2, 1  # a drawn launch: a cpu_op enclosing its cudaLaunchKernel
# Correlation ids unique across ranks, so merged files still link, and never small: HTA stores
# kernel-to-launch links in the correlation column's dtype, which overflows when ids fit in int8.
CORRELATIONS_PER_RANK = 1 << 24
FLOW_ID_BASE = 1 << 40  # collective flow ids apart from the correlation ids of ac2g flows

_NCCL_KIND = {"all_gather": "AllGather", "reduce_scatter": "ReduceScatter", "all_reduce": "AllReduce",
              "broadcast": "Broadcast", "all_to_all": "SendRecv"}  # NCCL runs all-to-all as grouped send/recv
_NCCL_SIGNATURE = "(ncclDevComm*, unsigned long, ncclWork*)"

Op = dict[str, Any]
Place = Callable[[Op], tuple[int, int, float, float]]  # op -> (pid, tid, start_us, end_us)


def us(seconds: float) -> int:
    """Whole microseconds, rounded to nearest (see the module docstring)."""
    return round(seconds * 1e6)


def gpu_pid(rank: int) -> int:
    return rank + 1


def host_pid(rank: int) -> int:
    return HOST_PID_BASE + rank


# Kineto's names for copies to and from pinned host memory (offloading), which HTA counts as memory.
_MEMCPY = {D2H: "Memcpy DtoH (Device -> Pinned)", H2D: "Memcpy HtoD (Pinned -> Device)"}
DEVICE_WORK = ("compute", "collective", "copy")  # device ops launched from the host: kernels and copies


def kernel_name(op: Op) -> str:
    """The kernel's name: NCCL's spelling for a collective, Kineto's for a host copy, the simulator's
    op name otherwise."""
    if op["kind"] == "copy":
        return _MEMCPY[op["stream"]]
    if op["kind"] != "collective":
        return op["name"]
    kind = _NCCL_KIND.get(parse_op_name(op["name"]).kind, "SendRecv")
    algorithm = (op.get("algorithm") or "ring").upper()
    return f"ncclKernel_{kind}_{algorithm}_SIMPLE{_NCCL_SIGNATURE}"


def is_device_op(op: Op) -> bool:
    return op["stream"] != HOST


# ---------------------------------------------------------------------------------------- streams
def _lanes(ops: list[Op]) -> dict[int, tuple[str, int]]:
    """(stream, lane) of each device op, by ``id``: ops overlapping on one stream (gloo runs two
    collectives at once) take further lanes, because a CUDA stream runs one kernel at a time."""
    out: dict[int, tuple[str, int]] = {}
    ends: dict[tuple[int, str], list[int]] = defaultdict(list)
    for op in sorted(ops, key=lambda o: (o["rank"], us(o["start_s"]), us(o["end_s"]))):
        lane_ends = ends[(op["rank"], op["stream"])]
        start = us(op["start_s"])
        lane = next((i for i, end in enumerate(lane_ends) if end <= start), len(lane_ends))
        if lane == len(lane_ends):
            lane_ends.append(0)
        lane_ends[lane] = us(op["end_s"])
        out[id(op)] = (op["stream"], lane)
    return out


def stream_ids(lanes: Iterable[tuple[str, int]]) -> dict[tuple[str, int], int]:
    """One integer per (stream, lane), the same on every rank: compute 7, the others from 20."""
    ids = {(COMPUTE, 0): COMPUTE_STREAM}
    for key in sorted(set(lanes) - {(COMPUTE, 0)}, key=lambda k: (k[0] == COMPUTE, k)):
        ids[key] = FIRST_OTHER_STREAM + len(ids) - 1
    return ids


def kineto_place(ops: list[Op]) -> Place:
    """Where :func:`write_rank_traces` draws each device op of ``ops``: (pid, tid, start, end in us)."""
    lanes = _lanes([op for op in ops if is_device_op(op)])
    ids = stream_ids(lanes.values())
    return lambda op: (gpu_pid(op["rank"]), ids[lanes[id(op)]], us(op["start_s"]), us(op["end_s"]))


# ------------------------------------------------------------------------------------------ flows
def collective_instances(ops: list[Op]) -> list[list[Op]]:
    """Each collective instance's ops, one per member rank, in rank order.

    An instance is the n-th op of one name in one step on each rank (a name recurs when FSDP
    gathers a layer again for backward); members of one instance start and end at the same
    instant, which tells sibling groups of a hybrid run apart when they did not run in lockstep;
    the op records do not name their group, so sibling groups that did are chained as one."""
    seen: dict[tuple, int] = defaultdict(int)
    instances: dict[tuple, list[Op]] = defaultdict(list)
    for op in sorted((o for o in ops if o["kind"] == "collective"), key=lambda o: (o["rank"], o["start_s"])):
        n = seen[(op["rank"], op["name"], op["step"])]
        seen[(op["rank"], op["name"], op["step"])] += 1
        instances[(op["name"], op["step"], n, op["start_s"], op["end_s"])].append(op)
    return [sorted(members, key=lambda o: o["rank"]) for members in instances.values()]


def collective_flows(ops: list[Op], place: Place | None = None, first_id: int = FLOW_ID_BASE) -> list[dict]:
    """Flow events (``ph: s`` then ``ph: f`` with ``bp: e``) chaining each collective instance
    across its ranks in rank order; each endpoint lies mid-slice so that it binds to the
    collective's own slice.  ``place`` says where an op is drawn (default: :func:`kineto_place`);
    ids count up from ``first_id`` and depend only on ``ops``, so every rank's file agrees."""
    place = place or kineto_place(ops)
    flows: list[dict] = []
    flow_id = first_id
    for members in collective_instances(ops):
        for a, b in zip(members, members[1:], strict=False):
            for op, phase in ((a, "s"), (b, "f")):
                pid, tid, start, end = place(op)
                mid = start + (end - start) // 2 if isinstance(start, int) else (start + end) / 2
                flow = {"ph": phase, "id": flow_id, "pid": pid, "tid": tid, "ts": mid,
                        "cat": "collective", "name": op["name"], "args": {"step": op["step"]}}
                if phase == "f":
                    flow["bp"] = "e"
                flows.append(flow)
            flow_id += 1
    return flows


# ------------------------------------------------------------------------------------------- host
def _blocked(ops: list[Op]) -> list[tuple[int, int]]:
    """The host's own spans (its waits), sorted: no launch is drawn inside one."""
    return sorted((us(op["start_s"]), us(op["end_s"])) for op in ops if not is_device_op(op))


def _launch_times(kernels: list[Op], blocked: list[tuple[int, int]]) -> dict[int, int]:
    """Start (us) of each kernel's drawn ``cpu_op``, by ``id``: latest first, each ending by its
    kernel's start and before the next launch, and stepping back over the host's waits."""
    out: dict[int, int] = {}
    cursor = None
    for op in sorted(kernels, key=lambda o: (o["step"], o["start_s"]), reverse=True):
        end = us(op["start_s"]) if cursor is None else min(us(op["start_s"]), cursor)
        for lo, hi in reversed(blocked):
            if lo < end and hi > end - CPU_OP_US:
                end = lo
        out[id(op)] = cursor = end - CPU_OP_US
    return out


def _x(name: str, cat: str, pid: int, tid: int, ts: int, dur: int, args: dict) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _host_events(rank: int, ops: list[Op], kernels: list[Op], place: Place,
                 window_end: int) -> tuple[list[dict], dict[int, int]]:
    """Host-thread events of ``rank``: ProfilerStep spans, launches, waits; and each kernel's correlation."""
    pid = host_pid(rank)
    starts = _launch_times(kernels, _blocked(ops))
    correlation: dict[int, int] = {}
    events: list[dict] = []
    step_spans: dict[int, list[int]] = {}
    for n, op in enumerate(sorted(kernels, key=lambda o: starts[id(o)]), start=1):
        t, corr = starts[id(op)], (rank + 1) * CORRELATIONS_PER_RANK + n
        correlation[id(op)] = corr
        gpu, stream, k_start, _ = place(op)
        events.append(_x(op["name"], "cpu_op", pid, pid, t, CPU_OP_US, {"External id": corr}))
        launch = "cudaMemcpyAsync" if op["kind"] == "copy" else "cudaLaunchKernel"
        events.append(_x(launch, "cuda_runtime", pid, pid, t + CPU_OP_US - LAUNCH_US, LAUNCH_US,
                         {"External id": corr, "correlation": corr}))
        events.append({"ph": "s", "id": corr, "pid": pid, "tid": pid, "ts": t + CPU_OP_US - LAUNCH_US,
                       "cat": "ac2g", "name": "ac2g"})
        events.append({"ph": "f", "id": corr, "pid": gpu, "tid": stream, "ts": k_start,
                       "cat": "ac2g", "name": "ac2g", "bp": "e"})
        span = step_spans.setdefault(op["step"], [t, t + CPU_OP_US])
        span[0], span[1] = min(span[0], t), max(span[1], t + CPU_OP_US)
    for op in ops:
        if not is_device_op(op):
            t0, t1 = us(op["start_s"]), us(op["end_s"])
            events.append(_x(op["name"], "cpu_op", pid, pid, t0, t1 - t0, {"step": op["step"]}))
            span = step_spans.setdefault(op["step"], [t0, t1])
            span[0], span[1] = min(span[0], t0), max(span[1], t1)
    events.extend(_profiler_steps(pid, step_spans, window_end))
    return events, correlation


def _profiler_steps(pid: int, spans: dict[int, list[int]], window_end: int) -> list[dict]:
    """``ProfilerStep#n`` from the step's first host event to the next step's (the last one to the
    end of its work on the GPU), as ``profiler.step()`` called at each step's start would record."""
    steps = sorted(spans)
    out = []
    for i, step in enumerate(steps):
        start = spans[step][0]
        end = spans[steps[i + 1]][0] if i + 1 < len(steps) else max(spans[step][1], window_end)
        out.append(_x(f"ProfilerStep#{step}", "user_annotation", pid, pid, start, max(end - start, 0),
                      {"External id": 0}))
    return out


# ----------------------------------------------------------------------------------------- device
def _device_events(rank: int, ops: list[Op], place: Place, correlation: dict[int, int]) -> list[dict]:
    events = []
    for op in ops:
        if not is_device_op(op):
            continue
        pid, stream, start, end = place(op)
        args = {"device": rank, "step": op["step"], "phase": op["phase"], "layer": op["layer"],
                "bytes": op["bytes"], "op": op["name"]}
        if op.get("algorithm"):
            args["algorithm"] = op["algorithm"]
        if op["kind"] in DEVICE_WORK:
            corr = correlation[id(op)]
            args |= {"stream": stream, "correlation": corr, "External id": corr}
            cat = "gpu_memcpy" if op["kind"] == "copy" else "kernel"
            events.append(_x(kernel_name(op), cat, pid, stream, start, end - start, args))
        else:
            events.append(_x(op["name"], "gpu_user_annotation", pid, stream, start, end - start, args))
    return events


def _meta(kind: str, pid: int, tid: int, **args) -> dict:
    return {"ph": "M", "name": kind, "pid": pid, "tid": tid, "ts": 0, "args": args}


def _metadata(rank: int, streams: Iterable[int]) -> list[dict]:
    """Process and thread names: the host first, then the GPU with one line per stream."""
    gpu, host = gpu_pid(rank), host_pid(rank)
    events = [_meta("process_name", host, 0, name=f"rank {rank} host"),
              _meta("process_sort_index", host, 0, sort_index=2 * rank),
              _meta("thread_name", host, host, name="thread (main)"),
              _meta("process_name", gpu, 0, name=f"GPU {rank}"),
              _meta("process_sort_index", gpu, 0, sort_index=2 * rank + 1)]
    for s in sorted(set(streams)):
        events += [_meta("thread_name", gpu, s, name=f"stream {s}"),
                   _meta("thread_sort_index", gpu, s, sort_index=s)]
    return events


# ------------------------------------------------------------------------------------------ files
def _rank_trace(result, rank: int, place: Place, flows: list[dict]) -> dict:
    """Rank ``rank``'s trace in Kineto's layout (see the module docstring), times not yet shifted."""
    ops = [op for op in result.ops if op["rank"] == rank]
    kernels = [op for op in ops if is_device_op(op) and op["kind"] in DEVICE_WORK]
    host, correlation = _host_events(rank, ops, kernels, place, us(result.window[1]))
    device = _device_events(rank, ops, place, correlation)
    own_flows = [f for f in flows if f["pid"] == gpu_pid(rank)]
    scenario = result.scenario
    return {
        "schemaVersion": 1,
        "distributedInfo": {"backend": scenario.cluster.backend, "rank": rank,
                            "world_size": result.world_size},
        "deviceProperties": [{"id": rank, "name": scenario.cluster.gpu,
                              "totalGlobalMem": result.metrics.get("memory", {}).get("capacity_bytes", 0)}],
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": 0,
        "traceName": f"rank-{rank}.pt.trace.json",
        "otherData": {"generator": "zero-sim", "model": scenario.workload.model,
                      "strategy": scenario.training.strategy,
                      "simulated_ranks": list(result.simulated_ranks)},
        "traceEvents": _metadata(rank, {e["tid"] for e in device}) + host + device + own_flows,
    }


def rank_traces(result) -> dict[int, dict]:
    """Every simulated rank's trace as a dict, keyed by rank, on one time axis."""
    place = kineto_place(result.ops)
    flows = collective_flows(result.ops, place)
    traces = {rank: _rank_trace(result, rank, place, flows) for rank in result.simulated_ranks}
    # Drawn launches may fall before time 0; one whole-microsecond shift for all ranks keeps every
    # duration and the ranks' alignment as they were.
    shift = max(0, -min((e["ts"] for t in traces.values() for e in t["traceEvents"]), default=0))
    for trace in traces.values():
        trace["otherData"]["time_shift_us"] = shift
        for event in trace["traceEvents"]:
            if event["ph"] != "M":
                event["ts"] += shift
    return traces


def write_rank_traces(result, directory) -> list[Path]:
    """Write ``rank-<r>.pt.trace.json`` for each simulated rank of ``result`` into ``directory``
    (created if missing), each whole or not at all; returns the paths.  HTA reads every ``.json``
    in a directory, so give one that holds nothing else."""
    directory = Path(directory)
    paths = []
    for rank, trace in rank_traces(result).items():
        path = directory / f"rank-{rank}.pt.trace.json"
        write_json_atomic(path, trace)
        paths.append(path)
    return paths
