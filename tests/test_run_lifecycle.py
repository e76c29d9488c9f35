"""A stopped run stops, and a run directory is complete or visibly not.

1. However a run ends (its timeout, SIGINT, SIGTERM or SIGHUP to the launcher, SIGKILL to
   the launcher or to torchrun), no process it started is left running, and nothing it
   would have written appears later.  The runs stall on purpose (``--fail-mode stall``),
   so each one would have finished at a known time, which the tests wait past.
2. A run that fails leaves no earlier run's result behind, and says why in ``failed.json``;
   an ``--out`` that cannot take the files is refused before the first step.
3. ``load_run`` refuses every damaged run directory with one sentence naming the file and
   the field, and never raises anything else: checked case by case, then by fuzzing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("torch")  # the real runs need it (`.[real]`)

from real_runs_helpers import RUN, Descendants, process_table, real_run  # noqa: E402

from real_runs.launch import FAILED_FILE, RunFailed, launch, launch_argv  # noqa: E402
from real_runs.options import train_argv  # noqa: E402
from sim2real.overlay import OverlayError, load_run, measured_step  # noqa: E402

# Rank 1 stalls in step 1, so the run would end about stall_s after rank 0 says "step 1/3".
STALLING = {**RUN, "steps": 3, "fail_rank": 1, "fail_at_step": 1, "fail_mode": "stall", "stall_s": 5.0}
# A timeout of 8 s must fall inside the stall however fast the ranks start.
TIMEOUT_S, LONG_STALL_S = 8, 10.0
FUZZ_EXAMPLES = int(os.environ.get("ZERO_SIM_FUZZ_EXAMPLES", "200"))


def one_sentence(message: str) -> str:
    assert "\n" not in message and "Traceback" not in message, message
    assert message.endswith("."), message
    return message


def nothing_appears(out: Path, until: float) -> None:
    """Wait until ``until`` (a monotonic time) and check that the run wrote no result meanwhile."""
    while time.monotonic() < until:
        assert not (out / "run.json").exists(), "a stopped run finished in the background"
        time.sleep(0.2)
    assert not [f for f in os.listdir(out) if re.fullmatch(r"run\.json|rank\d+\.json", f)]


def our_zombies() -> list[str]:
    """Children of this process that ended and were never reaped, as ``pid (name)``."""
    return [f"{pid} {comm(pid)}" for pid, (ppid, _, state) in process_table().items()
            if ppid == os.getpid() and state == "Z"]


def comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(" ", 1)[1].rsplit(")", 1)[0] + ")"
    except OSError:
        return "(gone)"


# --- 1. a stopped run stops ------------------------------------------------------------------

@pytest.mark.slow
def test_a_run_that_outlives_its_timeout_leaves_no_process_and_no_result(tmp_path):
    step_one = []
    on_line = lambda line: step_one.append(time.monotonic()) if line.startswith("step 1/") else None  # noqa: E731
    with Descendants() as family:
        try:
            with pytest.raises(RunFailed, match=f"did not finish within {TIMEOUT_S} s"):
                launch("ddp", nproc=2, out=tmp_path, timeout_s=TIMEOUT_S, on_line=on_line,
                       **{**STALLING, "stall_s": LONG_STALL_S})
            stopped = time.monotonic()
            family.sample()
            assert len(family.seen) >= 3, "torchrun and two ranks were running"
            # Nothing it started is left; the launcher reaped its own.
            assert family.gone_within(2.0) == []
            assert our_zombies() == []
        finally:
            family.kill_survivors()
    nothing_appears(tmp_path, until=(step_one[0] if step_one else stopped) + LONG_STALL_S + 2)
    assert json.loads((tmp_path / FAILED_FILE).read_text()) == {
        "reason": f"The run did not finish within {TIMEOUT_S} s and was stopped."}


def start_launcher(out: Path) -> tuple[subprocess.Popen, list[str], threading.Event]:
    """``python -m real_runs.train --nproc 2`` (the launcher) in a process of its own; its lines
    are collected, and the event is set once rank 0 has finished step 0 ("step 1/3")."""
    argv = train_argv("ddp", 2, out, STALLING)
    proc = subprocess.Popen([sys.executable, "-m", "real_runs.train", "--nproc", "2", *argv],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines, training = [], threading.Event()

    def read():
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith("step 1/"):
                training.set()

    threading.Thread(target=read, daemon=True).start()
    return proc, lines, training


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGHUP, signal.SIGINT],
                         ids=lambda s: signal.Signals(s).name)
def test_a_launcher_that_is_killed_or_stopped_takes_every_rank_with_it(tmp_path, sig):
    proc, lines, training = start_launcher(tmp_path)
    with Descendants(proc.pid) as family:
        try:
            assert training.wait(60), "the ranks never started training:\n" + "\n".join(lines[-20:])
            signalled = time.monotonic()
            family.sample()
            assert len(family.seen) >= 3, "torchrun and two ranks were running"
            proc.send_signal(sig)
            rc = proc.wait(15)
            assert family.gone_within(3.0) == []
        finally:
            family.kill_survivors()
            proc.kill()
    nothing_appears(tmp_path, until=signalled + STALLING["stall_s"] + 2)
    name = signal.Signals(sig).name
    if sig == signal.SIGKILL:
        # Nothing could write failed.json; the folder still says the run did not finish.
        assert rc == -signal.SIGKILL and not (tmp_path / FAILED_FILE).exists()
        with pytest.raises(OverlayError, match="has no run.json: the run did not finish"):
            load_run(tmp_path)
        return
    said = f"The run was stopped by {name} before it finished."
    assert rc == (128 + sig if sig == signal.SIGINT else 1)
    assert lines[-1] == f"error: {said}"
    assert json.loads((tmp_path / FAILED_FILE).read_text()) == {"reason": said}
    with pytest.raises(OverlayError) as refused:
        load_run(tmp_path)
    assert f'it said "{said[:-1]}"' in one_sentence(str(refused.value))


@pytest.mark.slow
def test_a_torchrun_killed_outright_takes_its_ranks_with_it(tmp_path):
    killed = []

    def kill_torchrun(line: str) -> None:
        if line.startswith("step 1/") and not killed:
            table = process_table()
            (torchrun,) = [pid for pid, (ppid, _, _) in table.items()
                           if ppid == os.getpid() and b"torch.distributed.run" in cmdline(pid)]
            os.kill(torchrun, signal.SIGKILL)
            killed.append(time.monotonic())

    with Descendants() as family:
        try:
            with pytest.raises(RunFailed, match="torchrun exit status -9"):
                launch("ddp", nproc=2, out=tmp_path, timeout_s=60, on_line=kill_torchrun, **STALLING)
            assert killed and len(family.seen) >= 3
            assert family.gone_within(2.0) == []
            # The orphaned ranks were adopted by the launcher (a subreaper), and reaped by it.
            assert our_zombies() == []
        finally:
            family.kill_survivors()
    nothing_appears(tmp_path, until=killed[0] + STALLING["stall_s"] + 2)


def cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


# --- 2. a run directory is complete or visibly not -------------------------------------------

def write_run(path: Path, world: int = 2, steps: int = 2) -> None:
    """A small run directory as ``real_runs.train`` writes it: ``run.json`` and one
    ``rank<r>.json`` per rank, two layers, one bucket all-reduced per step."""
    path.mkdir(parents=True, exist_ok=True)
    memory = {"params": 4096, "grads": 4096, "optimizer": 8192, "activations": 1024, "buffers": 512}
    for rank in range(world):
        ops, samples = [], [{"step": -1, "t_s": 0.0, "category": c, "bytes": memory[c]}
                            for c in ("params", "grads", "optimizer")]
        for step in range(steps):
            t = 0.0
            for name, stream, layer, phase, dur in (
                    ("fwd L0", "compute", 0, "forward", 0.002), ("fwd L1", "compute", 1, "forward", 0.002),
                    ("bwd L1", "compute", 1, "backward", 0.004), ("bwd L0", "compute", 0, "backward", 0.004),
                    ("all_reduce B0", "comm", None, "backward", 0.003),
                    ("wait all_reduce B0", "host", None, "optimizer", 0.001),
                    ("opt all", "compute", None, "optimizer", 0.001)):
                ops.append({"rank": rank, "stream": stream, "name": name, "start_s": t, "end_s": t + dur,
                            "bytes": 4096 if stream != "compute" else 0, "layer": layer, "phase": phase,
                            "step": step})
                t += dur
            samples += [{"step": step, "t_s": 0.001, "category": "activations", "bytes": 1024},
                        {"step": step, "t_s": 0.009, "category": "activations", "bytes": 0}]
        (path / f"rank{rank}.json").write_text(json.dumps({
            "rank": rank, "world_size": world, "strategy": "ddp", "device": "cpu", "ops": ops,
            "memory_timeline": samples, "memory": memory, "step_times_s": [0.02] * steps,
            "losses": [5.0] * steps}))
    (path / "run.json").write_text(json.dumps({
        "strategy": "ddp", "world_size": world, "backend": "gloo", "device": "cpu", "model": "nano",
        "params": 1024, "global_batch": 8, "seq_len": 32, "steps": steps, "step_times_s": [0.02] * steps,
        "median_step_s": 0.02, "losses": [5.0] * steps, "memory": {str(r): memory for r in range(world)},
        "files": sorted(f"rank{r}.json" for r in range(world))}))


def test_a_rank_whose_exception_escaped_is_named_with_its_error():
    """A module without train.py's "error:" line, or an error raised in native code, still
    names the rank and what it raised, not "no rank said why"."""
    from real_runs.launch import _failure_sentence

    output = ["[rank2]: Traceback (most recent call last):",
              "[rank2]:   File \"calls.py\", line 28, in <lambda>",
              "[rank2]: RuntimeError: [rank2]:[F1123 11:38:20.821672457 ProcessGroupGloo.cpp:1537] "
              "Check failed: outputShape[0] * worldSize == inputShape[0] (262143 vs. 262144). "]
    assert _failure_sentence(1, [], output) == (
        "The run failed: rank 2 raised RuntimeError: Check failed: outputShape[0] * worldSize == "
        "inputShape[0] (262143 vs. 262144).")


@pytest.mark.slow
def test_a_run_that_fails_to_start_leaves_no_earlier_result_behind(tmp_path, monkeypatch):
    temp = tmp_path / "temp"  # the launcher's and torchrun's temporary folders go here
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    monkeypatch.setenv("TMPDIR", str(temp))
    tmp_path = tmp_path / "out"
    tmp_path.mkdir()
    write_run(tmp_path)
    (tmp_path / "trace_rank0.json").write_text("{}")
    (tmp_path / "state.pt").write_bytes(b"old")
    assert load_run(tmp_path).world_size == 2  # an earlier run, complete
    argv = ["--strategy", "ddp", "--model", "nano", "--global-batch", "3", "--out", str(tmp_path)]
    with pytest.raises(RunFailed) as failure:
        launch_argv(argv, 2, timeout_s=60)  # not checked first, as launch() would: the ranks refuse
    said = "The run failed to start: --global-batch 3 does not split evenly across 2 ranks."
    assert str(failure.value) == said
    assert sorted(os.listdir(tmp_path)) == [FAILED_FILE]
    with pytest.raises(OverlayError) as refused:
        load_run(tmp_path)
    assert str(refused.value) == (f"The run in {tmp_path} failed and cannot be overlaid; "
                                  f'it said "{said[:-1]}".')
    # torchrun's log folders (one per launch, which it never removes) went with the launch.
    assert os.listdir(temp) == []


@pytest.mark.slow
def test_torchrun_started_by_hand_with_bad_input_leaves_the_folder_marked_failed(tmp_path):
    write_run(tmp_path)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc_per_node=2", "-m", "real_runs.train", "--strategy", "ddp",
                           "--model", "nano", "--global-batch", "3", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert sorted(os.listdir(tmp_path)) == [FAILED_FILE]
    with pytest.raises(OverlayError, match="Bad input: --global-batch 3 does not split evenly"):
        load_run(tmp_path)


def test_an_out_folder_that_cannot_take_files_is_refused_before_anything_starts(tmp_path):
    (tmp_path / "a-file").write_text("")
    out = tmp_path / "a-file" / "run"
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "real_runs.train", "--strategy", "ddp", "--nproc", "2",
                           "--out", str(out)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and time.monotonic() - started < 30
    said = f"--out {out} is not writable: Not a directory; choose another folder."
    assert done.stderr.strip() == f"error: {said}"
    with pytest.raises(ValueError, match="is not writable"):
        launch("ddp", nproc=2, out=out)


def test_an_out_folder_on_a_read_only_mount_is_refused_with_one_sentence(tmp_path):
    mount = tmp_path / "ro"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(mount)],
                          capture_output=True)
    if made.returncode != 0:
        pytest.skip("this machine cannot mount a read-only tmpfs (needs root)")
    try:
        with pytest.raises(ValueError) as refused:
            launch("ddp", nproc=2, out=mount / "run", **RUN)
        assert str(refused.value) == (f"--out {mount / 'run'} is not writable: Read-only file system; "
                                      f"choose another folder.")
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_an_out_folder_without_room_is_refused(tmp_path, monkeypatch):
    import real_runs.options

    full = os.statvfs(tmp_path)
    small = os.statvfs_result((*full[:4], 10 * 2**20 // full.f_frsize, *full[5:]))
    monkeypatch.setattr(real_runs.options.os, "statvfs", lambda path: small)
    with pytest.raises(ValueError) as refused:
        launch("ddp", nproc=2, out=tmp_path, **RUN)
    assert str(refused.value) == (f"--out {tmp_path} has only 10 MB free and a run needs at least 50 MB; "
                                  f"choose another folder.")


# --- 3. load_run refuses what is damaged, in one sentence ----------------------------------------

def test_a_small_complete_run_directory_loads(tmp_path):
    write_run(tmp_path)
    run = load_run(tmp_path)
    assert run.world_size == 2 and len(run.ops) == 2 * 2 * 7 and run.peaks[1]["optimizer"] == 8192
    assert measured_step(run).step == 1


def edit(path: Path, change) -> None:
    data = json.loads(path.read_text())
    data = change(data) or data
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("file, change, says", [
    ("rank1.json", lambda d: [d], "rank1.json holds a JSON list, not an object"),
    ("rank0.json", lambda d: d.update(memory_timeline=[{"step": "two"}]),
     "rank0.json has a bad memory_timeline[0].step: input should be a valid integer"),
    ("rank0.json", lambda d: d["memory_timeline"][3].update(category="vram"),
     "rank0.json has a bad memory_timeline[3].category: input should be"),
    ("rank0.json", lambda d: d.update(step_times_s=[0.02, float("nan")]),
     "rank0.json has a bad step_times_s[1]: input should be a finite number"),
    ("rank1.json", lambda d: d["ops"][2].update(end_s=float("inf")),
     "rank1.json has a bad ops[2].end_s: input should be a finite number"),
    ("rank1.json", lambda d: d["ops"][2].update(bytes=-4),
     "rank1.json has a bad ops[2].bytes: input should be greater than or equal to 0"),
    ("rank1.json", lambda d: d.pop("ops") and None, "rank1.json has no ops field"),
    ("rank1.json", lambda d: d["ops"][0].update(rank=0),
     "rank1.json has a bad ops[0].rank: 0 in the file of rank 1"),
    ("run.json", lambda d: d.update(world_size=0),
     "run.json has a bad world_size: input should be greater than or equal to 1"),
    ("run.json", lambda d: d.update(world_size=-1),
     "run.json has a bad world_size: input should be greater than or equal to 1"),
    ("run.json", lambda d: d.update(world_size="2"),
     "run.json has a bad world_size: input should be a valid integer"),
    ("run.json", lambda d: d["memory"]["0"].update(params=float("inf")),
     "run.json has a bad memory.0.params: input should be a valid integer"),
    ("run.json", lambda d: d["memory"].update({"7": {}}), "run.json has a bad memory.7: the run had 2 ranks"),
    ("run.json", lambda d: d.update(step_times_s=[0.02]),
     "run.json has a bad step_times_s: 1 steps, but every rank recorded 2"),
    ("rank1.json", lambda d: d.update(step_times_s=[0.02]),
     "recorded different numbers of steps (rank 0 2, rank 1 1), so they cannot be overlaid"),
])
def test_a_damaged_file_is_refused_naming_the_file_and_the_field(tmp_path, file, change, says):
    write_run(tmp_path)
    edit(tmp_path / file, change)
    with pytest.raises(OverlayError) as refused:
        load_run(tmp_path)
    assert says in one_sentence(str(refused.value))


def test_rank_files_of_another_run_mixed_in_are_refused(tmp_path):
    write_run(tmp_path)
    shutil.copy(tmp_path / "rank1.json", tmp_path / "rank2.json")
    with pytest.raises(OverlayError, match="holds rank2.json but run.json says the run had 2 ranks"):
        load_run(tmp_path)


def test_a_run_that_failed_is_refused_quoting_its_sentence(tmp_path):
    write_run(tmp_path)
    reason = "The run failed: rank 1 raised RuntimeError: boom."
    (tmp_path / FAILED_FILE).write_text(json.dumps({"reason": reason}))
    with pytest.raises(OverlayError) as refused:
        load_run(tmp_path)
    assert str(refused.value) == (f"The run in {tmp_path} failed and cannot be overlaid; "
                                  f'it said "The run failed: rank 1 raised RuntimeError: boom".')
    (tmp_path / FAILED_FILE).write_text("[not json")
    with pytest.raises(OverlayError, match="failed.json is there but unreadable"):
        load_run(tmp_path)


# Fuzzing: any JSON value put anywhere in any file, keys dropped, files replaced, cut short or
# added; load_run must load the result or refuse it with one OverlayError sentence.
SCALARS = (st.none() | st.booleans() | st.integers(min_value=-2**64, max_value=2**64)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8)
           | st.sampled_from([float("nan"), float("inf"), -float("inf"), -1, 0, -0.5, "2", "", [], {}]))
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=6)


def mutate(data, draw):
    """``data`` (a parsed JSON file) with one value replaced or one key dropped, at a random depth."""
    if not isinstance(data, (dict, list)) or not data or draw(st.integers(0, 4)) == 0:
        return draw(VALUES)
    key = draw(st.sampled_from(sorted(data) if isinstance(data, dict) else range(len(data))))
    if isinstance(data, dict) and draw(st.integers(0, 5)) == 0:
        del data[key]
    else:
        data[key] = mutate(data[key], draw)
    return data


HOW = ["edit", "edit", "edit", "cut", "garbage", "remove", "extra rank"]


def fuzz_once(base: Path, data) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        shutil.copytree(base, run)
        names = sorted(f.name for f in run.glob("*.json"))
        for _ in range(data.draw(st.integers(1, 3), label="changes")):
            name = data.draw(st.sampled_from(names), label="file")
            how = data.draw(st.sampled_from(HOW), label="how")
            path = run / name
            if not path.exists():
                continue
            if how == "edit":
                try:
                    parsed = json.loads(path.read_text())
                except ValueError:  # garbled by an earlier change
                    continue
                path.write_text(json.dumps(mutate(parsed, data.draw)))
            elif how == "cut":
                raw = path.read_bytes()
                path.write_bytes(raw[:data.draw(st.integers(0, len(raw)), label="at")])
            elif how == "garbage":
                path.write_bytes(data.draw(st.binary(max_size=20), label="bytes"))
            elif how == "remove":
                path.unlink()
            elif (target := run / f"rank{data.draw(st.integers(0, 4), label='rank')}.json") != path:
                shutil.copy(path, target)
        try:
            loaded = load_run(run)
        except OverlayError as e:
            assert "\n" not in str(e) and str(e).endswith("."), str(e)
        else:
            assert loaded.world_size >= 1


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("fuzz") / "run"
    write_run(path)
    return path


@settings(max_examples=FUZZ_EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_load_run_loads_or_refuses_any_damaged_directory_in_one_sentence(synthetic, data):
    fuzz_once(synthetic, data)


@pytest.mark.slow
def test_load_run_loads_or_refuses_any_damaged_real_run_in_one_sentence():
    _, out = real_run("ddp", 2)

    @settings(max_examples=max(FUZZ_EXAMPLES // 10, 20), deadline=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(data=st.data())
    def fuzz(data):
        fuzz_once(Path(out), data)

    fuzz()
