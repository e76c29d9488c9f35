"""The engine: FIFO streams, collectives that wait for every member, links that are shared."""

import dataclasses

import pytest

from zero_sim.calibration import Calibration, CollectiveFit
from zero_sim.engine.cpu_device import CpuDevice
from zero_sim.engine.engine import Engine
from zero_sim.engine.gpu_device import GpuDevice
from zero_sim.engine.program import ProgramBuilder
from zero_sim.engine.run_types import EngineConfig, Straggler
from zero_sim.engine.shared_cores import SharedCores
from zero_sim.scenario import simulate
from zero_sim.system.collectives import CollectiveModel
from zero_sim.system.topology import build_topology
from zero_sim.vocabulary import COMPUTE
from zero_sim.vocabulary.records import OpRecord


def run(program, topology="dgx-a100", n=2, **config):
    topo = build_topology(topology, n)
    config.setdefault("steps", 1)
    config.setdefault("host_overhead_s", 0.0)
    config.setdefault("explicit_ranks", True)
    engine = Engine(program, topo, CollectiveModel(topo, algorithm="ring"), EngineConfig(**config))
    out = engine.run()
    return {(r.rank, r.name): r for r in out.records}, out


def test_an_op_queued_behind_another_waits_even_when_its_data_is_ready():
    b = ProgramBuilder()
    b.collective("all_reduce", "all_reduce B0", 1e9, "backward")  # a long one first
    late = b.compute("fwd L0", "forward", 0.001)
    b.collective("all_reduce", "all_reduce B1", 1e3, "backward", deps=())  # tiny, but behind B0 on the FIFO
    ops, _ = run(b.build())
    assert ops[(0, "all_reduce B1")].start_s >= ops[(0, "all_reduce B0")].end_s
    assert ops[(0, "fwd L0")].start_s == 0.0 and late == 1


def test_a_collective_starts_when_the_last_member_arrives():
    b = ProgramBuilder()
    b.collective("all_reduce", "all_reduce B0", 1e6, "backward")
    ops, out = run(b.build(), n=4, straggler=Straggler(probability=1.0, seconds=0.01, seed=1))
    starts = {ops[(r, "all_reduce B0")].start_s for r in range(4)}
    ends = {ops[(r, "all_reduce B0")].end_s for r in range(4)}
    assert len(starts) == 1 and len(ends) == 1
    assert starts.pop() == pytest.approx(0.01)


def test_a_collective_waits_for_the_compute_issued_before_it():
    # torch's NCCL process group makes the comm stream wait on the current stream.
    b = ProgramBuilder()
    b.compute("bwd L1", "backward", 0.005)
    b.collective("all_reduce", "all_reduce B0", 1e6, "backward")
    ops, _ = run(b.build())
    assert ops[(0, "all_reduce B0")].start_s == pytest.approx(0.005)


def test_two_groups_in_flight_together_share_the_link_they_both_cross():
    # Hybrid sharding: 2 nodes x 8; the 8 cross-node rings (one GPU per node each) cross on
    # each GPU's own rail, and p4d has 4 NICs for its 8 GPUs, so every NIC carries two rings.
    topo = build_topology("p4d-efa", 16)
    b = ProgramBuilder()
    b.collective("all_reduce", "all_reduce L1", 1e9, "backward", group="inter")
    prog = b.build()
    collapsed = Engine(prog, topo, CollectiveModel(topo, algorithm="ring"),
                       EngineConfig(steps=1, host_overhead_s=0, explicit_ranks=False)).run()
    explicit = Engine(prog, topo, CollectiveModel(topo, algorithm="ring"),
                      EngineConfig(steps=1, host_overhead_s=0, explicit_ranks=True)).run()
    t_collapsed = collapsed.records[0].end_s
    t_explicit = max(r.end_s for r in explicit.records)
    one_ring_alone = (CollectiveModel(topo, algorithm="ring").plan("all_reduce", 1e9, ((0, 8),))
                      .isolated_time(topo))
    assert t_explicit == pytest.approx(t_collapsed, rel=1e-6)
    assert t_explicit == pytest.approx(2 * one_ring_alone, rel=0.02)  # two rings share each NIC


def test_a_slow_host_starves_the_gpu():
    b = ProgramBuilder()
    for i in range(10):
        b.compute(f"fwd L{i}", "forward", 1e-4)
    fast, _ = run(b.build(), host_overhead_s=1e-6)
    slow, _ = run(b.build(), host_overhead_s=1e-3)
    assert fast[(0, "fwd L9")].end_s == pytest.approx(10 * 1e-4 + 1e-6, rel=0.01)
    assert slow[(0, "fwd L9")].end_s == pytest.approx(10 * 1e-3 + 1e-4, rel=0.01)


def test_the_host_runs_ahead_of_its_gpu_and_waits_only_at_a_sync():
    # Launches are drawn on the host lane; ahead of a long kernel the host has issued the next
    # ones long before they start, and a sync holds it until the op it waits on has ended.
    b = ProgramBuilder()
    first = b.compute("fwd L0", "forward", 0.01, host_s=1e-4)
    b.compute("fwd L1", "forward", 1e-3, host_s=1e-4)
    b.sync("wait L0", "forward", deps=(first,), host_s=0.0)
    b.compute("fwd L2", "forward", 1e-3, host_s=1e-4)
    ops, _ = run(b.build())
    launches = {name: r for (rank, name), r in ops.items() if name.startswith("launch")}
    assert launches["launch fwd L1"].end_s == pytest.approx(2e-4)
    assert ops[(0, "fwd L1")].start_s == pytest.approx(ops[(0, "fwd L0")].end_s)
    assert launches["launch fwd L2"].start_s == pytest.approx(ops[(0, "fwd L0")].end_s)
    assert launches["launch fwd L2"].end_s == pytest.approx(ops[(0, "fwd L0")].end_s + 1e-4)
    assert ops[(0, "fwd L2")].start_s == pytest.approx(ops[(0, "fwd L1")].end_s)


def test_an_op_record_becomes_a_dict_of_every_field():
    record = OpRecord(3, "comm", "all_gather L1", 0.5, 0.75, 1e6, 1, "forward", 1, "collective", "ring")
    assert record.to_dict() == dataclasses.asdict(record)


def test_compute_overlapping_communication_runs_slower_when_asked():
    b = ProgramBuilder()
    b.collective("all_reduce", "all_reduce B0", 1e9, "backward")
    b.compute("bwd L0", "backward", 0.001)
    plain, _ = run(b.build())
    slowed, _ = run(b.build(), device=GpuDevice(overlap_slowdown=0.5))
    assert slowed[(0, "bwd L0")].end_s - slowed[(0, "bwd L0")].start_s == pytest.approx(0.0015)
    assert plain[(0, "bwd L0")].end_s - plain[(0, "bwd L0")].start_s == pytest.approx(0.001)


def test_on_a_gpu_only_the_part_of_an_op_a_collective_overlaps_runs_slower():
    # The collective is issued first and runs for some milliseconds; the compute beside it
    # starts at once and outlasts it by far.  Only the overlapped stretch is slowed.
    b = ProgramBuilder()
    b.collective("all_reduce", "all_reduce B0", 5e8, "backward")
    b.compute("bwd L0", "backward", 0.050, deps=())
    plain, _ = run(b.build())
    slowed, _ = run(b.build(), device=GpuDevice(overlap_slowdown=0.5))
    comm = slowed[(0, "all_reduce B0")].end_s - slowed[(0, "all_reduce B0")].start_s
    assert 0 < comm < 0.050
    # During the collective the op does comm / 1.5 of its work; the rest at full rate after it.
    expected = comm + (0.050 - comm / 1.5)
    assert slowed[(0, "bwd L0")].end_s - slowed[(0, "bwd L0")].start_s == pytest.approx(expected)
    assert plain[(0, "bwd L0")].end_s - plain[(0, "bwd L0")].start_s == pytest.approx(0.050)


def test_on_a_cpu_an_op_that_starts_beside_a_collective_is_slowed_whole():
    # The CPU calibration measures this rule: gloo's threads take cores while the call streams.
    b = ProgramBuilder()
    b.collective("all_reduce", "all_reduce B0", 5e8, "backward")
    b.compute("bwd L0", "backward", 0.050, deps=())
    slowed, _ = run(b.build(), device=CpuDevice(overlap_slowdown=0.5))
    comm = slowed[(0, "all_reduce B0")].end_s - slowed[(0, "all_reduce B0")].start_s
    assert comm < 0.050
    assert slowed[(0, "bwd L0")].end_s - slowed[(0, "bwd L0")].start_s == pytest.approx(0.075)


def test_shared_cores_add_their_costs_but_keep_the_wrapped_devices_slowdown_rule():
    b = ProgramBuilder()
    b.collective("all_reduce", "all_reduce B0", 5e8, "backward")
    b.compute("bwd L0", "backward", 0.050, deps=())
    alone, _ = run(b.build(), device=GpuDevice(overlap_slowdown=0.5))
    wrapped, _ = run(b.build(), device=SharedCores(GpuDevice(overlap_slowdown=0.5)))
    charged, _ = run(b.build(), device=SharedCores(GpuDevice(overlap_slowdown=0.5), collective_cpu_s=0.002))
    assert wrapped == alone
    assert charged[(0, "bwd L0")].end_s == pytest.approx(alone[(0, "bwd L0")].end_s + 0.002)


def test_gpus_are_slowed_by_communication_by_default_and_cpu_ranks_are_not():
    gpu = simulate(model="gpt2-124m", strategy="fsdp", gpus=8, topology="dgx-a100", steps=1)
    told = simulate(model="gpt2-124m", strategy="fsdp", gpus=8, topology="dgx-a100", steps=1,
                    overlap_slowdown=0.0)
    cpu = simulate(model="gpt2-124m", seq_len=64, strategy="ddp", gpus=2, topology="cpu-gloo", steps=1)
    assert gpu.scenario.hardware.overlap_slowdown == 0.35 and told.scenario.hardware.overlap_slowdown == 0.0
    assert gpu.metrics["compute_time_s"] > told.metrics["compute_time_s"]
    assert cpu.scenario.hardware.overlap_slowdown == 0.0


def test_each_collective_takes_the_calibrated_cpu_time_from_the_compute_it_runs_alongside():
    b = ProgramBuilder()
    b.collective("all_reduce", "all_reduce B0", 1e3, "backward")
    b.collective("all_reduce", "all_reduce B1", 1e9, "backward")
    b.compute("bwd L0", "backward", 0.010)
    plain, _ = run(b.build())
    charged, _ = run(b.build(), device=SharedCores(CpuDevice(), collective_cpu_s=0.002))

    def took(records):
        return records[(0, "bwd L0")].end_s - records[(0, "bwd L0")].start_s

    # B0 is in flight when bwd L0 starts and B1 starts while it computes: it pays for each once.
    assert charged[(0, "all_reduce B1")].start_s < charged[(0, "bwd L0")].end_s
    assert took(charged) == pytest.approx(took(plain) + 0.004)


def test_a_short_compute_op_loses_at_most_its_own_time_to_the_collectives_beside_it():
    # A fair scheduler gives the compute thread half its core while gloo's threads want it
    # all: a 1 ms op beside two collectives owing 2 ms each takes 2 ms, not 5 ms.
    b = ProgramBuilder()
    b.collective("all_reduce", "all_reduce B0", 1e3, "backward")
    b.collective("all_reduce", "all_reduce B1", 1e9, "backward")
    b.compute("bwd L0", "backward", 0.001)
    charged, _ = run(b.build(), device=SharedCores(CpuDevice(), collective_cpu_s=0.002))
    assert charged[(0, "bwd L0")].end_s - charged[(0, "bwd L0")].start_s == pytest.approx(0.002)


def test_a_collective_that_runs_while_nothing_computes_costs_no_compute():
    b = ProgramBuilder()
    c = b.collective("all_reduce", "all_reduce B0", 1e3, "optimizer")
    b.sync("wait all_reduce B0", "optimizer", deps=(c,))
    b.compute("fwd L0", "forward", 0.001)
    plain, _ = run(b.build())
    charged, _ = run(b.build(), device=SharedCores(CpuDevice(), collective_cpu_s=0.002))
    assert charged[(0, "fwd L0")].end_s == pytest.approx(plain[(0, "fwd L0")].end_s)


@pytest.mark.parametrize("explicit", [True, False])
def test_a_collective_crawls_while_its_ranks_compute_and_resumes_its_pace_when_they_stop(explicit):
    # 4 ranks on 2 cores: while the ranks compute, gloo's threads barely get a core.
    b = ProgramBuilder()
    b.collective("all_reduce", "all_reduce B0", 1e9, "backward")
    b.compute("bwd L0", "backward", 0.010)
    plain, _ = run(b.build(), explicit_ranks=explicit)
    cores = SharedCores(CpuDevice(), comm_rate_while_computing=0.25)
    throttled, _ = run(b.build(), explicit_ranks=explicit, device=cores)
    alone = plain[(0, "all_reduce B0")].end_s
    assert alone > 0.0025  # still in flight when the compute ends, even at a quarter of its pace
    # During the 10 ms of compute it does 2.5 ms of its work; the rest at full pace after.
    assert throttled[(0, "all_reduce B0")].end_s == pytest.approx(alone + 0.010 * (1 - 0.25))
    assert throttled[(0, "bwd L0")].end_s == pytest.approx(0.010)  # compute is not slowed by this knob


def test_a_latency_also_stretches_while_the_ranks_compute():
    b = ProgramBuilder()
    b.collective("all_reduce", "all_reduce B0", 1.0, "backward")  # 1 byte: nearly all latency
    b.compute("bwd L0", "backward", 1.0)
    plain, _ = run(b.build())
    throttled, _ = run(b.build(), device=SharedCores(CpuDevice(), comm_rate_while_computing=0.5))
    took = plain[(0, "all_reduce B0")].end_s
    assert throttled[(0, "all_reduce B0")].end_s == pytest.approx(2 * took, rel=1e-6)


def test_a_collectives_bytes_keep_their_pace_while_its_per_call_work_waits_for_a_core():
    # Streaming needs a share of a core that a fair scheduler grants; every hand-off of a call
    # waits for one.  So while the ranks compute, only the latency part of a call stretches.
    def took(nbytes, **rates):
        b = ProgramBuilder()
        b.collective("all_reduce", "all_reduce B0", nbytes, "backward")
        b.compute("bwd L0", "backward", 100.0)  # computing for as long as the call runs
        return run(b.build(), device=SharedCores(CpuDevice(), **rates))[0][(0, "all_reduce B0")].end_s

    def at(per_call, nbytes_pace, nbytes=1e9):
        return took(nbytes, comm_rate_while_computing=per_call, comm_bytes_rate_while_computing=nbytes_pace)

    # A 1-byte call is nearly all latency: its per-call work at half pace doubles it.
    assert at(0.5, 1.0, nbytes=1.0) == pytest.approx(2 * took(1.0), rel=1e-3)
    # A gigabyte's latency is a sliver of it: at half pace it adds that sliver, no more ...
    plain = took(1e9)
    latency_extra, bytes_extra = at(0.5, 1.0) - plain, at(1.0, 0.5) - plain
    assert 0 < latency_extra < 0.02 * plain
    # ... while its bytes at half pace add nearly all of it, and the two parts add up to the whole.
    assert latency_extra + bytes_extra == pytest.approx(at(0.5, 0.5) - plain, rel=1e-9)
    assert at(0.5, 0.5) == pytest.approx(2 * plain, rel=1e-9)


def test_memory_is_allocated_at_start_and_freed_at_end():
    b = ProgramBuilder({"params": 100})
    b.compute("fwd L0", "forward", 0.001, alloc=(("activations", 50),))
    b.compute("bwd L0", "backward", 0.002, free=(("activations", 50),))
    _, out = run(b.build(), n=1)
    acts = [(t, v) for t, cat, v in out.memory[0] if cat == "activations"]
    assert acts == [(0.0, 0), (0.0, 50), (pytest.approx(0.003), 0)]
    assert COMPUTE in b.build().streams()


def overlapping_collectives(backend):
    result = simulate(model="gpt2-124m", micro_batch=1, seq_len=256, strategy="zero2", bucket_mb=0.0, gpus=2,
                      topology="cpu-gloo", gpu="CPU", precision="fp32", backend=backend)
    spans = sorted((op["start_s"], op["end_s"]) for op in result.ops
                   if op["rank"] == 0 and op["stream"] == "comm" and op["step"] == 1)
    return sum(1 for (s1, e1), (s2, _) in zip(spans, spans[1:], strict=False) if s2 < e1 - 1e-12)


def test_gloo_runs_two_collectives_of_one_stream_at_once_where_nccl_runs_one():
    """gloo's process group hands async collectives to two worker threads; a CUDA stream is one queue."""
    assert overlapping_collectives("gloo") > 0
    assert overlapping_collectives("nccl") == 0


def gloo_pair(first_bytes, second_bytes):
    """Two world all_reduces queued back to back on gloo over a 1 Gbit/s two-rank link."""
    topo = build_topology("emu-uniform", 2, 1).with_bandwidth(1.0)
    b = ProgramBuilder()
    b.collective("all_reduce", "all_reduce B0", first_bytes, "backward", deps=())
    b.collective("all_reduce", "all_reduce B1", second_bytes, "backward", deps=())
    model = CollectiveModel(topo, "gloo")
    out = Engine(b.build(), topo, model, EngineConfig(steps=1, host_overhead_s=0.0)).run()
    ops = {r.name: r for r in out.records}
    alone = {nbytes: model.plan("all_reduce", nbytes, ((0, 1),)).isolated_time(topo)
             for nbytes in (first_bytes, second_bytes)}
    return ops["all_reduce B0"], ops["all_reduce B1"], alone


def test_a_small_gloo_call_behind_a_large_one_pays_its_latency_while_the_large_one_streams():
    big, small, alone = gloo_pair(50e6, 1e3)
    assert small.start_s == big.start_s  # gloo's second worker thread takes it at once
    assert small.end_s < big.end_s  # its latency overlapped the large one's bytes
    assert big.end_s == pytest.approx(alone[50e6], rel=0.01)


def test_two_small_gloo_calls_pay_their_latencies_one_after_the_other():
    # Two worker threads do not halve a call's per-call work: the second waits for the first's.
    first, second, alone = gloo_pair(1e3, 1e3)
    assert second.end_s == pytest.approx(2 * alone[1e3], rel=0.05)
    assert first.end_s == pytest.approx(alone[1e3], rel=0.05)


def queued_small_calls(count, queued_latency_s):
    """``count`` 1 KB all_reduces issued back to back on gloo, calibrated at 2 ms a call made
    alone and ``queued_latency_s`` a call queued behind another; when the last one ends."""
    topo = build_topology("emu-uniform", 2, 1).with_bandwidth(1.0)
    fit = CollectiveFit("all_reduce", 2, 2e-3, 100e6, 0.0, queued_latency_s=queued_latency_s)
    b = ProgramBuilder()
    for i in range(count):
        b.collective("all_reduce", f"all_reduce B{i}", 1e3, "backward", deps=())
    model = CollectiveModel(topo, "gloo", calibration=Calibration({"all_reduce": fit}, backend="gloo"))
    out = Engine(b.build(), topo, model, EngineConfig(steps=1, host_overhead_s=0.0)).run()
    return max(r.end_s for r in out.records), fit.time(1e3) - fit.latency_s


def test_small_gloo_calls_queued_back_to_back_pay_the_queued_latency_after_the_first():
    # The sweep times small calls queued as well as alone; a queue's first call finds no one
    # ahead and pays the whole latency, each later one waits for the one ahead and pays the
    # queued figure.  Without a queued figure every call pays the whole latency, as before.
    end, wire = queued_small_calls(10, queued_latency_s=1.5e-3)
    assert end == pytest.approx(2e-3 + 9 * 1.5e-3 + wire, rel=1e-6)
    end, wire = queued_small_calls(10, queued_latency_s=None)
    assert end == pytest.approx(10 * 2e-3 + wire, rel=1e-6)
    # A call alone is a queue of one: it pays the latency it was measured at alone.
    end, wire = queued_small_calls(1, queued_latency_s=1.5e-3)
    assert end == pytest.approx(2e-3 + wire, rel=1e-6)

