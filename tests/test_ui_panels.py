"""The notebook panels, driven the way a reader drives them: change a control, look again.

Every panel recomputes when a control changes and exposes what it shows as
``panel.result`` (and a refusal as ``panel.error``), so these tests set a control's
``value`` exactly as a slider release would and read the result back.  No browser and no
kernel are needed: without the ``ipympl`` backend the panels draw into a plain figure.
"""

from __future__ import annotations

import json
import re

import matplotlib
import pytest

matplotlib.use("Agg")

from zero_sim import SimResult, simulate  # noqa: E402
from zero_sim.links import bottleneck_gbps  # noqa: E402
from zero_sim.strategies import STRATEGIES, get_strategy  # noqa: E402
from zero_sim.strategies.base import Knob  # noqa: E402
from zero_sim.ui.controls import make_control, metrics_text, read_control, set_control  # noqa: E402
from zero_sim.ui.panels import ComparePanel, MemoryCalculator, NcclFitPanel, Planner, TimelineExplorer  # noqa: E402
from zero_sim.ui.plots import plot_measured_step  # noqa: E402
from zero_sim.vocabulary.model_states import model_state_bytes  # noqa: E402

STEP = re.compile(r"step time ([0-9.]+) ms")


def shown_step_ms(panel) -> float:
    """The step time as the reader sees it in the panel's headline (HTML tags stripped)."""
    text = re.sub(r"<[^>]+>", "", panel.metrics.value)
    return float(STEP.search(text).group(1))


@pytest.fixture
def explorer():
    return TimelineExplorer(strategy="ddp", model="gpt2-124m", gpus=8, topology="pcie", micro_batch=8)


# ----------------------------------------------------------------------------- timeline explorer


def test_the_explorer_opens_on_the_default_scenario(explorer):
    assert isinstance(explorer.result, SimResult)
    assert explorer.error is None
    direct = simulate(model="gpt2-124m", strategy="ddp", gpus=8, topology="pcie", micro_batch=8)
    assert explorer.result.metrics["step_time_s"] == pytest.approx(direct.metrics["step_time_s"])
    assert shown_step_ms(explorer) == pytest.approx(direct.metrics["step_time_s"] * 1e3, abs=0.01)
    assert "zs-metrics" in explorer.metrics._dom_classes


def test_moving_the_bandwidth_slider_shows_a_new_slower_step(explorer):
    before = explorer.result
    assert explorer.controls["bandwidth_override"].value is False  # the topology's own links at first
    explorer.controls["bandwidth_gbps"].value = 50.0  # what releasing the slider does
    assert explorer.controls["bandwidth_override"].value is True  # moving it means "use this"
    assert explorer.settings()["bandwidth_gbps"] == 50.0
    assert explorer.result is not before
    assert explorer.result.metrics["step_time_s"] > before.metrics["step_time_s"]
    assert shown_step_ms(explorer) == pytest.approx(explorer.result.metrics["step_time_s"] * 1e3, abs=0.01)


def test_unticking_override_returns_to_the_topology_links(explorer):
    first = explorer.result.metrics["step_time_s"]
    explorer.controls["bandwidth_gbps"].value = 20.0
    explorer.controls["bandwidth_override"].value = False
    assert "bandwidth_gbps" not in explorer.settings()
    assert explorer.result.metrics["step_time_s"] == pytest.approx(first)


def test_the_bandwidth_slider_starts_at_the_topologys_bottleneck(explorer):
    preset = bottleneck_gbps("pcie", 8)
    assert explorer.controls["bandwidth_gbps"].value == pytest.approx(preset, rel=0.03)
    explorer.controls["topology"].value = "dgx-a100"
    dgx = bottleneck_gbps("dgx-a100", 8)
    assert explorer.controls["bandwidth_gbps"].value == pytest.approx(dgx, rel=0.03)
    assert explorer.result.metrics["topology"] == "dgx-a100"


def test_smaller_buckets_mean_more_collectives(explorer):
    default = explorer.result.metrics["collectives_per_step"]
    explorer.controls["bucket_mb"].value = 1
    assert explorer.result.metrics["collectives_per_step"] > default


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_each_strategy_shows_and_passes_only_its_own_knobs(explorer, strategy):
    explorer.controls["strategy"].value = strategy
    own = {k.name for k in get_strategy(strategy).knobs}
    visible = {name for name in explorer.knob_names if explorer.controls[name].layout.display != "none"}
    assert visible == own
    passed = set(explorer.settings()) & {n for s in STRATEGIES.values() for n in (k.name for k in s.knobs)}
    # A knob whose default is "let the strategy decide" (None) is left out rather than passed.
    assert passed == {k.name for k in get_strategy(strategy).knobs if k.default is not None}
    assert explorer.error is None, explorer.error
    assert explorer.result.metrics["strategy"] == strategy


def test_switching_strategy_resets_its_knobs_to_their_defaults(explorer):
    explorer.controls["bucket_mb"].value = 100
    explorer.controls["strategy"].value = "zero2"
    for knob in get_strategy("zero2").knobs:
        assert read_control(explorer.controls[knob.name], knob.kind) == knob.default


def test_refused_settings_show_one_sentence_not_a_traceback(explorer):
    # Sliders offer only what the simulator takes, so a refusal comes from typed input: a text box.
    explorer.controls["strategy"].value = "fsdp"
    explorer.controls["wrap"].value = "99"  # GPT-2 124M has no layer 99
    assert explorer.result is None
    assert explorer.error and "\n" not in explorer.error and "Traceback" not in explorer.error
    assert explorer.error in explorer.errors.value.replace("&#x27;", "'")
    assert explorer.metrics.value == ""
    # Said once, above the figure; the figure is left blank rather than repeating it.
    assert not any(ax.texts for ax in explorer.figure.axes)
    explorer.controls["wrap"].value = "blocks"  # fixing it brings the picture back
    assert explorer.error is None and explorer.result is not None and explorer.errors.value == ""


def test_the_trace_button_writes_a_perfetto_trace(explorer, tmp_path):
    explorer.trace_dir = tmp_path
    explorer.trace_button.click()
    files = list(tmp_path.glob("*.json"))
    assert len(files) == 1
    trace = json.loads(files[0].read_text())
    assert {e["name"] for e in trace["traceEvents"] if e["ph"] == "X"} >= {"fwd L1", "bwd L1"}
    assert files[0].name in explorer.trace_status.value
    # The path named the step shown then; once the step changes, it is no longer said.
    explorer.controls["micro_batch"].value = 16
    assert explorer.trace_status.value == ""


def test_the_panel_reproduces_as_a_command_line(explorer):
    cmd = explorer.command_line()
    assert cmd.startswith("zero-sim simulate --strategy ddp")
    assert "--topology pcie" in cmd and "--bucket-mb 25" in cmd


def test_a_measured_step_is_drawn_one_lane_per_stream_of_the_chosen_rank():
    ops = [{"rank": r, "step": step, "stream": stream, "name": name, "start_s": 1.0 + t, "end_s": 1.002 + t}
           for r in (0, 1) for step in (0, 1)
           for stream, name, t in (("compute", "fwd L1", 0.0), ("comm", "all_reduce B0", 0.001),
                                   ("host", "wait all_reduce B0", 0.002))]
    ax = plot_measured_step(ops, rank=1, heading="measured: ddp on 2 ranks (gloo)")
    assert ax.get_title() == "measured: ddp on 2 ranks (gloo), step 1"
    assert [t.get_text() for t in ax.get_yticklabels()] == ["rank 1 host", "rank 1 compute", "rank 1 comm"]
    assert ax.get_xlim()[0] <= 0 and len(ax.collections) == 3


def test_the_headline_text_names_every_number():
    m = simulate(model="gpt2-124m", strategy="ddp", gpus=8, topology="pcie").metrics
    text = metrics_text(m)
    for words in ("step time", "exposed comm", "overlap", "TFLOP/s per GPU", "peak memory", "fits"):
        assert words in text


# ----------------------------------------------------------------------------- generic controls


@pytest.mark.parametrize("knob, typed", [
    (Knob("depth", 3, "an int", int), 5),
    (Knob("ratio", 0.5, "a float"), 0.75),
    (Knob("flag", False, "a bool", bool), True),
    (Knob("mode", "a", "a choice", str, ("a", "b")), "b"),
    (Knob("label", "blocks", "free text", str), "layers"),
    (Knob("limit", None, "an int whose default is the strategy's", int), 7),
])
def test_a_knob_never_seen_before_gets_a_working_control(knob, typed):
    w = make_control(knob.name, knob.default, knob.kind, knob.choices, knob.help)
    assert read_control(w, knob.kind) == knob.default
    set_control(w, typed)
    assert read_control(w, knob.kind) == typed


def test_slider_stops_grow_to_take_a_value_they_lack():
    w = make_control("gpus", 8, int)
    set_control(w, 24)
    assert read_control(w, int) == 24


# ----------------------------------------------------------------------------- compare panel


def test_hook_launch_beats_step_launch_until_the_backward_is_compiled():
    panel = ComparePanel({"step": {"zero2_launch": "step"}, "hook": {"zero2_launch": "hook"}},
                         strategy="zero2", topology="dgx-a100", bucket_mb=0,
                         settings=("gpus", "bandwidth_gbps", "compiled_backward"))
    step, hook = panel.result["step"].metrics, panel.result["hook"].metrics
    assert hook["phases"]["optimizer_s"] < step["phases"]["optimizer_s"]
    panel.controls["compiled_backward"].value = True  # hooks now fire only at the end of backward
    step, hook = panel.result["step"].metrics, panel.result["hook"].metrics
    assert hook["step_time_s"] == pytest.approx(step["step_time_s"], rel=0.02)
    assert set(panel.frame().index) == {"step", "hook"}


def test_a_refused_variant_is_reported_and_the_others_still_shown():
    panel = ComparePanel({"fine": {}, "broken": {"bucket_mb": -1}}, strategy="ddp", topology="pcie")
    assert set(panel.result) == {"fine"}
    assert "broken" in panel.errors and "bucket" in panel.errors["broken"]


# ----------------------------------------------------------------------------- memory arithmetic


def test_a_1_5b_model_needs_24_gb_of_model_states_without_sharding():
    assert sum(model_state_bytes(0, 1.5e9, 1).values()) == pytest.approx(24e9)


@pytest.mark.parametrize("stage, gb", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_the_zero_papers_7_5b_on_64_gpus(stage, gb):
    assert sum(model_state_bytes(stage, 7.5e9, 64).values()) / 1e9 == pytest.approx(gb, abs=0.05)


def test_the_memory_calculator_follows_its_sliders():
    calc = MemoryCalculator(params_billion=1.5, gpus=8, stage=0, k=12)
    assert calc.result["total_bytes"] == pytest.approx(24e9)
    calc.controls["stage"].value = 3
    assert calc.result["total_bytes"] == pytest.approx(24e9 / 8)
    assert calc.result["comm_volume_elements"] == pytest.approx(3 * 1.5e9)
    calc.controls["k"].value = 8  # an optimizer keeping a master copy and a momentum only
    assert calc.result["total_bytes"] == pytest.approx(12 * 1.5e9 / 8)
    calc.controls["gpus"].value = 1
    assert calc.result["fits"] is (calc.result["total_bytes"] <= calc.result["capacity_bytes"])


def test_the_calculator_shows_the_formulas_bytes_for_every_stage():
    calc = MemoryCalculator(params_billion=7.5, gpus=64, stage=2, k=12)
    for stage, shown in enumerate(calc.result["all_stages"]):
        held = model_state_bytes(stage, 7.5e9, 64, optimizer_bytes=12)
        assert shown == {"params_bytes": held["params"], "grads_bytes": held["grads"],
                         "optimizer_bytes": held["optimizer"], "total_bytes": sum(held.values())}


@pytest.mark.parametrize("stage, strategy", list(enumerate(["ddp", "zero1", "zero2", "zero3"])))
def test_the_simulator_holds_what_the_formula_says(stage, strategy):
    m = simulate(model="gpt2-1.5b", strategy=strategy, gpus=8, topology="dgx-a100", micro_batch=1).metrics
    formula = sum(model_state_bytes(stage, m["params"], 8).values())
    # ZeRO-3 pads each layer's shard to a multiple of N, and may keep small tensors whole.
    assert m["memory"]["model_states_bytes"] == pytest.approx(formula, rel=0.01)


# ----------------------------------------------------------------------------- nccl-tests fit

PCIE_PAIR = """
8,388,608 2,097,152 580.2 14.46 14.46 632.5 13.26 13.26
67,108,864 16,777,216 3528.4 19.02 19.02 3520.6 19.06 19.06
1,073,741,824 268,435,456 53,866 19.93 19.93 54,288 19.78 19.78
"""


def test_pasting_nccl_tests_output_fits_latency_and_bandwidth():
    panel = NcclFitPanel({"pair": PCIE_PAIR})
    fit = panel.result["fit"]
    assert fit.busbw / 1e9 == pytest.approx(20.0, rel=0.05)
    assert panel.result["table"].n_ranks == 2
    panel.controls["text"].value = "this is not a table"
    panel.button.click()
    assert panel.result is None and "nccl-tests" in panel.error


# ----------------------------------------------------------------------------- planner panel


def test_the_planner_puts_first_a_fitting_candidate_near_the_fastest_with_the_most_room():
    """Within 5% of the fastest speeds are too close to call, so the one with most memory to spare
    (its whole 80% interval inside the GPU first) is put first."""
    planner = Planner(model="gpt2-350m", gpus=8, topology="dgx-a100", micro_batch=4, recompute=("none",))
    df = planner.result
    best = planner.best()
    assert best is not None and bool(best["fits"])
    fitting = df[df["fits"]]
    assert best["tokens_per_s"] >= 0.95 * fitting["tokens_per_s"].max()
    rivals = df[df["too_close_to_call"] & (df["fit_verdict"] == best["fit_verdict"])]
    assert best["spare_GB"] == pytest.approx(rivals["spare_GB"].max(), abs=0.05)
    assert planner.progress.n == planner.progress.total  # the bar ran over every candidate
    # Planning is long work, so it runs when the reader presses "plan", not on every control.
    planner.controls["gpus"].value = 16
    assert planner.result is df
    # ... but the panel says at once that what it shows is the previous plan.
    assert "Settings changed</b> to gpt2-350m on 16 GPUs" in planner.summary.value
    assert planner.figure.axes[0].get_title().endswith("(previous plan: press plan)")
    planner.button.click()
    assert planner.result is not df and set(planner.result["gpus"]) == {16}
    assert "previous plan" not in planner.figure.axes[0].get_title()
    # The chart plots what "fits" compares: the reserved memory against the GPU's.
    assert planner.figure.axes[0].get_xlabel().startswith("reserved memory per GPU")
    # ... and each fitting candidate's likely step time as a bar (the 80% interval).
    from matplotlib.collections import LineCollection

    bars = [c for c in planner.figure.axes[0].collections if isinstance(c, LineCollection)]
    assert bars and all(len(seg) == 2 for seg in bars[0].get_segments())


def test_notebook_text_names_settings_not_command_line_flags():
    from zero_sim.ui.text import without_flags

    assert without_flags("--hybrid needs two nodes; raise --gpus or lower --gpus-per-node") == \
        "hybrid needs two nodes; raise gpus or lower gpus_per_node"


# ----------------------------------------------------------------------------- figures that read well


def _legends(fig):
    return [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend() is not None)]


def _overlaps(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def _check_reads_well(fig):
    """At most FIGURE_WIDTH inches wide, legends included and off every axis's data area, and every
    drawn axis naming its unit (a categorical axis of lanes or stages excepted)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from zero_sim.ui.plots import FIGURE_WIDTH

    canvas = FigureCanvasAgg(fig)  # a panel's figure has no canvas outside a notebook: draw it as a PNG would
    canvas.draw()
    renderer = canvas.get_renderer()
    whole = fig.get_window_extent(renderer)
    assert fig.get_figwidth() <= FIGURE_WIDTH
    for legend in _legends(fig):
        box = legend.get_window_extent(renderer)
        assert whole.x0 - 1 <= box.x0 and box.x1 <= whole.x1 + 1, "a legend spills past the figure's width"
        for ax in fig.axes:
            if ax.axison:
                assert not _overlaps(box, ax.get_window_extent(renderer)), "a legend sits on the data"
    for ax in fig.axes:
        if ax.get_title():
            box = ax.title.get_window_extent(renderer)
            assert whole.x0 - 1 <= box.x0 and box.x1 <= whole.x1 + 1, f"title cut: {ax.get_title()!r}"
        if not ax.axison:
            continue
        for axis, label in ((ax.xaxis, ax.get_xlabel()), (ax.yaxis, ax.get_ylabel())):
            ticks = [t.get_text() for t in axis.get_ticklabels() if t.get_visible() and t.get_text()]
            ticks = [t.replace("mathdefault", "") for t in ticks]  # log axes write 10^1 in mathtext
            numeric = any(re.search(r"\d", t) and not re.search(r"[a-zA-Z]{3}", t) for t in ticks)
            if numeric:  # numbers need their unit; lanes ("rank 0 compute") and stages ("DDP") are names
                assert re.search(r"\((ms|GB|GB/s|MiB)\)", label), f"no unit: {label!r}"


def test_every_panel_figure_fits_the_notebook_with_its_legends_beside_the_data(explorer):
    _check_reads_well(explorer.figure.fig)
    compare = ComparePanel({"a": {}, "b": {"bucket_mb": 100}}, strategy="ddp", topology="pcie")
    _check_reads_well(compare.figure.fig)
    _check_reads_well(MemoryCalculator().figure.fig)
    _check_reads_well(NcclFitPanel({"pair": PCIE_PAIR}).figure.fig)
    planner = Planner(model="gpt2-124m", gpus=8, topology="dgx-a100", micro_batch=4, recompute=("none",))
    _check_reads_well(planner.figure.fig)


def test_the_quickstart_timeline_keeps_its_long_title_inside_the_figure():
    import matplotlib.pyplot as plt

    result = simulate(model="gpt2-124m", strategy="ddp", gpus=8, topology="pcie", micro_batch=8)
    fig, ax = plt.subplots(figsize=(9, 3.2), layout="constrained")  # notebook 00's figure
    result.plot_timeline(ax=ax, max_ranks=2)
    assert len(ax.get_title()) > 80
    _check_reads_well(fig)
    plt.close(fig)


def test_the_cli_demo_figure_keeps_its_legends_off_the_curves():
    import matplotlib.pyplot as plt

    from zero_sim.ui.plots import plot_overview

    fig = plot_overview(simulate(model="gpt2-124m", strategy="ddp", gpus=8, topology="pcie", micro_batch=8))
    _check_reads_well(fig)
    assert fig.axes[1].get_ylabel().endswith("(GB)")
    plt.close(fig)


def test_the_timeline_says_which_ranks_it_draws(explorer):
    title = explorer.figure.axes[0].get_title()
    assert title.endswith("(ranks 0-3 of 8 shown)"), title


def test_each_strategy_keeps_its_colour_from_one_plan_to_the_next():
    from zero_sim.ui.plots import STRATEGY_COLORS, strategy_color

    assert len(set(STRATEGY_COLORS.values())) == len(STRATEGY_COLORS) >= len(STRATEGIES)
    assert all(strategy_color(name) == STRATEGY_COLORS[name] for name in STRATEGIES)
    assert strategy_color("zero-infinity") == strategy_color("zero-infinity")  # a newcomer's is stable too
    planner = Planner(model="gpt2-124m", gpus=8, topology="dgx-a100", micro_batch=4, recompute=("none",))

    def colours():
        legend = planner.figure.axes[0].get_legend()
        return {t.get_text(): h.get_color() for t, h in zip(legend.get_texts(), legend.legend_handles,
                                                             strict=True) if t.get_text() in STRATEGIES}

    first = colours()
    planner.controls["model"].value = "gpt2-350m"  # a re-plan ranks the strategies differently
    planner.button.click()
    assert colours() == first == {name: strategy_color(name) for name in first}


def test_the_optimizer_phase_is_shown_split_into_waiting_and_update(explorer):
    m = explorer.result.metrics
    text = metrics_text(m)
    wait, update = m["phases"]["optimizer_wait_s"] * 1e3, m["phases"]["optimizer_update_s"] * 1e3
    assert f"optimizer: {wait:.2f} ms waiting for communication + {update:.2f} ms update" in text
    assert "waiting for communication" in explorer.metrics.value
