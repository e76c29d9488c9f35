"""When one simulated rank stands for every rank: the engine's symmetry rule, decided per scenario.

The engine can simulate rank 0 alone, its collectives costing what the whole group costs (every
sibling group's link loads included), or every rank (docs/engine.md, row 12).  The two give the
same figures wherever every rank runs the same program on the same hardware at the same moments,
which holds when:

* each rank is a GPU timed by the plain GPU device: a CPU calibration's shared cores are measured
  per machine, not shown to be alike per rank;
* no straggler draws are made: they differ by rank;
* the library is NCCL (gloo's worker threads are modelled per rank);
* every node in the job is full and every PCIe switch's GPUs are all in the job, so that each rank
  shares its host link (offloading's copies) with as many others as rank 0 does.

Above eight GPUs one rank stands for all whatever these say (the cost of every rank grows with N);
at eight or fewer every rank is simulated unless these hold.  A user's ``explicit_ranks`` wins.
``tests/test_plan_search.py`` and ``tests/test_sim_properties.py`` check that the figures agree.
"""

from __future__ import annotations

# Up to this many GPUs every rank is simulated when ranks may differ.
EXPLICIT_UP_TO = 8


def ranks_alike(settings, topology, gpu_name: str, shared_cores: bool) -> bool:
    """Whether every rank's timeline is rank 0's (the conditions above)."""
    s = settings
    straggles = s.straggler_prob > 0 and s.straggler_ms > 0
    if shared_cores or gpu_name == "CPU" or s.backend != "nccl" or straggles:
        return False
    per_link = topology.host.gpus_per_link if topology.host is not None else 1
    return topology.ranks_per_node % per_link == 0 and s.gpus % topology.ranks_per_node == 0


def explicit_ranks(settings, alike: bool = False) -> bool:
    """Whether every rank is simulated: as the user asked; else at most eight GPUs whose ranks may differ."""
    if settings.explicit_ranks is not None:
        return settings.explicit_ranks
    return settings.gpus <= EXPLICIT_UP_TO and not alike


__all__ = ["EXPLICIT_UP_TO", "explicit_ranks", "ranks_alike"]
