"""Play one training step of 4 ranks under DDP, ZeRO-1, ZeRO-2 and ZeRO-3 (or FSDP), side by side.

A **Play** button and a time slider walk the step; at each moment every strategy's column
shows, for each rank:

* three rows of N boxes, one per shard of the parameters, the gradients and the optimizer
  state: a filled box is a shard the rank keeps, the rank's own shard outlined (under DDP
  every rank keeps every shard; under ZeRO-1 only its own optimizer shard; ...);
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


class StepThrough(Panel):
    """Play one step of DDP, ZeRO-1, ZeRO-2 and ZeRO-3 (or FSDP) on 4 ranks, shard by shard."""

    def __init__(self, model: str = "gpt2-124m", topology: str = "pcie", micro_batch: int = 2,
                 last: str = "zero3", figsize=(FIGURE_WIDTH, 6.0), auto: bool = True):
        super().__init__()
        self.controls = {
            "model": W.Dropdown(options=sorted(MODELS), value=model, description="model", style=STYLE),
            "topology": W.Dropdown(options=sorted(TOPOLOGIES), value=topology, description="topology",
                                   style=STYLE),
            "micro_batch": W.Dropdown(options=[1, 2, 4, 8], value=micro_batch, description="micro-batch",
                                      style=STYLE),
            "last": W.ToggleButtons(options=[(LABELS[name], name) for name in SHARDING], value=last,
                                    description="fully sharded", style={"description_width": "10em"}),
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

    def moment(self) -> dict[str, list[RankMoment]]:
        return self.result.frame(self.now_s(), RANKS)

    def render(self):
        if self.result is None:
            return
        t = self.now_s()
        self.clock.value = f"<b>{format_ms(t)}</b> into the step"
        frame = self.moment()
        scale = max(tl.peak_bytes() for tl in self.result.timelines.values())
        for ax, (strategy, ranks) in zip(self._columns, frame.items(), strict=True):
            self._draw_column(ax, strategy, ranks, scale)
        self.figure.fig.suptitle("each box: a quarter of an array; filled: the rank keeps it (its own "
                                 "quarter outlined) · bar: memory in flight now, one scale for all",
                                 fontsize=8, y=0.985)
        self.figure.show()

    def _draw_column(self, ax, strategy: str, ranks: list[RankMoment], scale: float):
        ax.clear()
        ax.set_axis_off()
        timeline = self.result.timelines[strategy]
        n = len(ranks)
        ax.set_xlim(-1.2, n + 0.2)
        ax.set_ylim(-0.6, 4.6 * n)
        status = "step done" if ranks[0].done else f"step {format_ms(timeline.step_s)}"
        ax.set_title(f"{LABELS.get(strategy, strategy)} · {status}", fontsize=9,
                     color=strategy_color(strategy))
        for i, moment in enumerate(ranks):
            top = 4.6 * (n - 1 - i) + 4.0
            ax.text(-1.15, top - 0.1, f"rank {moment.rank}", fontsize=7, va="top")
            for row, cat in enumerate(MODEL_STATES):
                y = top - 1.0 - row * 0.8
                ax.text(-0.15, y + 0.3, ROW_NAMES[cat], fontsize=7, ha="right", va="center")
                kept = round(moment.held[cat] * n)
                for shard in range(n):
                    filled = kept >= n or shard == moment.rank % n and kept >= 1
                    own = shard == moment.rank % n
                    ax.add_patch(Rectangle((shard, y), 0.9, 0.6,
                                           facecolor=MEMORY_COLORS[cat] if filled else "white",
                                           edgecolor="black" if own else "#BBBBBB",
                                           linewidth=1.2 if own else 0.6))
            # In flight: buffers then activations, as a bar across the shard boxes' width.
            y = top - 3.6
            width = n * 0.975
            left = 0.0
            for cat, nbytes in ((BUFFERS, moment.in_flight_bytes), (ACTIVATIONS, moment.activations_bytes)):
                w = width * nbytes / scale if scale else 0.0
                ax.add_patch(Rectangle((left, y), w, 0.5, facecolor=MEMORY_COLORS[cat], edgecolor="none"))
                left += w
            ax.add_patch(Rectangle((0, y), width, 0.5, facecolor="none", edgecolor="#BBBBBB", linewidth=0.6))
        first = ranks[0]
        doing = [f"compute: {first.compute or ('-' if first.done else 'idle')}"]
        for op in first.comm or [None]:
            doing += [f"comm: {op['name']}", f"   {op['algorithm']}, {op['link']}"] if op else ["comm: -", ""]
        doing += [f"in flight {first.in_flight_bytes / GB:.2f} GB",
                  f"activations {first.activations_bytes / GB:.2f} GB"]
        ax.text(-1.15, -0.7, "\n".join(doing), fontsize=7, va="top", ha="left")


def _legend(fig) -> None:
    """What each colour is, under the columns."""
    handles = [Rectangle((0, 0), 1, 1, facecolor=MEMORY_COLORS[cat])
               for cat in (*MODEL_STATES, BUFFERS, ACTIVATIONS)]
    labels = ["parameters", "gradients", "optimizer state", "in flight: buckets, gathered weights",
              "activations"]
    fig.legend(handles, labels, loc="lower center", ncols=5, fontsize=7, frameon=False)


__all__ = ["FRAMES", "RANKS", "StepThrough"]
