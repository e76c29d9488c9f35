"""The memory calculator: the ZeRO paper's per-rank model states for every stage, without simulating.

Sliders for the model size Ψ, the number of ranks N, the optimizer's bytes per
parameter K and the GPU; bars of the model states one GPU holds under DDP and each ZeRO
stage, the chosen one outlined.  The bytes come from the one formula of
:func:`zero_sim.vocabulary.model_states.model_state_bytes`, which the simulator's
strategies also use, so the calculator and the simulator's ``memory`` metrics agree.
"""

from __future__ import annotations

import ipywidgets as W

from zero_sim.system.gpus import GB, GPUS
from zero_sim.ui.controls import STYLE, format_gb, wide_layout, with_stop
from zero_sim.ui.figure import FIGURE_WIDTH, Figure
from zero_sim.ui.panel import Panel
from zero_sim.ui.plots import MEMORY_COLORS, legend_beside
from zero_sim.vocabulary import GRADS, OPTIMIZER_STATE, PARAMS
from zero_sim.vocabulary.model_states import model_state_bytes, sharded

STAGE_NAMES = ("DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3")

# Sizes people train (GPT-2, LLaMA-style, the ZeRO paper's 7.5B, GPT-3), in billions of parameters.
MODEL_SIZES_BILLION = [0.125, 0.35, 0.76, 1, 1.5, 2.7, 3, 6.7, 7, 7.5, 13, 20, 30, 40, 65, 70, 100, 175, 530,
                       1000]
GPU_COUNTS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]


def comm_volume_elements(psi: float, stage: int) -> float:
    """Elements each rank sends and receives per step: 2 Psi for DDP and stages 1-2, 3 Psi for stage 3."""
    return (3 if sharded(stage, PARAMS) else 2) * psi


def _stage_bytes(psi: float, n: int, stage: int, k: float) -> dict[str, float]:
    """One stage's model states under the calculator's keys (mixed precision: 2-byte params and grads)."""
    held = model_state_bytes(stage, psi, n, param_bytes=2, grad_bytes=2, optimizer_bytes=k)
    return {"params_bytes": held[PARAMS], "grads_bytes": held[GRADS],
            "optimizer_bytes": held[OPTIMIZER_STATE], "total_bytes": sum(held.values())}


class MemoryCalculator(Panel):
    """Sliders for model size, N, ZeRO stage and K; bars of per-rank model states for every stage.

    Pure arithmetic (:func:`~zero_sim.vocabulary.model_states.model_state_bytes`), no
    simulation: it is the back-of-the-envelope the ZeRO paper teaches, and what the
    simulator's ``memory`` metrics must agree with.  ``result`` holds the chosen stage's
    ``params_bytes``, ``grads_bytes``, ``optimizer_bytes`` and ``total_bytes``, whether
    they fit, the communication volume, and every stage's bytes under ``all_stages``.
    """

    def __init__(self, params_billion: float = 1.5, gpus: int = 8, stage: int = 0, k: int = 12,
                 gpu: str = "A100-80GB", figsize=(FIGURE_WIDTH, 3.6), auto: bool = True):
        super().__init__()
        self.controls = {
            # Common model sizes, not a log scale: a log slider would round 1.5 to 1.51 in the browser.
            "params_billion": W.SelectionSlider(options=with_stop(MODEL_SIZES_BILLION, params_billion),
                                                value=params_billion, description="model size (billions)",
                                                style=STYLE, layout=wide_layout()),
            "gpus": W.SelectionSlider(options=with_stop(GPU_COUNTS, gpus), value=gpus, description="GPUs (N)",
                                      style=STYLE, layout=wide_layout()),
            "stage": W.ToggleButtons(options=[(name, i) for i, name in enumerate(STAGE_NAMES)], value=stage,
                                     description="who shards what",
                                     style={"description_width": "11em", "button_width": "7em"}),
            "k": W.IntSlider(value=k, min=0, max=16, description="K (optimizer bytes)", style=STYLE,
                             layout=wide_layout()),
            "gpu": W.Dropdown(options=[g for g in GPUS if g != "CPU"], value=gpu, description="GPU",
                              style=STYLE),
        }
        self.summary = W.HTML()
        self.summary.add_class("zs-memory-summary")
        self.figure = Figure(figsize)
        self.figure.fig.subplots_adjust(left=0.09, right=0.8, top=0.88, bottom=0.1)  # legend at the right
        self.widget = W.VBox([W.HBox([W.VBox([self.controls["params_billion"], self.controls["gpus"],
                                              self.controls["k"]]),
                                      W.VBox([self.controls["gpu"]])]),
                              self.controls["stage"], self.summary, self.figure.widget])
        self.watch()
        if auto:
            self.update()

    def update(self, *_):
        c = self.controls
        psi = c["params_billion"].value * 1e9
        n, stage, k = c["gpus"].value, c["stage"].value, c["k"].value
        capacity = GPUS[c["gpu"].value].hbm_bytes
        per_stage = [_stage_bytes(psi, n, s, k) for s in range(4)]
        chosen = per_stage[stage]
        self.result = chosen | {
            "params": psi, "gpus": n, "stage": stage, "k": k, "capacity_bytes": capacity,
            "fits": chosen["total_bytes"] <= capacity,
            "comm_volume_elements": comm_volume_elements(psi, stage),
            "comm_volume_bytes": comm_volume_elements(psi, stage) * 2,
            "all_stages": per_stage,
        }
        self.error = None
        self.render()
        return self.result

    def render(self):
        r = self.result
        name = STAGE_NAMES[r["stage"]]
        fits = ("<span style='color:#2e7d32'><b>fits</b></span>" if r["fits"] else
                "<span style='color:#c62828'><b>does not fit</b></span>")
        weights_move = sharded(r["stage"], PARAMS)  # gathered before use: a third Psi on the wire
        vol = "3&Psi;" if weights_move else "2&Psi;"
        self.summary.value = (
            f"<div style='line-height:1.6'>With <b>{name}</b>, each of the {r['gpus']} GPUs holds "
            f"<b>{format_gb(r['params_bytes'])}</b> of parameters + <b>{format_gb(r['grads_bytes'])}</b> "
            f"of gradients + <b>{format_gb(r['optimizer_bytes'])}</b> of optimizer state = "
            f"<b>{format_gb(r['total_bytes'])}</b> of model states, which {fits} in one "
            f"{self.controls['gpu'].value} ({format_gb(r['capacity_bytes'])}) before a single activation "
            f"is stored.<br>"
            f"Each GPU sends and receives about {vol} = {r['comm_volume_bytes'] / GB:.1f} GB per step "
            f"(bf16 gradients{' and parameters' if weights_move else ''}).</div>")
        fig = self.figure
        fig.clear()
        ax = fig.axes[0]
        xs = range(4)
        bottoms = [0.0] * 4
        parts = (("params_bytes", PARAMS), ("grads_bytes", GRADS), ("optimizer_bytes", OPTIMIZER_STATE))
        for key, cat in parts:
            heights = [s[key] / GB for s in r["all_stages"]]
            ax.bar(xs, heights, bottom=bottoms, color=MEMORY_COLORS[cat], label=cat,
                   edgecolor=["black" if i == r["stage"] else "none" for i in xs],
                   linewidth=[2 if i == r["stage"] else 0 for i in xs])
            bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
        for i, total in enumerate(bottoms):
            ax.text(i, total, f"{total:.3g} GB", ha="center", va="bottom", fontsize=9,
                    fontweight="bold" if i == r["stage"] else "normal")
        ax.axhline(r["capacity_bytes"] / GB, color="black", linestyle="--", linewidth=1,
                   label=f"{self.controls['gpu'].value} memory")
        ax.set_xticks(list(xs), STAGE_NAMES)
        ax.set_ylabel("model states per GPU (GB)")
        ax.set_ylim(0, max(max(bottoms), r["capacity_bytes"] / GB) * 1.18)
        ax.set_title(f"model states per GPU: {r['params'] / 1e9:.3g}B parameters, N = {r['gpus']}, "
                     f"K = {r['k']}", fontsize=10)
        handles, labels = ax.get_legend_handles_labels()
        legend_beside(ax, handles[::-1], labels=labels[::-1])  # top of the stack first
        fig.show()


__all__ = ["MODEL_SIZES_BILLION", "STAGE_NAMES", "MemoryCalculator", "comm_volume_elements"]
