"""ZeRO++ on a slow network: what each of its three parts moves across nodes, what it costs, and when
it helps ZeRO-3 (docs/zeropp.md)."""

import json

import pytest

from zero_sim import simulate
from zero_sim.cli import main
from zero_sim.engine.groups import process_groups
from zero_sim.plan.planner import candidates
from zero_sim.scenario import ScenarioError, prepare
from zero_sim.system.collectives import CollectiveModel
from zero_sim.system.topology import build_topology
from zero_sim.system.zeropp import WEIGHT_GROUP
from zero_sim.vocabulary import ALL_GATHER, ALL_TO_ALL, BACKWARD, FORWARD, PARAMS, REDUCE_SCATTER
from zero_sim.vocabulary.collectives import bus_factor

# Four Llama-2-7B blocks: one forward and backward gather more elements than DeepSpeed's default
# max_reuse_distance, so every layer is released after its forward and gathered again for backward.
LLAMA = dict(model="llama2-7b", layers=4, micro_batch=1, seq_len=1024, strategy="zero3")
EFA = dict(LLAMA, gpus=32, topology="p4d-efa")  # 4 nodes of 8 A100 joined by 400 Gbit/s EFA
QWZ, QGZ = dict(zero_quantized_weights=True), dict(zero_quantized_gradients=True)
HPZ = dict(zero_hpz_partition_size=8)
ALL = QWZ | HPZ | QGZ


def program(**settings):
    p = prepare(**settings)
    return p, p.strategy.build(p.ctx)


def nic_bytes(p, prog, kinds, phase) -> float:
    """Bytes leaving every node's NICs for the collectives of ``kinds`` in ``phase``, each planned as the
    engine plans it (every sibling group at once): the payload per edge (a ring's bus factor of the
    buffer, an all-to-all's slice) times each NIC's load, protocol overheads left out."""
    model = CollectiveModel(p.topology)
    total = 0.0
    for op in prog.ops:
        if op.kind == "collective" and op.collective in kinds and op.phase == phase:
            plan = model.plan(op.collective, op.nbytes, process_groups(p.topology, op.group))
            pairwise = op.collective == ALL_TO_ALL
            edge = op.nbytes / plan.n if pairwise else bus_factor(op.collective, plan.n) * op.nbytes
            total += sum(edge * load for stage in plan.stages for link, load in stage.loads
                         if link.startswith("nic") and link.endswith(".out"))
    return total


def step_ms(**settings) -> float:
    return simulate(**settings).metrics["step_time_s"] * 1e3


# --- qwZ -------------------------------------------------------------------------------------


def test_qwz_halves_the_forward_gathers_bytes_across_nodes_plus_one_scale_per_block():
    p, plain = program(**EFA)
    _, quantized = program(**EFA, **QWZ)
    bf16, int8 = (nic_bytes(p, prog, (ALL_GATHER,), FORWARD) for prog in (plain, quantized))
    # One byte an element instead of two, and a 4-byte scale per block of at most 8,000 elements.
    assert int8 / bf16 == pytest.approx(0.5 * (1 + 4 / WEIGHT_GROUP), rel=0.01)
    assert int8 / bf16 > 0.5
    # Each gather is two calls (data, then scales), and each is dequantized once on the compute stream.
    gathers = [op for op in quantized.ops if op.collective == ALL_GATHER]
    dequantized = [op for op in quantized.ops if op.name.startswith("dequantize")]
    assert len(gathers) == 2 * sum(op.collective == ALL_GATHER for op in plain.ops)
    assert len(dequantized) == len(gathers) // 2 and all(op.stream == "compute" for op in dequantized)


# --- hpZ -------------------------------------------------------------------------------------


def test_hpz_keeps_the_backward_gathers_inside_the_node():
    # Every layer released right after use, as DeepSpeed does for a model beyond max_reuse_distance.
    released = dict(EFA, max_reuse_distance=0)
    p, plain = program(**released)
    _, hierarchical = program(**released, **HPZ)
    assert nic_bytes(p, plain, (ALL_GATHER,), BACKWARD) > 0
    assert nic_bytes(p, hierarchical, (ALL_GATHER,), BACKWARD) == 0
    backward = {op.group for op in hierarchical.ops if op.collective == ALL_GATHER and op.phase == BACKWARD}
    assert backward == {"intra"}
    # Only gathers made before a weight's first release cross nodes: the forward's, and what
    # the forward prefetched for backward before the layer was released.
    crossing = [nic_bytes(p, prog, (ALL_GATHER,), FORWARD) + nic_bytes(p, prog, (ALL_GATHER,), BACKWARD)
                for prog in (plain, hierarchical)]
    assert crossing[1] < 0.75 * crossing[0]


def test_hpz_secondary_partition_costs_its_share_of_the_weights_until_the_optimizer():
    plain, hierarchical = simulate(**EFA), simulate(**EFA, **HPZ)
    p, _ = program(**EFA)
    sharded = sum(t.numel for layer in p.workload.layers for t in layer.tensors
                  if t.numel > p.knobs.param_persistence_threshold)

    def params_peak(result) -> int:
        return max(m["bytes"] for m in result.memory if m["category"] == PARAMS)

    # Two bytes a weight, over the 8 ranks of a node, counted in the weights while it lives.
    extra = params_peak(hierarchical) - params_peak(plain)
    assert extra == pytest.approx(2 * sharded / 8, rel=0.01)
    memory = [r.metrics["memory"] for r in (plain, hierarchical)]
    assert memory[1]["model_states_bytes"] == memory[0]["model_states_bytes"]  # not held across steps
    assert memory[1]["peak_bytes"] > memory[0]["peak_bytes"]


def test_with_accumulation_later_forwards_gather_inside_the_node_too():
    p, prog = program(**EFA, **HPZ, grad_accum=2)
    backward = next(op.index for op in prog.ops if op.phase == BACKWARD)
    second = next(op.index for op in prog.ops[backward:] if op.name == "fwd L0")  # the second micro-step's
    first = {op.group for op in prog.ops[:second] if op.collective == ALL_GATHER and op.phase == FORWARD}
    later = {op.group for op in prog.ops[second:] if op.collective == ALL_GATHER}
    assert "world" in first and later == {"intra"}


def test_a_smaller_secondary_partition_gathers_among_its_own_ranks():
    _, prog = program(**EFA, zero_hpz_partition_size=4, max_reuse_distance=0)
    backward = {op.group for op in prog.ops if op.collective == ALL_GATHER and op.phase == BACKWARD}
    assert backward == {"intra:4"}
    assert process_groups(build_topology("p4d-efa", 16), "intra:4") == (
        (0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11), (12, 13, 14, 15))


# --- qgZ -------------------------------------------------------------------------------------


def test_qgz_cuts_the_gradient_bytes_across_nodes_about_fourfold():
    settings = dict(LLAMA, gpus=64, topology="p4d-efa")  # 8 nodes
    p, plain = program(**settings)
    _, quantized = program(**settings, **QGZ)
    bf16 = nic_bytes(p, plain, (REDUCE_SCATTER, ALL_TO_ALL), BACKWARD)
    int4 = nic_bytes(p, quantized, (REDUCE_SCATTER, ALL_TO_ALL), BACKWARD)
    # A quarter of the bytes (int4 for bf16) of which the node keeps its own (g-1)/g; a ring
    # reduce-scatter sends (N-1)/N of the whole. The norms' 1-D gradients still reduce-scatter in bf16.
    n, g = 64, 8
    assert int4 / bf16 == pytest.approx(0.25 * ((g - 1) / g) / ((n - 1) / n), rel=0.03)
    kinds = {op.collective for op in quantized.ops if op.phase == BACKWARD and op.kind == "collective"}
    assert ALL_TO_ALL in kinds and REDUCE_SCATTER in kinds  # 1-D tensors fall back, as DeepSpeed's do


def test_qgz_on_one_node_reduce_scatters_as_deepspeed_does():
    _, plain = program(**dict(LLAMA, gpus=8, topology="p4d-efa"))
    _, quantized = program(**dict(LLAMA, gpus=8, topology="p4d-efa"), **QGZ)
    assert [op.nbytes for op in plain.ops if op.kind == "collective"] == [
        op.nbytes for op in quantized.ops if op.kind == "collective"]


def test_all_to_all_sends_each_peer_its_slice_at_once():
    topo = build_topology("p4d-efa", 8)
    plan = CollectiveModel(topo).plan(ALL_TO_ALL, 1e9, process_groups(topo, "intra"))
    stage, = plan.stages
    port = topo.links["nvlink0.up"].capacity
    # Seven slices of an eighth leave each GPU's port at once; one step's latency on top.
    assert stage.isolated_time(topo) - stage.latency_s == pytest.approx(7 / 8 * 1e9 / port, rel=1e-6)
    assert plan.sent_bytes == pytest.approx(7 / 8 * 1e9)


# --- when it helps ---------------------------------------------------------------------------


@pytest.mark.parametrize("part", [QWZ, HPZ, QGZ, ALL], ids=["qwZ", "hpZ", "qgZ", "all"])
def test_each_part_speeds_zero3_on_a_slow_network(part):
    slow = dict(EFA, node_bandwidth_gbps=100)
    assert step_ms(**slow, **part) < 0.95 * step_ms(**slow)


def test_on_a_fast_network_zeropp_barely_matters():
    fast = dict(LLAMA, gpus=32, topology="dgx-a100")  # 8 x 200 Gbit/s InfiniBand a node
    ratio = step_ms(**fast, **ALL) / step_ms(**fast)
    assert 0.9 < ratio < 1.1
    slow = dict(EFA, node_bandwidth_gbps=100)
    assert step_ms(**slow, **ALL) / step_ms(**slow) < 0.8 * ratio


def test_the_summary_and_json_say_which_parts_were_assumed(capsys):
    flags = ["simulate", "--model", "llama2-7b", "--layers", "4", "--strategy", "zero3", "--gpus", "32",
             "--topology", "p4d-efa", "--micro-batch", "1", "--zero-quantized-weights",
             "--zero-hpz-partition-size", "8"]
    assert main(flags) == 0
    line = next(li for li in capsys.readouterr().out.splitlines() if li.strip().startswith("ZeRO++"))
    assert "qwZ" in line and "hpZ" in line and "qgZ" not in line
    assert main(flags + ["--json"]) == 0
    assert "qwZ" in json.loads(capsys.readouterr().out)["zeropp"]
    assert simulate(**EFA).metrics["zeropp"] is None


# --- refusals --------------------------------------------------------------------------------


@pytest.mark.parametrize("settings, words", [
    (dict(EFA, strategy="fsdp", **QWZ), "applies to zero3, not to fsdp"),
    (dict(EFA, strategy="zero2", **QGZ), "applies to zero3, not to zero2"),
    (dict(EFA, zero_hpz_partition_size=3), "must divide a node's 8 ranks"),
    (dict(EFA, zero_hpz_partition_size=16), "larger than a node's 8 ranks"),
    (dict(model="gpt2-124m", gpus=4, topology="cpu-gloo", strategy="zero3", **QWZ), "CPU ranks"),
])
def test_what_is_not_modelled_is_refused_in_one_sentence(settings, words):
    with pytest.raises(ScenarioError, match=words) as refused:
        simulate(**settings)
    assert refused.value.args[0].count(". ") == 0


def test_the_cli_refuses_with_exit_status_2(capsys):
    assert main(["simulate", "--strategy", "zero2", "--zero-quantized-gradients"]) == 2
    assert "applies to zero3" in capsys.readouterr().err


def test_the_planner_never_turns_zeropp_on_by_itself():
    names = {"zero_quantized_weights", "zero_hpz_partition_size", "zero_quantized_gradients"}
    assert not any(names & set(c) for c in candidates(["zero3"]))


def test_plan_sets_zeropp_on_zero3_candidates_and_says_so(capsys):
    assert main(["plan", "--model", "llama2-7b", "--layers", "4", "--gpus", "32", "--topology", "p4d-efa",
                 "--strategies", "zero3,zero2", "--recompute", "none", "--micro-batch", "1", "--workers", "1",
                 "--zero-quantized-weights", "--zero-hpz-partition-size", "8"]) == 0
    out = capsys.readouterr().out
    assert "zero3 with ZeRO++ qwZ, hpZ 8" in out.splitlines()[0]
    assert "zero_hpz_partition_size=8," in out
    assert main(["plan", "--strategies", "zero2", "--zero-quantized-weights"]) == 2
    assert "apply to zero3" in capsys.readouterr().err


# --- the DeepSpeed reader --------------------------------------------------------------------


def ds_config(tmp_path, stage: int, **zero) -> str:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
                                "zero_optimization": {"stage": stage, **zero}}))
    return str(path)


def test_deepspeed_zeropp_keys_become_the_zero3_settings(tmp_path):
    config = ds_config(tmp_path, 3, zero_quantized_weights=True, zero_hpz_partition_size=8,
                       zero_quantized_gradients=True)
    result = simulate(deepspeed_config=config, model="llama2-7b", layers=4, gpus=32, topology="p4d-efa",
                      seq_len=1024)
    knobs = result.scenario.knobs
    assert (knobs.zero_quantized_weights, knobs.zero_hpz_partition_size, knobs.zero_quantized_gradients) == (
        True, 8, True)
    assert any("zero_hpz_partition_size" in note and note.startswith("read") for note in result.metrics[
        "config_notes"])
    assert result.metrics["step_time_s"] == pytest.approx(simulate(**EFA, **ALL).metrics["step_time_s"])


@pytest.mark.parametrize("stage, zero, words", [
    (3, dict(zero_quantized_nontrainable_weights=True), "frozen weights stored in int8"),
    (2, dict(zero_quantized_weights=True), "applies to zero3, not to zero2"),
    (3, dict(zero_hpz_partition_size=16), "larger than a node's 8 ranks"),
])
def test_deepspeed_zeropp_not_modelled_is_refused_naming_the_key(tmp_path, stage, zero, words):
    with pytest.raises(ScenarioError, match=words) as refused:
        simulate(deepspeed_config=ds_config(tmp_path, stage, **zero), model="llama2-7b", layers=4, gpus=32,
                 topology="p4d-efa")
    assert next(iter(zero)) in str(refused.value)
