"""The Linux side of an emulated cluster: ``ip netns``, veth pairs, a bridge, ``tc`` qdiscs.

Every command that builds, probes or deletes namespaces is here; each failure is one
sentence (:class:`ClusterUnavailable`).  Namespaces are named ``zsim-<pid>-<n>-br`` (the
bridge) and ``zsim-<pid>-<n>-n<i>`` (the nodes), so those left by a process that was killed
outright are recognised, by its pid, and deleted by :func:`cleanup_stale`.

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
from dataclasses import dataclass

from .shapes import ClusterShape

PREFIX = "zsim"  # namespaces: zsim-<pid>-<n>-br, zsim-<pid>-<n>-n<i>
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
    base = f"{PREFIX}-{os.getpid()}-{next(_serial)}"
    tag = f"zs{os.getpid()}"  # interface names: at most 15 characters
    if shape.kind == "shared-bus":
        ns = add_namespace(f"{base}-n0", built)
        shape_link(ns, "lo", shape, delay=True)
        return [Node(ns, "lo", "127.0.0.1")]
    nodes = []
    bridge_ns = add_namespace(f"{base}-br", built)
    bridge = f"{tag}br"
    _sh("ip", "-n", bridge_ns, "link", "add", bridge, "type", "bridge")
    _sh("ip", "-n", bridge_ns, "link", "set", bridge, "up")
    for i in range(n_nodes):
        ns = add_namespace(f"{base}-n{i}", built)
        inner, outer, addr = f"{tag}n{i}", f"{tag}b{i}", f"{_SUBNET}.{i + 1}"
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


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def delete_namespace(ns: str) -> None:
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


def cleanup_stale() -> list[str]:
    """Delete the namespaces of processes that died without tearing their cluster down."""
    gone = []
    for ns in _namespaces():
        m = re.match(rf"{PREFIX}-(\d+)-", ns)
        if m and not _pid_alive(int(m[1])):
            delete_namespace(ns)
            gone.append(ns)
    return gone


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
    ns = f"{PREFIX}-{os.getpid()}-probe{next(_serial)}"
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
