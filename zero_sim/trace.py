"""Chrome / Perfetto trace export of a simulation.

One ``pid`` per rank (rank + 1: Perfetto treats pid 0 as the kernel's idle process), one
``tid`` per stream (``host``, ``compute``, ``comm``...), a complete event (``ph: X``) per op
named in the shared vocabulary, a counter track (``ph: C``) of memory per category, and flow
arrows joining each collective across its ranks (:func:`zero_sim.kineto.collective_flows`).
Open it at ui.perfetto.dev or chrome://tracing.

When ranks were collapsed (all ranks identical), every rank's lanes carry rank 0's ops,
up to ``max_ranks`` ranks, so the file still shows N lanes.  For per-rank files that Holistic
Trace Analysis and TensorBoard read, see :mod:`zero_sim.kineto`.
"""

from __future__ import annotations

from zero_sim.kineto import collective_flows
from zero_sim.vocabulary import MEMORY_CATEGORIES, STREAMS
from zero_sim.vocabulary.files import check_output_path, write_json_atomic

_TID = {name: i for i, name in enumerate(STREAMS)}


def _tid(stream: str) -> int:
    if stream not in _TID:
        _TID[stream] = len(_TID)
    return _TID[stream]


def to_chrome_trace(result, path=None, max_ranks: int = 16) -> dict:
    """The trace of ``result`` as a dict; with ``path``, also written there whole or not at all.

    The path is checked before the trace is built (a directory, a link or a device there is
    refused), and a failed write leaves nothing behind: both raise
    :class:`~zero_sim.vocabulary.files.OutputPathError`, one sentence."""
    if path is not None:
        check_output_path(path)
    ranks = list(range(min(result.world_size, max_ranks)))
    events: list[dict] = []
    for rank in ranks:
        pid = rank + 1
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                       "args": {"name": f"rank {rank}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                       "args": {"sort_index": rank}})
        source = result.rank_of_lane(rank)
        streams_seen = set()
        for op in result.ops:
            if op["rank"] != source:
                continue
            streams_seen.add(op["stream"])
            events.append({
                "ph": "X", "name": op["name"], "cat": op["kind"], "pid": pid, "tid": _tid(op["stream"]),
                "ts": op["start_s"] * 1e6, "dur": max(0.0, op["end_s"] - op["start_s"]) * 1e6,
                "args": {"stream": op["stream"], "bytes": op["bytes"], "layer": op["layer"],
                         "phase": op["phase"], "step": op["step"], "algorithm": op.get("algorithm", "")},
            })
        for stream in sorted(streams_seen, key=_tid):
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": _tid(stream),
                           "args": {"name": stream}})
        current = dict.fromkeys(MEMORY_CATEGORIES, 0)
        for m in sorted((m for m in result.memory if m["rank"] == source), key=lambda m: m["t_s"]):
            current[m["category"]] = m["bytes"]
            events.append({"ph": "C", "name": "memory (MB)", "pid": pid, "ts": m["t_s"] * 1e6,
                           "args": {c: v / 1e6 for c, v in current.items()}})
    # Lanes that copy a collapsed rank's ops are relabelled, so arrows join the copies too.
    drawn = [op | {"rank": lane} for lane in ranks for op in result.ops
             if op["rank"] == result.rank_of_lane(lane)]
    events += collective_flows(drawn, lambda op: (op["rank"] + 1, _tid(op["stream"]), op["start_s"] * 1e6,
                                                  op["end_s"] * 1e6))
    scenario = result.scenario
    trace = {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "distributedInfo": {"backend": scenario.cluster.backend, "rank": 0,
                            "world_size": result.world_size},
        "otherData": {"generator": "zero-sim", "strategy": scenario.training.strategy,
                      "model": scenario.workload.model, "topology": scenario.cluster.topology,
                      "collapsed_ranks": len(result.simulated_ranks) < result.world_size},
    }
    if path is not None:
        write_json_atomic(path, trace)
    return trace
