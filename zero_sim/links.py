"""What the network model says about one cluster, in the units a reader types and nccl-tests prints.

Two questions the notebooks ask of :mod:`zero_sim.system` without simulating a step:

* which link limits a ring over every rank, and how fast it is (the value that
  ``--bandwidth-gbps`` overrides, so a bandwidth slider can start there);
* how long one isolated collective takes per message size, which is what nccl-tests
  measures (one collective over every rank, nothing else running, NCCL choosing its
  algorithm and protocol), so the two can be laid side by side.  ``size`` is nccl-tests'
  size: the whole buffer (for all_gather the gathered output, for reduce_scatter the input).
"""

from __future__ import annotations

from collections.abc import Iterable

from zero_sim.system.collectives import CollectiveModel
from zero_sim.system.topology import Topology, build_topology
from zero_sim.vocabulary.collectives import bus_factor


def bottleneck_gbps(topology: str, gpus: int, gpus_per_node: int | None = None) -> float | None:
    """Bandwidth of the link that limits a ring over every rank, in Gbit/s (None for an unknown cluster);
    on a rail-optimised network, one NIC's."""
    try:
        topo = build_topology(topology, gpus, gpus_per_node)
    except ValueError:
        return None
    kind = topo.bottleneck_kind()
    caps = [link.capacity for link in topo.links.values() if link.kind == kind]
    return min(caps) * 8 / 1e9 if caps else None


def _model(topology: str, gpus: int, gpus_per_node: int | None, bandwidth_gbps: float | None,
           backend: str, algorithm: str) -> tuple[Topology, CollectiveModel]:
    topo = build_topology(topology, gpus, gpus_per_node)
    if bandwidth_gbps is not None:
        topo = topo.with_bandwidth(bandwidth_gbps)
    return topo, CollectiveModel(topo, backend, algorithm)


def predicted_collective_s(sizes: Iterable[float], topology: str, gpus: int, kind: str = "all_reduce",
                           gpus_per_node: int | None = None, bandwidth_gbps: float | None = None,
                           backend: str = "nccl", algorithm: str = "auto") -> list[float]:
    """Seconds one lone collective over every rank takes, per size in bytes (nccl-tests' ``time``)."""
    topo, model = _model(topology, gpus, gpus_per_node, bandwidth_gbps, backend, algorithm)
    members = (tuple(range(gpus)),)
    return [model.plan(kind, float(size), members).isolated_time(topo) for size in sizes]


def predicted_collectives(sizes: Iterable[float], topology: str, gpus: int, kind: str = "all_reduce",
                          gpus_per_node: int | None = None, bandwidth_gbps: float | None = None,
                          backend: str = "nccl", algorithm: str = "auto") -> list[dict]:
    """One row per size, as nccl-tests prints it: ``size_bytes``, ``time_us``, ``algbw_gbps``,
    ``busbw_gbps``, and what the model chose (``algorithm``, ``protocol``)."""
    topo, model = _model(topology, gpus, gpus_per_node, bandwidth_gbps, backend, algorithm)
    members = (tuple(range(gpus)),)
    rows = []
    for size in sizes:
        plan = model.plan(kind, float(size), members)
        t = plan.isolated_time(topo)
        algbw = size / t / 1e9 if t > 0 else 0.0
        rows.append({"size_bytes": size, "time_us": t * 1e6, "algbw_gbps": algbw,
                     "busbw_gbps": algbw * bus_factor(kind, gpus), "algorithm": plan.algorithm,
                     "protocol": plan.protocol})
    return rows


__all__ = ["bottleneck_gbps", "predicted_collective_s", "predicted_collectives"]
