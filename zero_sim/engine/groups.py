"""Process groups over a topology's ranks: ``world`` (every rank), ``intra`` (each node's
ranks: hybrid FSDP shards within a node) and ``inter`` (the ranks with the same local index
on every node: hybrid FSDP's replicas, which all-reduce the node-sharded gradients)."""

from __future__ import annotations

from zero_sim.system.topology import Topology


def process_groups(topo: Topology, kind: str) -> tuple[tuple[int, ...], ...]:
    n, g = topo.world_size, topo.ranks_per_node
    if kind == "world":
        return (tuple(range(n)),)
    if kind == "intra":
        return tuple(tuple(range(node * g, (node + 1) * g)) for node in range(n // g))
    if kind == "inter":
        return tuple(tuple(range(i, n, g)) for i in range(g))
    raise ValueError(f"unknown process group {kind!r}")


def group_index(topo: Topology, kind: str, rank: int) -> int:
    if kind == "world":
        return 0
    if kind == "intra":
        return rank // topo.ranks_per_node
    return rank % topo.ranks_per_node
