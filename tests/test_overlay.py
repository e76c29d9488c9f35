"""A real run laid over its prediction: what the tables hold, what must agree exactly, what is refused.

The runs are the shared cached ones of ``tests/real_runs_helpers.py`` (two CPU ranks on
gloo, the ``nano`` model, two steps), so this file and the real-runs tests start each
run once per session.  Runs this file needs and nobody has started yet are launched
two at a time.
"""

from __future__ import annotations

import json
import re
import shutil
from concurrent.futures import ThreadPoolExecutor

import matplotlib
import pytest

matplotlib.use("Agg")

from real_runs_helpers import real_run  # noqa: E402

from real_runs.model import PRESETS  # noqa: E402
from sim2real.overlay import (  # noqa: E402
    CATEGORIES,
    PHASE_ROWS,
    OverlayError,
    collectives_from_trace,
    compare,
    load_run,
    measured_step,
    steady_timing,
    step_timing,
)
from sim2real.replay import predict_run  # noqa: E402
from zero_sim.ui.plots import PREDICTED_HATCH, overlay_lanes, plot_overlay, plot_overlay_pair  # noqa: E402

MODEL_STATE_STRATEGIES = ("ddp", "zero1", "zero2-step", "zero2-hook", "fsdp")


@pytest.fixture(scope="module")
def runs():
    """strategy -> run directory, every run this file uses, launched two at a time.

    ``fsdp-torch`` runs with ``--trace``: its rank files hold compute only."""
    wanted = {s: {} for s in MODEL_STATE_STRATEGIES} | {"ddp-torch": {}, "fsdp-torch": {"trace": True}}
    with ThreadPoolExecutor(max_workers=2) as pool:
        outs = pool.map(lambda s: real_run(s, 2, **wanted[s])[1], wanted)
        return dict(zip(wanted, outs, strict=True))


@pytest.fixture(scope="module")
def comparisons(runs):
    out = {}
    for strategy, path in runs.items():
        run = load_run(path)
        out[strategy] = compare(run, predict_run(run.run))
    return out


def one_sentence(message: str) -> str:
    assert "\n" not in message and "Traceback" not in message
    assert message.endswith("."), message
    assert not re.search(r"[.!?]\s+[A-Z]", message), f"more than one sentence: {message}"
    return message


# ----------------------------------------------------------------------------- the tables


def test_a_real_run_and_its_prediction_give_every_table(comparisons):
    c = comparisons["zero2-hook"]
    assert list(c.phases.index) == list(PHASE_ROWS)
    assert list(c.phases.columns) == ["predicted_s", "measured_s", "error"]
    assert (c.phases["measured_s"] >= 0).all() and (c.phases["predicted_s"] >= 0).all()
    step = c.phases.loc["step time"]
    assert step["error"] == pytest.approx((step["predicted_s"] - step["measured_s"]) / step["measured_s"])
    # forward + backward + optimizer tile the step on both sides
    for side in ("predicted_s", "measured_s"):
        parts = c.phases.loc[["forward", "backward", "optimizer"], side].sum()
        assert parts == pytest.approx(c.phases.loc["step time", side], rel=1e-9)

    assert set(c.categories.index) <= set(CATEGORIES)
    assert {"fwd", "bwd", "opt", "reduce_scatter", "all_gather", "wait"} <= set(c.categories.index)
    n_layers = c.run.run["model_config"]["n_layer"] + 2
    assert c.categories.loc["fwd", "measured_count"] == c.categories.loc["fwd", "predicted_count"] == n_layers
    # one reduce-scatter per parameter tensor, on both sides
    assert c.categories.loc["reduce_scatter", "measured_count"] == c.categories.loc["reduce_scatter",
                                                                                     "predicted_count"]

    assert list(c.memory.index) == ["params", "grads", "optimizer", "model states", "activations", "buffers",
                                    "peak total"]
    assert {"name", "rank", "stream", "predicted_start_s", "predicted_end_s", "measured_start_s",
            "measured_end_s", "matched_by"} <= set(c.ops.columns)
    assert set(c.ops["rank"]) == {0, 1}
    paired = c.ops[c.ops["matched_by"].notna()]
    assert set(paired["matched_by"]) == {"name", "kind+layer"}  # per-tensor names differ: B<k> vs L<i>
    assert len(paired) >= 0.9 * c.summary["ops_predicted"]
    assert c.summary["step"] == 1 and c.summary["world_size"] == 2

    text = c.to_markdown()
    assert "| step time" in text and "| model states" in text and "| reduce_scatter" in text


def test_the_measured_metrics_use_the_simulators_own_definitions(comparisons):
    """step_timing applied to the prediction's own ops gives back the SimResult's metrics."""
    for c in comparisons.values():
        sim = c.sim
        t = step_timing(sim.step_ops(0), sim.metrics["step_time_s"])
        m = sim.metrics
        assert t["compute_time_s"] == pytest.approx(m["compute_time_s"], rel=1e-9, abs=1e-12)
        assert t["exposed_comm_s"] == pytest.approx(m["exposed_comm_s"], rel=1e-9, abs=1e-12)
        assert t["comm_time_s"] == pytest.approx(m["comm_time_s"], rel=1e-9, abs=1e-12)
        for phase in ("forward_s", "backward_s", "optimizer_s", "optimizer_wait_s", "optimizer_update_s"):
            assert t[phase] == pytest.approx(m["phases"][phase], rel=1e-9, abs=1e-12)
        assert c.phases.loc["exposed comm", "predicted_s"] == m["exposed_comm_s"]


@pytest.mark.parametrize("strategy", MODEL_STATE_STRATEGIES)
def test_model_state_memory_is_predicted_to_the_byte(comparisons, strategy):
    """Both sides count the same tensors: params, grads and Adam moments agree exactly."""
    mem = comparisons[strategy].memory
    for row in ("params", "grads", "optimizer", "model states"):
        assert mem.loc[row, "predicted_bytes"] == mem.loc[row, "measured_bytes"], (strategy, row)
        assert mem.loc[row, "error"] == 0
    assert comparisons[strategy].summary["model_states_equal"]


def test_the_default_step_is_a_steady_state_one_and_any_recorded_step_can_be_asked_for(runs):
    run = load_run(runs["zero2-hook"])
    assert measured_step(run).step == 1  # two steps recorded: step 0 pays one-off costs
    first = measured_step(run, step=0)
    assert first.step == 0 and set(first.ops["step"]) == {0}
    assert set(first.step_time_s) == {0, 1}
    for _rank, ops in first.ops.groupby("rank"):
        assert ops["start_s"].min() >= 0  # each rank's clock starts at its own step start


def test_a_whole_runs_timing_is_the_median_over_steps_of_the_ranks_mean(runs):
    """Validation reads exposed communication over every steady step, not one step of one rank."""
    run = load_run(runs["zero2-hook"])

    def ranks_mean(step):
        ms = measured_step(run, step=step)
        per_rank = [step_timing(ms.ops[ms.ops["rank"] == r].to_dict("records"), ms.step_time_s[r])
                    for r in range(run.world_size)]
        return {k: sum(t[k] for t in per_rank) / len(per_rank) for k in per_rank[0]}

    first, second = ranks_mean(0), ranks_mean(1)
    steady = steady_timing(run)  # two steps recorded: the steady one is step 1 alone
    for key in ("step_time_s", "exposed_comm_s", "compute_time_s", "backward_s"):
        assert steady[key] == pytest.approx(second[key], rel=1e-12)
        # From step 0 on, the median of two steps is their mean.
        assert steady_timing(run, first_step=0)[key] == pytest.approx((first[key] + second[key]) / 2,
                                                                      rel=1e-12)
    with pytest.raises(OverlayError) as err:
        steady_timing(run, first_step=2)
    assert "run more steps" in one_sentence(str(err.value))


def test_torch_ddps_wait_for_its_all_reduces_is_exposed_communication_not_backward(runs):
    """torch's DDP waits for its buckets inside ``backward()``, after autograd's last node.  The
    record closes layer 0's backward when that node has run, so the wait shows as exposed
    communication, as the simulator's DDP predicts it, and not as compute."""
    run = load_run(runs["ddp-torch"])
    waits = []
    for step in sorted(run.ops["step"].unique()):
        ms = measured_step(run, step=int(step))
        for rank in range(run.world_size):
            mine = ms.ops[ms.ops["rank"] == rank]
            backward_end = float(mine[mine["name"] == "bwd L0"]["end_s"].max())
            last_reduce_end = float(mine[mine["name"].str.startswith("all_reduce")]["end_s"].max())
            update_start = float(mine[mine["name"].str.startswith("opt")]["start_s"].min())
            # The update waits for DDP's finalize, which runs after layer 0's backward closes.
            assert backward_end < update_start
            # A collective's end is stamped by a watcher thread once the OS runs it, so on a
            # busy machine the stamp can land after the update has started; until then the
            # reduction runs under no compute, and that is exposed communication.
            waited = min(last_reduce_end, update_start) - backward_end
            if waited > 0:
                exposed = step_timing(mine.to_dict("records"), ms.step_time_s[rank])["exposed_comm_s"]
                assert exposed >= waited - 1e-9
            waits.append(waited)
    # Were the wait counted in the backward, only the Python between DDP's finalize and the
    # optimizer (well under a millisecond) would separate the two.  The last bucket's reduction
    # is short here and a rank's callback may run after it ends: one rank-step shows it.
    assert max(waits) > 1e-3, f"no rank-step waited a millisecond after its backward: {waits}"


# ----------------------------------------------------------------------------- refusals, one sentence each


def test_a_directory_that_is_not_a_finished_run_is_refused(tmp_path):
    with pytest.raises(OverlayError) as missing:
        load_run(tmp_path / "nowhere")
    (tmp_path / "half").mkdir()
    with pytest.raises(OverlayError) as unfinished:
        load_run(tmp_path / "half")
    for exc in (missing, unfinished):
        msg = one_sentence(str(exc.value))
        assert "the run did not finish, or this is not a run directory" in msg


def test_a_missing_rank_file_is_named(runs, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(runs["zero2-step"], copy)
    (copy / "rank1.json").unlink()
    with pytest.raises(OverlayError) as exc:
        load_run(copy)
    msg = one_sentence(str(exc.value))
    assert "rank1.json" in msg and "rank 1" in msg


def test_a_prediction_for_another_world_size_is_refused_with_both_sizes(runs):
    run = load_run(runs["zero2-step"])
    four = predict_run({**run.run, "world_size": 4})
    with pytest.raises(OverlayError) as exc:
        compare(run, four)
    msg = one_sentence(str(exc.value))
    assert "2 ranks" in msg and "simulates 4" in msg


def test_a_prediction_for_another_model_is_refused_with_both_models(runs):
    run = load_run(runs["zero2-step"])
    other = predict_run({**run.run, "model": "tiny", "model_config": PRESETS["tiny"].to_dict()})
    with pytest.raises(OverlayError) as exc:
        compare(run, other)
    msg = one_sentence(str(exc.value))
    assert f"{run.run['params']:,}" in msg and f"{other.scenario.workload.params:,}" in msg and "nano" in msg


def test_a_rank_file_without_ops_is_refused(runs, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(runs["zero2-step"], copy)
    record = json.loads((copy / "rank1.json").read_text())
    record["ops"] = []
    (copy / "rank1.json").write_text(json.dumps(record))
    run = load_run(copy)
    with pytest.raises(OverlayError) as exc:
        compare(run, predict_run(run.run))
    msg = one_sentence(str(exc.value))
    assert "rank1.json" in msg and "fwd L<i>" in msg


def test_a_step_out_of_range_is_refused(runs):
    run = load_run(runs["zero2-step"])
    with pytest.raises(OverlayError) as exc:
        compare(run, predict_run(run.run), step=7)
    assert one_sentence(str(exc.value)) == "Step 7 is out of range: the run recorded steps 0 to 1."


# ----------------------------------------------------------------------------- the pictures


def _bars(ax):
    """(lane index, hatched?) for every bar drawn: predicted bars are hatched, measured ones solid."""
    found = set()
    for coll in ax.collections:
        hatched = coll.get_hatch() == PREDICTED_HATCH
        for path in coll.get_paths():
            ys = path.vertices[:, 1]
            found.add((round(float(ys.min() + ys.max()) / 2), hatched))
    return found


def test_the_overlay_draws_measured_and_predicted_bars_on_every_rank_and_stream(comparisons):
    c = comparisons["zero2-hook"]
    ax = plot_overlay(c)
    lanes = overlay_lanes(c)
    assert {s for _, s in lanes} == {"host", "compute", "comm"} and {r for r, _ in lanes} == {0, 1}
    bars = _bars(ax)
    for y, lane in enumerate(lanes):
        assert (y, True) in bars, f"no predicted bars on {lane}"
        assert (y, False) in bars, f"no measured bars on {lane}"
    assert "predicted" in ax.get_title() and "measured" in ax.get_title()
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert (any(lbl.startswith("predicted") for lbl in labels)
            and any(lbl.startswith("measured") for lbl in labels))


def _reduce_scatter_starts(c, rank, side):
    ops = c.ops[(c.ops["rank"] == rank) & (c.ops["kind"] == "reduce_scatter")]
    return ops[f"{side}_start_s"].dropna()


def test_the_hook_variant_moves_reduce_scatters_into_backward_measured_and_predicted(comparisons):
    step, hook = comparisons["zero2-step"], comparisons["zero2-hook"]
    for rank in (0, 1):
        for i, side in enumerate(("predicted", "measured")):
            hook_end = hook.timing(rank)[i]["backward_end_s"]
            step_end = step.timing(rank)[i]["backward_end_s"]
            assert _reduce_scatter_starts(hook, rank, side).min() < hook_end, (rank, side)
            assert _reduce_scatter_starts(step, rank, side).min() >= step_end, (rank, side)

    fig = plot_overlay_pair(step, hook)
    top, bottom = fig.axes
    assert top.get_shared_x_axes().joined(top, bottom)
    for ax in (top, bottom):
        # per rank: one dashed (predicted) and one solid (measured) end-of-backward marker
        assert len([c for c in ax.collections if c.__class__.__name__ == "LineCollection"]) == 4
    assert fig.legends


# ----------------------------------------------------------------------------- profiler traces


def _span(name, ts_us, dur_us, tid=1, cat="cpu_op"):
    return {"ph": "X", "cat": cat, "name": name, "pid": 7, "tid": tid, "ts": ts_us, "dur": dur_us}


def test_collectives_are_read_from_a_gloo_profiler_trace_when_the_record_has_none(tmp_path):
    """fsdp-torch records compute only; its trace's gloo spans become comm ops on the record's clock."""
    base = 5_000_000.0  # the trace's clock, in microseconds: unrelated to the record's
    events = [
        _span("FSDP::all_gather", base + 100, 500, cat="user_annotation"),
        _span("c10d::_allgather_base_", base + 150, 20),
        _span("gloo:all_gather", base + 180, 300, tid=9, cat="user_annotation"),
        _span("FSDP::all_gather (layers.1)", base + 900, 300, cat="user_annotation"),
        _span("c10d::_allgather_base_", base + 950, 20),
        _span("gloo:all_gather", base + 960, 200, tid=8, cat="user_annotation"),
        _span("FSDP::post_backward_reduce (layers.1)", base + 3000, 400, cat="user_annotation"),
        _span("c10d::_reduce_scatter_base_", base + 3050, 20),
        _span("gloo:all_reduce", base + 3060, 250, tid=9, cat="user_annotation"),
        _span("Optimizer.step#AdamW.step", base + 4000, 1000, cat="user_annotation"),
    ]
    trace = tmp_path / "trace_rank0.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    record = [{"rank": 0, "stream": "compute", "name": "fwd L1", "start_s": 0.0012, "end_s": 0.002,
               "layer": 1, "phase": "forward", "step": 0},
              {"rank": 0, "stream": "compute", "name": "opt all", "start_s": 0.004, "end_s": 0.005,
               "layer": None, "phase": "optimizer", "step": 0}]
    ops = collectives_from_trace(trace, 0, record, [0.006])
    assert [op["name"] for op in ops] == ["all_gather L0", "all_gather L1", "reduce_scatter L1"]
    assert all(op["stream"] == "comm" and op["step"] == 0 for op in ops)
    # the optimizer anchor puts trace time base+4000 us at record time 4.0 ms
    assert ops[1]["start_s"] == pytest.approx(0.00096) and ops[1]["end_s"] == pytest.approx(0.00116)

    unpaired = [e for e in events if e["name"] != "gloo:all_reduce"]
    trace.write_text(json.dumps({"traceEvents": unpaired}))
    with pytest.raises(OverlayError) as exc:
        collectives_from_trace(trace, 0, record, [0.006])
    assert "cannot be paired reliably" in one_sentence(str(exc.value))


def test_a_real_fsdp_torch_trace_supplies_the_collectives_its_record_lacks(runs):
    run = load_run(runs["fsdp-torch"])
    comm = run.ops[run.ops["stream"] == "comm"]
    assert len(comm) and set(comm["source"]) == {"trace"}
    assert set(comm["kind"]) == {"all_gather", "reduce_scatter"}
    assert any("read from traces/rank0.pt.trace.json" in n for n in run.notes)
    step = measured_step(run)
    ops = step.ops
    n_layers = run.run["model_config"]["n_layer"] + 2
    for rank in (0, 1):
        mine = ops[ops["rank"] == rank]
        for layer in range(1, n_layers - 1):  # each block is gathered before its forward runs
            gather = mine[mine["name"] == f"all_gather L{layer}"]["start_s"].min()
            forward = mine[mine["name"] == f"fwd L{layer}"]["start_s"].min()
            assert gather < forward, (rank, layer)
        assert (mine["end_s"] <= step.step_time_s[rank] + 1e-3).all()
    c = compare(run, predict_run(run.run))
    paired = c.ops[(c.ops["stream"] == "comm") & c.ops["matched_by"].notna()]
    assert set(paired["matched_by"]) == {"name"} and len(paired) >= 2 * (n_layers - 1)
