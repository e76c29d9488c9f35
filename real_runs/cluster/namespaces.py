"""The Linux side of an emulated cluster: ``ip netns``, veth pairs, a bridge, ``tc`` qdiscs.

Every command that builds, probes or deletes namespaces is here; each failure is one
sentence (:class:`ClusterUnavailable`).

**Names carry their owner.**  Everything a cluster creates is named for the process that
built it (its :class:`Owner`), so that what a process killed outright left behind is
recognised by the next cluster built on the machine, and deleted by :func:`cleanup_stale`:

- namespaces: ``zsim-<pid>-<start>-<serial>-br`` (the bridge's), ``...-n<i>`` (node ``i``),
  ``...-probe`` (:func:`unavailable_reason`'s throwaway), e.g. ``zsim-4242-93710-0-n1``;
- the bridge ``zs<pid>br``; veth ends ``zs<pid>n<i>`` (in node ``i``, the interface gloo
  binds) and ``zs<pid>b<i>`` (on the bridge), e.g. ``zs4242n1``; the qdiscs sit on those
  (on the node's ``lo`` for ``shared-bus``).

``<start>`` is when the owner started (clock ticks after boot, ``/proc/<pid>/stat``), so a
later process that happens to get the same pid is not taken for the owner; ``<serial>``
counts the clusters one process builds.  Interface names must fit Linux's 15 characters
(IFNAMSIZ - 1), which leaves no room for the start time: at most 7 digits of pid (the
kernel's pid_max is 4194304) and ``n249`` make 13.  Interfaces and qdiscs live only inside
the cluster's namespaces (nothing is created in the host's), so deleting a namespace
deletes them with it; :func:`cleanup_stale` still deletes host-namespace links named
``zs<pid>...`` whose pid owns no live cluster, in case one ever got there.  A namespace
outlives its owner (``ip netns add`` bind-mounts it at ``/run/netns/<name>``), and so do the
processes in it (``torchrun`` and the ranks): deleting one first kills every process inside.

Two clusters, in one process or in two, coexist: their names differ, and their addresses
and ports lie inside their own namespaces.

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
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

from .shapes import ClusterShape

PREFIX = "zsim"  # namespaces: zsim-<pid>-<start>-<serial>-<role>
_OUR_NAMESPACE = re.compile(rf"{PREFIX}-(\d+)-(\d+)-")
_OUR_LINK = re.compile(r"zs(\d+)(br|[nb]\d+)")
_IFNAME_MAX = 15  # Linux's IFNAMSIZ (16) less the terminating NUL
_SUBNET = "10.213.0"  # private, and inside the cluster's own namespaces: it cannot clash with the host
_MIN_BURST = 128 << 10
_QUEUE = 32 << 20
_NETEM_PACKETS = 100_000
_NO_NETEM = "This kernel has no netem qdisc (CONFIG_NET_SCH_NETEM), so latency_ms > 0 cannot be emulated"
_serial = itertools.count()


class ClusterUnavailable(RuntimeError):
    """This machine cannot build the cluster; one sentence in ``str()``."""


@dataclass(frozen=True)
class Node:
    ns: str  # network namespace
    ifname: str  # the interface gloo binds (GLOO_SOCKET_IFNAME)
    addr: str


def _stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (state first), or None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


@dataclass(frozen=True)
class Owner:
    """The process that built a cluster: its pid, and when it started (so that a later
    process given the same pid is not taken for it)."""

    pid: int
    start: int  # clock ticks after boot (field 22 of /proc/<pid>/stat)

    @classmethod
    def of(cls, pid: int) -> Owner | None:
        fields = _stat(pid)
        return cls(pid, int(fields[19])) if fields else None

    @classmethod
    def me(cls) -> Owner:
        return cls.of(os.getpid())  # type: ignore[return-value]

    def alive(self) -> bool:
        """This very process still runs (a zombie has ended: only its exit status is left)."""
        fields = _stat(self.pid)
        return fields is not None and fields[0] not in "ZX" and int(fields[19]) == self.start


def namespace_name(owner: Owner, serial: int, role: str) -> str:
    """``zsim-<pid>-<start>-<serial>-<role>``; role ``br``, ``n<i>`` or ``probe``."""
    return f"{PREFIX}-{owner.pid}-{owner.start}-{serial}-{role}"


def link_name(pid: int, role: str) -> str:
    """``zs<pid><role>``; role ``br``, ``n<i>`` or ``b<i>``: at most 15 characters, as Linux requires."""
    name = f"zs{pid}{role}"
    if len(name) > _IFNAME_MAX:
        raise ValueError(f"Interface name {name!r} is longer than Linux's {_IFNAME_MAX} characters.")
    return name


def owner_of_namespace(ns: str) -> Owner | None:
    """Who built namespace ``ns``; None when it is not an emulated cluster's."""
    m = _OUR_NAMESPACE.match(ns)
    return Owner(int(m[1]), int(m[2])) if m else None


def owner_pid_of_link(name: str) -> int | None:
    """The pid in link ``name``; None when it is not an emulated cluster's."""
    m = _OUR_LINK.fullmatch(name)
    return int(m[1]) if m else None


def _one_line(text: str) -> str:
    lines = [x.strip() for x in text.strip().splitlines() if x.strip()]
    return lines[0].rstrip(".") if lines else "no message"


def _sh(*cmd: str) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise ClusterUnavailable(f"Building the emulated cluster failed at `{' '.join(cmd)}`: "
                                 f"{_one_line(done.stderr or done.stdout)}.")
    return done.stdout


# -- building -------------------------------------------------------------------------


def add_namespace(name: str, built: list[str]) -> str:
    """Create namespace ``name`` with its ``lo`` up.  It is appended to ``built`` before it
    exists, so a failure halfway through still deletes it."""
    built.append(name)
    _sh("ip", "netns", "add", name)
    _sh("ip", "-n", name, "link", "set", "lo", "up")
    return name


def shape_link(ns: str, dev: str, shape: ClusterShape, delay: bool) -> None:
    """A tbf qdisc at the shape's rate on ``dev`` in ``ns``, with netem's delay under it
    when ``delay`` and the shape has latency."""
    rate = shape.bandwidth_gbps * 1e9
    burst = max(int(rate / 8 / 250), _MIN_BURST)
    _sh("tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "handle", "1:", "tbf",
        "rate", f"{int(rate)}bit", "burst", str(burst), "limit", str(burst + _QUEUE))
    if delay and shape.latency_ms > 0:
        _sh("tc", "-n", ns, "qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:", "netem",
            "delay", f"{shape.latency_ms:g}ms", "limit", str(_NETEM_PACKETS))


def build(shape: ClusterShape, n_nodes: int, built: list[str]) -> list[Node]:
    """Build ``n_nodes`` nodes wired as ``shape`` says; every namespace goes into ``built``
    (the bridge first) as it is created, so the caller can delete them all if this fails."""
    me, serial = Owner.me(), next(_serial)
    if shape.kind == "shared-bus":
        ns = add_namespace(namespace_name(me, serial, "n0"), built)
        shape_link(ns, "lo", shape, delay=True)
        return [Node(ns, "lo", "127.0.0.1")]
    nodes = []
    bridge_ns = add_namespace(namespace_name(me, serial, "br"), built)
    bridge = link_name(me.pid, "br")
    _sh("ip", "-n", bridge_ns, "link", "add", bridge, "type", "bridge")
    _sh("ip", "-n", bridge_ns, "link", "set", bridge, "up")
    for i in range(n_nodes):
        ns = add_namespace(namespace_name(me, serial, f"n{i}"), built)
        inner, outer, addr = link_name(me.pid, f"n{i}"), link_name(me.pid, f"b{i}"), f"{_SUBNET}.{i + 1}"
        _sh("ip", "-n", bridge_ns, "link", "add", outer, "type", "veth", "peer", "name", inner, "netns", ns)
        _sh("ip", "-n", bridge_ns, "link", "set", outer, "master", bridge)
        _sh("ip", "-n", bridge_ns, "link", "set", outer, "up")
        # No IPv6 link-local address: gloo takes the interface's first address, which must be ours.
        _sh("ip", "-n", ns, "link", "set", inner, "addrgenmode", "none")
        _sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", inner)
        _sh("ip", "-n", ns, "link", "set", inner, "up")
        shape_link(ns, inner, shape, delay=True)  # upload
        shape_link(bridge_ns, outer, shape, delay=False)  # download
        nodes.append(Node(ns, inner, addr))
    return nodes


# -- deleting -------------------------------------------------------------------------


def _namespaces() -> list[str]:
    done = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    return [line.split()[0] for line in done.stdout.splitlines() if line.strip()]


def _host_links() -> list[str]:
    done = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True)
    # "7: zs42b0@zs42n0: <BROADCAST,...> ...": the name, less the peer after "@".
    return [line.split(":", 2)[1].strip().split("@")[0] for line in done.stdout.splitlines() if ":" in line]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _is_zombie(pid: int) -> bool:
    fields = _stat(pid)
    return fields is None or fields[0] == "Z"


def delete_namespace(ns: str) -> int:
    """Kill whatever still runs inside ``ns`` and delete it (a namespace outlives its name while a
    process is in it, and a process in it would outlive the run); returns how many were killed."""
    pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    deadline = time.monotonic() + 5.0
    for pid in pids:
        while _pid_alive(int(pid)) and not _is_zombie(int(pid)) and time.monotonic() < deadline:
            time.sleep(0.02)
    return len(pids)


@dataclass
class Removed:
    """What :func:`cleanup_stale` removed (and what it could not); false when it found nothing."""

    owners: list[int] = field(default_factory=list)  # pids of the processes that left them
    namespaces: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    processes: int = 0  # killed because they still ran inside those namespaces
    failed: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.namespaces or self.links or self.failed)

    def sentence(self) -> str:
        what = [f"namespaces {', '.join(self.namespaces)}"] if self.namespaces else []
        what += [f"links {', '.join(self.links)}"] if self.links else []
        text = (f"Removed what emulated clusters of ended processes ({', '.join(map(str, self.owners))}) "
                f"left behind: {' and '.join(what) or 'nothing'}")
        if self.processes:
            text += f", killing {self.processes} process{'es' if self.processes > 1 else ''} still inside"
        if self.failed:
            text += f"; could not remove {', '.join(self.failed)}"
        return text + "."


def cleanup_stale() -> Removed:
    """Delete what clusters of ended processes left: their namespaces (with every process, link and
    qdisc inside) and host-namespace links named for them.  What a live owner built is left alone."""
    removed, live = Removed(), set()
    stale = []
    for ns in _namespaces():
        owner = owner_of_namespace(ns)
        if owner is not None and owner.alive():
            live.add(owner.pid)
        elif owner is not None:
            stale.append((owner.pid, ns))
    for pid, ns in stale:
        removed.processes += delete_namespace(ns)
        removed.namespaces.append(ns)
        removed.owners.append(pid)
    # Links carry no start time: one is stale unless its pid owns a live cluster's namespace,
    # which every cluster creates before its first link.
    for link in _host_links():
        pid = owner_pid_of_link(link)
        if pid is not None and pid not in live:
            subprocess.run(["ip", "link", "del", link], capture_output=True)
            removed.links.append(link)
            removed.owners.append(pid)
    left = set(_namespaces()) | set(_host_links())
    removed.failed = [x for x in removed.namespaces + removed.links if x in left]
    removed.namespaces = [x for x in removed.namespaces if x not in left]
    removed.links = [x for x in removed.links if x not in left]
    removed.owners = sorted(set(removed.owners))
    return removed


# -- probing --------------------------------------------------------------------------


def unavailable_reason(latency: bool = False) -> str | None:
    """None when this machine can build emulated clusters; otherwise one sentence why not.

    Checked for real: a throwaway namespace gets a veth pair, a bridge and a tbf qdisc
    (and a netem qdisc with ``latency=True``), and is deleted again."""
    if not sys.platform.startswith("linux"):
        return f"Emulated clusters need Linux network namespaces; this is {sys.platform}."
    if os.geteuid() != 0:
        return (f"Emulated clusters need root to create network namespaces; "
                f"this process runs as uid {os.geteuid()}.")
    missing = [c for c in ("ip", "tc") if shutil.which(c) is None]
    if missing:
        return f"Emulated clusters need iproute2's `ip` and `tc`, and {' and '.join(missing)} is not on PATH."
    ns = namespace_name(Owner.me(), next(_serial), "probe")
    checks = [
        (["ip", "netns", "add", ns], "This machine does not permit creating network namespaces"),
        (["ip", "-n", ns, "link", "add", "p0", "type", "veth", "peer", "name", "p1"],
         "This kernel has no veth links"),
        (["ip", "-n", ns, "link", "add", "b0", "type", "bridge"], "This kernel has no bridges"),
        (["tc", "-n", ns, "qdisc", "add", "dev", "p0", "root", "handle", "1:", "tbf", "rate", "1gbit",
          "burst", "128k", "limit", "1m"], "This kernel has no tbf qdisc (CONFIG_NET_SCH_TBF)"),
    ]
    if latency:
        checks.append((["tc", "-n", ns, "qdisc", "add", "dev", "p0", "parent", "1:1", "handle", "10:",
                        "netem", "delay", "1ms"], _NO_NETEM))
    try:
        for cmd, why in checks:
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                return f"{why} ({cmd[0]} said: {_one_line(done.stderr)})."
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    return None
