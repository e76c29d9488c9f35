"""Calibrating from the user's own profiler traces, starting with a real one: DDP on two A100s."""

import gzip
import json
import shutil
from pathlib import Path

import pytest

from sim2real.cli import main as zero_sim
from zero_sim import simulate
from zero_sim.calibration import Calibration
from zero_sim.calibration.format import CalibrationError
from zero_sim.calibration.from_traces import calibration_from_traces, run_facts

A100_TRACE = Path(__file__).parent / "data" / "hta_a100_ddp" / "rank-0.json.gz"


@pytest.fixture(scope="module")
def findings():
    return calibration_from_traces([A100_TRACE])


def nccl_kernels():
    events = json.load(gzip.open(A100_TRACE))["traceEvents"]
    return [e for e in events if e.get("cat") == "kernel" and e["name"].startswith("nccl")]


def test_the_device_properties_choose_the_gpu_preset(findings):
    # The trace names an "A100-PG509-200" with 42.3 GB: the 40 GB part.
    assert findings.gpu == "A100-40GB"
    assert findings.ranks == [0] and findings.steps == 3


def test_every_sized_all_reduce_kernel_feeds_a_fit_over_its_group(findings):
    sized = [k for k in nccl_kernels() if k["args"].get("Collective name") == "allreduce"]
    assert findings.collectives["all_reduce"]["calls"] == len(sized) == 15
    fit = findings.calibration.collectives["all_reduce"]
    assert fit.world_size == 2
    # nccl-tests' size convention: elements x 4 bytes of float, the fastest call of each size.
    assert sorted(fit.sizes) == sorted({4 * k["args"]["In msg nelems"] for k in sized})
    for size, seconds in zip(fit.sizes, fit.times_s, strict=True):
        fastest = min(k["dur"] for k in sized if 4 * k["args"]["In msg nelems"] == size) * 1e-6
        assert seconds == pytest.approx(fastest)
        assert fit.time(size) == pytest.approx(seconds, rel=fit.max_rel_error + 1e-9)
    assert 1e9 < fit.busbw < 300e9 and fit.latency_s >= 0


def test_kernel_time_is_split_by_phase_and_by_kind(findings):
    # A convolutional network's backward pass does about twice its forward pass's work.
    phases = findings.phases_ms
    assert {"forward", "backward", "optimizer"} <= phases.keys()
    assert 1.5 < phases["backward"] / phases["forward"] < 4
    mix = findings.kernel_mix_ms
    assert {"GEMM and convolution", "communication", "normalisation", "optimizer"} <= mix.keys()
    assert sum(phases.values()) == pytest.approx(sum(mix.values()), rel=1e-6)
    assert 0 < findings.idle_compute_ms < findings.step_ms


def test_the_report_says_what_it_could_not_find(findings):
    report = findings.report()
    assert "A100-40GB" in report and "all_reduce n=2" in report
    assert "not found: per-layer times" in report and "slower (the same kernels" in report


def test_the_file_written_is_one_the_simulator_reads(tmp_path, capsys):
    out = tmp_path / "cal.json"
    assert zero_sim(["calibrate", "--from-trace", str(A100_TRACE), "--out", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    cal = Calibration.load(out)
    assert cal.measured_on["traces"] == [A100_TRACE.name] and cal.measured_on["gpu"] == "A100-40GB"
    fit = cal.collectives["all_reduce"]
    with_trace = simulate(model="gpt2-124m", strategy="ddp", gpus=2, topology="p4d-efa", calibration=str(out))
    plain = simulate(model="gpt2-124m", strategy="ddp", gpus=2, topology="p4d-efa")
    # Two ranks' all-reduces now cost what the trace measured, not what the preset's links say.
    assert with_trace.metrics["comm_time_s"] != pytest.approx(plain.metrics["comm_time_s"], rel=0.01)
    first = next(op for op in with_trace.ops if op["name"].startswith("all_reduce") and op["rank"] == 0)
    assert first["end_s"] - first["start_s"] >= fit.latency_s


def test_a_folder_of_traces_is_read_whole(tmp_path):
    shutil.copy(A100_TRACE, tmp_path / "rank-0.pt.trace.json.gz")
    assert calibration_from_traces([tmp_path]).collectives["all_reduce"]["calls"] == 15


def test_kernels_without_message_sizes_say_why_there_is_no_collective_fit(tmp_path):
    data = json.load(gzip.open(A100_TRACE))
    for e in data["traceEvents"]:
        for key in ("In msg nelems", "Out msg nelems", "Group size"):
            e.get("args", {}).pop(key, None)
    older = tmp_path / "older.json"
    older.write_text(json.dumps(data))
    found = calibration_from_traces([older])
    assert found.calibration.collectives == {}
    assert any("NCCL message sizes" in why for why in found.not_found)


def test_older_traces_give_sizes_on_c10ds_op_around_the_launch_instead_of_the_kernel(tmp_path, findings):
    # PyTorch before the kernels carried their sizes recorded them on record_param_comms, the CPU op
    # around the collective's launch; the fit comes out the same from there.
    data = json.load(gzip.open(A100_TRACE))
    for e in data["traceEvents"]:
        if e.get("cat") == "kernel":
            for key in ("Collective name", "In msg nelems", "Out msg nelems", "Group size", "dtype"):
                e.get("args", {}).pop(key, None)
    older = tmp_path / "older.json"
    older.write_text(json.dumps(data))
    fit, again = findings.calibration.collectives["all_reduce"], calibration_from_traces([older])
    assert again.calibration.collectives["all_reduce"] == fit


def test_compute_beside_nccl_kernels_is_compared_with_the_same_kernels_alone(findings, tmp_path):
    # The same kernel with the same grid and block, alone and while an all-reduce runs beside it.
    slowdown = findings.calibration.overlap_slowdown
    assert findings.overlap_configs >= 5 and 0.0 <= slowdown < 0.35
    findings.calibration.save(tmp_path / "cal.json")
    cal = Calibration.load(tmp_path / "cal.json")
    assert cal.overlap_slowdown == slowdown
    # The simulator takes it for this GPU's compute beside communication, unless told otherwise.
    from zero_sim.scenario import prepare, rank_figures

    given = prepare(model="gpt2-124m", gpus=2, topology="p4d-efa", calibration=cal)
    assert rank_figures(given).overlap_slowdown == slowdown
    told = prepare(model="gpt2-124m", gpus=2, topology="p4d-efa", calibration=cal, overlap_slowdown=0.2)
    assert rank_figures(told).overlap_slowdown == 0.2


def test_zeroing_the_gradients_is_not_the_optimizer(findings):
    # Optimizer.zero_grad opens each step; the update (Optimizer.step) closes it.
    assert findings.optimizer_ms < 0.2 * findings.step_ms


@pytest.mark.parametrize("content, fragment", [
    (b'{"a": 1}', "not a PyTorch profiler trace"),
    (b'{"traceEvents": [', "not complete JSON"),
    (b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::add", "ts": 0, "dur": 1}]}',
     "hold no GPU kernels"),
])
def test_what_is_not_a_gpu_trace_is_one_sentence_and_status_2(tmp_path, capsys, content, fragment):
    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    with pytest.raises(CalibrationError, match=fragment):
        calibration_from_traces([bad])
    assert zero_sim(["calibrate", "--from-trace", str(bad), "--out", str(tmp_path / "c.json")]) == 2
    err = capsys.readouterr().err
    assert fragment in err and err.count("\n") == 1 and not (tmp_path / "c.json").exists()


def test_a_truncated_download_and_a_missing_path_are_told_apart(tmp_path):
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(A100_TRACE.read_bytes()[:5000])
    with pytest.raises(CalibrationError, match="truncated"):
        calibration_from_traces([cut])
    with pytest.raises(CalibrationError, match="does not exist"):
        calibration_from_traces([tmp_path / "nowhere.json"])


def test_a_cuda_graphs_kernels_belong_to_the_region_of_its_one_launch(tmp_path):
    # A replayed CUDA graph is one cudaGraphLaunch; CUPTI gives each of its kernels that launch's
    # correlation id, so they land in the phase and the layer around the launch, on two streams.
    def x(cat, name, ts, dur, tid=1, **args):
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": tid, "args": args}

    events = [x("user_annotation", "ProfilerStep#1", 0, 1000),
              x("user_annotation", "## forward ##", 0, 400), x("user_annotation", "fwd L0", 10, 30),
              x("user_annotation", "fwd L1", 50, 300), x("user_annotation", "fwd L2", 360, 30),
              x("cuda_runtime", "cudaLaunchKernel", 12, 5, correlation=1),
              x("cuda_runtime", "cudaGraphLaunch", 60, 20, correlation=2),
              x("cuda_runtime", "cudaLaunchKernel", 362, 5, correlation=3),
              x("user_annotation", "## backward ##", 400, 500),
              x("kernel", "embedding_kernel", 20, 10, tid=7, correlation=1, stream=7),
              *[x("kernel", f"ampere_gemm_{i}", 100 + 60 * i, 50, tid=7 + i % 2, correlation=2,
                  stream=7 + i % 2) for i in range(4)],
              x("kernel", "head_gemm", 380, 10, tid=7, correlation=3, stream=7)]
    trace = tmp_path / "graphs.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    found = calibration_from_traces([trace], tokens=128)
    assert found.phases_ms == {"forward": pytest.approx(0.22)}
    assert found.layer_ms["block"]["fwd"] == pytest.approx(0.2)  # the graph's four kernels in fwd L1
    # Only forward spans were labelled: the report says what backward was taken as.
    assert "forward only" in found.layers_note and found.layer_ms["block"]["bwd"] == pytest.approx(0.4)


def labelled_cpu_trace(path: Path, layers: int = 4, steps: int = 3) -> Path:
    """A CPU trace as real_runs --trace writes one: fwd/bwd spans per layer, layer i taking i+1 ms."""
    events, t = [], 0.0
    for step in range(steps):
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "ts": t,
                       "dur": 1e5, "pid": 1, "tid": 1})
        for direction, scale in (("fwd", 1.0), ("bwd", 2.0)):
            for i in range(layers):
                dur = (i + 1) * 1e3 * scale * (1.1 if step == 1 else 1.0)  # one slower step: medians
                events.append({"ph": "X", "cat": "user_annotation", "name": f"{direction} L{i}", "ts": t,
                               "dur": dur, "pid": 1, "tid": 1})
                t += dur
        t = (step + 1) * 1e5
    path.write_text(json.dumps({"traceEvents": events, "distributedInfo": {"rank": 0, "world_size": 2}}))
    return path


def test_labelled_layers_become_the_compute_block_by_kind(tmp_path):
    found = calibration_from_traces([labelled_cpu_trace(tmp_path / "rank0.json")], tokens=512)
    compute = found.calibration.compute
    # Layer 0 the embedding (1 ms), the last the head (4 ms), blocks the mean of layers 1 and 2.
    assert compute.layer_seconds["embedding"] == pytest.approx({"fwd": 1e-3, "bwd": 2e-3})
    assert compute.layer_seconds["block"] == pytest.approx({"fwd": 2.5e-3, "bwd": 5e-3})
    assert compute.layer_seconds["head"] == pytest.approx({"fwd": 4e-3, "bwd": 8e-3})
    assert compute.tokens == 512 and found.device_note.startswith("CPU")
    assert any("gloo" in why for why in found.not_found)
    # Without the tokens they computed at, the times are reported but not used.
    unsized = calibration_from_traces([tmp_path / "rank0.json"])
    assert unsized.calibration.compute is None and unsized.layer_ms["block"]["fwd"] == pytest.approx(2.5)
    assert any("--tokens" in why for why in unsized.not_found)


@pytest.mark.slow
def test_a_real_runs_trace_calibrates_its_layers_at_the_tokens_of_its_run_json(tmp_path, capsys):
    from real_runs.launch import launch
    from sim2real.overlay import load_run
    from sim2real.replay import predict_run

    launch("ddp", nproc=2, out=tmp_path / "run", model="tiny", steps=5, global_batch=8, trace=True)
    found = calibration_from_traces([tmp_path / "run" / "traces"])
    assert found.ranks == [0, 1]
    compute = found.calibration.compute
    assert compute.tokens == 8 // 2 * 64  # global batch over ranks, times the tiny model's 64 tokens
    assert compute.layer_seconds["block"]["bwd"] > compute.layer_seconds["block"]["fwd"] > 0
    # The traced run replayed from its own trace's layer times.
    out = tmp_path / "cal.json"
    found.calibration.save(out)
    replayed = predict_run(load_run(tmp_path / "run").run, str(out))
    fwd = sum(op["end_s"] - op["start_s"] for op in replayed.step_ops(0) if op["name"].startswith("fwd L"))
    blocks = len([op for op in replayed.step_ops(0) if op["name"].startswith("fwd L")]) - 2
    traced = sum(compute.layer_seconds[k]["fwd"] for k in ("embedding", "head")) \
        + blocks * compute.layer_seconds["block"]["fwd"]
    assert fwd == pytest.approx(traced, rel=0.25)
    # validate --trace: the same replay, with the error per phase printed before any what-if.
    assert zero_sim(["validate", "--trace", str(tmp_path / "run"), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    phases = {row["phase"]: row for row in printed["phases"]}
    assert {"step time", "compute", "forward", "backward"} <= phases.keys()
    assert abs(phases["forward"]["error"]) < 0.5 and printed["summary"]["measured_step_s"] > 0


@pytest.mark.slow
def test_a_two_rank_trace_predicts_the_four_rank_run_on_the_emulated_cluster(tmp_path, figures):
    from real_runs.cluster import ClusterShape, launch_in_cluster, unavailable_reason
    from sim2real.replay import predict_run

    if (why := unavailable_reason()) is not None:
        pytest.skip(why)
    shape, run = ClusterShape("uniform", 10.0), dict(model="tiny", steps=8, global_batch=8)
    two = launch_in_cluster("ddp", 2, tmp_path / "two", shape, trace=True, **run)
    four = launch_in_cluster("ddp", 4, tmp_path / "four", shape, **run)
    calibration = calibration_from_traces([tmp_path / "two" / "traces"]).calibration
    compute = calibration.compute
    assert (compute.ranks, compute.cores) == (2, two["cores"])
    from_trace, preset = predict_run(four, calibration), predict_run(four)
    itself = predict_run(two, calibration)

    def error(sim, measured):
        return sim.metrics["step_time_s"] / measured["median_step_s"] - 1

    figures(f"2 ranks from their own trace: {error(itself, two):+.0%}",
            f"4 ranks from the 2-rank trace: {error(from_trace, four):+.0%}; "
            f"from the CPU preset: {error(preset, four):+.0%} "
            f"(measured {four['median_step_s'] * 1e3:.1f} ms, {four['cores']} cores)")
    # Four ranks compute half the tokens each; on fewer cores than ranks they also take turns.
    block = next(op for op in from_trace.step_ops(0) if op["name"] == "fwd L2" and op["rank"] == 0)
    turns = max(1.0, 4 / two["cores"]) / max(1.0, 2 / two["cores"])
    expected = compute.layer_seconds["block"]["fwd"] / 2 * turns
    assert block["end_s"] - block["start_s"] == pytest.approx(expected, rel=0.05)
    # The traced run itself: its compute is the trace's; its communication's CPU cost on cores the
    # ranks share is not in a trace (a collective sweep measures it), and this box's speed drifts,
    # hence the margin (runs seen: -9% to -32%).
    assert abs(error(itself, two)) < 0.5


def test_without_labels_the_layers_come_from_module_annotations(tmp_path):
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    from real_runs.model import build_model
    from real_runs.presets import PRESETS

    # A user's own loop, profiled with with_stack and with_modules and no record_function labels.
    cfg = PRESETS["tiny"]
    model, tokens = build_model(cfg, 0, torch.device("cpu")), torch.randint(0, cfg.vocab, (4, cfg.max_seq))
    trace = tmp_path / "trace.json"
    with profile(activities=[ProfilerActivity.CPU], with_stack=True, with_modules=True,
                 schedule=schedule(wait=0, warmup=1, active=2, repeat=1),
                 on_trace_ready=lambda p: p.export_chrome_trace(str(trace))) as prof:
        for _ in range(3):
            model(tokens, tokens).backward()
            prof.step()
    found = calibration_from_traces([trace], tokens=4 * cfg.max_seq)
    assert "Block as the blocks" in found.layers_note and "forward only" in found.layers_note
    block = found.calibration.compute.layer_seconds["block"]
    # No module marks backward: it is taken as twice the forward (a CPU trace has no phases).
    assert block["fwd"] > 0 and block["bwd"] == pytest.approx(2 * block["fwd"])
    assert "layers: from module annotations" in found.report()


def test_validate_trace_wants_a_traced_real_run(tmp_path, capsys):
    assert zero_sim(["validate", "--trace", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "is not a traced real run" in err and "--from-trace" in err and err.count("\n") == 1


def test_a_large_trace_is_streamed_keeping_only_what_a_calibration_reads(tmp_path):
    import tracemalloc

    from zero_sim.calibration.trace_reading import read_trace

    # 100,000 host operator events (what fills real traces) beside one kernel: about 15 MB.
    ops = ",".join(json.dumps({"ph": "X", "cat": "cpu_op", "name": f"aten::op_{i % 97}", "ts": i, "dur": 1,
                               "pid": 1, "tid": 1, "args": {"Input Dims": [[1024, 1024]], "Ev Idx": i}})
                   for i in range(100_000))
    kernel = {"ph": "X", "cat": "kernel", "name": "ampere_sgemm", "ts": 5, "dur": 3, "pid": 0, "tid": 7,
              "args": {"correlation": 9, "stream": 7, "registers per thread": 32}}
    big = tmp_path / "big.json"
    big.write_text('{"distributedInfo": {"rank": 3}, "traceEvents": ['
                   + ops + "," + json.dumps(kernel) + "]}")
    seen = []
    tracemalloc.start()
    data = read_trace(big, on_progress=lambda done, total: seen.append((done, total)))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert data["distributedInfo"] == {"rank": 3}
    assert data["traceEvents"] == [{**kernel, "args": {"correlation": 9, "stream": 7}}]
    assert peak < big.stat().st_size / 8  # json.load would hold every event: several times the file
    assert seen[-1] == (big.stat().st_size, big.stat().st_size)
    assert all(a[0] <= b[0] for a, b in zip(seen, seen[1:], strict=False))


def test_a_lora_runs_optimizer_updates_its_adapters_alone(tmp_path):
    # run.json of a LoRA fine-tune: 1,000 weights, 16 of them trainable, on 2 ranks.
    traces = tmp_path / "traces"
    traces.mkdir()
    for strategy, updated in (("ddp", 16), ("zero2", 8)):
        run = {"world_size": 2, "params": 1000, "trainable_params": 16, "strategy": strategy}
        (tmp_path / "run.json").write_text(json.dumps(run))
        assert run_facts(traces).params_updated == updated
