"""What the network model says about one cluster, in the units a reader types and nccl-tests prints.

Two questions the notebooks ask of :mod:`zero_sim.system` without simulating a step:

* which link limits a ring over every rank, and how fast it is (the value that
  ``--bandwidth-gbps`` overrides, so a bandwidth slider can start there);
* how long one isolated collective takes per message size, which is what nccl-tests
  measures (one collective, nothing else running), so the two can be laid side by side.
"""

from __future__ import annotations

from collections.abc import Iterable

from zero_sim.system.collectives import CollectiveModel
from zero_sim.system.topology import build_topology


def bottleneck_gbps(topology: str, gpus: int, gpus_per_node: int | None = None) -> float | None:
    """Bandwidth of the link that limits a ring over every rank, in Gbit/s (None for an unknown cluster)."""
    try:
        topo = build_topology(topology, gpus, gpus_per_node)
    except ValueError:
        return None
    kind = topo.bottleneck_kind()
    caps = [link.capacity for link in topo.links.values() if link.kind == kind]
    return min(caps) * 8 / 1e9 if caps else None


def predicted_collective_s(sizes: Iterable[float], topology: str, gpus: int, kind: str = "all_reduce",
                           gpus_per_node: int | None = None, bandwidth_gbps: float | None = None,
                           backend: str = "nccl") -> list[float]:
    """Seconds the network model gives one isolated collective over every rank, per size in bytes."""
    topo = build_topology(topology, gpus, gpus_per_node)
    if bandwidth_gbps is not None:
        topo = topo.with_bandwidth(bandwidth_gbps)
    model = CollectiveModel(topo, backend)
    members = (tuple(range(gpus)),)
    return [model.plan(kind, float(size), members).isolated_time(topo) for size in sizes]


__all__ = ["bottleneck_gbps", "predicted_collective_s"]
