"""An emulated cluster makes communication between ranks cost what its links allow, runs
real training inside, and leaves nothing behind however the run ends: an exception, Ctrl-C,
SIGTERM or SIGHUP tear it down, and what SIGKILL leaves the next cluster removes.

Everything that builds a cluster needs root and network namespaces; on a machine
without them those tests skip, saying why.  Bad input is refused everywhere.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from real_runs_helpers import RUN, reference_for

from real_runs.cluster import (
    ClusterShape,
    ClusterUnavailable,
    EmulatedCluster,
    Owner,
    cleanup_stale,
    launch_in_cluster,
    link_name,
    namespace_name,
    unavailable_reason,
)
from real_runs.cluster import main as cluster_main
from real_runs.launch import RunFailed, run_module

WHY_NOT = unavailable_reason()
needs_cluster = pytest.mark.skipif(WHY_NOT is not None, reason=WHY_NOT or "")
OURS = f"zsim-{os.getpid()}-"


def our_namespaces(prefix: str = OURS) -> list[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in listed.splitlines() if line.startswith(prefix)]


def processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line names ``text`` (a run's own output folder)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if text.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


def still_running(pids: list[int]) -> list[int]:
    """Those of ``pids`` that are alive (not gone, not a zombie waiting to be reaped)."""
    alive = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    alive.append(pid)
        except OSError:
            pass
    return alive


def assert_nothing_left(out) -> None:
    assert our_namespaces() == []
    assert processes_mentioning(str(out)) == []


def host_links() -> list[str]:
    listed = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    return [line.split(":", 2)[1].strip().split("@")[0] for line in listed.splitlines() if ":" in line]


def assert_nothing_of(pid: int) -> None:
    """No namespace and no host link named for ``pid`` is left."""
    assert our_namespaces(f"zsim-{pid}-") == []
    assert [x for x in host_links() if x.startswith(f"zs{pid}")] == []


def cluster_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "real_runs.cluster", *args],
                          capture_output=True, text=True, timeout=timeout)


# --- 1. A shaped link costs what the wire needs ---------------------------------------

def all_reduce_seconds(out, nbytes: int, cluster: EmulatedCluster | None = None) -> float:
    """Mean time of one all_reduce of ``nbytes``, timed by the collective microbenchmark."""
    path = str(out / "coll.json")
    args = ["collectives", "--collectives", "all_reduce", "--min-bytes", str(nbytes),
            "--max-bytes", str(nbytes), "--budget-s", "0.6", "--out", path]
    if cluster is None:
        run_module("real_runs.microbench", args, 2, timeout_s=120)
    else:
        cluster.run_module("real_runs.microbench", args, timeout_s=120)
    with open(path) as f:
        (row,) = json.load(f)["rows"]
    return row["time_us"] / 1e6


@needs_cluster
@pytest.mark.slow
def test_an_all_reduce_between_shaped_nics_takes_as_long_as_the_wire_needs(tmp_path, figures):
    nbytes, gbps, n = 4 << 20, 0.2, 2
    # Ring all-reduce: every rank sends 2(n-1)/n of the buffer through its own NIC.
    wire_s = 2 * (n - 1) / n * nbytes / (gbps * 1e9 / 8)
    unshaped = all_reduce_seconds(tmp_path, nbytes)
    with EmulatedCluster(n, ClusterShape("uniform", gbps)) as cluster:
        shaped = all_reduce_seconds(tmp_path, nbytes, cluster)
    figures(f"all_reduce of {nbytes >> 20} MiB on 2 ranks: unshaped {unshaped * 1e3:.1f} ms, "
            f"uniform {gbps} Gbit/s {shaped * 1e3:.1f} ms (wire {wire_s * 1e3:.1f} ms)")
    assert 0.6 * wire_s < shaped < 2 * wire_s
    assert shaped > 5 * unshaped
    assert our_namespaces() == []


# --- 2. Real training inside, recorded as such ----------------------------------------

@needs_cluster
@pytest.mark.slow
def test_ddp_in_a_uniform_cluster_trains_the_same_model_and_says_where_it_ran(tmp_path):
    shape = ClusterShape("uniform", 1.0)
    run = launch_in_cluster("ddp", 2, tmp_path, shape, timeout_s=120, **RUN)
    block = {"kind": "uniform", "bandwidth_gbps": 1.0, "latency_ms": 0.0, "nproc": 2}
    assert run["cluster"] == block
    assert json.loads((tmp_path / "run.json").read_text())["cluster"] == block
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]
    # The network changes how long a step takes, never what it computes.
    ref = reference_for(run)
    l2 = math.sqrt(sum(float(t.double().pow(2).sum()) for t in ref["params"].values()))
    assert run["world_size"] == 2 and run["param_l2"] == pytest.approx(l2, rel=1e-5)
    assert_nothing_left(tmp_path)


# --- 3. The other shapes build, run and go away ---------------------------------------

@needs_cluster
@pytest.mark.slow
def test_two_nodes_of_two_ranks_run_ddp(tmp_path):
    lines = []
    run = launch_in_cluster("ddp", 4, tmp_path, ClusterShape("two-nodes", 1.0), on_line=lines.append,
                            timeout_s=150, **RUN)
    assert run["world_size"] == 4 and run["cluster"]["kind"] == "two-nodes"
    assert any(line.startswith("step 2/2") for line in lines)
    assert_nothing_left(tmp_path)


@needs_cluster
@pytest.mark.slow
def test_a_shared_bus_runs_from_the_command_line(tmp_path):
    done = cluster_cli("--shape", "shared-bus", "--bandwidth-gbps", "1", "--nproc", "2", "--",
                       "--strategy", "ddp", "--out", str(tmp_path), "--model", "nano", "--seq-len", "32",
                       "--steps", "2", "--global-batch", "8")
    assert done.returncode == 0, done.stderr
    assert "shared-bus: 2 ranks in 1 namespace of 2 ranks" in done.stdout
    run = json.loads((tmp_path / "run.json").read_text())
    assert run["cluster"] == {"kind": "shared-bus", "bandwidth_gbps": 1.0, "latency_ms": 0.0, "nproc": 2}
    assert_nothing_left(tmp_path)


# --- 4. Nothing is left behind --------------------------------------------------------

@needs_cluster
def test_an_exception_in_the_with_block_still_tears_everything_down():
    with pytest.raises(KeyError), EmulatedCluster(4, ClusterShape("uniform", 1.0)) as cluster:
        assert len(our_namespaces()) == 5  # four nodes and the bridge
        raise KeyError("boom")
    assert cluster.namespaces == [] and our_namespaces() == []


@needs_cluster
@pytest.mark.slow
def test_a_failing_rank_stops_every_node_names_the_rank_and_leaves_nothing(tmp_path):
    started = time.monotonic()
    with pytest.raises(RunFailed) as failure:
        launch_in_cluster("ddp", 2, tmp_path, ClusterShape("uniform", 1.0), fail_rank=1, fail_at_step=0,
                          timeout_s=120, **RUN)
    assert time.monotonic() - started < 60
    assert "rank 1 raised RuntimeError: injected fault at step 0" in str(failure.value)
    assert len(str(failure.value).splitlines()) == 1
    assert not (tmp_path / "run.json").exists()
    assert_nothing_left(tmp_path)


HOLDER = """
import faulthandler, signal, subprocess, sys, time
from real_runs.cluster import ClusterShape, EmulatedCluster
# Ctrl-C as in a terminal: a test run started in the background inherits SIGINT ignored.
signal.signal(signal.SIGINT, signal.default_int_handler)
faulthandler.register(signal.SIGUSR1)  # the test asks where it is stuck, should it hang
with EmulatedCluster(2, ClusterShape("uniform", 1.0)) as cluster:
    # A process inside a namespace, as a rank would be, that the holder's death does not end.
    subprocess.Popen(["ip", "netns", "exec", cluster.nodes[0].ns, "sleep", "300"], start_new_session=True)
    print(" ".join(cluster.namespaces), flush=True)
    time.sleep(300)
"""


def hold_a_cluster(stderr=None) -> tuple[subprocess.Popen, list[str]]:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, stderr=stderr,
                              text=True)
    names = holder.stdout.readline().split()
    assert names and set(names) <= set(our_namespaces(f"zsim-{holder.pid}-"))
    return holder, names


def sleepers_in(names: list[str]) -> list[int]:
    return [int(p) for ns in names if ns in our_namespaces("zsim-")
            for p in subprocess.run(["ip", "netns", "pids", ns], capture_output=True,
                                    text=True).stdout.split()]


@needs_cluster
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP],
                         ids=["ctrl-c", "sigterm", "sighup"])
def test_an_interrupted_holder_tears_down_on_its_way_out(sig, tmp_path):
    log = (tmp_path / "holder.err").open("w+")
    holder, names = hold_a_cluster(stderr=log)
    sleepers = sleepers_in(names)
    assert sleepers
    holder.send_signal(sig)
    try:
        holder.wait(timeout=30)
    except subprocess.TimeoutExpired:
        holder.send_signal(signal.SIGUSR1)  # faulthandler writes every thread's stack
        time.sleep(1)
        log.seek(0)
        pytest.fail(f"the holder did not end within 30 s of {sig.name}; its stderr:\n{log.read()[-4000:]}")
    finally:
        if holder.poll() is None:  # never leave the holder sleeping after a failure
            holder.kill()
    assert not set(names) & set(our_namespaces("zsim-"))
    assert still_running(sleepers) == []
    if sig != signal.SIGINT:  # a stop signal ends the interpreter through Python, with 128 + the signal
        assert holder.returncode == 128 + sig


@needs_cluster
def test_a_cluster_whose_holder_was_killed_outright_is_cleaned_up_by_the_next_one():
    holder, names = hold_a_cluster()
    sleepers = sleepers_in(names)
    holder.kill()  # no teardown can run: the namespaces and the process inside outlive it
    holder.wait()
    assert set(names) <= set(our_namespaces("zsim-")) and sleepers
    with EmulatedCluster(1, ClusterShape("shared-bus", 1.0)):
        assert not set(names) & set(our_namespaces("zsim-"))
    assert still_running(sleepers) == []


@needs_cluster
def test_two_clusters_coexist_and_a_new_one_leaves_the_live_one_alone():
    holder, names = hold_a_cluster()
    try:
        lines = []
        with EmulatedCluster(2, ClusterShape("uniform", 1.0), on_line=lines.append) as mine:
            assert set(names) <= set(our_namespaces("zsim-"))
            assert not set(names) & set(mine.namespaces)
        assert set(names) <= set(our_namespaces("zsim-"))
        assert not [line for line in lines if any(ns in line for ns in names)]
    finally:
        holder.terminate()
        holder.wait(timeout=20)
    assert not set(names) & set(our_namespaces("zsim-"))


def ended_owner() -> Owner:
    """The owner a process that has ended would have been: its pid is known to be free."""
    sleeper = subprocess.Popen(["sleep", "60"])
    owner = Owner.of(sleeper.pid)
    sleeper.kill()
    sleeper.wait()
    return owner


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


def leave_a_cluster(owner: Owner) -> tuple[list[str], list[str]]:
    """What a cluster of ``owner`` killed outright leaves, made with the cluster's own naming:
    a bridge namespace and a node joined by a shaped veth, a process inside, and a stray
    host-namespace veth.  Returns (namespaces, host links)."""
    br, node = namespace_name(owner, 0, "br"), namespace_name(owner, 0, "n0")
    ip("netns", "add", br)
    ip("netns", "add", node)
    inner, outer = link_name(owner.pid, "n0"), link_name(owner.pid, "b0")
    ip("-n", br, "link", "add", outer, "type", "veth", "peer", "name", inner, "netns", node)
    subprocess.run(["tc", "-n", node, "qdisc", "add", "dev", inner, "root", "tbf", "rate", "1gbit",
                    "burst", "128k", "limit", "1m"], check=True, capture_output=True)
    stray = link_name(owner.pid, "b1")
    ip("link", "add", stray, "type", "veth", "peer", "name", link_name(owner.pid, "n1"))
    return [br, node], [stray, link_name(owner.pid, "n1")]


@needs_cluster
def test_stale_cleanup_removes_what_ended_processes_left_and_spares_live_owners():
    gone = ended_owner()
    # A live pid that started at another time is some later process, not the one that built it.
    reused = Owner(os.getpid(), Owner.me().start + 1)
    live_process = subprocess.Popen(["sleep", "60"])
    live = Owner.of(live_process.pid)
    stale_ns, stale_links = leave_a_cluster(gone)
    inside = subprocess.Popen(["ip", "netns", "exec", stale_ns[1], "sleep", "60"], start_new_session=True)
    reused_ns = namespace_name(reused, 0, "n0")
    ip("netns", "add", reused_ns)
    live_ns, live_links = leave_a_cluster(live)
    try:
        removed = cleanup_stale()
        assert set(stale_ns + [reused_ns]) <= set(removed.namespaces)
        assert set(stale_links) <= set(removed.links) and removed.processes >= 1
        assert {gone.pid, reused.pid} <= set(removed.owners) and removed.failed == []
        assert not set(stale_ns + [reused_ns]) & set(our_namespaces("zsim-"))
        assert not set(stale_links) & set(host_links())
        inside.wait(timeout=10)  # killed, as a rank left inside would be
        # What a live process built is left alone.
        assert set(live_ns) <= set(our_namespaces("zsim-")) and set(live_links) <= set(host_links())
        sentence = removed.sentence()
        assert len(sentence.splitlines()) == 1 and stale_ns[0] in sentence and str(gone.pid) in sentence
    finally:
        for ns in live_ns:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", live_links[0]], capture_output=True)
        live_process.kill()
        live_process.wait()
    assert_nothing_of(gone.pid)
    assert_nothing_of(live.pid)


def test_interface_names_fit_linux_limit_for_the_largest_pid():
    assert len(link_name(4194304, "n249")) <= 15  # pid_max's ceiling, the largest node index
    with pytest.raises(ValueError):
        link_name(4194304, "n1234567")


class CommandLine:
    """``python -m real_runs.cluster`` running a long training run, its output followed live."""

    def __init__(self, out, shape: str = "uniform"):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "real_runs.cluster", "--shape", shape, "--bandwidth-gbps", "1",
             "--nproc", "2", "--", "--strategy", "ddp", "--out", str(out), "--model", "nano",
             "--seq-len", "32", "--global-batch", "8", "--steps", "100000"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.lines: list[str] = []
        self.stepping = threading.Event()
        threading.Thread(target=self._follow, daemon=True).start()

    def _follow(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)
            if line.startswith("step "):
                self.stepping.set()

    def wait_until_stepping(self) -> None:
        assert self.stepping.wait(60), "".join(self.lines[-20:])

    def end(self, sig: int) -> tuple[int, str]:
        self.proc.send_signal(sig)
        try:
            status = self.proc.wait(timeout=30)  # stderr holds a line or two: the pipe cannot fill
        except subprocess.TimeoutExpired:
            self.proc.kill()  # a failed test must not leave a 100,000-step run to the next ones
            self.proc.wait()
            raise
        return status, self.proc.stderr.read()


@needs_cluster
@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGINT, signal.SIGTERM],
                         ids=["sighup", "ctrl-c", "sigterm"])
def test_the_command_line_stopped_mid_run_says_so_in_one_line_and_leaves_nothing(tmp_path, sig):
    run = CommandLine(tmp_path)
    run.wait_until_stepping()
    status, err = run.end(sig)
    name = signal.Signals(sig).name
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err and name in err, err
    assert status == 128 + sig, err  # the shells' convention
    assert "nothing of the emulated cluster is left" in err
    assert_nothing_of(run.proc.pid)
    assert still_running(processes_mentioning(str(tmp_path))) == []


@needs_cluster
@pytest.mark.slow
def test_what_a_killed_command_line_left_is_removed_by_the_next_start(tmp_path):
    run = CommandLine(tmp_path)
    run.wait_until_stepping()
    status, _ = run.end(signal.SIGKILL)
    assert status == -signal.SIGKILL
    left = our_namespaces(f"zsim-{run.proc.pid}-")
    assert len(left) == 3  # bind mounts in /run/netns outlive their creator: the bridge's and two nodes
    lines = []
    with EmulatedCluster(1, ClusterShape("shared-bus", 1.0), on_line=lines.append):
        assert_nothing_of(run.proc.pid)
    (line,) = lines
    assert line.startswith("cluster: Removed") and all(ns in line for ns in left)
    deadline = time.monotonic() + 10
    while still_running(processes_mentioning(str(tmp_path))) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert still_running(processes_mentioning(str(tmp_path))) == []


# --- 5. Bad input: one sentence -------------------------------------------------------

@pytest.mark.parametrize("nproc, shape, says", [
    (0, ClusterShape("uniform", 1.0), "nproc must be a positive"),
    (2, ClusterShape("ring", 1.0), "Unknown cluster shape 'ring'"),
    (2, ClusterShape("uniform", 0.0), "bandwidth_gbps must be a positive"),
    (2, ClusterShape("uniform", 1.0, -1.0), "latency_ms must be zero or"),
    (3, ClusterShape("two-nodes", 1.0), "nproc must be even"),
])
def test_bad_cluster_input_is_one_sentence(nproc, shape, says):
    with pytest.raises(ValueError) as bad:
        EmulatedCluster(nproc, shape)
    text = str(bad.value)
    assert says in text and len(text.splitlines()) == 1 and text.endswith(".") and "Traceback" not in text


@pytest.mark.parametrize("args, says", [
    (["--shape", "ring", "--bandwidth-gbps", "1", "--nproc", "2"], "Unknown cluster shape 'ring'"),
    (["--shape", "uniform", "--nproc", "2"], "required: --bandwidth-gbps"),
    (["--shape", "two-nodes", "--bandwidth-gbps", "1", "--nproc", "3"], "nproc must be even"),
])
def test_the_command_line_refuses_bad_input_with_one_sentence_and_status_2(args, says):
    done = cluster_cli(*args)
    assert done.returncode == 2
    assert says in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


@needs_cluster
def test_the_command_line_checks_the_training_options_before_building_anything(capsys):
    # In this process (torch is already imported here); the exit status is main()'s.
    status = cluster_main(["--shape", "uniform", "--bandwidth-gbps", "1", "--nproc", "2", "--",
                           "--strategy", "zero4"])
    err = capsys.readouterr().err
    assert status == 2 and "Unknown strategy 'zero4'" in err and len(err.strip().splitlines()) == 1
    assert our_namespaces() == []


def test_latency_is_built_or_refused_in_one_sentence(tmp_path):
    # Latency needs netem, which some kernels lack: then the cluster says so rather than
    # silently running without it.
    why = unavailable_reason(latency=True)
    if WHY_NOT is not None:
        pytest.skip(WHY_NOT)
    shape = ClusterShape("uniform", 1.0, latency_ms=20.0)
    if why is None:
        with EmulatedCluster(2, shape) as cluster:
            assert "+20 ms one way" in cluster.describe()
        return
    with pytest.raises(ClusterUnavailable) as refused:
        EmulatedCluster(2, shape).__enter__()
    assert str(refused.value) == why and "netem" in why and len(why.splitlines()) == 1
    done = cluster_cli("--shape", "uniform", "--bandwidth-gbps", "1", "--latency-ms", "20", "--nproc", "2",
                       "--", "--strategy", "ddp", "--out", str(tmp_path))
    assert done.returncode == 2 and "netem" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert our_namespaces() == []
