"""One training step, moment by moment: what each rank holds and does at a time t, read from a simulation.

The step-through panel (:mod:`zero_sim.ui.panels.step_through`) plays a step of several
strategies side by side; this module answers, for one strategy's :class:`~zero_sim.results.SimResult`
and a time ``t`` into its reported step, everything the picture needs, from the simulator's
own records and memory samples (nothing is drawn by hand, so it works for any model and
topology the simulator accepts):

* **held**: per model-state array (parameters, gradients, optimizer state), the share of the
  whole array the rank keeps for the whole step. "Whole" is the most any strategy of the
  comparison keeps (DDP keeps every array whole), so ZeRO-1's optimizer state reads 1/N;
* **in flight**: the communication buffers allocated now (gradient buckets on their way,
  gathered weights of ZeRO-3 and FSDP), and the activations saved so far, in bytes;
* **borrowed**: per array, how much of the *other* ranks' quarters of the layer at work the
  rank holds for a moment: under ZeRO-3 and FSDP a layer's parameters arrive during its
  all-gather (0 -> 1 as the collective runs), stay while the layer computes, and are freed
  after; a bucket's full gradients leave during its reduce-scatter (1 -> 0). The share
  follows the collective's progress, so the picture fills and empties as the step plays;
* **doing**: the op running on the rank's compute stream and on each comm stream now, with
  its collective's algorithm and the link class that limits it.

A moment after the step has ended on that strategy reads as ``done``: strategies take
different times, and the slower one keeps playing while the faster one waits.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

from zero_sim.results import SimResult
from zero_sim.system.topology import build_topology
from zero_sim.vocabulary import ACTIVATIONS, BUFFERS, COMPUTE, GRADS, OPTIMIZER_STATE, PARAMS

MODEL_STATES = (PARAMS, GRADS, OPTIMIZER_STATE)


@dataclass
class RankMoment:
    """What one rank holds and does at one moment of the step."""

    rank: int
    held: dict[str, float]  # model-state category -> share of the whole array kept (0..1)
    in_flight_bytes: int  # communication buffers now: buckets, gathered weights
    activations_bytes: int
    total_bytes: int  # every category now
    compute: str | None  # the op on the compute stream now
    comm: list[dict[str, Any]] = field(default_factory=list)  # collectives now: name, algorithm, bytes
    done: bool = False  # the step has ended on this rank
    borrowed: dict[str, float] = field(default_factory=dict)  # category -> share of the others' quarters


# A layer's weights are whole on a sharding rank while they are gathered and while the layer runs.
WORKING_PHASES = ("forward", "backward")


def _progress(op: dict, t_abs: float) -> float:
    span = op["end_s"] - op["start_s"]
    return min(1.0, max(0.0, (t_abs - op["start_s"]) / span)) if span > 0 else 1.0


def borrowed_shares(held: dict[str, float], compute: dict | None, comm: list[dict], t_abs: float
                    ) -> dict[str, float]:
    """How much of the other ranks' quarters of the layer at work a rank holds at ``t_abs``.

    Only arrays the strategy shards (held < 1) borrow: parameters while a forward/backward
    all-gather runs (its progress) or a layer computes (whole), gradients while a
    reduce-scatter runs (what is left to send) or a backward op computes (whole).
    """
    computing = compute is not None and compute.get("phase") in WORKING_PHASES
    shares = {PARAMS: 0.0, GRADS: 0.0}
    for op in comm:
        if op["name"].startswith("all_gather") and op.get("phase") in WORKING_PHASES:
            shares[PARAMS] = max(shares[PARAMS], _progress(op, t_abs))
        elif op["name"].startswith("reduce_scatter"):
            shares[GRADS] = max(shares[GRADS], 1.0 - _progress(op, t_abs))
    if computing:
        shares[PARAMS] = 1.0
        if compute.get("phase") == "backward":
            shares[GRADS] = 1.0
    return {cat: share if held.get(cat, 1.0) < 0.999 else 0.0 for cat, share in shares.items()}


class StrategyTimeline:
    """One strategy's simulated step, indexed for asking "what is happening at time t"."""

    def __init__(self, result: SimResult):
        self.result = result
        self.start, self.end = result.window
        self.step_s = self.end - self.start
        self.ranks = sorted(result.simulated_ranks)
        self.resident = {cat: 0 for cat in MODEL_STATES}
        # rank -> category -> (times, totals): the category's total after each change, in time order.
        self._memory: dict[int, dict[str, tuple[list[float], list[int]]]] = {}
        for sample in result.memory:
            by_category = self._memory.setdefault(sample["rank"], {})
            times, totals = by_category.setdefault(sample["category"], ([], []))
            times.append(sample["t_s"])
            totals.append(sample["bytes"])
        first = self._memory.get(self.ranks[0], {})
        for cat in MODEL_STATES:
            if cat in first:
                self.resident[cat] = max(first[cat][1])
        self.held = {cat: 0.0 for cat in MODEL_STATES}  # set by StepFrames, against the whole arrays
        # rank -> stream -> ops sorted by start, and their starts (for bisection)
        self._ops: dict[int, dict[str, list[dict]]] = {}
        for op in result.ops:
            if op["kind"] in ("compute", "collective"):
                self._ops.setdefault(op["rank"], {}).setdefault(op["stream"], []).append(op)
        self._starts: dict[tuple[int, str], list[float]] = {}
        for rank, streams in self._ops.items():
            for stream, ops in streams.items():
                ops.sort(key=lambda op: op["start_s"])
                self._starts[(rank, stream)] = [op["start_s"] for op in ops]
        topo = result.scenario.cluster
        self.link = link_label(topo.topology, result.world_size, topo.gpus_per_node)

    def memory_at(self, rank: int, category: str, t_abs: float) -> int:
        times, totals = self._memory.get(rank, {}).get(category, ([], []))
        i = bisect.bisect_right(times, t_abs) - 1
        return totals[i] if i >= 0 else 0

    def running(self, rank: int, stream: str, t_abs: float) -> dict | None:
        ops = self._ops.get(rank, {}).get(stream, [])
        i = bisect.bisect_right(self._starts.get((rank, stream), []), t_abs) - 1
        # Ops of one stream never overlap, so only the last one started can still be running.
        if i >= 0 and ops[i]["end_s"] > t_abs:
            return ops[i]
        return None

    def moment(self, rank: int, t_s: float) -> RankMoment:
        """Rank ``rank`` at ``t_s`` seconds into the reported step."""
        t_abs = self.start + min(t_s, self.step_s)
        totals = {cat: self.memory_at(rank, cat, t_abs) for cat in (*MODEL_STATES, ACTIVATIONS, BUFFERS)}
        compute = self.running(rank, COMPUTE, t_abs)
        comm = [op for stream in sorted(self._ops.get(rank, {})) if stream != COMPUTE
                for op in [self.running(rank, stream, t_abs)] if op is not None]
        borrowed = borrowed_shares(self.held, compute, comm, t_abs) if t_s < self.step_s else {}
        return RankMoment(
            rank=rank, held=dict(self.held), in_flight_bytes=totals[BUFFERS],
            activations_bytes=totals[ACTIVATIONS], total_bytes=sum(totals.values()),
            compute=compute["name"] if compute else None,
            comm=[{"name": op["name"], "algorithm": op["algorithm"], "bytes": op["bytes"], "link": self.link}
                  for op in comm],
            done=t_s >= self.step_s, borrowed=borrowed)

    def peak_bytes(self) -> int:
        """The most memory any rank held at once during the reported step (every category)."""
        return int(self.result.metrics["memory"]["peak_bytes"])


class StepFrames:
    """Several strategies' steps (same model and cluster), played on one clock."""

    def __init__(self, results: dict[str, SimResult]):
        if not results:
            raise ValueError("StepFrames needs at least one simulation result")
        self.timelines = {label: StrategyTimeline(r) for label, r in results.items()}
        # "Whole" is the most any strategy keeps of an array (DDP keeps each whole).
        whole = {cat: max(t.resident[cat] for t in self.timelines.values()) for cat in MODEL_STATES}
        for timeline in self.timelines.values():
            timeline.held = {cat: timeline.resident[cat] / whole[cat] if whole[cat] else 0.0
                             for cat in MODEL_STATES}
        self.longest_s = max(t.step_s for t in self.timelines.values())

    def frame(self, t_s: float, ranks: int = 4) -> dict[str, list[RankMoment]]:
        """Every strategy's first ``ranks`` ranks at ``t_s`` seconds into their steps."""
        return {label: [tl.moment(rank, t_s) for rank in tl.ranks[:ranks]]
                for label, tl in self.timelines.items()}


def link_label(topology: str, gpus: int, gpus_per_node: int | None = None) -> str:
    """The link class that limits a ring over every rank, with its speed: "pcie-bus 40 GB/s shared"."""
    try:
        topo = build_topology(topology, gpus, gpus_per_node)
    except ValueError:
        return "the network"
    kind = topo.bottleneck_kind()
    link = next(link for link in topo.links.values() if link.kind == kind)
    return f"{kind} {link.capacity / 1e9:.0f} GB/s{' shared' if link.shared else ''}"


__all__ = ["MODEL_STATES", "RankMoment", "borrowed_shares", "StepFrames", "StrategyTimeline", "link_label"]
