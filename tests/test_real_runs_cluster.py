"""An emulated cluster makes communication between ranks cost what its links allow, runs
real training inside, and leaves nothing behind however the run ends.

Everything that builds a cluster needs root and network namespaces; on a machine
without them those tests skip, saying why.  Bad input is refused everywhere.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time

import pytest
from real_runs_helpers import RUN, reference_for

from real_runs.cluster import (
    ClusterShape,
    ClusterUnavailable,
    EmulatedCluster,
    launch_in_cluster,
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
import subprocess, sys, time
from real_runs.cluster import ClusterShape, EmulatedCluster
with EmulatedCluster(2, ClusterShape("uniform", 1.0)) as cluster:
    # A process inside a namespace, as a rank would be, that the holder's death does not end.
    subprocess.Popen(["ip", "netns", "exec", cluster.nodes[0].ns, "sleep", "300"], start_new_session=True)
    print(" ".join(cluster.namespaces), flush=True)
    time.sleep(300)
"""


def hold_a_cluster() -> tuple[subprocess.Popen, list[str]]:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True)
    names = holder.stdout.readline().split()
    assert names and set(names) <= set(our_namespaces(f"zsim-{holder.pid}-"))
    return holder, names


def sleepers_in(names: list[str]) -> list[int]:
    return [int(p) for ns in names if ns in our_namespaces("zsim-")
            for p in subprocess.run(["ip", "netns", "pids", ns], capture_output=True,
                                    text=True).stdout.split()]


@needs_cluster
@pytest.mark.parametrize("sig", [2, 15], ids=["ctrl-c", "sigterm"])
def test_an_interrupted_holder_tears_down_on_its_way_out(sig):
    holder, names = hold_a_cluster()
    sleepers = sleepers_in(names)
    assert sleepers
    holder.send_signal(sig)
    holder.wait(timeout=20)
    assert not set(names) & set(our_namespaces("zsim-"))
    assert still_running(sleepers) == []


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
