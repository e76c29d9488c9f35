"""An emulated cluster on one Linux machine: ranks in network namespaces, links shaped by ``tc``.

Real runs on one machine talk over loopback at memory speed, so communication looks
free.  Here every byte between ranks crosses a link that really runs at a chosen rate,
so a collective costs what the chosen topology would make it cost::

    from real_runs.cluster import ClusterShape, EmulatedCluster, launch_in_cluster

    run = launch_in_cluster("fsdp", 4, "out/fsdp-1g", ClusterShape("uniform", 1.0), steps=5)
    run["median_step_s"], run["cluster"]

    with EmulatedCluster(2, ClusterShape("two-nodes", 0.5)) as cluster:
        cluster.run_module("real_runs.microbench", ["collectives", "--max-bytes", "16M"], on_line=print)

From a shell (the arguments after ``--`` go to ``real_runs.train``)::

    python -m real_runs.cluster --shape uniform --bandwidth-gbps 1 --nproc 2 -- --strategy ddp --steps 5

Building a cluster needs root (network namespaces, ``tc``); :func:`unavailable_reason`
says whether this machine can, in one sentence when it cannot.

- :mod:`.shapes`: the shapes (``uniform``, ``two-nodes``, ``shared-bus``) and their checks;
- :mod:`.namespaces`: the ``ip netns`` / veth / bridge / ``tc`` commands, the names that carry
  their owner's pid, what tbf does to bursty traffic, stale cleanup and :func:`unavailable_reason`;
- :mod:`.signals`: teardown at exit, on Ctrl-C, SIGTERM and SIGHUP, with signals held back during it;
- :mod:`.emulated`: :class:`EmulatedCluster`, :func:`launch_in_cluster`, :func:`stamp_run_json`,
  and what the emulation does not model;
- :mod:`.cli`: the command line (``__main__`` runs it).
"""

from .cli import main, make_parser
from .emulated import EmulatedCluster, launch_in_cluster, stamp_run_json
from .namespaces import (
    ClusterUnavailable,
    Owner,
    Removed,
    cleanup_stale,
    link_name,
    namespace_name,
    unavailable_reason,
)
from .shapes import SHAPES, ClusterShape
from .signals import Stopped, signals_held, stopping_on_signals

__all__ = [
    "SHAPES", "ClusterShape", "ClusterUnavailable", "EmulatedCluster", "Owner", "Removed", "Stopped",
    "cleanup_stale", "launch_in_cluster", "link_name", "main", "make_parser", "namespace_name",
    "signals_held", "stamp_run_json", "stopping_on_signals", "unavailable_reason",
]
