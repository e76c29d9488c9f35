"""Which links a collective's traffic crosses: bytes per link for every byte of the buffer.

Each of NCCL's algorithms spreads a buffer over a topology's links in its own pattern: rings
over every channel (``topology.channel_loads``), trees with a chain inside each node and a
double binary tree across nodes, NVLink SHARP through the switch.  The functions here return
those loads; :mod:`zero_sim.system.collectives` prices them (fixed costs, step latencies and
the busiest link's share) and picks the cheapest algorithm, as NCCL's tuner does.
"""

from __future__ import annotations

from functools import lru_cache

from zero_sim.system.topology import Topology, by_node, channel_rings, ring_loads


def gloo_ring_loads(topo: Topology, instances: tuple[tuple[int, ...], ...]) -> tuple[tuple[str, int], ...]:
    """One ring in rank order per instance (gloo's, and a named stage's), its loads summed over instances."""
    merged: dict[str, int] = {}
    for members in instances:
        for name, load in ring_loads(topo, members).items():
            merged[name] = merged.get(name, 0) + load
    return tuple(sorted(merged.items()))


def merge_loads(parts) -> tuple[tuple[str, float], ...]:
    """Link loads of several instances of one collective (one per process group), summed."""
    merged: dict[str, float] = {}
    for loads in parts:
        for name, load in loads.items():
            merged[name] = merged.get(name, 0) + load
    return tuple(sorted(merged.items()))


def _add_path(loads: dict, topo: Topology, src: int, dst: int, weight: float) -> None:
    for name in topo.path(src, dst):
        loads[name] = loads.get(name, 0.0) + weight


def _uniform_nodes(topo: Topology, members: tuple[int, ...]) -> list[list[int]] | None:
    nodes = by_node(topo, members)
    return nodes if nodes and all(len(g) == len(nodes[0]) for g in nodes) else None


def _inter_tree(loads: dict, topo: Topology, nodes: list[list[int]], weight: float) -> None:
    """NCCL's double binary tree across nodes, once per rail: for each member index ``j`` two
    trees over the nodes' ``j``-th members (a heap in node order, and the same in reverse
    order, so a node interior in one is a leaf in the other), each edge both ways."""
    g, r = len(nodes), len(nodes[0])
    for j in range(r):
        for order in (range(g), range(g - 1, -1, -1)):
            order = list(order)
            for i in range(1, g):
                child, parent = nodes[order[i]][j], nodes[order[(i - 1) // 2]][j]
                _add_path(loads, topo, child, parent, weight)
                _add_path(loads, topo, parent, child, weight)


@lru_cache(maxsize=1024)
def tree_loads(topo: Topology, members: tuple[int, ...]) -> dict[str, float] | None:
    """Bytes per link per buffer byte of NCCL's tree all_reduce: for every head index ``j`` and
    each of the two trees (half the data each), a chain through each node from its ``j``-th
    member, reduce one way and broadcast the other, and the double binary tree across nodes."""
    nodes = _uniform_nodes(topo, members)
    if nodes is None:
        return None
    r = len(nodes[0])
    weight = 1.0 / (2 * r)
    loads: dict[str, float] = {}
    for j in range(r):
        for ranks in nodes:
            chain = ranks[j:] + ranks[:j]
            for a, b in zip(chain, chain[1:], strict=False):
                _add_path(loads, topo, a, b, 2 * weight)  # both trees' chains
                _add_path(loads, topo, b, a, 2 * weight)
    if len(nodes) > 1:
        _inter_tree(loads, topo, nodes, weight)
    return loads


@lru_cache(maxsize=1024)
def nvls_loads(topo: Topology, members: tuple[int, ...]) -> dict[str, float] | None:
    """NVLink SHARP: every member's port carries ``(r+1)/r`` of the buffer each way (its data
    to the switch and its reduced shard back, then its shard up and everyone's down) at the
    switch's efficiency; across nodes each member sends its shard over its own rail in a
    double binary tree."""
    fab = topo.spec.fabric
    nodes = _uniform_nodes(topo, members)
    if fab.kind != "nvswitch" or fab.nvls_efficiency <= 0 or nodes is None or len(nodes[0]) < 2:
        return None
    r = len(nodes[0])
    per_port = (r + 1) / r / fab.nvls_efficiency
    loads: dict[str, float] = {}
    for rank in members:
        for direction in ("up", "down"):
            name = f"nvlink{rank}.{direction}"
            loads[name] = loads.get(name, 0.0) + per_port
    if len(nodes) > 1:
        _inter_tree(loads, topo, nodes, 1.0 / (2 * r))
    return loads


@lru_cache(maxsize=1024)
def pairwise_loads(topo: Topology, members: tuple[int, ...]) -> dict[str, float]:
    """An all-to-all run as NCCL runs it, every member sending its ``1/n`` slice straight to every
    other member at once (grouped send/recv): per byte of one slice, each ordered pair's path
    carries it once, so a GPU's port carries ``n-1`` slices each way and a NIC one slice for
    every pair whose path crosses it."""
    loads: dict[str, float] = {}
    for src in members:
        for dst in members:
            if src != dst:
                _add_path(loads, topo, src, dst, 1.0)
    return loads


@lru_cache(maxsize=4096)
def ring_hops(topo: Topology, members: tuple[int, ...]) -> tuple[float, float, int]:
    """Simple-protocol latency of the slowest step inside a node and across nodes, and the node count."""
    ring = channel_rings(topo, members)[0]
    intra = inter = 0.0
    n = len(ring)
    for i, src in enumerate(ring):
        dst = ring[(i + 1) % n]
        lat = topo.path_latency(src, dst)
        if topo.node_of(src) == topo.node_of(dst):
            intra = max(intra, lat)
        else:
            inter = max(inter, lat)
    return intra, inter, len(by_node(topo, members))
