"""What an emulated cluster looks like, checked before anything is built.

- ``uniform``: one namespace per rank (a node of one rank), each joined by a veth pair
  to a bridge that lives in a namespace of its own.  Both ends of every veth carry a
  ``tbf`` qdisc at ``bandwidth_gbps``: the node end limits what the rank uploads, the
  bridge end what it downloads, so each rank has a full-duplex NIC of that rate and
  the bridge is a non-blocking switch.
- ``two-nodes``: the first half of the ranks in one namespace, the second half in
  another, both on the bridge as above.  Ranks of one node reach each other's address
  through that namespace's ``lo``, which is not shaped: only the link between the two
  nodes is slow.
- ``shared-bus``: every rank in one namespace whose ``lo`` carries the ``tbf`` qdisc.
  Every byte any rank sends waits in that one queue, so the ranks share
  ``bandwidth_gbps`` between them (a bus), rather than each having it.

``latency_ms`` adds a ``netem`` delay under the ``tbf`` on the sending end only (the
node end of a veth, or ``lo``), so any byte between two nodes is delayed once, by
``latency_ms``.  Kernels built without netem cannot add it: building such a cluster raises
:class:`~real_runs.cluster.ClusterUnavailable`, and ``unavailable_reason(latency=True)``
says so beforehand.
"""

from __future__ import annotations

from dataclasses import dataclass

SHAPES = ("uniform", "two-nodes", "shared-bus")
MAX_NODES = 250  # every node's address lies in one /24


@dataclass(frozen=True)
class ClusterShape:
    kind: str  # one of SHAPES
    bandwidth_gbps: float  # Gbit/s of the shaped link(s)
    latency_ms: float = 0.0  # one-way added delay on shaped links (netem), 0 = none


def node_count(nproc: int, shape: ClusterShape) -> int:
    """How many namespaces (nodes) hold the ``nproc`` ranks of ``shape``."""
    return {"uniform": nproc, "two-nodes": 2, "shared-bus": 1}[shape.kind]


def check_shape(nproc, shape: ClusterShape) -> None:
    """ValueError, one sentence, unless ``nproc`` ranks can be wired as ``shape`` says."""
    if not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"nproc must be a positive whole number of ranks, not {nproc!r}.")
    if shape.kind not in SHAPES:
        raise ValueError(f"Unknown cluster shape {shape.kind!r}; choose one of {', '.join(SHAPES)}.")
    if not isinstance(shape.bandwidth_gbps, (int, float)) or not shape.bandwidth_gbps > 0:
        raise ValueError(f"bandwidth_gbps must be a positive number of Gbit/s, not {shape.bandwidth_gbps!r}.")
    if not isinstance(shape.latency_ms, (int, float)) or not shape.latency_ms >= 0:
        raise ValueError(f"latency_ms must be zero or a positive number of milliseconds, "
                         f"not {shape.latency_ms!r}.")
    if shape.kind == "two-nodes" and (nproc < 2 or nproc % 2):
        raise ValueError(f"The two-nodes shape splits the ranks in two halves, so nproc must be even "
                         f"and at least 2, not {nproc}.")
    if shape.kind == "uniform" and nproc > MAX_NODES:
        raise ValueError(f"The uniform shape gives every rank its own address in one /24, "
                         f"so nproc must be at most {MAX_NODES}, not {nproc}.")
