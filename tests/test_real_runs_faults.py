"""When a run goes wrong it says so in one sentence, promptly, and leaves no result
that looks complete."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import torch
from real_runs_helpers import RUN, Descendants

from real_runs.launch import FAILED_FILE, RunFailed, launch, progress_line, supervise
from real_runs.processes import start


def train_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "real_runs.train", *args],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args, says", [
    (["--strategy", "zero4"], "Unknown strategy 'zero4'"),
    (["--strategy", "ddp", "--model", "gpt5"], "Unknown model preset 'gpt5'"),
    (["--strategy", "ddp", "--nproc", "3", "--global-batch", "8"], "does not split evenly across 3 ranks"),
    (["--strategy", "ddp", "--seq-len", "100000"], "--seq-len must be between"),
    (["--steps", "3"], "required: --strategy"),
])
def test_bad_input_is_one_sentence_and_exit_status_2(args, says):
    done = train_cli(*args)
    assert done.returncode == 2
    assert says in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


def test_the_launcher_refuses_bad_input_before_starting_anything(tmp_path):
    with pytest.raises(ValueError, match="Unknown strategy"):
        launch("zero4", nproc=2, out=tmp_path)
    assert not os.listdir(tmp_path)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given on a machine without CUDA")
def test_asking_for_cuda_without_it_is_bad_input():
    done = train_cli("--strategy", "ddp", "--device", "cuda")
    assert done.returncode == 2 and "no CUDA device" in done.stderr


def test_a_rank_error_is_found_even_after_another_process_left_its_line_unfinished():
    # Ranks and torchrun share one pipe: another process's unfinished line can sit in
    # front of the failing rank's error, which must still be named.
    script = ("import os, sys; os.write(2, b'[rank 0] lost a peer: RuntimeError'); "
              "os.write(2, b'[rank 1] error: RuntimeError: injected fault at step 1\\n'); sys.exit(1)")
    with pytest.raises(RunFailed) as failure:
        supervise([start([sys.executable, "-c", script], dict(os.environ))], timeout_s=30, grace_s=0.1)
    assert str(failure.value) == "The run failed: rank 1 raised RuntimeError: injected fault at step 1."


def test_a_progress_line_inside_a_crash_message_is_not_read_as_part_of_it():
    # faulthandler writes "Fatal Python error: Aborted" in pieces, and rank 0's progress
    # line can land between them on the shared pipe.
    script = ("import os, sys; w = lambda b: os.write(2, b); "
              f"w(b'Fatal Python error: '); w(b'{progress_line(1, 3, 5.5794, 0.013)}'); w(b'Aborted\\n\\n'); "
              f"w(b'{progress_line(2, 3, 5.1, 0.012)}\\n'); "
              "w(b'Current thread 0x1 (most recent call first):\\n  File \"train.py\", line 97 in f\\n'); "
              "w(b'  rank      : 1 (local_rank: 1)\\n  exitcode  : -6 (pid: 7) (SIGABRT)\\n'); sys.exit(1)")
    with pytest.raises(RunFailed) as failure:
        supervise([start([sys.executable, "-c", script], dict(os.environ))], timeout_s=30, grace_s=0.1)
    assert str(failure.value) == ('The run failed: rank 1 died (SIGABRT: Fatal Python error: Aborted, '
                                  'File "train.py", line 97 in f) and the other ranks were stopped.')


@pytest.mark.slow
@pytest.mark.parametrize("mode, says", [("raise", "rank 1 raised RuntimeError: injected fault at step 1"),
                                        ("kill", "rank 1 died (SIGKILL)"),
                                        # faulthandler says where a native crash happened
                                        ("abort", "rank 1 died (SIGABRT: Fatal Python error: Aborted, File")])
def test_a_failing_rank_ends_the_whole_run_with_a_clear_error(tmp_path, mode, says):
    # A previous complete run in the same place must not survive a failed one.
    (tmp_path / "run.json").write_text("{}")
    started = time.monotonic()
    with pytest.raises(RunFailed) as failure:
        launch("fsdp", nproc=2, out=tmp_path, fail_rank=1, fail_at_step=1, fail_mode=mode,
               timeout_s=120, **{**RUN, "steps": 3})
    assert time.monotonic() - started < 60
    # On a miss, what the ranks printed (the sentence is read from it) says why.
    assert says in str(failure.value), "\n".join(failure.value.output[-60:])
    assert len(str(failure.value).splitlines()) == 1
    assert not (tmp_path / "run.json").exists()
    assert json.loads((tmp_path / FAILED_FILE).read_text()) == {"reason": str(failure.value)}


@pytest.mark.slow
def test_a_run_that_outlives_its_timeout_is_stopped(tmp_path):
    # Stopped means every process it started: torchrun starts each rank in a session of its own.
    started = time.monotonic()
    with Descendants() as family:
        try:
            with pytest.raises(RunFailed, match="did not finish within"):
                launch("ddp", nproc=2, out=tmp_path, timeout_s=6, **{**RUN, "steps": 10_000})
            assert time.monotonic() - started < 20
            assert len(family.seen) >= 3, "torchrun and two ranks were running"
            assert family.gone_within(2.0) == []
        finally:
            family.kill_survivors()
    assert not (tmp_path / "run.json").exists()


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="needs a CUDA device (NCCL, CUDA events, CUDA memory stats)")
def test_one_rank_on_cuda_records_events_and_peak_memory(tmp_path):
    run = launch("fsdp", nproc=1, out=tmp_path, device="cuda", **RUN)
    assert run["backend"] == "nccl"
    assert 0 < run["memory"]["0"]["peak_allocated"] <= run["memory"]["0"]["peak_reserved"]
    assert run["gpu"]["name"] and run["gpu"]["total_memory_bytes"] > 0  # the stamp replay reads


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="needs a CUDA device (NCCL, CUDA events, CUDA memory stats)")
def test_a_bf16_run_on_cuda_holds_2_2_12_bytes_a_parameter_and_replays(tmp_path):
    from sim2real.replay import predict_run

    run = launch("zero2", nproc=1, out=tmp_path, device="cuda", precision="bf16", **RUN)
    formula = run["model_states_formula"]
    assert (formula["b"], formula["K"], run["dtype"]) == (2, 12, "bfloat16")
    assert set(formula["measured"].values()) == {formula["bytes"]}
    sim = predict_run(run)
    assert sim.scenario.cluster.backend == "nccl" and sim.scenario.training.precision == "mixed"
