"""Strategy programs: their memory, their traffic and the knobs they accept."""

import pytest

from zero_sim import ScenarioError, simulate
from zero_sim.strategies import STRATEGIES, Strategy
from zero_sim.strategies.base import Step
from zero_sim.system.collectives import bus_factor
from zero_sim.vocabulary import ALL_REDUCE, BACKWARD, layer_collective

N = 8


@pytest.mark.parametrize("strategy,formula", [
    ("ddp", lambda psi: 16 * psi),
    ("zero1", lambda psi: 4 * psi + 12 * psi / N),
    ("zero2", lambda psi: 2 * psi + 14 * psi / N),
    ("zero3", lambda psi: 16 * psi / N),
    ("fsdp", lambda psi: 16 * psi / N),
])
def test_model_state_memory_matches_the_zero_paper(strategy, formula):
    extra = {"param_persistence_threshold": 0} if strategy == "zero3" else {}
    m = simulate(params=100_000_000, gpus=N, strategy=strategy, micro_batch=1, **extra).metrics
    assert m["memory"]["model_states_bytes"] == pytest.approx(formula(m["params"]), abs=16 * N)


def test_zero3_moves_one_and_a_half_times_the_bytes_of_zero2(figures):
    """The ZeRO paper's accounting: every parameter gathered in forward and again in backward.
    DeepSpeed's default max_reuse_distance keeps recently used layers gathered instead, so the
    paper's figure needs it off."""
    kw = dict(params=100_000_000, gpus=N, micro_batch=1)
    z2 = simulate(strategy="zero2", **kw).metrics
    z3 = simulate(strategy="zero3", param_persistence_threshold=0, max_reuse_distance=0, **kw).metrics
    psi_bytes = 2 * z2["params"] * bus_factor("all_gather", N)
    figures(f"per rank per step: zero2 {z2['comm_volume_bytes'] / psi_bytes:.2f} x Psi, "
            f"zero3 {z3['comm_volume_bytes'] / psi_bytes:.2f} x Psi (bf16, ring factor (N-1)/N folded in)")
    assert z2["comm_volume_bytes"] == pytest.approx(2 * psi_bytes)
    assert z3["comm_volume_bytes"] == pytest.approx(3 * psi_bytes)


def test_fsdp_keeps_its_root_gathered_through_backward():
    r = simulate(params=100_000_000, gpus=N, micro_batch=1, strategy="fsdp")
    layer_numel = {op["layer"]: op["bytes"] / 2 for op in r.step_ops() if op["name"].startswith("all_gather")}
    gathers = [op for op in r.step_ops() if op["name"].startswith("all_gather")]
    root = [op for op in gathers if op["layer"] == 0]
    assert len(root) == 1  # root: gathered once; every block: twice
    blocks = {op["layer"] for op in gathers} - {0}
    assert all(sum(1 for op in gathers if op["layer"] == b) == 2 for b in blocks)
    assert layer_numel


def test_fsdp_with_a_root_per_layer_reduces_the_heads_gradients_before_the_embeddings_backward():
    """torch's root is one flat parameter: its gradients are complete, and reduced, only after the
    embedding's backward, the last compute of the step.  Split per layer (real_runs' fsdp) the
    head's reduction leaves as soon as the head's backward is done, under the blocks' backward,
    and the head is gathered as the last block's forward prefetch."""
    kw = dict(model="gpt2-124m", micro_batch=1, seq_len=256, strategy="fsdp", forward_prefetch=True, gpus=2)
    head = 13
    for root in ("one", "per_layer"):
        ops = {op["name"]: op for op in simulate(root=root, **kw).step_ops() if op["rank"] == 0}
        if root == "one":
            assert f"reduce_scatter L{head}" not in ops and f"all_gather L{head}" not in ops
            assert ops["reduce_scatter L0"]["start_s"] >= ops["bwd L0"]["end_s"] - 1e-12
            continue
        reductions = [name for name in ops if name.startswith("reduce_scatter")]
        assert len(reductions) == head + 1  # embedding, twelve blocks, head: one each
        assert ops[f"bwd L{head}"]["end_s"] - 1e-12 <= ops[f"reduce_scatter L{head}"]["start_s"]
        assert ops[f"reduce_scatter L{head}"]["start_s"] < ops["bwd L1"]["start_s"]
        assert ops[f"all_gather L{head}"]["start_s"] <= ops[f"fwd L{head - 1}"]["start_s"]


def test_fsdp_updates_after_every_reduction_or_unit_by_unit_as_each_lands():
    """torch's FSDP steps the optimizer once backward has waited for every reduce-scatter;
    ``update=per_unit`` (the real runs' FSDP) updates a unit as soon as its own has landed."""
    def ops(update):
        r = simulate(params=100_000_000, gpus=N, micro_batch=1, strategy="fsdp", update=update,
                     bandwidth_gbps=10)
        return [op for op in r.step_ops() if op["name"].startswith(("opt", "reduce_scatter"))]

    after = ops("after_backward")
    last_reduction_end = max(op["end_s"] for op in after if op["name"].startswith("reduce"))
    assert all(op["start_s"] >= last_reduction_end for op in after if op["name"].startswith("opt"))
    per_unit = ops("per_unit")
    reductions = {op["layer"]: op for op in per_unit if op["name"].startswith("reduce")}
    updates = [op for op in per_unit if op["name"].startswith("opt")]
    assert updates[0]["start_s"] < max(op["end_s"] for op in reductions.values())  # overlaps the last ones
    assert updates[0]["layer"] == max(reductions)  # the first unit reduced is the first updated
    assert len(updates) == len(after) - len(reductions)


def _fsdp_copy_ops(copies, **kw):
    r = simulate(model="llama2-7b", gpus=8, topology="dgx-h100", micro_batch=1, strategy="fsdp",
                 reduce_dtype="fp32", copies=copies, **kw)
    return r, r.step_ops()


def test_fsdp2_copies_each_gather_out_on_the_compute_stream_before_the_unit_computes():
    """fully_shard splits the all-gather buffer into the parameters on the current stream after
    waiting on the gather, so a unit's compute follows its copy-out, which follows its gather."""
    _, ops = _fsdp_copy_ops("fsdp2")
    by_name = {op["name"]: op for op in ops if op["phase"] == "forward"}
    gathers = [op for op in ops if op["name"].startswith("all_gather")]
    copies = [op for op in ops if op["name"].startswith("copy_out")]
    assert len(copies) == len(gathers)  # one per gather, forward and backward
    assert all(op["stream"] == "compute" for op in copies)
    for layer in (1, 16, 32):
        copy = by_name[f"copy_out L{layer}"]
        assert copy["start_s"] >= by_name[f"all_gather L{layer}"]["end_s"] - 1e-12
        assert by_name[f"fwd L{layer}"]["start_s"] >= copy["end_s"] - 1e-12


def test_fsdp2_casts_gradients_into_the_reduce_scatter_input_where_fsdp1_only_concatenates_them():
    """FSDP1's copy is autograd's concatenation of the views' bf16 gradients (2 bytes read, 2
    written); FSDP2's chunk_cat reads bf16 and writes fp32 for an fp32 reduction (2 + 4)."""
    copy_in = {}
    for copies in ("fsdp1", "fsdp2"):
        _, ops = _fsdp_copy_ops(copies)
        by_name = {op["name"]: op for op in ops}
        copy_in[copies] = by_name["copy_in L5"]["end_s"] - by_name["copy_in L5"]["start_s"]
        assert by_name["reduce_scatter L5"]["start_s"] >= by_name["copy_in L5"]["end_s"] - 1e-12
        assert by_name["copy_in L5"]["start_s"] >= by_name["bwd L5"]["end_s"] - 1e-12
    assert copy_in["fsdp2"] / copy_in["fsdp1"] == pytest.approx(6 / 4)


def test_fsdp_copies_cost_memory_bandwidth_time_and_none_costs_nothing(figures):
    steps = {c: _fsdp_copy_ops(c)[0].metrics["step_time_s"] for c in ("none", "fsdp1", "fsdp2")}
    _, ops = _fsdp_copy_ops("none")
    assert not [op for op in ops if op["name"].startswith(("copy_in", "copy_out"))]
    figures("llama2-7b, 8 x H100, fsdp, fp32 reduce: step " + ", ".join(
        f"{c} {s:.3f} s" for c, s in steps.items()))
    assert steps["none"] < steps["fsdp1"] < steps["fsdp2"]
    assert steps["fsdp2"] / steps["none"] < 1.1  # copies are memory-bound, a few percent of a step


@pytest.mark.parametrize("phase", ["forward", "backward"])
def test_fsdp_prefetches_one_unit_ahead_from_the_root_on_even_where_gloo_could_run_two(phase):
    # Forward prefetch from the root's forward fetches the first block; 'pre' from the head's
    # backward fetches the last block.  Each prefetch starts once the unit about to compute
    # has its own weights, so gathers never split the link even with gloo's two threads.
    r = simulate(model="gpt2-124m", micro_batch=1, seq_len=256, strategy="fsdp", forward_prefetch=True,
                 gpus=2, topology="cpu-gloo", gpu="CPU", precision="fp32", backend="gloo")
    ops = [op for op in r.step_ops() if op["rank"] == 0 and op["phase"] == phase]
    gathers = sorted((op for op in ops if op["name"].startswith("all_gather")), key=lambda op: op["start_s"])
    assert all(b["start_s"] >= a["end_s"] - 1e-12 for a, b in zip(gathers, gathers[1:], strict=False))
    compute = {op["name"]: op for op in ops if op["stream"] == "compute"}
    first_block = "fwd L1" if phase == "forward" else "bwd L12"
    block_gather = next(op for op in gathers if op["layer"] == int(first_block.split("L")[1]))
    root_compute = compute["fwd L0"] if phase == "forward" else compute["bwd L13"]
    assert block_gather["start_s"] <= root_compute["start_s"]  # issued from the root, not after it


def test_hybrid_sharding_sends_only_a_shard_across_nodes(figures):
    r = simulate(params=200_000_000, gpus=16, topology="p4d-efa", micro_batch=1, strategy="fsdp", hybrid=True)
    inter = [op for op in r.step_ops() if op["stream"] == "comm:inter"]
    psi = r.metrics["params"]
    cross = sum(op["bytes"] for op in inter)
    figures(f"hybrid FSDP on 2 nodes x 8: cross-node all-reduce of {cross / 1e6:.1f} MB per rank "
            f"= 2 Psi / G ({2 * psi / 8 / 1e6:.1f} MB), not 2 Psi")
    assert cross == pytest.approx(2 * psi / 8, rel=0.01)
    assert r.metrics["memory"]["model_states_bytes"] == pytest.approx(16 * psi / 8, abs=16 * 8)


def test_zero3_peak_memory_falls_as_n_grows():
    peaks = [simulate(model="gpt2-1.5b", gpus=n, micro_batch=1, strategy="zero3").metrics["memory"]
             ["peak_bytes"] for n in (8, 16, 32, 64)]
    assert peaks == sorted(peaks, reverse=True)


def test_prefetch_never_slows_a_step_when_memory_is_not_binding():
    times = [simulate(model="gpt2-350m", gpus=16, topology="p4d-efa", micro_batch=2, strategy="zero3",
                      prefetch=k).metrics["step_time_s"] for k in (0, 1, 2, 4)]
    assert all(b <= a * (1 + 1e-9) for a, b in zip(times, times[1:], strict=False))


def test_a_model_that_does_not_fit_is_a_result_not_an_error():
    m = simulate(model="gpt3-175b", gpus=8, micro_batch=1, strategy="ddp").metrics
    assert m["memory"]["fits"] is False
    # Judged on what the allocator holds: the tensors' peak plus its reserve and the CUDA context.
    held = m["memory"]["reserved_peak_bytes"]
    assert held > m["memory"]["peak_bytes"]
    assert m["memory"]["shortfall_bytes"] == held - m["memory"]["capacity_bytes"] > 0


def test_a_flag_for_another_strategy_is_refused_by_name():
    with pytest.raises(ScenarioError, match="--prefetch applies to zero3, not to ddp"):
        simulate(strategy="ddp", prefetch=2)
    with pytest.raises(ScenarioError, match="--zero2-launch applies to zero2, not to fsdp"):
        simulate(strategy="fsdp", zero2_launch="hook")


def test_impossible_settings_are_refused():
    with pytest.raises(ScenarioError, match="--prefetch must be a non-negative integer for zero3"):
        simulate(strategy="zero3", prefetch=-1)
    with pytest.raises(ScenarioError, match="--wrap names layer 99, which does not exist"):
        simulate(strategy="fsdp", wrap="1,99")
    with pytest.raises(ScenarioError, match="--hybrid needs at least two nodes"):
        simulate(strategy="fsdp", hybrid=True, gpus=8)
    with pytest.raises(ScenarioError, match="--bucket-mb must be a positive number for ddp"):
        simulate(strategy="ddp", bucket_mb=0)


def test_stragglers_hurt_more_as_n_grows(figures):
    def slowdown(n):
        kw = dict(model="gpt2-350m", gpus=n, topology="p4d-efa", micro_batch=2, strategy="fsdp")
        clean = simulate(**kw).metrics["step_time_s"]
        stalled = simulate(**kw, straggler_prob=0.002, straggler_ms=20, seed=3, steps=4)
        return stalled.metrics["step_time_s"] / clean
    s8, s256 = slowdown(8), slowdown(256)
    figures(f"0.2% chance per rank per collective of a 20 ms stall: step x{s8:.2f} at N=8, "
            f"x{s256:.2f} at N=256")
    assert s256 > s8


class _AllReduceEachLayer(Step):
    """A whole strategy in one hook: all-reduce a layer's gradients once its last backward has run."""

    def after_backward(self, layer, op):
        if self.last_micro:
            nbytes = layer.numel * self.p.grad_bytes
            self.b.collective(ALL_REDUCE, layer_collective(ALL_REDUCE, layer.index), nbytes, BACKWARD,
                              layer=layer.index, deps=(op,))


def test_a_strategy_that_overrides_one_hook_gets_the_whole_step(monkeypatch):
    # The base Step owns the skeleton: micro-steps of forward, then backward in reverse with
    # recompute, then the optimizer, with the model states of its ZeRO stage (0 by default).
    class AllReduceEachLayer(Strategy):
        name = "all-reduce-each-layer"
        Step = _AllReduceEachLayer

    monkeypatch.setitem(STRATEGIES, AllReduceEachLayer.name, AllReduceEachLayer())
    r = simulate(model="gpt2-124m", gpus=2, micro_batch=1, seq_len=256, grad_accum=2, recompute="full",
                 strategy=AllReduceEachLayer.name)
    ops = r.step_ops()
    layers = sorted({op["layer"] for op in ops if op["name"].startswith("fwd")})
    compute = [op["name"] for op in ops if op["stream"] == "compute"]
    recomputed = [i for i in layers if f"recompute L{i}" in compute]
    assert recomputed and len(recomputed) < len(layers)  # blocks recompute; embedding and head do not
    backward = [name for i in reversed(layers)
                for name in ([f"recompute L{i}"] if i in recomputed else []) + [f"bwd L{i}"]]
    micro_step = [f"fwd L{i}" for i in layers] + backward
    assert compute == 2 * micro_step + [f"opt L{i}" for i in layers]
    comm = [op for op in ops if op["stream"] == "comm"]
    # One all-reduce per layer, from the last micro-step only, each after that layer's backward.
    assert [op["name"] for op in comm] == [f"all_reduce L{i}" for i in reversed(layers)]
    last_bwd_end = {op["layer"]: op["end_s"] for op in ops if op["name"].startswith("bwd")}
    assert all(op["start_s"] >= last_bwd_end[op["layer"]] - 1e-12 for op in comm)
    assert r.metrics["memory"]["model_states_bytes"] == 16 * r.metrics["params"]


def test_the_optimizer_phase_separates_waiting_for_communication_from_the_update():
    """On PCIe, DDP's last all-reduces outlast backward: the optimizer phase is long, but
    nearly all of it is compute idling on the network, and the update itself is the
    optimizer op's own duration."""
    result = simulate(model="gpt2-124m", strategy="ddp", gpus=8, topology="pcie", micro_batch=8)
    phases = result.metrics["phases"]
    assert phases["optimizer_s"] == pytest.approx(phases["optimizer_wait_s"] + phases["optimizer_update_s"])
    assert phases["optimizer_wait_s"] > 5 * phases["optimizer_update_s"] > 0
    updates = [op for op in result.step_ops(0) if op["name"].startswith("opt")]
    assert phases["optimizer_update_s"] == pytest.approx(sum(op["end_s"] - op["start_s"] for op in updates))
    # On NVSwitch the reductions hide under backward, so nothing is left to wait for.
    fast = simulate(model="gpt2-124m", strategy="ddp", gpus=8, topology="dgx-a100", micro_batch=8)
    assert fast.metrics["phases"]["optimizer_wait_s"] < 0.1 * phases["optimizer_wait_s"]
