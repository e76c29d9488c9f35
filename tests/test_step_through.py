"""Playing one step: who keeps which shard, what is in flight, and what runs, moment by moment."""

import matplotlib
import pytest

from zero_sim import simulate
from zero_sim.ui.panels.step_through import FRAMES, StepThrough
from zero_sim.ui.step_frames import StepFrames, link_label
from zero_sim.vocabulary import GRADS, OPTIMIZER_STATE, PARAMS

matplotlib.use("Agg")


@pytest.fixture(scope="module")
def frames():
    # Every rank simulated, as the panel asks: each GPU's own shard is drawn.
    return StepFrames({s: simulate(model="gpt2-124m", strategy=s, gpus=4, topology="pcie", micro_batch=2,
                                   explicit_ranks=True) for s in ("ddp", "zero1", "zero2", "zero3")})


@pytest.mark.parametrize("strategy, params, grads, optimizer", [
    ("ddp", 1, 1, 1), ("zero1", 1, 1, 0.25), ("zero2", 1, 0.25, 0.25), ("zero3", 0.25, 0.25, 0.25)])
def test_each_stage_shards_one_more_array(frames, strategy, params, grads, optimizer):
    # The ZeRO paper's stages: 1 shards the optimizer state, 2 the gradients too, 3 the parameters too.
    held = frames.frame(0.0)[strategy][2].held
    assert held[PARAMS] == pytest.approx(params, abs=0.01)
    assert held[GRADS] == pytest.approx(grads, abs=0.01)
    assert held[OPTIMIZER_STATE] == pytest.approx(optimizer, abs=0.01)


def test_zero3_waits_for_its_first_layer_to_be_gathered_before_computing(frames):
    first = frames.frame(1e-4)["zero3"][0]
    assert first.compute is None
    assert [op["name"] for op in first.comm] == ["all_gather L0"]
    assert first.comm[0]["link"] == link_label("pcie", 4)
    # ... while DDP, whose weights are all there, has been computing since the step began.
    gathered = next(op["end_s"] for op in frames.timelines["zero3"].result.ops
                    if op["rank"] == 0 and op["step"] == 1 and op["name"] == "all_gather L0")
    gathered -= frames.timelines["zero3"].start
    ddp = frames.timelines["ddp"]
    assert any(ddp.moment(0, gathered * i / 20).compute for i in range(20))


def test_zero3_holds_more_in_flight_while_a_layer_is_gathered_than_between_layers(frames):
    timeline = frames.timelines["zero3"]
    moments = [timeline.moment(0, timeline.step_s * i / 200) for i in range(200)]
    in_flight = [m.in_flight_bytes for m in moments]
    assert max(in_flight) > min(in_flight)
    gathering = [m.in_flight_bytes for m in moments
                 if any(op["name"].startswith("all_gather") for op in m.comm)]
    assert gathering and max(gathering) == max(in_flight)


def test_activations_build_up_in_forward_and_are_gone_when_the_step_ends(frames):
    timeline = frames.timelines["ddp"]
    forward_end = max(op["end_s"] for op in timeline.result.ops
                      if op["rank"] == 0 and op["phase"] == "forward" and op["step"] == 1) - timeline.start
    assert timeline.moment(0, forward_end).activations_bytes > timeline.moment(0, 1e-4).activations_bytes
    end = timeline.moment(0, timeline.step_s)
    assert end.done and end.activations_bytes == 0 and end.compute is None


def test_a_faster_strategy_reads_done_while_the_slower_one_still_plays(frames):
    fastest = min(frames.timelines.values(), key=lambda t: t.step_s)
    slowest = max(frames.timelines.values(), key=lambda t: t.step_s)
    t = (fastest.step_s + slowest.step_s) / 2
    assert fastest.moment(0, t).done and not slowest.moment(0, t).done
    assert frames.longest_s == slowest.step_s


def test_the_panel_plays_from_the_start_to_the_end_of_the_longest_step():
    panel = StepThrough(model="gpt2-124m", topology="dgx-a100", micro_batch=1)
    assert panel.now_s() == 0.0
    panel.time.value = FRAMES - 1
    assert panel.now_s() == pytest.approx(panel.result.longest_s)
    assert all(ranks[0].done for ranks in panel.moment().values())
    panel.controls["last"].value = "fsdp"
    assert list(panel.result.timelines) == ["ddp", "zero1", "zero2", "fsdp"]


def test_the_panels_words_stay_inside_the_figure_and_off_each_other():
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    panel = StepThrough(model="gpt2-124m", topology="p4d-efa", micro_batch=2)
    for frame in (0, FRAMES // 3, FRAMES // 2):
        panel.time.value = frame
        fig = panel.figure.fig
        canvas = FigureCanvasAgg(fig)
        canvas.draw()
        renderer = canvas.get_renderer()
        whole = fig.get_window_extent(renderer)
        boxes = [t.get_window_extent(renderer) for ax in fig.axes if ax.get_visible() for t in ax.texts]
        for box in boxes:
            assert whole.x0 <= box.x0 and box.x1 <= whole.x1 and whole.y0 <= box.y0
        for i, a in enumerate(boxes):
            for b in boxes[i + 1:]:
                assert not (a.x0 < b.x1 - 1 and b.x0 < a.x1 - 1 and a.y0 < b.y1 - 1 and b.y0 < a.y1 - 1)


def test_zero3_s_other_quarters_fill_while_a_layer_is_gathered_and_empty_after_the_backward(frames):
    timeline = frames.timelines["zero3"]
    gather = next(op for op in timeline.result.ops
                  if op["rank"] == 0 and op["step"] == 1 and op["name"] == "all_gather L0")
    start, end = gather["start_s"] - timeline.start, gather["end_s"] - timeline.start
    # Every rank fills the other quarters as the gather runs: empty at its start, half-way at its middle.
    early, middle = timeline.moment(0, start + 1e-9), timeline.moment(0, (start + end) / 2)
    assert early.borrowed[PARAMS] < 0.05 and middle.borrowed[PARAMS] == pytest.approx(0.5, abs=0.05)
    assert all(timeline.moment(r, (start + end) / 2).borrowed[PARAMS] > 0.4 for r in timeline.ranks)
    # After the step's last layer, nothing borrowed is left.
    assert timeline.moment(0, timeline.step_s * 0.999).borrowed.get(PARAMS, 0.0) == 0.0
    # A reduce-scatter sends the gradients' other quarters away: what is left shrinks as it runs.
    scatter = next(op for op in timeline.result.ops if op["rank"] == 0 and op["step"] == 1
                   and op["name"].startswith("reduce_scatter"))
    s0, s1 = scatter["start_s"] - timeline.start, scatter["end_s"] - timeline.start
    left = [timeline.moment(0, s0 + (s1 - s0) * f).borrowed[GRADS] for f in (0.2, 0.8)]
    assert left[0] > left[1]


def test_ddp_borrows_nothing_because_it_keeps_everything(frames):
    timeline = frames.timelines["ddp"]
    moments = [timeline.moment(0, timeline.step_s * i / 50) for i in range(50)]
    assert all(share == 0.0 for m in moments for share in m.borrowed.values())


def test_reading_another_moment_leaves_the_slider_at_zero():
    panel = StepThrough(model="gpt2-124m", topology="pcie", micro_batch=2)
    later = panel.moment(panel.result.longest_s / 3)
    assert panel.time.value == 0 and panel.play.value == 0
    assert later != panel.moment()
