"""Calibration: measured collective and layer times, saved in one file, change what the simulator predicts."""

import json
import math
from dataclasses import replace

import pytest

from zero_sim.calibration import (
    Calibration,
    CalibrationError,
    CollectiveFit,
    ComputeCalibration,
    CpuCalibration,
    compute_from_layers,
    cpu_from_sweep,
    fit_nccl_tests_text,
    fit_sweep,
    topology_from_imports,
)
from zero_sim.calibration.fit import paces_under_compute, per_call_pace, streaming_pace
from zero_sim.engine.groups import process_groups
from zero_sim.scenario import ScenarioError, simulate
from zero_sim.system.collectives import CollectiveModel, bus_factor
from zero_sim.system.nccl_tests import parse_nccl_tests
from zero_sim.system.topology import build_topology


@pytest.mark.parametrize("table", ["seed002_pcie_pair.txt", "seed002_host_bridge.txt"])
def test_a_calibration_from_seed_002_reproduces_every_measured_size_within_5_percent(
        data_dir, table, figures):
    text = (data_dir / table).read_text()
    fit = fit_nccl_tests_text(text, "all_reduce")
    rows = parse_nccl_tests(text).rows
    errors = [fit.time(r.size_bytes) / (r.time_us * 1e-6) - 1 for r in rows]
    figures(f"{table}: {fit.latency_s * 1e6:.0f} us + {fit.busbw / 1e9:.2f} GB/s; worst error "
            f"{max(map(abs, errors)):.1%} over {len(rows)} sizes "
            f"({rows[0].size_bytes:,} to {rows[-1].size_bytes:,} B)")
    assert max(map(abs, errors)) <= 0.05


def sweep_rows(kind, n, latency_s, busbw, sizes):
    return [{"collective": kind, "size_bytes": s,
             "time_us": (latency_s + bus_factor(kind, n) * s / busbw) * 1e6,
             "algbw_gbps": 0.0, "busbw_gbps": 0.0} for s in sizes]


def test_a_sweep_fit_reads_latency_from_small_sizes_and_bandwidth_from_large_ones():
    sizes = [4096 << i for i in range(14)]  # 4 KB .. 32 MB
    rows = (sweep_rows("all_reduce", 4, 300e-6, 0.5e9, sizes)
            + sweep_rows("all_gather", 4, 200e-6, 0.8e9, sizes))
    fits = fit_sweep(rows, 4)
    assert set(fits) == {"all_reduce", "all_gather"}
    assert fits["all_reduce"].latency_s == pytest.approx(300e-6, rel=0.05)
    assert fits["all_reduce"].busbw == pytest.approx(0.5e9, rel=0.01)
    assert fits["all_gather"].busbw == pytest.approx(0.8e9, rel=0.01)
    assert fits["all_reduce"].max_rel_error < 0.05


def test_the_latency_is_the_mean_small_call_so_slow_spells_count_but_one_disturbed_row_does_not():
    """A step pays the sum of its small calls: rows caught in a slow spell raise the latency,
    while the slowest row (here one that lost the CPU to something else) and the fastest are dropped."""
    sizes = [1024 << i for i in range(16)]  # 1 KB .. 32 MB
    rows = sweep_rows("all_gather", 2, 0.0, 0.25e9, sizes)
    spells = [0.5e-3, 0.5e-3, 2.5e-3, 0.5e-3, 0.4e-3, 80e-3]  # the six sizes up to 32 KB
    for row, extra in zip(rows, spells, strict=False):
        row["time_us"] += extra * 1e6
    latency = fit_sweep(rows, 2)["all_gather"].latency_s
    assert latency == pytest.approx((0.5e-3 + 0.5e-3 + 2.5e-3 + 0.5e-3) / 4, rel=0.02)


def test_small_calls_timed_queued_give_the_latency_a_call_pays_behind_another():
    """An idle sweep times each small size alone and queued back to back; the queued times
    give their own latency, read the same way (less the bytes' share, a trimmed mean).
    A sweep without queued times (one written before they were measured) gives none."""
    sizes = [1024 << i for i in range(16)]  # 1 KB .. 32 MB
    rows = sweep_rows("reduce_scatter", 4, 7e-3, 0.05e9, sizes)
    for row in rows:
        if row["size_bytes"] <= 64 << 10:
            row["queued_time_us"] = row["time_us"] - 1.8e3  # queued: 1.8 ms less per call
    fit = fit_sweep(rows, 4)["reduce_scatter"]
    assert fit.latency_s == pytest.approx(7e-3, rel=0.01)
    assert fit.queued_latency_s == pytest.approx(5.2e-3, rel=0.01)
    for row in rows:
        row.pop("queued_time_us", None)
    assert fit_sweep(rows, 4)["reduce_scatter"].queued_latency_s is None


def test_a_sweep_with_one_size_cannot_be_fitted():
    with pytest.raises(CalibrationError, match="fewer than two sizes"):
        fit_sweep(sweep_rows("all_reduce", 2, 1e-4, 1e9, [1 << 20]), 2)


def test_a_sweep_of_latency_bound_sizes_only_asks_for_larger_ones():
    # Up to 64 KB every call costs its latency: times that do not grow with size hold no bandwidth.
    rows = sweep_rows("all_reduce", 2, 1e-3, 1e15, [1024 << i for i in range(7)])
    with pytest.raises(CalibrationError, match=r"reaches only 65,536 bytes.*at least 1M \(--max-bytes\)"):
        fit_sweep(rows, 2)


def calibration(n=2, latency_s=1e-3, busbw=50e6):
    fits = {k: CollectiveFit(k, n, latency_s, busbw, 0.0)
            for k in ("all_reduce", "reduce_scatter", "all_gather")}
    compute = ComputeCalibration({"embedding": {"fwd": 1e-3, "bwd": 2e-3},
                                  "block": {"fwd": 10e-3, "bwd": 20e-3},
                                  "head": {"fwd": 5e-3, "bwd": 10e-3}}, 4096, 1e-8, n, 2, 1.1, "small")
    return Calibration(fits, compute, "gloo", {"host": "test"})


def test_a_calibrated_collective_costs_exactly_its_fit_when_alone():
    cal = calibration()
    topo = build_topology("emu-uniform", 2, 1).with_bandwidth(1.0)
    model = CollectiveModel(topo, "gloo", "auto", cal)
    plan = model.plan("all_reduce", 8e6, process_groups(topo, "world"))
    assert plan.algorithm == "calibrated"
    assert plan.isolated_time(topo) == pytest.approx(cal.collectives["all_reduce"].time(8e6))


def test_from_1_mb_a_calibrated_collective_alone_takes_what_the_sweep_measured():
    # Per-byte cost that grows with size: the fitted line misses the large sizes, the plan does not.
    sizes = [4096 << i for i in range(14)]  # 4 KB .. 32 MB
    rows = sweep_rows("all_reduce", 2, 1e-3, 50e6, sizes)
    for r in rows:
        r["time_us"] *= 1 + 0.2 * max(0.0, math.log2(r["size_bytes"] / (1 << 20))) / 5  # +20% at 32 MB
    fit = fit_sweep(rows, 2)["all_reduce"]
    measured = {r["size_bytes"]: r["time_us"] * 1e-6 for r in rows}
    cal = replace(calibration(), collectives={"all_reduce": fit})
    topo = build_topology("emu-uniform", 2, 1).with_bandwidth(10.0)
    model = CollectiveModel(topo, "gloo", "auto", cal)

    def alone(nbytes):
        return model.plan("all_reduce", nbytes, process_groups(topo, "world")).isolated_time(topo)

    assert fit.max_rel_error > 0.05
    for s in (1 << 20, 4 << 20, 32 << 20):
        assert alone(s) == pytest.approx(measured[s])
    between = 6 << 20  # log-log between 4 MB and 8 MB
    assert measured[4 << 20] < alone(between) < measured[8 << 20]
    assert alone(64 << 10) == pytest.approx(fit.time(64 << 10))  # small sizes: the fit
    assert alone(64 << 20) == pytest.approx(fit.time(64 << 20))  # beyond the sweep: the fit


def test_calibrated_or_not_gloo_runs_two_collectives_of_a_stream_at_once():
    topo = build_topology("emu-uniform", 2, 1)
    assert CollectiveModel(topo, "gloo", "auto", calibration()).in_flight == 2
    assert CollectiveModel(topo, "gloo", "auto").in_flight == 2
    assert CollectiveModel(topo, "nccl", "auto", calibration()).in_flight == 1


def test_two_large_calibrated_calls_in_flight_together_take_as_long_as_one_after_the_other():
    # 50 MB/s of busbw on a 1 Gbit/s link: the measured rate, not the wire, limits a call.  A
    # second gloo thread overlaps the calls but adds no throughput: they split the measured rate.
    from zero_sim.engine.engine import Engine
    from zero_sim.engine.program import ProgramBuilder
    from zero_sim.engine.run_types import EngineConfig

    cal = calibration(latency_s=1e-3, busbw=50e6)
    topo = build_topology("emu-uniform", 2, 1).with_bandwidth(1.0)
    model = CollectiveModel(topo, "gloo", "auto", cal)
    b = ProgramBuilder()
    for k in range(2):
        b.collective("all_reduce", f"all_reduce B{k}", 8e6, "backward", deps=())
    out = Engine(b.build(), topo, model, EngineConfig(steps=1, host_overhead_s=0.0)).run()
    last = max(r.end_s for r in out.records)
    alone = cal.collectives["all_reduce"].time(8e6)
    assert last == pytest.approx(2 * alone, rel=0.01)


def test_a_calibrated_gloo_reduce_scatter_loads_the_link_with_an_all_reduces_bytes():
    # gloo reduce-scatters by all-reducing: alone it takes its fitted time, but the link
    # sees twice a reduce-scatter's bytes, so two at once cannot both run at full speed.
    cal = calibration(latency_s=0.0, busbw=50e6)  # 100 MB/s on the wire: within the 1 Gbit/s link
    topo = build_topology("emu-uniform", 2, 1).with_bandwidth(1.0)
    plan = CollectiveModel(topo, "gloo", "auto", cal).plan("reduce_scatter", 8e6,
                                                           process_groups(topo, "world"))
    (stage,) = plan.stages
    assert stage.edge_bytes == pytest.approx(bus_factor("all_reduce", 2) * 8e6)
    assert plan.isolated_time(topo) == pytest.approx(cal.collectives["reduce_scatter"].time(8e6))


def cpu_rows(call_cpu_s, streaming_cores):
    """An idle sweep whose calls use ``call_cpu_s`` of CPU each, plus, beyond 64 KB,
    ``streaming_cores`` of a core for as long as they are in flight."""
    rows = []
    for size in [1024 << i for i in range(14)]:
        t = 1e-3 + size / 100e6
        cpu = call_cpu_s + (streaming_cores * t if size > 64 << 10 else 0.0)
        rows.append({"collective": "all_reduce", "size_bytes": size, "time_us": t * 1e6, "cpu_us": cpu * 1e6})
    return rows


def test_what_a_collective_costs_compute_comes_from_the_cpu_time_its_calls_used():
    # Two ranks on two cores: each rank's compute owns a core, so what gloo's threads use comes
    # out of it whole.  A call's 200 us is lost once; a tenth of a core while streaming leaves
    # 2 - 2 * 0.1 = 1.8 cores to the two ranks' compute: 11% slower.
    two = cpu_from_sweep(cpu_rows(200e-6, 0.1), 2, cores=2)
    assert two.collective_cpu_s == pytest.approx(200e-6)
    assert two.overlap_slowdown == pytest.approx(2 / 1.8 - 1)
    assert (two.call_cpu_s, two.ranks, two.cores) == (pytest.approx(200e-6), 2, 2)
    assert two.streaming_cores == pytest.approx(0.1, rel=1e-6)
    # Four ranks on two cores: the four ranks' threads take twice a call's CPU from each rank's share.
    four = cpu_from_sweep(cpu_rows(200e-6, 0.1), 4, cores=2)
    assert four.collective_cpu_s == pytest.approx(400e-6)
    assert four.overlap_slowdown == pytest.approx(2 / 1.6 - 1)
    # Two ranks on eight cores: idle cores absorb all of it.
    roomy = cpu_from_sweep(cpu_rows(200e-6, 0.1), 2, cores=8)
    assert roomy.collective_cpu_s == 0 and roomy.overlap_slowdown == 0
    # Communication that would need five cores gets a fair share of the two: a quarter core
    # per thread (two compute and two communication threads), so compute keeps half its cores.
    greedy = cpu_from_sweep(cpu_rows(200e-6, 5.0), 2, cores=2)
    assert greedy.overlap_slowdown == pytest.approx(1.0)
    assert greedy.comm_bytes_rate_while_computing == pytest.approx(0.5 / 5.0)


def test_a_ranks_bytes_stream_at_full_pace_unless_they_need_more_than_a_fair_share_of_a_core():
    # Four ranks on two cores: eight runnable threads, a quarter core each.
    assert streaming_pace(4, 2, 0.1) == 1.0
    assert streaming_pace(4, 2, 0.5) == pytest.approx(0.5)
    # Idle cores go to communication first: two ranks on eight cores have three cores each.
    assert streaming_pace(2, 8, 0.9) == 1.0
    assert streaming_pace(2, 8, 6.0) == pytest.approx(0.5)
    # Threads that use no CPU to stream are never slowed by compute.
    assert streaming_pace(4, 2, 0.0) == 1.0


def test_a_queue_timed_while_every_rank_computes_says_how_fast_per_call_work_progresses_meanwhile():
    # Four ranks on two cores, a queue of 16 calls: 0.2 s idle, of which 16 ms is the calls'
    # latency (1 ms each in this sweep) and the rest their bytes.  The bytes need a tenth of a
    # core, less than the quarter a fair scheduler gives each thread, so they keep their pace:
    # of the 0.8 s the queue took while the ranks computed, the bytes still took 0.184 s and
    # the per-call work the rest, 0.616 s for 16 ms of it.
    fit = cpu_from_sweep(cpu_rows(200e-6, 0.1), 4, cores=2)
    latency = fit_sweep(cpu_rows(200e-6, 0.1), 4)["all_reduce"].latency_s
    assert latency == pytest.approx(1e-3, rel=1e-3)

    def queue(loaded_s, kind="all_reduce"):
        return {"collective": kind, "calls": 16, "bytes": 8 << 20, "idle_s": 0.2, "loaded_s": loaded_s,
                "compute_slowdown": 0.1}

    four = cpu_from_sweep(cpu_rows(200e-6, 0.1), 4, cores=2, under_compute=[queue(0.8)])
    per_call = 16 * latency
    assert four.comm_rate_while_computing == pytest.approx(per_call / (0.8 - (0.2 - per_call)))
    assert four.comm_bytes_rate_while_computing == 1.0
    # Moving at that pace, the per-call work takes that share of its idle CPU from the compute:
    # 400 us per call for four ranks on two cores, times the pace.  Streaming takes 4 ranks x 0.1
    # of a core at full pace.  Both are read from the calls' CPU time over the whole sweep, not
    # from the queue's short windows of compute.
    assert four.collective_cpu_s == pytest.approx(400e-6 * four.comm_rate_while_computing)
    assert four.overlap_slowdown == pytest.approx(fit.overlap_slowdown) == pytest.approx(2 / 1.6 - 1)
    # The median over the collectives; a queue slowed no more than its bytes keeps its pace,
    # and one whose collective the sweep did not fit falls back to the whole queue's ratio.
    assert per_call_pace(queue(0.2), None, 1.0) == 1.0
    assert per_call_pace(queue(0.19), fit_sweep(cpu_rows(200e-6, 0.1), 4)["all_reduce"], 1.0) == 1.0
    assert per_call_pace(queue(0.8, "broadcast"), None, 1.0) == pytest.approx(0.25)
    assert per_call_pace(queue(1e3), None, 1.0) == 0.02  # never quite stopped
    # Without that queue, collectives keep their pace whatever the ranks do.
    assert fit.comm_rate_while_computing == 1.0


def test_a_queue_of_large_calls_beside_the_mixed_one_measures_the_bytes_pace_as_well():
    # Four ranks on two cores, calls with 1 ms of latency (the sweep's fit).  While the ranks
    # compute, per-call work moves at a fifth of its pace and bytes at half of theirs; the
    # fair share of a core would have kept the bytes at full pace.
    latency = fit_sweep(cpu_rows(200e-6, 0.1), 4)["all_reduce"].latency_s

    def queue(name, calls, bytes_s, per_call_pace=0.2, bytes_pace=0.5):
        per_call = calls * latency
        return {"collective": "all_reduce", "queue": name, "calls": calls, "bytes": 1,
                "idle_s": per_call + bytes_s, "loaded_s": per_call / per_call_pace + bytes_s / bytes_pace,
                "compute_slowdown": 0.0}

    measured = cpu_from_sweep(cpu_rows(200e-6, 0.1), 4, cores=2,
                              under_compute=[queue("mixed", 32, 0.05), queue("large", 8, 0.3)])
    assert measured.comm_rate_while_computing == pytest.approx(0.2, rel=1e-3)
    assert measured.comm_bytes_rate_while_computing == pytest.approx(0.5, rel=1e-3)
    # Bytes at half pace take half their CPU from compute: four ranks x 0.1 x 0.5 of the two cores.
    assert measured.overlap_slowdown == pytest.approx(2 / (2 - 4 * 0.1 * 0.5) - 1, rel=1e-3)
    # Where the two queues say one part kept its pace, it is 1 and the other is read alone.
    fit = fit_sweep(cpu_rows(200e-6, 0.1), 4)["all_reduce"]
    assert paces_under_compute(queue("mixed", 32, 0.05, 1.0, 0.4), queue("large", 8, 0.3, 1.0, 0.4),
                               fit) == pytest.approx((1.0, 0.4), rel=1e-3)
    assert paces_under_compute(queue("mixed", 32, 0.05, 0.3, 1.0), queue("large", 8, 0.3, 0.3, 1.0),
                               fit) == pytest.approx((0.3, 1.0), rel=1e-3)
    # A queue that ran faster loaded than idle (noise) never makes a pace above 1.
    assert paces_under_compute(queue("mixed", 32, 0.05, 1.5, 1.5), queue("large", 8, 0.3, 1.5, 1.5),
                               fit) == (1.0, 1.0)
    # Without a fit for the collective, each queue's own ratio.
    assert paces_under_compute(queue("mixed", 32, 0.05), queue("large", 8, 0.3), None) == pytest.approx(
        (queue("mixed", 32, 0.05)["idle_s"] / queue("mixed", 32, 0.05)["loaded_s"],
         queue("large", 8, 0.3)["idle_s"] / queue("large", 8, 0.3)["loaded_s"]))


def test_a_sweep_without_cpu_times_at_both_ends_cannot_say_what_communication_costs():
    with pytest.raises(CalibrationError, match="from 1K to at least 1M"):
        cpu_from_sweep([r for r in cpu_rows(2e-4, 0.1) if r["size_bytes"] < 1 << 20], 2, cores=2)
    with pytest.raises(CalibrationError, match="CPU time per call"):
        cpu_from_sweep([{k: v for k, v in r.items() if k != "cpu_us"} for r in cpu_rows(2e-4, 0.1)], 2, 2)


def test_the_cpu_figures_reach_the_engine_for_as_many_ranks_as_were_measured():
    cal = replace(calibration(), cpu=CpuCalibration(300e-6, 0.25, 2))
    args = dict(model="gpt2-124m", micro_batch=1, seq_len=256, strategy="zero2", bucket_mb=0.0, gpus=2,
                topology="emu-uniform", gpus_per_node=1, gpu="CPU", backend="gloo", precision="fp32")
    with_cpu = simulate(calibration=cal, **args)
    assert with_cpu.scenario.hardware.collective_cpu_us == pytest.approx(300)
    assert with_cpu.scenario.hardware.overlap_slowdown == pytest.approx(0.25)
    without = simulate(calibration=calibration(), **args)
    assert with_cpu.metrics["step_time_s"] > without.metrics["step_time_s"]
    # An explicit setting wins over the measured one.
    assert simulate(calibration=cal, overlap_slowdown=0.0, **args).scenario.hardware.overlap_slowdown == 0.0
    # Measured on 4 ranks: says nothing about 2.
    four = simulate(calibration=replace(cal, cpu=CpuCalibration(300e-6, 0.25, 4)), **args)
    assert four.scenario.hardware.collective_cpu_us == 0 and four.scenario.hardware.overlap_slowdown == 0


def test_a_fit_for_another_group_size_is_not_used():
    cal = calibration(n=4)
    topo = build_topology("emu-uniform", 2, 1)
    plan = CollectiveModel(topo, "gloo", "auto", cal).plan("all_reduce", 8e6, process_groups(topo, "world"))
    assert plan.algorithm == "ring"


def test_the_simulator_uses_calibrated_layer_times_scaled_by_tokens(tmp_path):
    cal = calibration()
    path = tmp_path / "cal.json"
    cal.save(path)
    result = simulate(model="gpt2-124m", micro_batch=2, seq_len=1024, strategy="ddp", gpus=2,
                      topology="emu-uniform", gpus_per_node=1, gpu="CPU", backend="gloo", precision="fp32",
                      calibration=str(path))
    fwd_block = next(op for op in result.ops if op["name"] == "fwd L1")
    assert fwd_block["end_s"] - fwd_block["start_s"] == pytest.approx(10e-3 * 2048 / 4096, rel=0.01)
    assert "all_reduce n=2" in result.scenario.inputs.calibration


def test_a_calibration_survives_a_round_trip_through_its_file(tmp_path):
    cal = calibration()
    cal.save(tmp_path / "c.json")
    back = Calibration.load(tmp_path / "c.json")
    assert back.collectives == cal.collectives
    assert back.compute == cal.compute
    assert back.backend == "gloo"
    with_cpu = replace(cal, cpu=CpuCalibration(2e-4, 0.1, 2, comm_rate_while_computing=0.25))
    with_cpu.save(tmp_path / "cpu.json")
    assert Calibration.load(tmp_path / "cpu.json").cpu == with_cpu.cpu
    queued = replace(cal, collectives={k: replace(f, queued_latency_s=f.latency_s / 2)
                                       for k, f in cal.collectives.items()})
    queued.save(tmp_path / "queued.json")
    assert Calibration.load(tmp_path / "queued.json").collectives == queued.collectives


@pytest.mark.parametrize("content,fragment", [
    ("not json", "is not JSON"),
    ('{"format": "something-else"}', "is not a zero-sim calibration file"),
    ('{"format": "zero-sim-calibration/1", "collectives": {"all_reduce": {"world_size": 2}}}',
     "lacks collectives.all_reduce.latency_s"),
    ('{"format": "zero-sim-calibration/1", "collectives": {"all_reduce": {"world_size": 2, "latency_s": 0, '
     '"busbw_gbps": -1}}}', "collectives.all_reduce.busbw_gbps -1, which must be at least"),
    ('{"format": "zero-sim-calibration/1", "cpu": {"collective_cpu_s": 0, "overlap_slowdown": 0, '
     '"comm_rate_while_computing": 0}}', "above 0 and at most 1"),
    ('{"format": "zero-sim-calibration/1", "compute": '
     '{"layer_seconds": {"block": {"fwd": 0.01, "bwd": 0.02}}, '
     '"tokens": 512, "slowest_rank_factor": 0.5}}', "at least 1"),
])
def test_a_bad_calibration_file_gets_one_sentence(tmp_path, content, fragment):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ScenarioError) as err:
        simulate(calibration=str(path))
    assert fragment in str(err.value)
    assert "\n" not in str(err.value)


def test_a_calibration_from_another_backend_is_refused(tmp_path):
    with pytest.raises(ScenarioError, match="measured with gloo"):
        simulate(calibration=calibration(), backend="nccl")


def test_compute_calibration_reports_how_much_sharing_the_cores_costs():
    def layers(block_fwd, ranks):
        by_kind = {"embedding": {"fwd": 1e-4, "bwd": 2e-4}, "block": {"fwd": block_fwd, "bwd": 2 * block_fwd},
                   "head": {"fwd": 1e-3, "bwd": 2e-3}}
        return {"by_kind": by_kind, "tokens": 512, "world_size": ranks, "cores": 2,
                "optimizer_s_per_param": 1e-9}

    comp = compute_from_layers(layers(0.027, 4), alone=layers(0.010, 1))
    assert comp.ranks == 4 and comp.sharing_factor == pytest.approx(2.7)
    assert comp.layer_seconds["block"]["fwd"] == 0.027


def test_the_slowest_rank_stretches_forward_and_backward_but_not_the_optimizer():
    # A step waits on its slowest rank; the simulator runs its ranks alike, at that rank's pace.
    def block_and_opt(factor):
        cal = calibration()
        cal = replace(cal, compute=replace(cal.compute, slowest_rank_factor=factor))
        result = simulate(model="gpt2-124m", micro_batch=2, seq_len=1024, strategy="ddp", gpus=2,
                          topology="emu-uniform", gpus_per_node=1, gpu="CPU", backend="gloo",
                          precision="fp32", calibration=cal)
        took = {op["name"]: op["end_s"] - op["start_s"] for op in result.step_ops(0)}
        return took["fwd L1"], took["bwd L1"], sum(t for n, t in took.items() if n.startswith("opt"))

    fwd, bwd, opt = block_and_opt(1.0)
    slow_fwd, slow_bwd, slow_opt = block_and_opt(1.1)
    assert slow_fwd == pytest.approx(1.1 * fwd) and slow_bwd == pytest.approx(1.1 * bwd)
    assert slow_opt == pytest.approx(opt)
    slow = replace(calibration(), compute=replace(calibration().compute, slowest_rank_factor=1.1))
    assert "slowest rank 1.100x the mean" in slow.describe()


NVSWITCH = """\tGPU0\tGPU1\tGPU2\tGPU3
GPU0\t X \tNV12\tNV12\tNV12
GPU1\tNV12\t X \tNV12\tNV12
GPU2\tNV12\tNV12\t X \tNV12
GPU3\tNV12\tNV12\tNV12\t X
"""
PCIE_TWO_GROUPS = """\tGPU0\tGPU1\tGPU2\tGPU3
GPU0\t X \tPIX\tSYS\tSYS
GPU1\tPIX\t X \tSYS\tSYS
GPU2\tSYS\tSYS\t X \tPIX
GPU3\tSYS\tSYS\tPIX\t X
"""


def test_nvidia_smi_topo_and_nccl_tests_make_a_topology_whose_links_reproduce_the_measurement(data_dir):
    fit = fit_nccl_tests_text((data_dir / "seed002_pcie_pair.txt").read_text())
    spec = topology_from_imports(PCIE_TWO_GROUPS, {"all_reduce": fit})
    assert spec.fabric.kind == "pcie" and spec.fabric.subgroups == 2
    topo = build_topology(spec, 2)  # a pair on one bus, as the table was measured
    plan = CollectiveModel(topo).plan("all_reduce", 256e6, process_groups(topo, "world"))
    assert plan.isolated_time(topo) == pytest.approx(fit.time(256e6), rel=0.03)

    nv = topology_from_imports(NVSWITCH, {"all_reduce": CollectiveFit("all_reduce", 4, 20e-6, 200e9, 0.0)})
    assert nv.fabric.kind == "nvswitch" and nv.fabric.port_gbps == pytest.approx(200.0)


def test_an_imported_topology_is_simulated_by_name_calibrated(tmp_path, data_dir):
    fit = fit_nccl_tests_text((data_dir / "seed002_host_bridge.txt").read_text())
    cal = Calibration({"all_reduce": fit}, None, "nccl", {},
                      topology_from_imports(PCIE_TWO_GROUPS, {"all_reduce": fit}))
    cal.save(tmp_path / "box.json")
    assert json.loads((tmp_path / "box.json").read_text())["topology"]["fabric"]["kind"] == "pcie"
    result = simulate(calibration=str(tmp_path / "box.json"), topology="calibrated", gpus=4, gpus_per_node=4,
                      model="gpt2-124m", micro_batch=2)
    assert result.scenario.cluster.topology == "calibrated"
    with pytest.raises(ScenarioError, match="needs --calibration"):
        simulate(topology="calibrated", gpus=2)
