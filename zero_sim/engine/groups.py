"""Process groups over a topology's ranks: ``world`` (every rank), ``intra`` (each node's
ranks: hybrid FSDP shards within a node), ``inter`` (the ranks with the same local index
on every node: hybrid FSDP's replicas, which all-reduce the node-sharded gradients) and
``intra:<k>`` (blocks of ``k`` consecutive ranks, ``k`` dividing the node's ranks: ZeRO++'s
secondary partition groups of ``zero_hpz_partition_size`` ranks, as DeepSpeed's
``_create_zero_param_parallel_group`` builds them)."""

from __future__ import annotations

from functools import lru_cache

from zero_sim.system.topology import Topology


def subgroup_size(kind: str) -> int | None:
    """``k`` of an ``intra:<k>`` group, None for the other kinds (and for a malformed one)."""
    size = kind[len("intra:"):] if kind.startswith("intra:") else ""
    return int(size) if size.isdigit() else None


def process_groups(topo: Topology, kind: str) -> tuple[tuple[int, ...], ...]:
    """The member lists of every group of ``kind``, in group-index order."""
    return _groups(topo.world_size, topo.ranks_per_node, kind)


# The engine asks for a group's members at every collective: the lists depend only on the world
# size, the node size and the kind, so each is built once per process.
@lru_cache(maxsize=256)
def _groups(n: int, g: int, kind: str) -> tuple[tuple[int, ...], ...]:
    if (k := subgroup_size(kind)) is not None:
        return tuple(tuple(range(start, start + k)) for start in range(0, n, k))
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
    if (k := subgroup_size(kind)) is not None:
        return rank // k
    return rank % topo.ranks_per_node
