"""The command line: the JSON contract, files it writes, and one sentence for bad input."""

import json
import subprocess
import sys

import pytest

from zero_sim.cli import main

CONTRACT = {"params", "strategy", "gpus", "step_time_s", "compute_time_s", "exposed_comm_s",
            "comm_overlap_fraction", "comm_volume_bytes", "phases", "memory", "tflops_per_gpu",
            "tokens_per_s"}
MEMORY = {"params_bytes", "grads_bytes", "optimizer_bytes", "model_states_bytes", "activations_bytes",
          "buffers_bytes", "peak_bytes", "capacity_bytes", "fits"}


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "zero_sim.cli", *args], capture_output=True, text=True,
                          timeout=120)


def test_simulate_json_has_the_contracted_fields(tmp_path):
    trace, plot = tmp_path / "t.json", tmp_path / "t.png"
    out = run_cli("simulate", "--model", "gpt2-124m", "--strategy", "ddp", "--gpus", "8",
                  "--topology", "pcie",
                  "--bucket-mb", "25", "--json", "--trace", str(trace), "--plot", str(plot))
    assert out.returncode == 0, out.stderr
    metrics = json.loads(out.stdout)
    assert CONTRACT <= metrics.keys()
    assert MEMORY <= metrics["memory"].keys()
    phases = metrics["phases"]
    assert set(phases) == {"forward_s", "backward_s", "optimizer_s", "optimizer_wait_s", "optimizer_update_s"}
    assert phases["optimizer_s"] == pytest.approx(phases["optimizer_wait_s"] + phases["optimizer_update_s"])
    assert plot.stat().st_size > 10_000
    chrome = json.loads(trace.read_text())
    assert chrome["distributedInfo"]["world_size"] == 8
    names = {e["name"] for e in chrome["traceEvents"] if e["ph"] == "X"}
    assert {"fwd L1", "bwd L1", "all_reduce B0"} <= names
    assert {e["args"]["stream"] for e in chrome["traceEvents"] if e["ph"] == "X"} >= {"compute", "comm"}


@pytest.mark.parametrize("args,sentence", [
    (["simulate", "--model", "gpt5"], "unknown model preset 'gpt5'"),
    (["simulate", "--topology", "moon"], "unknown topology preset 'moon'"),
    (["simulate", "--gpus", "0"], "--gpus must be a positive integer"),
    (["simulate", "--micro-batch", "-2"], "--micro-batch must be a positive integer"),
    (["simulate", "--gpus", "12", "--gpus-per-node", "8"], "not divisible by --gpus-per-node 8"),
    (["simulate", "--strategy", "ddp", "--prefetch", "2"], "--prefetch applies to zero3"),
    (["simulate", "--strategy", "zero9"], "unknown strategy 'zero9'"),
    (["simulate", "--gpus", "many"], "--gpus must be a whole number, got 'many'"),
])
def test_bad_input_is_one_sentence_and_exit_status_2(capsys, args, sentence):
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert sentence in err
    assert "Traceback" not in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("flag,name", [("--plot", "x.png"), ("--trace", "t.json"), ("--trace-dir", "traces")])
def test_an_output_into_a_directory_that_is_not_there_is_refused_and_nothing_is_created(
        tmp_path, capsys, flag, name):
    """A typo in a directory name is a bad path like any other: refused before simulating, and no
    directory appears (a directory named for outputs, as --trace-dir's, is created, not its parents)."""
    missing = tmp_path / "nonexistent" / "dir"
    assert main(["simulate", "--gpus", "2", "--seq-len", "128", flag, str(missing / name)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"zero-sim: cannot write {missing / name}: ") and len(err.splitlines()) == 1
    assert "does not exist" in err
    assert list(tmp_path.iterdir()) == []


def test_a_directory_named_for_outputs_is_created_when_its_parent_exists(tmp_path, capsys):
    assert main(["simulate", "--gpus", "2", "--seq-len", "128", "--trace-dir", str(tmp_path / "traces")]) == 0
    assert sorted(p.name for p in (tmp_path / "traces").iterdir()) == ["rank-0.pt.trace.json",
                                                                      "rank-1.pt.trace.json"]
    assert main(["demo", "--out", str(tmp_path / "no" / "such")]) == 2
    assert "does not exist" in capsys.readouterr().err and not (tmp_path / "no").exists()


def test_a_malformed_nccl_tests_file_is_refused(tmp_path, capsys):
    bad = tmp_path / "bad.txt"
    bad.write_text("hello\nworld\n")
    assert main(["fit-nccl-tests", str(bad)]) == 2
    assert "no nccl-tests rows found" in capsys.readouterr().err


def test_fitting_seed_002_from_the_command_line(data_dir):
    out = run_cli("fit-nccl-tests", str(data_dir / "seed002_pcie_pair.txt"), "--json")
    fit = json.loads(out.stdout)
    assert fit["n_ranks"] == 2 and 19 < fit["busbw_gbps"] < 21


def test_a_model_that_does_not_fit_exits_0_and_says_by_how_much():
    out = run_cli("simulate", "--model", "gpt3-175b", "--gpus", "8", "--micro-batch", "1", "--json")
    assert out.returncode == 0
    mem = json.loads(out.stdout)["memory"]
    assert mem["fits"] is False and mem["shortfall_bytes"] > 0


def test_a_host_bound_step_says_how_long_the_gpu_waits_and_what_to_change(capsys):
    # A small model, one sequence per GPU, HF Trainer's eager host: the H100s wait for launches.
    small = ["simulate", "--model", "gpt2-124m", "--strategy", "ddp", "--gpus", "8", "--topology", "dgx-h100",
             "--micro-batch", "1", "--stack", "hf-trainer"]
    assert main(small) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "host-bound" in x)
    assert "torch.compile" in line and "larger micro-batch" in line
    assert main([*small, "--json"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert 0.05 * metrics["step_time_s"] < metrics["gpu_waiting_for_host_s"] < metrics["step_time_s"]
    # With eight sequences of a 1.5B model each launch carries enough work: nothing to say.
    assert main(["simulate", "--model", "gpt2-1.5b", "--strategy", "ddp", "--gpus", "8", "--topology",
                 "dgx-a100", "--micro-batch", "8"]) == 0
    assert "host-bound" not in capsys.readouterr().out


def test_python_api_returns_the_same_dict():
    from zero_sim import simulate

    out = run_cli("simulate", "--model", "gpt2-124m", "--gpus", "4", "--strategy", "zero2", "--json")
    assert json.loads(out.stdout)["step_time_s"] == pytest.approx(
        simulate(model="gpt2-124m", gpus=4, strategy="zero2").metrics["step_time_s"])


def test_a_garbled_nccl_tests_row_is_refused_naming_its_line(tmp_path, capsys, data_dir):
    table = tmp_path / "table.txt"
    table.write_text((data_dir / "seed002_pcie_pair.txt").read_text().replace("947.6", "94x.6"))
    assert main(["fit-nccl-tests", str(table)]) == 2
    err = capsys.readouterr().err.strip()
    assert "line 4 of the nccl-tests output has '94x.6'" in err and len(err.splitlines()) == 1


def test_demo_writes_a_picture_and_a_trace_and_says_where(tmp_path, capsys):
    out = tmp_path / "new"
    assert main(["demo", "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert f"wrote {out / 'demo_timeline.png'} and {out / 'demo_trace.json'}" in said
    assert (out / "demo_timeline.png").read_bytes()[:4] == b"\x89PNG"
    assert json.loads((out / "demo_trace.json").read_text())["traceEvents"]
    assert sorted(p.name for p in out.iterdir()) == ["demo_timeline.png", "demo_trace.json"]


def test_the_single_file_trace_numbers_ranks_from_pid_1_and_joins_each_collective_across_them(tmp_path):
    # Perfetto reads pid 0 as the kernel's idle process; flows draw one collective as one arrow chain.
    trace_path = tmp_path / "step.json"
    assert main(["simulate", "--strategy", "zero2", "--gpus", "4", "--seq-len", "128",
                 "--trace", str(trace_path)]) == 0
    events = json.loads(trace_path.read_text())["traceEvents"]
    assert {e["pid"] for e in events if e["ph"] == "X"} == {1, 2, 3, 4}
    starts = [e for e in events if e["ph"] == "s"]
    ends = {e["id"]: e for e in events if e["ph"] == "f"}
    assert starts and all(e["id"] in ends and ends[e["id"]]["bp"] == "e" for e in starts)
    # Four ranks: each collective instance is a chain of three arrows, rank r to rank r + 1.
    assert all(ends[e["id"]]["pid"] == e["pid"] + 1 for e in starts)
    assert len(starts) % 3 == 0
