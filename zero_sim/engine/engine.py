"""The discrete-event engine's core: ranks, their host thread and FIFO streams, on simpy.

What is simulated, per rank:

* a **host thread** that walks the program in order, paying a per-op issue cost, putting
  each op on its stream, and blocking only at ``sync`` ops;
* one **compute stream** and one or more **comm streams** (``comm``, ``comm:<group>``), each
  a FIFO queue: an op starts when it reaches the head of its stream *and* the ops it waits on
  (CUDA-event semantics) have finished.  Two ops on one stream never overlap, even when the
  second one's data is ready (the 'A Thousand Ways to Write ZeRO-2' blog post).  A collective
  also waits for the compute op issued just before it when its op says so (``Op.after_compute``:
  torch's NCCL process group makes its stream wait on the stream current at issue);
* **collectives** start on every member rank at the same instant: when the last member's
  stream reaches it.  A slow rank delays everyone (the allocator flushes of the Amazon
  Science article 'Making DeepSpeed ZeRO run efficiently on more-affordable hardware' are
  injected as per-rank, per-collective stalls, :class:`~zero_sim.engine.run_types.Straggler`);
* a **fluid network** (:mod:`zero_sim.engine.network`): a collective's bytes cross links
  whose capacity is split among every transfer active on them; so do a copy stream's bytes
  to and from host memory (offloading) over the GPU's host link.

What a device or a collective library adds plugs in beside this loop
(:mod:`zero_sim.engine.rank_kinds`): GPU compute slowed beside NCCL kernels
(:mod:`~zero_sim.engine.gpu_device`), CPU ranks whose host thread computes
(:mod:`~zero_sim.engine.cpu_device`), cores shared by compute and communication
(:mod:`~zero_sim.engine.shared_cores`), gloo's worker threads (:mod:`~zero_sim.engine.gloo_backend`).

Symmetry: when every rank runs the same program on a symmetric topology, all ranks have
identical timelines, so by default only rank 0 is simulated and collectives rendezvous with
themselves while costing what the full group costs (link loads include every sibling group).
``explicit_ranks=True`` simulates each rank; the tests check both give the same answer.

Steps: the program runs ``steps`` times back to back (the host runs ahead into the next step
as a real training loop does).  The last step is reported: it starts when the one before has
finished all its ops and ends when all of its own have.
"""

from __future__ import annotations

import gc
import random
from collections import deque
from contextlib import contextmanager

import simpy

from zero_sim.engine.gloo_backend import GlooBackend
from zero_sim.engine.groups import group_index, process_groups
from zero_sim.engine.network import FluidNetwork
from zero_sim.engine.program import Op, Program
from zero_sim.engine.rank_kinds import Backend
from zero_sim.engine.run_types import EngineConfig, RunOutput
from zero_sim.system.collectives import CollectiveModel, CollectivePlan
from zero_sim.system.host_side import copy_loads
from zero_sim.system.topology import Topology
from zero_sim.vocabulary import HOST, MEMORY_CATEGORIES
from zero_sim.vocabulary.records import OpRecord


class _Stream:
    __slots__ = ("queue", "waiter", "slots")

    def __init__(self, slots: simpy.Resource | None = None):
        self.queue: deque = deque()
        self.waiter: simpy.Event | None = None
        self.slots = slots


class _Rendezvous:
    __slots__ = ("expected", "arrived", "done", "start", "stall", "ranks")

    def __init__(self, env, expected):
        self.expected, self.arrived = expected, 0
        self.ranks: tuple[int, ...] = ()
        self.done = env.event()
        self.start = 0.0
        self.stall = 0.0


class Engine:
    def __init__(self, program: Program, topo: Topology, collectives: CollectiveModel, config: EngineConfig):
        self.program, self.topo, self.coll, self.config = program, topo, collectives, config
        n = topo.world_size
        self.explicit = bool(config.explicit_ranks)
        self.ranks = list(range(n)) if self.explicit else [0]
        self.env = simpy.Environment()
        self.net = FluidNetwork(self.env, topo)
        self.records: list[OpRecord] = []
        self.rendezvous: dict[tuple, _Rendezvous] = {}
        self.plans: dict[int, CollectivePlan] = {}
        self.comm_busy: dict[int, int] = {r: 0 for r in self.ranks}  # collectives in flight per rank
        self.rng = {r: random.Random((config.straggler.seed if config.straggler else 0) * 1_000_003 + r)
                    for r in self.ranks}
        self.memory: dict[int, list[tuple[float, str, int]]] = {r: [] for r in self.ranks}
        self.mem_now: dict[int, dict[str, int]] = {r: dict(program.resident) for r in self.ranks}
        self.step_ends: dict[int, list[float | None]] = {r: [None] * config.steps for r in self.ranks}
        self.rank_set = set(self.ranks)
        self.device, self.backend = config.device, backend_for(collectives)
        self.device.attach(self)
        self.backend.attach(self)
        self._remaining: dict[int, list[int]] = {}  # ops of each step not yet ended, per rank
        self._group_ranks: dict[tuple[str, int], tuple[int, ...]] = {}
        self.op_seconds: dict[int, float] = {}  # the last step's op durations on the first rank
        self._plan_groups()

    # ------------------------------------------------------------------ setup
    def _plan_groups(self) -> None:
        """Plan every collective once: its cost does not depend on when it runs, only its sharing does."""
        for op in self.program.ops:
            if op.kind != "collective":
                continue
            groups = process_groups(self.topo, op.group)
            instances = groups if not self.explicit else (groups[group_index(self.topo, op.group, 0)],)
            # Explicit ranks share links through the fluid network; a collapsed rank stands for every
            # sibling group, so its plan already carries all of their link loads.
            self.plans[op.index] = self.coll.plan(op.collective, op.nbytes, instances)
        self._own_plans: dict[tuple[int, int], CollectivePlan] = {}

    def _plan_for(self, op: Op, rank: int) -> CollectivePlan:
        if not self.explicit or op.group == "world":
            return self.plans[op.index]
        key = (op.index, group_index(self.topo, op.group, rank))
        plan = self._own_plans.get(key)
        if plan is None:
            groups = process_groups(self.topo, op.group)
            plan = self.coll.plan(op.collective, op.nbytes, (groups[key[1]],))
            self._own_plans[key] = plan
        return plan

    # ------------------------------------------------------------------ run
    def run(self) -> RunOutput:
        env, prog = self.env, self.program
        steps = self.config.steps
        streams_used = prog.streams()
        # Completion of each op per rank and step: None (not yet, nobody waiting), an event (not
        # yet, someone waiting on it) or True (done).  Events are made only for ops someone waits
        # on, so an op nobody waits for costs the event queue nothing when it ends.
        self.done: dict[int, list[list]] = {}
        for r in self.ranks:
            self.done[r] = [[None] * len(prog.ops) for _ in range(steps)]
            self._remaining[r] = [len(prog.ops)] * steps
            streams = {name: _Stream(self.backend.stream_slots()) for name in streams_used if name != HOST}
            for name, stream in streams.items():
                env.process(self._stream(r, name, stream))
            env.process(self._host(r, streams))
            for cat in MEMORY_CATEGORIES:
                self.memory[r].append((0.0, cat, self.mem_now[r].get(cat, 0)))
        with cyclic_gc_paused():
            env.run()
        for r in self.ranks:
            if None in self.step_ends[r]:
                stuck = [op.name for op in prog.ops if self.done[r][steps - 1][op.index] is not True][:5]
                raise RuntimeError(f"deadlock on rank {r}: ops never ran: {stuck}")
        # simpy numbers every scheduled event; reading the counter tells how much work the run was.
        events = next(env._eid) if hasattr(env, "_eid") else 0
        return RunOutput(self.records, self.memory, dict(prog.resident), self.step_ends, self.ranks,
                         events, self.plans, self.op_seconds)

    def _completion(self, rank: int, step: int, index: int) -> simpy.Event | None:
        """An event that fires when op ``index`` of ``step`` ends on ``rank``; None if it has ended."""
        done = self.done[rank][step]
        ev = done[index]
        if ev is True:
            return None
        if ev is None:
            ev = done[index] = self.env.event()
        return ev

    def _host(self, rank: int, streams: dict[str, _Stream]):
        """The host thread: issue each op after its issue cost, blocking only where it must wait.

        The host's clock ``t`` runs ahead of simulated time while it only issues: an op handed to
        a stream carries the time it was issued, and the stream does not start it before then.
        The host catches up with simulated time only where it blocks (a sync, host work, or on a
        CPU each compute op), so issuing a hundred ops costs no events of their own."""
        env, cfg = self.env, self.config
        default_issue = cfg.host_overhead_s
        last_compute: tuple[int, int] | None = None  # (step, op index) of the last compute issued
        t = env.now
        for step in range(cfg.steps):
            for op in self.program.ops:
                issue = default_issue if op.host_s is None else op.host_s
                if issue > 0:
                    start, t = t, t + issue
                    if op.host_s and op.kind == "compute":
                        # A modelled launch cost (eager Python issuing the layer's kernels) is drawn
                        # on the host lane, so a host falling behind its GPU shows on the timeline.
                        self.records.append(OpRecord(rank, HOST, f"launch {op.name}", start, t, 0.0,
                                                     op.layer, op.phase, step, "host"))
                if op.kind == "sync" or op.kind == "host":
                    if t > env.now:
                        yield env.timeout(t - env.now)
                    start = env.now
                    if op.kind == "sync":
                        yield from self._waits(rank, step, op)
                    else:
                        yield env.timeout(op.seconds)
                    self._finish(rank, step, op, start, env.now)
                    t = env.now
                    continue
                # A collective issued with the compute stream current first waits for the compute
                # work issued before it (torch's NCCL process group makes its stream wait on the
                # current stream); one issued from a side stream does not (Op.after_compute).
                waits = op.kind == "collective" and (op.after_compute or self.backend.always_after_compute)
                stream = streams[op.stream]
                stream.queue.append((step, op, last_compute if waits else None, t))
                if stream.waiter is not None:
                    waiter, stream.waiter = stream.waiter, None
                    waiter.succeed()
                if op.kind == "compute":
                    last_compute = (step, op.index)
                    if self.device.host_runs_compute:
                        # On a CPU the host thread *is* the compute stream: it cannot run ahead.
                        ev = self._completion(rank, step, op.index)
                        if ev is not None:
                            yield ev
                        t = max(t, env.now)

    def _waits(self, rank: int, step: int, op: Op):
        done = self.done[rank][step]
        for d in op.deps:
            if done[d] is not True:
                yield self._completion(rank, step, d)

    def _stream(self, rank: int, name: str, stream: _Stream):
        env = self.env
        while True:
            if not stream.queue:
                stream.waiter = env.event()
                yield stream.waiter
            step, op, implicit, issued = stream.queue.popleft()
            if issued > env.now:
                yield env.timeout(issued - env.now)
            if implicit is not None:
                ev = self._completion(rank, *implicit)
                if ev is not None:
                    yield ev
            if op.deps:
                yield from self._waits(rank, step, op)
            if op.kind == "collective":
                yield from self.backend.admit(rank, step, op, stream.slots)
            elif op.kind == "copy":
                start = env.now
                if op.alloc:
                    self._apply(rank, op.alloc, +1)
                # Over the GPU's host link, shared with the GPUs behind the same PCIe switch.
                yield self.net.transfer(copy_loads(self.topo, rank, op.stream, not self.explicit), op.nbytes,
                                        ranks=(rank,))
                self._finish(rank, step, op, start, env.now)
            else:
                start = env.now
                if op.alloc:
                    self._apply(rank, op.alloc, +1)
                yield from self.device.compute(rank, op)
                self._finish(rank, step, op, start, env.now)

    def _stall(self, rank: int, n_members: int) -> float:
        spec = self.config.straggler
        if spec is None or spec.probability <= 0:
            return 0.0
        rng = self.rng[rank]
        # A collapsed rank stands for all n members: the collective waits for the slowest one.
        draws = 1 if self.explicit else n_members
        p_any = 1.0 - (1.0 - spec.probability) ** draws
        return spec.seconds if rng.random() < p_any else 0.0

    def collective(self, rank: int, step: int, op: Op):
        """Run collective ``op`` on ``rank``: stall if a straggler, wait for every member, then its plan."""
        env = self.env
        plan = self._plan_for(op, rank)
        stall = self._stall(rank, plan.n)
        if stall:
            t = env.now
            yield env.timeout(stall)
            self.records.append(OpRecord(rank, op.stream, "wait stall", t, env.now, 0.0, op.layer,
                                         op.phase, step, "stall"))
        gi = group_index(self.topo, op.group, rank)
        key = (step, op.index, gi)
        rv = self.rendezvous.get(key)
        if rv is None:
            ranks = self._members(op.group, gi)
            rv = self.rendezvous[key] = _Rendezvous(env, len(ranks) if self.explicit else 1)
            rv.ranks = ranks
        rv.arrived += 1
        if rv.arrived == rv.expected:
            del self.rendezvous[key]
            rv.start = env.now
            env.process(self._run_plan(plan, rv.done, (op.stream, op.group, gi), rv.ranks))
        if op.alloc:
            self._apply(rank, op.alloc, +1)
        self.comm_busy[rank] += 1
        self.device.collective_began(rank, key)
        yield rv.done
        if op.seconds > 0:  # the library's kernels on this stream (Op.seconds of a collective)
            yield env.timeout(op.seconds)
        self.comm_busy[rank] -= 1
        self.device.collective_ended(rank, key)
        self._finish(rank, step, op, rv.start, env.now, plan)

    def _members(self, group: str, gi: int) -> tuple[int, ...]:
        """The simulated ranks of group ``gi`` of kind ``group`` (asked at every collective)."""
        ranks = self._group_ranks.get((group, gi))
        if ranks is None:
            members = process_groups(self.topo, group)[gi]
            ranks = self._group_ranks[(group, gi)] = tuple(r for r in members if r in self.rank_set)
        return ranks

    def _run_plan(self, plan: CollectivePlan, done: simpy.Event, caller: tuple, ranks: tuple[int, ...]):
        for stage in plan.stages:
            if stage.latency_s > 0:
                yield from self.backend.stage_latency(stage, caller, ranks)
            if stage.edge_bytes > 0 and stage.loads:
                yield self.net.transfer(stage.loads, stage.edge_bytes, stage.rate_cap, caller, ranks)
        done.succeed()

    # ------------------------------------------------------------------ bookkeeping
    def _apply(self, rank: int, changes, sign: int) -> None:
        now_mem, samples, now = self.mem_now[rank], self.memory[rank], self.env.now
        for cat, nbytes in changes:
            total = now_mem[cat] = now_mem.get(cat, 0) + sign * nbytes
            samples.append((now, cat, total))

    def _finish(self, rank: int, step: int, op: Op, start: float, end: float,
                plan: CollectivePlan | None = None) -> None:
        if op.free:
            self._apply(rank, op.free, -1)
        if op.kind != "sync" or end > start:
            self.records.append(OpRecord(
                rank, op.stream, op.name, start, end, op.nbytes, op.layer, op.phase, step, op.kind,
                plan.algorithm if plan else ""))
        if step == self.config.steps - 1 and rank == self.ranks[0]:
            self.op_seconds[op.index] = end - start
        done = self.done[rank][step]
        waiter, done[op.index] = done[op.index], True
        if waiter is not None:
            waiter.succeed()
        remaining = self._remaining[rank]
        remaining[step] -= 1
        if remaining[step] == 0:
            self.step_ends[rank][step] = end


@contextmanager
def cyclic_gc_paused():
    """Pause Python's cyclic garbage collector while the events run, then restore it.

    A run allocates hundreds of thousands of records, events and tuples and frees almost none
    of them, so each full collection walks an ever larger heap and finds nothing (about 40% of
    the wall time of 1,024 explicit ranks); reference counting still frees what it can."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def backend_for(collectives: CollectiveModel) -> Backend:
    """The backend plug-in for a collective model: gloo's worker threads, or NCCL's streams."""
    if getattr(collectives, "backend", "nccl") == "gloo":
        return GlooBackend(collectives.in_flight)
    return Backend()
