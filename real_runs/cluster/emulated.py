"""The emulated cluster itself: built on entry, ``torchrun`` on every node, torn down on exit.

**What it does not model.**  The kernel's work for TCP, veth and the bridge runs on the
machine's own cores, the same ones the ranks compute on: at high rates, or with many ranks,
the CPU and not the shaped link is the limit, and compute and communication slow each other
down more than on separate machines.  So a shaped rate costs what the wire would only while
it stays well below what the ranks reach unshaped (``real_runs.microbench collectives``
measures both).  There is no RDMA, no NVLink, no NIC offload, no packet loss, no
oversubscribed switch (apart from ``shared-bus``), and the ranks of a ``two-nodes`` node
share memory bandwidth with every other rank.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

from zero_sim.vocabulary.files import write_json_atomic

from .. import options
from ..launch import rank_env, run_outputs, supervise, torchrun_log_dir, without_nproc
from ..processes import kill_group, start
from .namespaces import ClusterUnavailable, Node, build, cleanup_stale, delete_namespace, unavailable_reason
from .shapes import ClusterShape, check_shape, node_count
from .signals import signals_held, track_live, untrack_live

_STORE_PORT = 29500  # the namespaces are new, so nothing else listens there


class EmulatedCluster:
    """``nproc`` ranks on this machine, wired as ``shape`` says; a context manager.

    ``on_line`` gets the cluster's own lines (what stale cleanup removed); stderr when None."""

    def __init__(self, nproc: int, shape: ClusterShape, on_line: Callable[[str], None] | None = None):
        check_shape(nproc, shape)
        self.nproc, self.shape = nproc, shape
        self.say = on_line or (lambda line: print(line, file=sys.stderr, flush=True))
        self.n_nodes = node_count(nproc, shape)
        self.ranks_per_node = nproc // self.n_nodes
        self.nodes: list[Node] = []
        self.namespaces: list[str] = []  # everything built so far, bridge first
        self._runs = 0

    def describe(self) -> str:
        rate = f"{self.shape.bandwidth_gbps:g} Gbit/s"
        delay = f", +{self.shape.latency_ms:g} ms one way" if self.shape.latency_ms else ", no added latency"
        link = {"uniform": f"each rank's NIC {rate} full duplex through a non-blocking bridge",
                "two-nodes": f"ranks within a node on unshaped loopback, the link between the nodes {rate} "
                             f"full duplex",
                "shared-bus": f"all ranks sharing one {rate} queue"}[self.shape.kind]
        return (f"{self.shape.kind}: {self.nproc} ranks in {self.n_nodes} namespace"
                f"{'s' if self.n_nodes > 1 else ''} of {self.ranks_per_node} rank"
                f"{'s' if self.ranks_per_node > 1 else ''}, {link}{delay}")

    def __repr__(self) -> str:
        return f"EmulatedCluster({self.describe()})"

    # -- building and tearing down ------------------------------------------------------

    def __enter__(self) -> EmulatedCluster:
        if self.namespaces:
            raise RuntimeError("This EmulatedCluster is already built; use it in one with-block at a time.")
        why = unavailable_reason(latency=self.shape.latency_ms > 0)
        if why:
            raise ClusterUnavailable(why)
        removed = cleanup_stale()
        if removed:
            self.say(f"cluster: {removed.sentence()}")
        track_live(self)
        try:
            self.nodes = build(self.shape, self.n_nodes, self.namespaces)
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.teardown()

    def teardown(self) -> None:
        """Kill every process left in the cluster's namespaces and delete them (what ``__exit__`` does)."""
        try:
            with signals_held():
                for ns in reversed(self.namespaces):
                    delete_namespace(ns)
                self.namespaces = []
                self.nodes = []
        finally:
            # After a held signal is handed on: until then it must still reach Stopped.
            untrack_live(self)

    # -- running ----------------------------------------------------------------------

    def run_module(self, module: str, argv: list[str], on_line: Callable[[str], None] | None = None,
                   timeout_s: float = 600.0) -> None:
        """Run ``python -m <module> <argv>`` on the cluster's ranks: one torchrun per node.

        Every line goes to ``on_line``.  If any node's torchrun fails, or ``timeout_s``
        passes, every node is stopped and :class:`~real_runs.launch.RunFailed` is raised
        with one sentence naming the failing rank."""
        if not self.nodes:
            raise RuntimeError("The cluster is not built; run modules inside "
                               "`with EmulatedCluster(...) as cluster:`.")
        # A fresh port per run: the previous run's store socket may linger in TIME_WAIT.
        port = _STORE_PORT + self._runs
        self._runs += 1
        procs = []
        with torchrun_log_dir() as logs:
            try:
                for i, node in enumerate(self.nodes):
                    cmd = ["ip", "netns", "exec", node.ns, sys.executable, "-m", "torch.distributed.run",
                           f"--nnodes={self.n_nodes}", f"--node-rank={i}",
                           f"--nproc-per-node={self.ranks_per_node}",
                           f"--master-addr={self.nodes[0].addr}", f"--master-port={port}",
                           "--monitor-interval=0.5", f"--log-dir={logs}", "-m", module, *without_nproc(argv)]
                    procs.append(start(cmd, rank_env(GLOO_SOCKET_IFNAME=node.ifname)))
            except BaseException:
                for proc in procs:
                    kill_group(proc)
                raise
            supervise(procs, on_line=on_line, timeout_s=timeout_s)

    def cluster_record(self) -> dict:
        return {"kind": self.shape.kind, "bandwidth_gbps": self.shape.bandwidth_gbps,
                "latency_ms": self.shape.latency_ms, "nproc": self.nproc}


def stamp_run_json(out: str | os.PathLike, cluster: EmulatedCluster) -> dict:
    """Add the cluster's shape to a run's ``run.json`` (atomically), so a replay of the run
    predicts it on the links it ran on; returns the run."""
    path = Path(out) / "run.json"
    with open(path) as f:
        run = json.load(f)
    run["cluster"] = cluster.cluster_record()
    write_json_atomic(path, run)
    return run


def launch_in_cluster(strategy: str, nproc: int, out: str | os.PathLike, shape: ClusterShape,
                      on_line: Callable[[str], None] | None = None, timeout_s: float = 600.0,
                      **flags) -> dict:
    """Like :func:`real_runs.launch.launch`, inside an :class:`EmulatedCluster` of ``shape``.

    Returns ``run.json`` as a dict, with a ``cluster`` block added to it (and to the file).
    Bad input raises ValueError before anything is built."""
    cluster = EmulatedCluster(nproc, shape, on_line=on_line)
    argv = options.train_argv(strategy, nproc, out, flags)
    with run_outputs(out):  # cleared before, marked failed if the run or the cluster fails
        with cluster:
            cluster.run_module("real_runs.train", argv, on_line=on_line, timeout_s=timeout_s)
        return stamp_run_json(out, cluster)
