"""The discrete-event engine: ranks, their host thread and FIFO streams, on simpy.

What is simulated, per rank:

* a **host thread** that walks the program in order, paying a per-op issue cost, putting
  each op on its stream, and blocking only at ``sync`` ops;
* one **compute stream** and one or more **comm streams** (``comm``, ``comm:<group>``),
  each a FIFO queue: an op starts when it reaches the head of its stream *and* the ops it
  waits on (CUDA-event semantics) have finished.  Two ops on one stream never overlap,
  even when the second one's data is ready (the 'A Thousand Ways to Write ZeRO-2' blog
  post), except where the backend runs collectives on several threads (gloo: two in
  flight, started in stream order).  Their per-call work (the latency part of a
  collective) is still paid one call at a time per process group: two gloo threads do not
  make two small calls cost one, but a small call behind a large one runs while the large
  one's bytes stream.  A call whose per-call work has to wait for another's pays the
  calibrated *queued* latency instead (the sweep times small calls queued back to back as
  well as alone: the second thread's hand-offs overlap the first's, so a queue costs less
  per call than calls made one at a time);
* **collectives** start on every member rank at the same instant: when the last member's
  stream reaches it.  A slow rank delays everyone (the allocator flushes of the Amazon
  Science article 'Making DeepSpeed ZeRO run efficiently on more-affordable hardware' are
  injected as per-rank, per-collective stalls);
* a **fluid network**: a collective's bytes cross links whose capacity is split among the
  ring edges of every transfer active on them; rates are recomputed whenever a transfer
  starts or ends.  Two process groups' collectives in flight together share the links
  they both cross;
* compute slowed by communication, ``overlap_slowdown``.  On a GPU, the part of a compute op
  that runs while a collective is in flight on its rank progresses at ``1 / (1 + overlap_slowdown)``
  of its rate: NCCL's kernels hold SMs and draw HBM bandwidth for exactly as long as they run.
  On a CPU (``host_runs_compute``), a compute op that *starts* while a collective is in flight
  runs ``1 + overlap_slowdown`` times longer, the rule the CPU calibration measures (gloo's
  threads take cores); besides, every collective takes ``collective_cpu_s`` from the first
  compute op that runs while it is in flight (on a CPU, the per-call work of its threads;
  a collective that runs while its rank computes nothing costs nothing), but an op loses at
  most its own time to them: a fair scheduler leaves the compute thread half its core, and
  the rest of that work runs once the rank stops computing;
* the other way round, while a member rank computes a collective's per-call work (its
  latency) moves at ``comm_rate_while_computing`` of its pace and its bytes at
  ``comm_bytes_rate_while_computing``: on a CPU with more ranks than cores, gloo's threads
  wait for a core at every hand-off until the compute pauses, while streaming needs only a
  share of a core that a fair scheduler grants (calibrated from a queue timed idle and
  under compute, and from the CPU the sweep's large calls used);
* a collective waits for the compute op issued just before it when the program says so
  (``Op.after_compute``, the default: torch's NCCL process group makes its stream wait on
  the stream current at issue, which for DDP's hooks is the compute stream), besides its
  explicit dependencies.  A collective issued from a side stream that never waited on
  compute (FSDP's unshard stream, DeepSpeed's allgather stream) has ``after_compute=False``
  and waits only for its dependencies and the collectives ahead of it on its comm stream.
  With gloo every collective keeps the wait: gloo has no comm stream, a call is handed to
  its worker threads when the host makes it, and on a CPU the host makes it only after the
  compute before it has run (on a GPU, gloo's CUDA path also makes its streams wait on the
  current stream: ``initializeStreamsEvents``, torch 2.13 ``c10d/ProcessGroupGlooDetail.hpp``
  lines 100-108);
* on a CPU (``host_runs_compute``) the host thread runs compute itself, so it cannot
  issue ahead of it; communication still runs asynchronously (gloo's own threads).

Symmetry: when every rank runs the same program on a symmetric topology, all ranks have
identical timelines, so by default only rank 0 is simulated and collectives rendezvous
with themselves while costing what the full group costs (link loads include every
sibling group).  ``explicit_ranks=True`` simulates each rank as its own set of processes;
the tests check both give the same answer.  Straggler stalls keep the collapse exact: the
stall a collective sees is the longest among its ``n`` members, drawn per member.

Steps: the program runs ``steps`` times back to back (the host runs ahead into the next
step as a real training loop does).  The last step is reported: it starts when the one
before has finished all its ops and ends when all of its own have.
"""

from __future__ import annotations

import random
from collections import deque

import simpy

from zero_sim.engine.groups import group_index, process_groups
from zero_sim.engine.network import FluidNetwork
from zero_sim.engine.program import Op, Program
from zero_sim.engine.run_types import EngineConfig, OpRecord, RunOutput
from zero_sim.system.collectives import CollectiveModel, CollectivePlan
from zero_sim.system.topology import Topology
from zero_sim.vocabulary import HOST, MEMORY_CATEGORIES


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
        rho = config.comm_rate_while_computing
        rho_bytes = config.comm_bytes_rate_while_computing
        rho_bytes = rho if rho_bytes is None else rho_bytes
        for name, value in (("comm_rate_while_computing", rho),
                            ("comm_bytes_rate_while_computing", rho_bytes)):
            if not 0 < value <= 1:
                raise ValueError(f"{name} must be in (0, 1], got {value}")
        if rho < 1 or rho_bytes < 1:
            self.net.throttle = lambda ranks, streams: (
                (rho_bytes if streams else rho) if any(self.computing[r] for r in ranks) else 1.0)
        self.records: list[OpRecord] = []
        self.rendezvous: dict[tuple, _Rendezvous] = {}
        self.plans: dict[int, CollectivePlan] = {}
        self.comm_busy: dict[int, int] = {r: 0 for r in self.ranks}
        # Fired when a rank's communication starts or stops, so that the compute op it slows
        # (GPU rule of ``overlap_slowdown``) can change its rate.
        self.comm_flip: dict[int, simpy.Event | None] = {r: None for r in self.ranks}
        # Per-call CPU cost of collectives (collective_cpu_s): those in flight not yet charged
        # to any compute, and what the compute op running now owes on top of its own time.
        self.uncharged: dict[int, set] = {r: set() for r in self.ranks}
        self.computing: dict[int, bool] = {r: False for r in self.ranks}
        self.owed: dict[int, float] = {r: 0.0 for r in self.ranks}
        self.rng = {r: random.Random((config.straggler.seed if config.straggler else 0) * 1_000_003 + r)
                    for r in self.ranks}
        self.memory: dict[int, list[tuple[float, str, int]]] = {r: [] for r in self.ranks}
        self.mem_now: dict[int, dict[str, int]] = {r: dict(program.resident) for r in self.ranks}
        self.step_ends: dict[int, list[float | None]] = {r: [None] * config.steps for r in self.ranks}
        self.rank_set = set(self.ranks)
        self.in_flight = collectives.in_flight
        # gloo: every collective follows the compute issued before it (see the module docstring).
        self.always_after_compute = getattr(collectives, "backend", "nccl") == "gloo"
        # One lock per process group and stream: the per-call part of a collective (see the module docstring).
        self.call_locks: dict[tuple, simpy.Resource] = {}
        self._remaining: dict[tuple[int, int], int] = {}
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
        self.done: dict[int, list[list[simpy.Event]]] = {}
        for r in self.ranks:
            self.done[r] = [[env.event() for _ in prog.ops] for _ in range(steps)]
            for s in range(steps):
                self._remaining[(r, s)] = len(prog.ops)
            streams = {name: _Stream(simpy.Resource(env, self.in_flight) if self.in_flight > 1 else None)
                       for name in streams_used if name != HOST}
            for name, stream in streams.items():
                env.process(self._stream(r, name, stream))
            env.process(self._host(r, streams))
            for cat in MEMORY_CATEGORIES:
                self.memory[r].append((0.0, cat, self.mem_now[r].get(cat, 0)))
        env.run()
        for r in self.ranks:
            if None in self.step_ends[r]:
                stuck = [op.name for op in prog.ops if not self.done[r][steps - 1][op.index].processed][:5]
                raise RuntimeError(f"deadlock on rank {r}: ops never ran: {stuck}")
        # simpy numbers every scheduled event; reading the counter tells how much work the run was.
        events = next(env._eid) if hasattr(env, "_eid") else 0
        return RunOutput(self.records, self.memory, dict(prog.resident), self.step_ends, self.ranks,
                         events, self.plans)

    def _host(self, rank: int, streams: dict[str, _Stream]):
        env, cfg = self.env, self.config
        default_issue = cfg.host_overhead_s
        last_compute: simpy.Event | None = None
        for step in range(cfg.steps):
            for op in self.program.ops:
                issue = default_issue if op.host_s is None else op.host_s
                if issue > 0:
                    yield env.timeout(issue)
                if op.kind == "sync":
                    start = env.now
                    yield from self._waits(rank, step, op)
                    self._finish(rank, step, op, start, env.now)
                elif op.kind == "host":
                    start = env.now
                    yield env.timeout(op.seconds)
                    self._finish(rank, step, op, start, env.now)
                else:
                    # A collective issued with the compute stream current first waits for the compute
                    # work issued before it (torch's NCCL process group makes its stream wait on the
                    # current stream); one issued from a side stream does not (Op.after_compute).
                    waits = op.kind == "collective" and (op.after_compute or self.always_after_compute)
                    implicit = last_compute if waits else None
                    stream = streams[op.stream]
                    stream.queue.append((step, op, implicit))
                    if stream.waiter is not None:
                        waiter, stream.waiter = stream.waiter, None
                        waiter.succeed()
                    if op.kind == "compute":
                        last_compute = self.done[rank][step][op.index]
                        if cfg.host_runs_compute:
                            # On a CPU the host thread *is* the compute stream: it cannot run ahead.
                            yield last_compute

    def _waits(self, rank: int, step: int, op: Op):
        done = self.done[rank][step]
        for d in op.deps:
            ev = done[d]
            if not ev.processed:
                yield ev

    def _stream(self, rank: int, name: str, stream: _Stream):
        env = self.env
        slowdown = self.config.overlap_slowdown
        while True:
            if not stream.queue:
                stream.waiter = env.event()
                yield stream.waiter
            step, op, implicit = stream.queue.popleft()
            if implicit is not None and not implicit.processed:
                yield implicit
            yield from self._waits(rank, step, op)
            if op.kind == "collective" and self.in_flight > 1:
                # Start in stream order, but let up to ``in_flight`` run at once (gloo's worker threads).
                slot = stream.slots.request()
                yield slot
                env.process(self._collective_in_slot(rank, step, op, stream.slots, slot))
            elif op.kind == "collective":
                yield from self._collective(rank, step, op)
            else:
                start = env.now
                seconds = op.seconds
                shared = bool(slowdown) and not self.config.host_runs_compute
                if slowdown and not shared and self.comm_busy[rank]:
                    seconds *= 1.0 + slowdown
                self._apply(rank, op.alloc, +1)
                self.computing[rank] = True
                if self.net.throttle is not None:
                    self.net.reshare()
                self.owed[rank] = len(self.uncharged[rank]) * self.config.collective_cpu_s
                self.uncharged[rank].clear()
                if seconds > 0 and shared:
                    yield from self._compute_beside_comm(rank, seconds, slowdown)
                elif seconds > 0:
                    yield env.timeout(seconds)
                # Collectives that ran alongside took their share of the core, but at most the op's
                # own time: the scheduler shares a core fairly, so communication threads that keep
                # it busy get half of it; what they need beyond that runs once the rank stops computing.
                lost = 0.0
                while self.owed[rank] > 0 and lost < seconds:
                    owed, self.owed[rank] = min(self.owed[rank], seconds - lost), 0.0
                    lost += owed
                    yield env.timeout(owed)
                self.owed[rank] = 0.0
                self.computing[rank] = False
                if self.net.throttle is not None:
                    self.net.reshare()
                self._finish(rank, step, op, start, env.now)

    def _compute_beside_comm(self, rank: int, seconds: float, slowdown: float):
        """Run ``seconds`` of compute; its rate is ``1 / (1 + slowdown)`` while a collective is in flight."""
        env, remaining = self.env, seconds
        while True:
            rate = 1.0 / (1.0 + slowdown) if self.comm_busy[rank] else 1.0
            flip = self.comm_flip[rank] = env.event()
            began = env.now
            yield env.timeout(remaining / rate) | flip
            if not flip.triggered:
                break
            remaining -= (env.now - began) * rate
            if remaining <= 0:
                break
        self.comm_flip[rank] = None

    def _comm_count(self, rank: int, change: int) -> None:
        before = self.comm_busy[rank]
        self.comm_busy[rank] = before + change
        flip = self.comm_flip[rank]
        if flip is not None and (before == 0) != (self.comm_busy[rank] == 0):
            self.comm_flip[rank] = None
            flip.succeed()

    def _collective_in_slot(self, rank: int, step: int, op: Op, slots: simpy.Resource, slot):
        yield from self._collective(rank, step, op)
        slots.release(slot)

    def _stall(self, rank: int, n_members: int) -> float:
        spec = self.config.straggler
        if spec is None or spec.probability <= 0:
            return 0.0
        rng = self.rng[rank]
        # A collapsed rank stands for all n members: the collective waits for the slowest one.
        draws = 1 if self.explicit else n_members
        p_any = 1.0 - (1.0 - spec.probability) ** draws
        return spec.seconds if rng.random() < p_any else 0.0

    def _collective(self, rank: int, step: int, op: Op):
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
            members = process_groups(self.topo, op.group)[gi]
            expected = sum(1 for r in members if r in self.rank_set) if self.explicit else 1
            rv = self.rendezvous[key] = _Rendezvous(env, expected)
            rv.ranks = tuple(r for r in members if r in self.rank_set)
        rv.arrived += 1
        if rv.arrived == rv.expected:
            del self.rendezvous[key]
            rv.start = env.now
            env.process(self._run_plan(plan, rv.done, (op.stream, op.group, gi), rv.ranks))
        self._apply(rank, op.alloc, +1)
        self._comm_count(rank, +1)
        if self.config.collective_cpu_s:
            if self.computing[rank]:
                self.owed[rank] += self.config.collective_cpu_s
            else:
                self.uncharged[rank].add(key)
        yield rv.done
        self.uncharged[rank].discard(key)
        self._comm_count(rank, -1)
        self._finish(rank, step, op, rv.start, env.now, plan)

    def _run_plan(self, plan: CollectivePlan, done: simpy.Event, caller: tuple, ranks: tuple[int, ...]):
        env = self.env
        for stage in plan.stages:
            if stage.latency_s > 0 and self.in_flight > 1:
                lock = self.call_locks.get(caller)
                if lock is None:
                    lock = self.call_locks[caller] = simpy.Resource(env, 1)
                # Behind another call's per-call work, this one pays the queued latency (module docstring).
                queued = lock.count > 0 and stage.queued_latency_s is not None
                with lock.request() as turn:
                    yield turn
                    yield self._latency(stage.queued_latency_s if queued else stage.latency_s, ranks)
            elif stage.latency_s > 0:
                yield self._latency(stage.latency_s, ranks)
            if stage.edge_bytes > 0 and stage.loads:
                yield self.net.transfer(stage.loads, stage.edge_bytes, stage.rate_cap, caller, ranks)
        done.succeed()

    def _latency(self, seconds: float, ranks: tuple[int, ...]) -> simpy.Event:
        # Throttled, a latency is work that slows while its ranks compute; otherwise a plain wait.
        if self.net.throttle is None:
            return self.env.timeout(seconds)
        return self.net.transfer((), seconds, 1.0, None, ranks)

    # ------------------------------------------------------------------ bookkeeping
    def _apply(self, rank: int, changes, sign: int) -> None:
        if not changes:
            return
        now_mem = self.mem_now[rank]
        for cat, nbytes in changes:
            now_mem[cat] = now_mem.get(cat, 0) + sign * nbytes
            self.memory[rank].append((self.env.now, cat, now_mem[cat]))

    def _finish(self, rank: int, step: int, op: Op, start: float, end: float,
                plan: CollectivePlan | None = None) -> None:
        self._apply(rank, op.free, -1)
        if op.kind != "sync" or end > start:
            self.records.append(OpRecord(
                rank, op.stream, op.name, start, end, op.nbytes, op.layer, op.phase, step, op.kind,
                plan.algorithm if plan else ""))
        self.done[rank][step][op.index].succeed()
        key = (rank, step)
        self._remaining[key] -= 1
        if self._remaining[key] == 0:
            self.step_ends[rank][step] = end
