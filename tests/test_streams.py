"""What each strategy's collectives wait for: the compute before them, or only their own dependencies.

torch's NCCL process group makes a collective wait on the stream that is current when it is
issued.  DDP issues its all-reduces from the autograd hook with the compute stream current, so
each one follows the backward that filled its bucket.  FSDP and DeepSpeed issue parameter
all-gathers from streams of their own that never wait on compute, so a gather can run while
an earlier layer computes, held back only by the prefetch and rate-limit rules.
"""

import pytest

from zero_sim.engine.engine import Engine
from zero_sim.engine.program import ProgramBuilder
from zero_sim.engine.run_types import EngineConfig
from zero_sim.scenario import simulate
from zero_sim.system.collectives import CollectiveModel
from zero_sim.system.topology import build_topology


def run(program, backend="nccl"):
    topo = build_topology("dgx-a100", 2)
    engine = Engine(program, topo, CollectiveModel(topo, backend, "ring"),
                    EngineConfig(steps=1, host_overhead_s=0.0, explicit_ranks=True))
    return {(r.rank, r.name): r for r in engine.run().records}


def compute_then_gather(after_compute: bool):
    b = ProgramBuilder()
    b.compute("fwd L0", "forward", 0.005)
    b.collective("all_gather", "all_gather L1", 1e6, "forward", after_compute=after_compute)
    return b.build()


def test_a_collective_issued_from_a_side_stream_does_not_wait_for_the_compute_before_it():
    # The compute stream is busy for 5 ms; a gather issued from the unshard stream starts at once,
    # one issued with the compute stream current (the default) only when that compute ends.
    assert run(compute_then_gather(after_compute=False))[(0, "all_gather L1")].start_s == 0.0
    assert run(compute_then_gather(after_compute=True))[(0, "all_gather L1")].start_s == pytest.approx(0.005)


def test_with_gloo_every_collective_still_follows_the_compute_before_it():
    # gloo has no comm stream: the host hands a call to gloo's threads after the compute before
    # it has run, so replays of CPU runs keep their waits whatever the strategy says.
    ops = run(compute_then_gather(after_compute=False), backend="gloo")
    assert ops[(0, "all_gather L1")].start_s == pytest.approx(0.005)


def test_a_ddp_all_reduce_starts_only_after_the_backward_that_filled_its_bucket():
    r = simulate(model="gpt2-124m", strategy="ddp", gpus=8, topology="dgx-a100", micro_batch=4)
    ops = r.step_ops()
    backward_end = {op["layer"]: op["end_s"] for op in ops if op["name"].startswith("bwd ")}
    reduces = [op for op in ops if op["name"].startswith("all_reduce")]
    assert reduces
    for op in reduces:  # each bucket is named after the layer whose backward completes it
        assert op["start_s"] >= backward_end[op["layer"]] - 1e-12


def test_an_fsdp_forward_gather_runs_while_the_unit_before_it_computes(figures):
    # No forward_prefetch: the host, running ahead, issues unit u+1's gather once the rate limiter
    # lets it (unit u-1 freed), and the gather overlaps unit u's forward.
    r = simulate(model="gpt2-1.5b", strategy="fsdp", gpus=8, topology="dgx-a100", micro_batch=1)
    ops = r.step_ops()
    fwd = {op["layer"]: op for op in ops if op["name"].startswith("fwd ")}
    gathers = {op["layer"]: op for op in ops
               if op["name"].startswith("all_gather") and op["phase"] == "forward"}
    overlapped = [u for u in range(1, 40) if fwd[u]["start_s"] <= gathers[u + 1]["start_s"] < fwd[u]["end_s"]]
    figures(f"fsdp gpt2-1.5b, 8 x A100: {len(overlapped)} of 39 block gathers start while the block before "
            f"them computes")
    assert len(overlapped) >= 30
    # The rate limiter still holds: unit u+1 is not gathered before unit u-1 has been freed.
    assert all(gathers[u + 1]["start_s"] >= fwd[u - 1]["end_s"] - 1e-12 for u in range(2, 40))


def test_a_deepspeed_stage3_gather_does_not_wait_for_unrelated_compute():
    # DeepSpeed's allgather stream never waits on compute: a prefetch for later layers runs while
    # an earlier layer computes.
    def gathers_during_other_compute(**knobs):
        r = simulate(model="gpt2-1.5b", strategy="zero3", gpus=8, topology="dgx-a100", micro_batch=1, **knobs)
        ops = [op for op in r.step_ops() if op["phase"] == "forward"]
        compute = [op for op in ops if op["stream"] == "compute"]
        return [(g["name"], c["name"]) for g in ops if g["name"].startswith("all_gather")
                for c in compute if c["start_s"] < g["start_s"] < c["end_s"] and c["layer"] < g["layer"]]

    assert len(gathers_during_other_compute()) >= 10


def test_deepspeed_defaults_are_in_elements_as_deepspeed_ships_them():
    from zero_sim.strategies import get_strategy

    knobs = {k.name: k.default for k in get_strategy("zero3").knobs}
    assert knobs["prefetch_bucket_size"] == 50_000_000  # stage3_prefetch_bucket_size
    assert knobs["max_live_params"] == 1_000_000_000  # stage3_max_live_parameters
    assert knobs["param_persistence_threshold"] == 100_000  # stage3_param_persistence_threshold
    assert knobs["max_reuse_distance"] == 1_000_000_000  # stage3_max_reuse_distance
    assert knobs["reduce_bucket_size"] == 500_000_000  # reduce_bucket_size
    assert knobs["overlap_comm"] is True  # stage 3's default


def test_a_layer_bigger_than_max_live_params_is_still_prefetched():
    # DeepSpeed counts what is live at each submodule and checks the limit before adding a tensor
    # (the last one may overshoot), so layers of 30M elements are still prefetched under a 20M limit.
    def forward_gathers(**knobs):
        r = simulate(model="gpt2-1.5b", strategy="zero3", gpus=8, topology="dgx-a100", micro_batch=1,
                     max_live_params=20_000_000, **knobs)
        return [op for op in r.step_ops() if op["name"].startswith("all_gather") and op["phase"] == "forward"]

    with_prefetch, without = forward_gathers(), forward_gathers(prefetch_bucket_size=0)
    assert len(with_prefetch) > len(without)


def test_gpt3_175b_fsdp_on_128_a100s_exposes_far_less_than_when_every_gather_waited(figures, monkeypatch):
    kw = dict(model="gpt3-175b", strategy="fsdp", gpus=128, topology="dgx-a100", micro_batch=1,
              recompute="full")
    now = simulate(**kw).metrics
    original = ProgramBuilder.collective

    def every_gather_waits(self, *args, **kwargs):  # the old rule: every collective follows the compute
        kwargs["after_compute"] = True
        return original(self, *args, **kwargs)

    monkeypatch.setattr(ProgramBuilder, "collective", every_gather_waits)
    before = simulate(**kw).metrics
    figures(f"GPT-3 175B, fsdp, 128 x A100 (dgx-a100), micro-batch 1, full recompute: exposed "
            f"communication {before['exposed_comm_s']:.2f} s when every gather waited for the compute "
            f"before it, {now['exposed_comm_s']:.2f} s now (step {before['step_time_s']:.2f} -> "
            f"{now['step_time_s']:.2f} s)")
    assert now["exposed_comm_s"] < 0.5 * before["exposed_comm_s"]
    assert now["step_time_s"] < before["step_time_s"]
