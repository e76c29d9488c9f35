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

**Shapes.**  Each needs root (network namespaces, ``tc``); :func:`unavailable_reason`
says whether this machine can build them.

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
``latency_ms``.  Kernels built without netem (this project's 2-core box is one) raise
:class:`ClusterUnavailable` for ``latency_ms > 0``; ``unavailable_reason(latency=True)``
says so beforehand.

**What tbf does to bursty traffic.**  Up to ``burst`` bytes (4 ms of the rate, at least
128 KiB) leave at memory speed, then bytes leave at the rate; whatever arrives faster
waits in a queue of up to ``limit`` bytes (32 MiB beyond the burst).  That queue is
deeper than TCP's send windows, so a busy link delays packets instead of dropping
them: round-trip times grow under load, TCP never sees a loss, and a message of S
bytes takes about ``(S - burst) / rate``.  For the megabyte messages of training the
burst is a rounding error; for messages under ~128 KiB the shaping barely shows and
per-message costs (system calls, the ranks' own CPU time) dominate, as on a fast real
network.  128 KiB is the floor because tbf drops any packet larger than its burst,
and the kernel hands it packets of up to 64 KiB (GSO on veth, 64 KiB frames on ``lo``).

**What it does not model.**  The kernel's work for TCP, veth and the bridge runs on the
machine's own cores, the same ones the ranks compute on (two, here): at high rates, or
with many ranks, the CPU and not the shaped link is the limit, and compute and
communication slow each other down more than on separate machines.  On the 2-core box a
16 MiB all-reduce between two ranks takes 25-27 ms unshaped (about 5 Gbit/s per rank)
and 33 ms at 5 Gbit/s, against 140 ms at 1 Gbit/s (wire: 134 ms): shapes up to about
2 Gbit/s cost what the wire would, faster ones mostly cost the CPU.  There is no
RDMA, no NVLink, no NIC offload, no packet loss, no oversubscribed switch (apart from
``shared-bus``), and the ranks of a ``two-nodes`` node share memory bandwidth with
every other rank.

**Cleanup.**  ``__exit__`` kills every process left in the namespaces and deletes them,
also after an exception or a Ctrl-C in the with-block (a Ctrl-C during the teardown is
held back until it is done); an ``atexit`` hook and, while a cluster is up, a SIGTERM
handler do the same when the interpreter ends.  Namespaces left by a process that was
killed outright (their names carry its pid) are deleted by the next ``__enter__``.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .launch import RunFailed, kill_group, rank_env, start, supervise, train_argv, without_nproc

SHAPES = ("uniform", "two-nodes", "shared-bus")

_PREFIX = "zsim"  # namespaces: zsim-<pid>-<n>-br, zsim-<pid>-<n>-n<i>
_SUBNET = "10.213.0"  # private, and inside the cluster's own namespaces: it cannot clash with the host
_MAX_NODES = 250  # one /24
_STORE_PORT = 29500  # the namespaces are new, so nothing else listens there
_MIN_BURST = 128 << 10
_QUEUE = 32 << 20
_NETEM_PACKETS = 100_000


@dataclass(frozen=True)
class ClusterShape:
    kind: str  # one of SHAPES
    bandwidth_gbps: float  # Gbit/s of the shaped link(s)
    latency_ms: float = 0.0  # one-way added delay on shaped links (netem), 0 = none


class ClusterUnavailable(RuntimeError):
    """This machine cannot build the cluster; one sentence in ``str()``."""


@dataclass(frozen=True)
class _Node:
    ns: str  # network namespace
    ifname: str  # the interface gloo binds (GLOO_SOCKET_IFNAME)
    addr: str


def _one_line(text: str) -> str:
    lines = [x.strip() for x in text.strip().splitlines() if x.strip()]
    return lines[0].rstrip(".") if lines else "no message"


def _sh(*cmd: str) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise ClusterUnavailable(f"Building the emulated cluster failed at `{' '.join(cmd)}`: "
                                 f"{_one_line(done.stderr or done.stdout)}.")
    return done.stdout


def _namespaces() -> list[str]:
    done = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    return [line.split()[0] for line in done.stdout.splitlines() if line.strip()]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _delete_namespace(ns: str) -> None:
    """Kill whatever still runs inside ``ns`` and delete it (a namespace outlives its name while a
    process is in it, and a process in it would outlive the run)."""
    pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    deadline = time.monotonic() + 5.0
    for pid in pids:
        while _pid_alive(int(pid)) and not _is_zombie(int(pid)) and time.monotonic() < deadline:
            time.sleep(0.02)


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def cleanup_stale() -> list[str]:
    """Delete the namespaces of processes that died without tearing their cluster down."""
    gone = []
    for ns in _namespaces():
        m = re.match(rf"{_PREFIX}-(\d+)-", ns)
        if m and not _pid_alive(int(m[1])):
            _delete_namespace(ns)
            gone.append(ns)
    return gone


def unavailable_reason(latency: bool = False) -> str | None:
    """None when this machine can build emulated clusters; otherwise one sentence why not.

    Checked for real: a throwaway namespace gets a veth pair, a bridge and a tbf qdisc
    (and a netem qdisc with ``latency=True``), and is deleted again."""
    if not sys.platform.startswith("linux"):
        return f"Emulated clusters need Linux network namespaces; this is {sys.platform}."
    if os.geteuid() != 0:
        return f"Emulated clusters need root to create network namespaces; this process runs as uid {os.geteuid()}."
    missing = [c for c in ("ip", "tc") if shutil.which(c) is None]
    if missing:
        return f"Emulated clusters need iproute2's `ip` and `tc`, and {' and '.join(missing)} is not on PATH."
    ns = f"{_PREFIX}-{os.getpid()}-probe{next(_serial)}"
    checks = [
        (["ip", "netns", "add", ns], "This machine does not permit creating network namespaces"),
        (["ip", "-n", ns, "link", "add", "p0", "type", "veth", "peer", "name", "p1"], "This kernel has no veth links"),
        (["ip", "-n", ns, "link", "add", "b0", "type", "bridge"], "This kernel has no bridges"),
        (["tc", "-n", ns, "qdisc", "add", "dev", "p0", "root", "handle", "1:", "tbf", "rate", "1gbit",
          "burst", "128k", "limit", "1m"], "This kernel has no tbf qdisc (CONFIG_NET_SCH_TBF)"),
    ]
    if latency:
        checks.append((["tc", "-n", ns, "qdisc", "add", "dev", "p0", "parent", "1:1", "handle", "10:", "netem",
                        "delay", "1ms"], _NO_NETEM))
    try:
        for cmd, why in checks:
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                return f"{why} ({cmd[0]} said: {_one_line(done.stderr)})."
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    return None


_NO_NETEM = "This kernel has no netem qdisc (CONFIG_NET_SCH_NETEM), so latency_ms > 0 cannot be emulated"
_serial = itertools.count()
_live: set[EmulatedCluster] = set()
_live_lock = threading.Lock()
_sigterm_before = None


def _teardown_all() -> None:
    for cluster in list(_live):
        cluster._teardown()


atexit.register(_teardown_all)


def _on_sigterm(signum, frame):
    # SystemExit unwinds the with-blocks (their __exit__ tears down); atexit catches the rest.
    raise SystemExit(128 + signum)


def _watch_sigterm(on: bool) -> None:
    """While a cluster is up, SIGTERM ends the interpreter through Python (so teardown runs)
    instead of killing it outright; only where nobody else has claimed SIGTERM."""
    global _sigterm_before
    if threading.current_thread() is not threading.main_thread():
        return
    if on and _sigterm_before is None and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        _sigterm_before = signal.signal(signal.SIGTERM, _on_sigterm)
    elif not on and _sigterm_before is not None and signal.getsignal(signal.SIGTERM) is _on_sigterm:
        signal.signal(signal.SIGTERM, _sigterm_before)
        _sigterm_before = None


@contextlib.contextmanager
def _sigint_held():
    """A Ctrl-C during teardown would leave half a cluster behind: hold it until teardown is done."""
    old = signal.getsignal(signal.SIGINT) if threading.current_thread() is threading.main_thread() else None
    if old is None:
        yield
        return
    caught = []
    signal.signal(signal.SIGINT, lambda *_: caught.append(True))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
        if caught:
            raise KeyboardInterrupt


def _check(nproc, shape: ClusterShape) -> None:
    if not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"nproc must be a positive whole number of ranks, not {nproc!r}.")
    if shape.kind not in SHAPES:
        raise ValueError(f"Unknown cluster shape {shape.kind!r}; choose one of {', '.join(SHAPES)}.")
    if not isinstance(shape.bandwidth_gbps, (int, float)) or not shape.bandwidth_gbps > 0:
        raise ValueError(f"bandwidth_gbps must be a positive number of Gbit/s, not {shape.bandwidth_gbps!r}.")
    if not isinstance(shape.latency_ms, (int, float)) or not shape.latency_ms >= 0:
        raise ValueError(f"latency_ms must be zero or a positive number of milliseconds, not {shape.latency_ms!r}.")
    if shape.kind == "two-nodes" and (nproc < 2 or nproc % 2):
        raise ValueError(f"The two-nodes shape splits the ranks in two halves, so nproc must be even "
                         f"and at least 2, not {nproc}.")
    if shape.kind == "uniform" and nproc > _MAX_NODES:
        raise ValueError(f"The uniform shape gives every rank its own address in one /24, "
                         f"so nproc must be at most {_MAX_NODES}, not {nproc}.")


class EmulatedCluster:
    """``nproc`` ranks on this machine, wired as ``shape`` says; a context manager."""

    def __init__(self, nproc: int, shape: ClusterShape):
        _check(nproc, shape)
        self.nproc, self.shape = nproc, shape
        self.n_nodes = {"uniform": nproc, "two-nodes": 2, "shared-bus": 1}[shape.kind]
        self.ranks_per_node = nproc // self.n_nodes
        self.nodes: list[_Node] = []
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

    # -- building ---------------------------------------------------------------------

    def __enter__(self) -> EmulatedCluster:
        if self.namespaces:
            raise RuntimeError("This EmulatedCluster is already built; use it in one with-block at a time.")
        why = unavailable_reason(latency=self.shape.latency_ms > 0)
        if why:
            raise ClusterUnavailable(why)
        cleanup_stale()
        with _live_lock:
            _live.add(self)
        _watch_sigterm(True)
        try:
            self._build()
        except BaseException:
            self._teardown()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._teardown()

    def _new_namespace(self, name: str) -> str:
        # Recorded before it exists, so a failure halfway through still deletes it.
        self.namespaces.append(name)
        _sh("ip", "netns", "add", name)
        _sh("ip", "-n", name, "link", "set", "lo", "up")
        return name

    def _shape_link(self, ns: str, dev: str, delay: bool) -> None:
        rate = self.shape.bandwidth_gbps * 1e9
        burst = max(int(rate / 8 / 250), _MIN_BURST)
        _sh("tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "handle", "1:", "tbf",
            "rate", f"{int(rate)}bit", "burst", str(burst), "limit", str(burst + _QUEUE))
        if delay and self.shape.latency_ms > 0:
            _sh("tc", "-n", ns, "qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:", "netem",
                "delay", f"{self.shape.latency_ms:g}ms", "limit", str(_NETEM_PACKETS))

    def _build(self) -> None:
        base = f"{_PREFIX}-{os.getpid()}-{next(_serial)}"
        tag = f"zs{os.getpid()}"  # interface names: at most 15 characters
        if self.shape.kind == "shared-bus":
            ns = self._new_namespace(f"{base}-n0")
            self._shape_link(ns, "lo", delay=True)
            self.nodes = [_Node(ns, "lo", "127.0.0.1")]
            return
        bridge_ns = self._new_namespace(f"{base}-br")
        bridge = f"{tag}br"
        _sh("ip", "-n", bridge_ns, "link", "add", bridge, "type", "bridge")
        _sh("ip", "-n", bridge_ns, "link", "set", bridge, "up")
        for i in range(self.n_nodes):
            ns = self._new_namespace(f"{base}-n{i}")
            inner, outer, addr = f"{tag}n{i}", f"{tag}b{i}", f"{_SUBNET}.{i + 1}"
            _sh("ip", "-n", bridge_ns, "link", "add", outer, "type", "veth", "peer", "name", inner, "netns", ns)
            _sh("ip", "-n", bridge_ns, "link", "set", outer, "master", bridge)
            _sh("ip", "-n", bridge_ns, "link", "set", outer, "up")
            # No IPv6 link-local address: gloo takes the interface's first address, which must be ours.
            _sh("ip", "-n", ns, "link", "set", inner, "addrgenmode", "none")
            _sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", inner)
            _sh("ip", "-n", ns, "link", "set", inner, "up")
            self._shape_link(ns, inner, delay=True)  # upload
            self._shape_link(bridge_ns, outer, delay=False)  # download
            self.nodes.append(_Node(ns, inner, addr))

    def _teardown(self) -> None:
        with _sigint_held():
            for ns in reversed(self.namespaces):
                _delete_namespace(ns)
            self.namespaces = []
            self.nodes = []
            with _live_lock:
                _live.discard(self)
                if not _live:
                    _watch_sigterm(False)

    # -- running ----------------------------------------------------------------------

    def run_module(self, module: str, argv: list[str], on_line: Callable[[str], None] | None = None,
                   timeout_s: float = 600.0) -> None:
        """Run ``python -m <module> <argv>`` on the cluster's ranks: one torchrun per node.

        Every line goes to ``on_line``.  If any node's torchrun fails, or ``timeout_s``
        passes, every node is stopped and :class:`~real_runs.launch.RunFailed` is raised
        with one sentence naming the failing rank."""
        if not self.nodes:
            raise RuntimeError("The cluster is not built; run modules inside `with EmulatedCluster(...) as cluster:`.")
        # A fresh port per run: the previous run's store socket may linger in TIME_WAIT.
        port = _STORE_PORT + self._runs
        self._runs += 1
        procs = []
        try:
            for i, node in enumerate(self.nodes):
                cmd = ["ip", "netns", "exec", node.ns, sys.executable, "-m", "torch.distributed.run",
                       f"--nnodes={self.n_nodes}", f"--node-rank={i}", f"--nproc-per-node={self.ranks_per_node}",
                       f"--master-addr={self.nodes[0].addr}", f"--master-port={port}",
                       "--monitor-interval=0.5", "-m", module, *without_nproc(argv)]
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
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(run, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)  # a reader never sees half a run.json
    return run


def launch_in_cluster(strategy: str, nproc: int, out: str | os.PathLike, shape: ClusterShape,
                      on_line: Callable[[str], None] | None = None, timeout_s: float = 600.0, **flags) -> dict:
    """Like :func:`real_runs.launch.launch`, inside an :class:`EmulatedCluster` of ``shape``.

    Returns ``run.json`` as a dict, with a ``cluster`` block added to it (and to the file).
    Bad input raises ValueError before anything is built."""
    cluster = EmulatedCluster(nproc, shape)
    argv = train_argv(strategy, nproc, out, flags)
    with cluster:
        cluster.run_module("real_runs.train", argv, on_line=on_line, timeout_s=timeout_s)
    return stamp_run_json(out, cluster)


# -- command line ---------------------------------------------------------------------


class _BadInput(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise _BadInput(f"{message[0].upper()}{message[1:]}.")


def make_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m real_runs.cluster", usage="%(prog)s --shape SHAPE --bandwidth-gbps G "
                "--nproc N [options] -- MODULE_ARGS...",
                description="Run real_runs.train (or --module) on ranks in an emulated cluster.")
    p.add_argument("--shape", required=True, help=", ".join(SHAPES))
    p.add_argument("--bandwidth-gbps", type=float, required=True, help="rate of the shaped link(s), Gbit/s")
    p.add_argument("--latency-ms", type=float, default=0.0, help="one-way delay added on shaped links (netem)")
    p.add_argument("--nproc", type=int, required=True, help="ranks")
    p.add_argument("--module", default="real_runs.train", help="the torchrun entry to run")
    p.add_argument("--timeout-s", type=float, default=600.0)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ours, rest = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    try:
        args = make_parser().parse_args(ours)
        cluster = EmulatedCluster(args.nproc, ClusterShape(args.shape, args.bandwidth_gbps, args.latency_ms))
        # Before the module's own checks, which may import torch: a machine that cannot
        # build the cluster says so at once.
        why = unavailable_reason(latency=args.latency_ms > 0)
        if why:
            print(f"error: {why}", file=sys.stderr)
            return 2
        if args.module == "real_runs.train":
            from . import train
            try:
                train.validate(train.make_parser().parse_args(rest), args.nproc)
            except train.BadInput as e:
                raise _BadInput(str(e)) from None
    except (_BadInput, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        with cluster:
            print(f"cluster: {cluster.describe()}", flush=True)
            cluster.run_module(args.module, rest, on_line=print, timeout_s=args.timeout_s)
    except ClusterUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except RunFailed as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.module == "real_runs.train":
        out = rest[rest.index("--out") + 1] if "--out" in rest else "out/real_run"
        stamp_run_json(out, cluster)
    return 0


if __name__ == "__main__":
    sys.exit(main())
