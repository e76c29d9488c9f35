"""Every control of every panel, moved through every value it offers: the simulator never refuses.

A reader learns by moving things.  If a slider stop leads to "cannot simulate this", the
reader learns that the tool is broken, not what a bucket does.  So each panel's sliders,
dropdowns and checkboxes offer only the values the simulator accepts beside the other
settings (``zero_sim.ui.offers``), and these tests hold them to it: for each panel, under
each strategy, every control is moved through its whole list of offered values (every
stop of a slider, every option of a dropdown, both states of an enabled checkbox) the way a
reader releases a slider, and after each move the panel must show a picture and no
refusal.  The explorer's controls are walked one after another without being put back, so
later controls are also tried in the corners earlier ones left (512 GPUs, a 64-GPU host
...); the notebooks' comparisons are walked one control at a time from where the notebook
opens them, which is what their readers can reach.

The converse is tested too: a value a control leaves out is one the simulator really
refuses, with the sentence the control's tooltip gives, so nothing runnable is hidden.
"""

from __future__ import annotations

import matplotlib
import pytest

matplotlib.use("Agg")

import ipywidgets as W  # noqa: E402

from zero_sim import ScenarioError, simulate  # noqa: E402
from zero_sim.strategies import STRATEGIES, get_strategy  # noqa: E402
from zero_sim.ui.offers import offering  # noqa: E402
from zero_sim.ui.panels import ComparePanel, MemoryCalculator, NcclFitPanel, Planner, TimelineExplorer  # noqa: E402

# ----------------------------------------------------------------------------- how a reader moves things


def offered(widget) -> list:
    """What a control lets the reader pick now: each option, both states of an enabled checkbox, every
    step of an integer slider."""
    if isinstance(widget, W.Checkbox):
        return [widget.value] if widget.disabled else [not widget.value, widget.value]
    if isinstance(widget, W.IntSlider):
        return list(range(widget.min, widget.max + 1, widget.step))
    return [o[1] if isinstance(o, tuple) else o for o in widget.options]


def shown_refusals(widget) -> list[str]:
    """Every refusal on screen: the red "cannot simulate this" lines anywhere in the panel's layout."""
    found = []
    if isinstance(widget, W.HTML) and "cannot simulate" in widget.value:
        found.append(widget.value)
    for child in getattr(widget, "children", ()):
        found += shown_refusals(child)
    return found


def movable(panel, name: str) -> bool:
    w = panel.controls[name]
    return (offering(w) or isinstance(w, W.IntSlider)) and not w.disabled and w.layout.display != "none"


def walk(panel, check, order=None, put_back: bool = False) -> int:
    """Move every movable control through every value it offers, checking the panel after each move;
    with ``put_back``, return each control to where it was before moving the next (each control
    alone, from the opening scenario).  Returns how many moves were made."""
    moves = 0
    for name in order or list(panel.controls):
        if not movable(panel, name):
            continue
        widget = panel.controls[name]
        start = widget.value
        for value in offered(widget):
            widget.value = value  # what releasing the slider on that stop does
            check(panel, f"{name} = {value!r}")
            moves += 1
        if put_back:
            widget.value = start
            check(panel, f"{name} back to {start!r}")
    return moves


def simulated_without_refusal(panel, move: str) -> None:
    assert panel.error is None, f"after {move}: {panel.error}"
    assert not shown_refusals(panel.widget), f"after {move}: a refusal is on screen"
    assert panel.result is not None, f"after {move}: nothing is shown"


def walk_order(panel) -> list[str]:
    # The costly leaders last: the model dropdown reaches 175B parameters, and moving the strategy
    # resets the knobs just walked.
    names = [n for n in panel.controls if n not in ("model", "strategy")]
    return names + [n for n in ("model", "strategy") if n in panel.controls]


# ----------------------------------------------------------------------------- the timeline explorer


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_every_control_of_the_timeline_explorer_offers_only_what_runs(strategy):
    # One rank's lanes drawn (not four): the same scenarios, a third less drawing.
    explorer = TimelineExplorer(strategy=strategy, model="gpt2-124m", gpus=8, topology="pcie", micro_batch=8,
                                max_ranks=1)
    simulated_without_refusal(explorer, "opening")
    assert walk(explorer, simulated_without_refusal, walk_order(explorer)) > 50


def test_ddp_is_not_offered_the_per_tensor_bucket_that_zero2_is():
    explorer = TimelineExplorer(strategy="ddp", topology="pcie", gpus=8)
    # DDP refuses a 0 MiB bucket; ZeRO-2 reads it as "one reduce-scatter per tensor".
    assert 0 not in offered(explorer.controls["bucket_mb"])
    explorer.controls["strategy"].value = "zero2"
    assert 0 in offered(explorer.controls["bucket_mb"])
    explorer.controls["bucket_mb"].value = 0
    explorer.controls["strategy"].value = "ddp"  # back to DDP: its own default, never the refused 0
    assert explorer.controls["bucket_mb"].value == 25 and explorer.error is None


def test_the_gpu_count_follows_the_topology_and_hybrid_sharding_needs_two_nodes():
    explorer = TimelineExplorer(strategy="fsdp", topology="dgx-a100", gpus=8)
    hybrid = explorer.controls["hybrid"]
    assert hybrid.disabled and "two nodes" in hybrid.tooltip  # one node of 8: there is nothing to hybridize
    explorer.controls["gpus"].value = 16
    assert not hybrid.disabled
    hybrid.value = True
    assert min(offered(explorer.controls["gpus"])) == 16  # fewer would be a single node again
    # A single 64-GPU host cannot take 128 ranks, nor shard across nodes: GPUs come down, hybrid goes off.
    explorer.controls["gpus"].value = 128
    explorer.controls["topology"].value = "cpu-gloo"
    assert explorer.controls["gpus"].value == 64 and hybrid.value is False and explorer.error is None
    assert max(offered(explorer.controls["gpus"])) == 64


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_value_left_out_is_one_the_simulator_refuses(strategy):
    explorer = TimelineExplorer(strategy=strategy, topology="gb200-nvl72", gpus=8)
    left_out = {name: why for name, why in explorer.offers.refused.items() if why}
    assert left_out, "this opening should leave something out (a 0 MiB bucket, 128 GPUs on 72-GPU nodes)"
    for name, refusals in left_out.items():
        for value, sentence in refusals.items():
            settings = explorer.settings({name: value})
            with pytest.raises(ScenarioError) as exc:
                simulate(**settings)
            assert str(exc.value) == sentence, f"{name} = {value!r}"


def test_a_typed_value_is_still_checked_and_refused_once():
    explorer = TimelineExplorer(strategy="zero3", topology="pcie", gpus=8)
    explorer.controls["prefetch"].value = "-1"  # a text box: typed, so the simulator answers
    assert explorer.error and "--prefetch" in explorer.error
    assert len(shown_refusals(explorer.widget)) == 1
    assert not any(ax.texts for ax in explorer.figure.axes)  # not repeated on the figure


# ----------------------------------------------------------------------------- comparisons


# The notebooks' comparisons, controls and openings as the notebooks build them, on smaller models where
# the model has no control (four GPT-2 blocks; GPT-2 350M for notebook 05's 10B), to keep the walks quick.
NOTEBOOK_COMPARISONS = {
    "03 buckets": lambda: ComparePanel(
        {"1 MiB": {"bucket_mb": 1}, "25 MiB (default)": {"bucket_mb": 25}, "100 MiB": {"bucket_mb": 100}},
        strategy="ddp", topology="pcie", gpus=8, micro_batch=8, settings=("gpus", "bandwidth_gbps"),
        layers=4),
    "04 launch": lambda: ComparePanel(
        {"step": {"zero2_launch": "step"}, "hook": {"zero2_launch": "hook"}},
        strategy="zero2", model="gpt2-124m", topology="dgx-h100", gpus=8, micro_batch=8, bucket_mb=0,
        settings=("gpus", "bandwidth_gbps", "micro_batch", "compiled_backward"), layers=4),
    "05 versus": lambda: ComparePanel(
        {"ZeRO-2": {"strategy": "zero2"}, "ZeRO-3": {"strategy": "zero3"}},
        strategy="zero3", gpus=16, bandwidth_gbps=400, settings=("gpus", "bandwidth_gbps"),
        model="gpt2-350m", topology="p4d-efa", micro_batch=4),
    "05 fixed": lambda: ComparePanel(
        {"unoptimized": {f: False for f in ("batch_collectives", "fine_grained_sync", "precomputed_fetch")},
         "optimized": {}},
        strategy="zero3", gpus=64, bandwidth_gbps=320, settings=("bandwidth_gbps", "prefetch_bucket_size"),
        model="gpt2-350m", topology="p4d-efa", micro_batch=4),
}


@pytest.mark.parametrize("name", list(NOTEBOOK_COMPARISONS))
def test_every_control_of_the_notebooks_comparisons_offers_only_what_runs(name):
    # Each control alone from what the notebook opens on: what a reader of that notebook can reach.
    panel = NOTEBOOK_COMPARISONS[name]()
    simulated_without_refusal(panel, "opening")
    assert walk(panel, simulated_without_refusal, put_back=True) > 5


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_every_control_of_a_comparison_offers_only_what_runs(strategy):
    knobs = [k.name for k in get_strategy(strategy).knobs]
    # The topology and model dropdowns are walked by the explorer's test, and several variants by the
    # notebooks' comparisons above; here, knob controls that stay visible whatever the strategy.
    panel = ComparePanel({"as set": {}}, strategy=strategy, topology="pcie", gpus=8,
                         settings=("gpus", "bandwidth_gbps", "micro_batch"), knobs=knobs)
    simulated_without_refusal(panel, "opening")
    assert walk(panel, simulated_without_refusal) > 20


# ----------------------------------------------------------------------------- planner, calculator, fit


def test_every_control_of_the_planner_offers_only_what_every_strategy_can_run():
    planner = Planner(model="gpt2-124m", gpus=8, topology="dgx-a100", micro_batch=4, recompute=("none",))

    def plannable(panel, move):
        assert not any(panel.offers.refusals()), f"after {move}: {panel.offers.refusals()}"

    assert walk(planner, plannable) > 50
    # Back to a small model, then plan: no refusal on screen.
    planner.controls["model"].value = "gpt2-124m"
    planner.button.click()
    simulated_without_refusal(planner, "plan")


def test_every_control_of_the_memory_calculator_shows_a_result():
    calc = MemoryCalculator()
    assert walk(calc, simulated_without_refusal) > 60


PAIR = """
#  size (B)        count   time (us)  algbw (GB/s)  busbw (GB/s)
    8388608      2097152      580.2      14.46      14.46
   67108864     16777216     3528.4      19.02      19.02
 1073741824    268435456    53866.0      19.93      19.93
"""


def test_every_control_of_the_nccl_fit_shows_a_fit():
    slower = PAIR.replace("580.2", "600.0").replace("14.46", "13.98")
    panel = NcclFitPanel({"pair": PAIR, "a slower pair": slower})
    assert walk(panel, simulated_without_refusal) >= 5
