"""Play one training step of 4 ranks under DDP, ZeRO-1, ZeRO-2 and ZeRO-3 (or FSDP), side by side.

A **Play** button and a time slider walk the step; at each moment every strategy's column
shows, for each rank:

* three rows of N boxes, one per shard of the parameters, the gradients and the optimizer
  state: a filled box is a shard the rank keeps, the rank's own shard outlined (under DDP
  every rank keeps every shard; under ZeRO-1 only its own optimizer shard; ...). A hatched
  box is another rank's quarter of the layer at work, held for a moment: under ZeRO-3 and
  FSDP it fills as the layer's all-gather runs and empties when the layer is done, and a
  gradient's quarters empty as its reduce-scatter sends them away;
* a bar of what is **in flight**: communication buffers (gradient buckets on their way,
  weights gathered for the layer about to run) and the activations saved so far, on one
  scale for every column, so a ZeRO-3 rank's gathered layer can be seen to come and go;
* under the column, the op on the compute stream and the collective under way, with its
  algorithm and the link class that limits it.

Everything comes from the simulator's own records (:mod:`zero_sim.ui.step_frames`), so it
works for any model and topology the simulator accepts.  ``result`` is the
:class:`~zero_sim.ui.step_frames.StepFrames` being played; ``moment()`` is the frame now.
"""

from __future__ import annotations

import ipywidgets as W
from matplotlib.patches import Rectangle

from zero_sim.scenario import ScenarioError, simulate
from zero_sim.strategies import STRATEGIES
from zero_sim.system.gpus import GB
from zero_sim.system.model_presets import PRESETS as MODELS
from zero_sim.system.topology import PRESETS as TOPOLOGIES
from zero_sim.ui.controls import STYLE, format_ms
from zero_sim.ui.figure import FIGURE_WIDTH, Figure
from zero_sim.ui.panel import Panel
from zero_sim.ui.step_frames import MODEL_STATES, RankMoment, StepFrames
from zero_sim.ui.style import MEMORY_COLORS, strategy_color
from zero_sim.ui.text import error_html
from zero_sim.vocabulary import ACTIVATIONS, BUFFERS, GRADS, OPTIMIZER_STATE, PARAMS

RANKS = 4  # ranks drawn, and simulated: the side-by-side view is about who holds which quarter
FRAMES = 120  # slider positions over the longest step
LABELS = {name: strategy.label for name, strategy in STRATEGIES.items()}
# The columns: every strategy that keeps whole weights, then one that shards them (the toggle).
WHOLE = [name for name, strategy in STRATEGIES.items() if not strategy.can.shards(PARAMS)]
SHARDING = [name for name, strategy in STRATEGIES.items() if strategy.can.shards(PARAMS)]
ROW_NAMES = {PARAMS: "P", GRADS: "G", OPTIMIZER_STATE: "O"}
TEXT_PT = 9  # every caption: smaller is hard to read beside the boxes


class StepThrough(Panel):
    """Play one step of DDP, ZeRO-1, ZeRO-2 and ZeRO-3 (or FSDP) on 4 ranks, shard by shard."""

    def __init__(self, model: str = "gpt2-124m", topology: str = "pcie", micro_batch: int = 2,
                 last: str = SHARDING[0], figsize=(FIGURE_WIDTH, 6.0), auto: bool = True):
        super().__init__()
        self.controls = {
            "model": W.Dropdown(options=sorted(MODELS), value=model, description="model", style=STYLE),
            "topology": W.Dropdown(options=sorted(TOPOLOGIES), value=topology, description="topology",
                                   style=STYLE),
            "micro_batch": W.Dropdown(options=[1, 2, 4, 8], value=micro_batch, description="micro-batch",
                                      style=STYLE),
            "last": W.ToggleButtons(options=[(LABELS[name], name) for name in SHARDING], value=last,
                                    description="fully sharded", style=STYLE),
        }
        self.time = W.IntSlider(value=0, min=0, max=FRAMES - 1, description="time", style=STYLE,
                                readout=False, continuous_update=True, layout=W.Layout(width="36em"))
        self.play = W.Play(value=0, min=0, max=FRAMES - 1, interval=150, description="play")
        W.jslink((self.play, "value"), (self.time, "value"))
        self.clock = W.HTML()
        self.status = W.HTML()
        self.figure = Figure(figsize)
        self.figure.fig.subplots_adjust(left=0.02, right=0.99, top=0.91, bottom=0.25, wspace=0.1)
        self._columns = [self.figure.fig.add_subplot(1, 4, i + 1) for i in range(4)]
        self.figure.axes[0].set_visible(False)
        _legend(self.figure.fig)
        self.widget = W.VBox([W.HBox([W.VBox([self.controls["model"], self.controls["topology"]]),
                                      W.VBox([self.controls["micro_batch"], self.controls["last"]])]),
                              W.HBox([self.play, self.time, self.clock]), self.status, self.figure.widget])
        self.watch()
        self.time.observe(lambda _change: self.render(), names="value")
        if auto:
            self.update()

    @property
    def strategies(self) -> list[str]:
        return [*WHOLE, self.controls["last"].value]

    def update(self, *_):
        c = self.controls
        try:
            results = {s: simulate(model=c["model"].value, topology=c["topology"].value, gpus=RANKS,
                                   micro_batch=c["micro_batch"].value, strategy=s, explicit_ranks=True)
                       for s in self.strategies}
        except ScenarioError as exc:
            self.error, self.result = str(exc), None
            self.status.value = error_html(self.error)
            self.figure.blank()
            return None
        self.error = None
        self.result = StepFrames(results)
        self.status.value = ""
        self.render()
        return self.result

    def now_s(self) -> float:
        """The moment shown, in seconds into the step."""
        return self.result.longest_s * self.time.value / (FRAMES - 1)

    def moment(self, at_s: float | None = None) -> dict[str, list[RankMoment]]:
        """Every strategy's ranks at the slider's time, or at ``at_s`` seconds (the slider stays put)."""
        return self.result.frame(self.now_s() if at_s is None else at_s, RANKS)

    def render(self):
        if self.result is None:
            return
        t = self.now_s()
        self.clock.value = f"<b>{format_ms(t)}</b> into the step"
        frame = self.moment()
        scale = max(tl.peak_bytes() for tl in self.result.timelines.values())
        for ax, (strategy, ranks) in zip(self._columns, frame.items(), strict=True):
            self._draw_column(ax, strategy, ranks, scale)
        self.figure.fig.suptitle("box: a quarter of an array (P parameters, G gradients, O optimizer); "
                                 "filled: kept all step; hatched: held for now",
                                 fontsize=TEXT_PT, y=0.99)
        self.figure.show()

    def _draw_column(self, ax, strategy: str, ranks: list[RankMoment], scale: float):
        ax.clear()
        ax.set_axis_off()
        timeline = self.result.timelines[strategy]
        n = len(ranks)
        ax.set_xlim(-1.2, n + 0.2)
        ax.set_ylim(-0.6, 4.6 * n)
        status = "done" if ranks[0].done else format_ms(timeline.step_s)
        ax.set_title(f"{LABELS.get(strategy, strategy)} · {status}", fontsize=TEXT_PT + 1,
                     color=strategy_color(strategy))
        for i, moment in enumerate(ranks):
            top = 4.6 * (n - 1 - i) + 4.0
            ax.text(-0.85, top - 1.6, f"rank {moment.rank}", fontsize=TEXT_PT, va="center", ha="center",
                    rotation=90)
            for row, cat in enumerate(MODEL_STATES):
                _draw_shards(ax, moment, cat, n, y=top - 1.0 - row * 0.8)
            # In flight: buffers then activations, as a bar across the shard boxes' width.
            y = top - 3.6
            width = n * 0.975
            left = 0.0
            for cat, nbytes in ((BUFFERS, moment.in_flight_bytes), (ACTIVATIONS, moment.activations_bytes)):
                w = width * nbytes / scale if scale else 0.0
                ax.add_patch(Rectangle((left, y), w, 0.5, facecolor=MEMORY_COLORS[cat], edgecolor="none"))
                left += w
            ax.add_patch(Rectangle((0, y), width, 0.5, facecolor="none", edgecolor="#BBBBBB", linewidth=0.6))
        ax.text(-1.15, -0.7, "\n".join(_doing(ranks[0])), fontsize=TEXT_PT, va="top", ha="left")


def _draw_shards(ax, moment: RankMoment, cat: str, n: int, y: float) -> None:
    """One array's N quarters: filled where kept all step, hatched up to the share held for now."""
    ax.text(-0.15, y + 0.3, ROW_NAMES[cat], fontsize=TEXT_PT, ha="right", va="center")
    kept = round(moment.held[cat] * n)
    borrowed = moment.borrowed.get(cat, 0.0)
    for shard in range(n):
        own = shard == moment.rank % n
        filled = kept >= n or own and kept >= 1
        ax.add_patch(Rectangle((shard, y), 0.9, 0.6, facecolor=MEMORY_COLORS[cat] if filled else "white",
                               edgecolor="black" if own else "#BBBBBB", linewidth=1.2 if own else 0.6))
        if not filled and borrowed > 0:
            ax.add_patch(Rectangle((shard, y), 0.9, 0.6 * borrowed, facecolor="white",
                                   edgecolor=MEMORY_COLORS[cat], hatch="////", linewidth=0.0))


def _doing(first: RankMoment) -> list[str]:
    """The caption under a column: what rank 0 computes, sends and holds in flight now."""
    lines = [f"compute: {first.compute or ('-' if first.done else 'idle')}"]
    for op in first.comm or [None]:
        lines += [f"comm: {op['name']}", f"  {op['algorithm']}, {op['link']}"] if op else ["comm: -", ""]
    lines += [f"in flight {first.in_flight_bytes / GB:.2f} GB",
              f"activations {first.activations_bytes / GB:.2f} GB"]
    return lines


def _legend(fig) -> None:
    """What each colour is, under the columns."""
    handles = [Rectangle((0, 0), 1, 1, facecolor=MEMORY_COLORS[cat])
               for cat in (*MODEL_STATES, BUFFERS, ACTIVATIONS)]
    handles.append(Rectangle((0, 0), 1, 1, facecolor="white", edgecolor=MEMORY_COLORS[PARAMS], hatch="////"))
    labels = ["parameters", "gradients", "optimizer state", "in flight: buckets, gathered weights",
              "activations", "another rank's quarter, held for now"]
    fig.legend(handles, labels, loc="lower center", ncols=3, fontsize=TEXT_PT, frameon=False)


__all__ = ["FRAMES", "RANKS", "StepThrough"]
