"""A rank's program for one training step: the ops its host thread issues, in order.

This is the interface between strategies and the engine.  A strategy (``strategies/``)
turns a workload and its knobs into a :class:`Program`; the engine runs it on every rank.
Ops are issued by the host in list order and land on a stream:

* ``compute`` ops take ``seconds`` on the compute stream;
* ``collective`` ops run on a comm stream over a process group (``world``, ``intra``
  = the ranks of one node, ``inter`` = one rank per node, ``intra:<k>`` = blocks of ``k``
  ranks inside a node), moving ``nbytes``; a collective's ``seconds`` are kernels the library
  runs on the collective's own stream around it (ZeRO++'s quantization), paid once the
  transfer ends while the stream and the rank's communication stay busy;
* ``sync`` ops block the *host* until their dependencies finish (``work.wait()`` on a
  CPU backend, ``stream.synchronize()``, ``.item()``);
* ``host`` ops are work on the host thread itself (Python deciding what to fetch, an optimizer
  running on the CPU);
* ``copy`` ops move ``nbytes`` between the GPU and host memory on a copy stream (``d2h`` or
  ``h2d``, CUDA's two copy engines), over the GPU's host link (offloading).

``deps`` are CUDA-event waits: the op may not start on its stream before those ops (of
the same step) have finished.  Streams are FIFO, so
an op also waits for everything issued before it on its stream.

``after_compute`` (collectives only) says whether the collective also waits for the compute
op issued just before it.  It is True where the collective is issued with the compute
stream current: torch's NCCL process group makes its stream wait on the current stream
(DDP's all-reduce from the autograd hook, FSDP's reduce-scatter after its post-backward
stream waited on the compute stream).  It is False where the library issues it from a
stream of its own that does not wait on compute (FSDP's unshard stream, DeepSpeed's
allgather stream): then only ``deps`` and the FIFO order of its comm stream hold it back.
Which strategy does which, with the library source for each, is in each strategy's file
and in docs/engine.md.  The engine keeps the wait for gloo regardless (see its docstring).

Memory effects: ``alloc`` at the op's start and ``free`` at its end, per category, so the
engine can draw memory over time.  ``Program.resident`` is what stays allocated across
steps (model states, persistent buffers); every step must free what it allocates.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from zero_sim.engine.groups import subgroup_size
from zero_sim.vocabulary import COMM, COMPUTE, D2H, H2D, HOST, MEMORY_CATEGORIES

OP_KINDS = ("compute", "collective", "sync", "host", "copy")
GROUPS = ("world", "intra", "inter")


@dataclass(slots=True)
class Op:
    index: int
    name: str
    stream: str
    kind: str
    phase: str
    layer: int | None = None
    seconds: float = 0.0
    collective: str | None = None
    group: str = "world"
    nbytes: float = 0.0
    deps: tuple[int, ...] = ()
    alloc: tuple[tuple[str, int], ...] = ()
    free: tuple[tuple[str, int], ...] = ()
    host_s: float | None = None  # host time to issue; None: the scenario's per-op overhead
    flops: float = 0.0  # hardware FLOPs executed (recompute included)
    after_compute: bool = True  # collectives: also wait for the compute op issued just before


@dataclass
class Program:
    ops: list[Op] = field(default_factory=list)
    resident: dict[str, int] = field(default_factory=dict)
    host_resident: dict[str, int] = field(default_factory=dict)  # model states in host memory (offload)
    nvme_resident: dict[str, int] = field(default_factory=dict)  # model states on NVMe drives (ZeRO-Infinity)
    model_flops: float = 0.0  # per rank per step, forward+backward, recompute excluded
    notes: list[str] = field(default_factory=list)  # assumptions the strategy made, for reports
    micro_starts: list[int] = field(default_factory=list)  # the index of each micro-step's first op

    def streams(self) -> list[str]:
        seen: list[str] = []
        for op in self.ops:
            if op.stream not in seen:
                seen.append(op.stream)
        return seen


class ProgramBuilder:
    """Small helper that strategies use to append ops and get their indices back."""

    def __init__(self, resident: dict[str, int] | None = None):
        self.program = Program(resident={c: 0 for c in MEMORY_CATEGORIES} | (resident or {}))

    def _add(self, **kw) -> int:
        ops = self.program.ops
        op = Op(index=len(ops), **kw)
        if op.alloc or op.free:
            for cat, _ in (*op.alloc, *op.free):
                if cat not in MEMORY_CATEGORIES:
                    raise ValueError(f"unknown memory category {cat!r}")
        ops.append(op)
        return op.index

    def compute(self, name: str, phase: str, seconds: float, *, layer: int | None = None,
                deps=(), alloc=(), free=(), flops: float = 0.0, host_s=None) -> int:
        return self._add(name=name, stream=COMPUTE, kind="compute", phase=phase, layer=layer,
                         seconds=seconds, deps=tuple(deps), alloc=tuple(alloc), free=tuple(free), flops=flops,
                         host_s=host_s)

    def collective(self, kind: str, name: str, nbytes: float, phase: str, *, group: str = "world",
                   stream: str = COMM, layer: int | None = None, deps=(), alloc=(), free=(),
                   host_s=None, after_compute: bool = True, seconds: float = 0.0) -> int:
        """A collective; ``after_compute=False`` when it is issued from a stream that does not wait
        for the compute op issued before it (see the module docstring); ``seconds`` of the library's
        kernels on its stream."""
        if group not in GROUPS and subgroup_size(group) is None:
            raise ValueError(f"unknown process group {group!r}")
        return self._add(name=name, stream=stream, kind="collective", phase=phase, layer=layer,
                         collective=kind, group=group, nbytes=float(nbytes), deps=tuple(deps),
                         alloc=tuple(alloc), free=tuple(free), host_s=host_s, after_compute=after_compute,
                         seconds=seconds)

    def copy(self, name: str, phase: str, nbytes: float, direction: str, *, layer: int | None = None,
             deps=(), alloc=(), free=(), host_s=None) -> int:
        """A copy of ``nbytes`` over the GPU's host link, ``direction`` d2h or h2d (its stream)."""
        if direction not in (D2H, H2D):
            raise ValueError(f"unknown copy direction {direction!r}")
        return self._add(name=name, stream=direction, kind="copy", phase=phase, layer=layer,
                         nbytes=float(nbytes), deps=tuple(deps), alloc=tuple(alloc), free=tuple(free),
                         host_s=host_s)

    def sync(self, name: str, phase: str, deps, *, host_s=None, free=()) -> int:
        return self._add(name=name, stream=HOST, kind="sync", phase=phase, deps=tuple(deps),
                         free=tuple(free), host_s=host_s)

    def host(self, name: str, phase: str, seconds: float, *, layer: int | None = None, host_s=0.0) -> int:
        return self._add(name=name, stream=HOST, kind="host", phase=phase, layer=layer, seconds=seconds,
                         host_s=host_s)

    def last(self) -> int:
        return len(self.program.ops) - 1

    def build(self) -> Program:
        return self.program
