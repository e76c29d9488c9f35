"""Chrome / Perfetto trace export of a simulation.

One ``pid`` per rank, one ``tid`` per stream (``host``, ``compute``, ``comm``...), a
complete event (``ph: X``) per op named in the shared vocabulary, and a counter track
(``ph: C``) of memory per category.  ``distributedInfo`` and ``args.stream`` are filled
in so trace-analysis tools that expect PyTorch-profiler traces can read the file; open it
at ui.perfetto.dev or chrome://tracing.

When ranks were collapsed (all ranks identical), every rank's lanes carry rank 0's ops,
up to ``max_ranks`` ranks, so the file still shows N lanes.
"""

from __future__ import annotations

from zero_sim.vocabulary import MEMORY_CATEGORIES, STREAMS
from zero_sim.vocabulary.files import write_json_atomic

_TID = {name: i for i, name in enumerate(STREAMS)}


def _tid(stream: str) -> int:
    if stream not in _TID:
        _TID[stream] = len(_TID)
    return _TID[stream]


def to_chrome_trace(result, path=None, max_ranks: int = 16) -> dict:
    ranks = list(range(min(result.world_size, max_ranks)))
    events: list[dict] = []
    for rank in ranks:
        events.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0,
                       "args": {"name": f"rank {rank}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0,
                       "args": {"sort_index": rank}})
        source = result.rank_of_lane(rank)
        streams_seen = set()
        for op in result.ops:
            if op["rank"] != source:
                continue
            streams_seen.add(op["stream"])
            events.append({
                "ph": "X", "name": op["name"], "cat": op["kind"], "pid": rank, "tid": _tid(op["stream"]),
                "ts": op["start_s"] * 1e6, "dur": max(0.0, op["end_s"] - op["start_s"]) * 1e6,
                "args": {"stream": op["stream"], "bytes": op["bytes"], "layer": op["layer"],
                         "phase": op["phase"], "step": op["step"], "algorithm": op.get("algorithm", "")},
            })
        for stream in sorted(streams_seen, key=_tid):
            events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": _tid(stream),
                           "args": {"name": stream}})
        current = dict.fromkeys(MEMORY_CATEGORIES, 0)
        for m in sorted((m for m in result.memory if m["rank"] == source), key=lambda m: m["t_s"]):
            current[m["category"]] = m["bytes"]
            events.append({"ph": "C", "name": "memory (MB)", "pid": rank, "ts": m["t_s"] * 1e6,
                           "args": {c: v / 1e6 for c, v in current.items()}})
    trace = {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "distributedInfo": {"backend": result.scenario.get("backend", "nccl"), "rank": 0,
                            "world_size": result.world_size},
        "otherData": {"generator": "zero-sim", "strategy": result.scenario.get("strategy"),
                      "model": result.scenario.get("model"), "topology": result.scenario.get("topology"),
                      "collapsed_ranks": len(result.simulated_ranks) < result.world_size},
    }
    if path is not None:
        write_json_atomic(path, trace)
    return trace
