"""Pictures of a simulation: a Gantt chart per rank x stream, memory over time, and bars.

Every figure here follows :mod:`zero_sim.ui.style` (re-exported from this module): one
palette for op kinds, memory categories and strategies, at most :data:`FIGURE_WIDTH`
inches wide with its legend outside the data, and a unit on every axis.  When a chart
draws only some ranks, its title or caption says which ("ranks 0-3 of 8 shown").

matplotlib is imported inside the drawing functions: :class:`~zero_sim.results.SimResult`
(whose ``plot_timeline``/``plot_memory`` the package's root points here) and the CLI reach this
module, and a simulation that draws nothing should not load it.
"""

from __future__ import annotations

from zero_sim.ui.style import (
    COLORS,
    FIGURE_WIDTH,
    HOST_COLOR,
    HOST_LABEL,
    MEMORY_COLORS,
    OP_COLORS,
    STRATEGY_COLORS,
    legend_below,
    legend_beside,
    op_color,
    strategy_color,
)
from zero_sim.vocabulary import MEMORY_CATEGORIES, parse_op_name
from zero_sim.vocabulary.files import OutputPathError, atomic_output, check_output_path


def ranks_shown(shown: int, world_size: int) -> str:
    """"ranks 0-3 of 8 shown" when a chart draws only some ranks, else ""."""
    if shown >= world_size:
        return ""
    ranks = "rank 0" if shown == 1 else f"ranks 0-{shown - 1}"
    return f"{ranks} of {world_size:,} shown"


def stream_order(streams) -> list[str]:
    """Streams top to bottom as every chart lays them out: host, compute, then the comm streams by name."""
    order = {"host": 0, "compute": 1}
    return sorted(set(streams), key=lambda s: (order.get(s, 2), s))


def lanes(result, max_ranks: int = 8) -> list[tuple[int, str]]:
    streams = stream_order(op["stream"] for op in result.ops)
    return [(rank, s) for rank in range(min(result.world_size, max_ranks)) for s in streams]


def timeline_title(result, max_ranks: int) -> str:
    """What the Gantt shows, the step's two headline numbers, and which ranks are drawn."""
    m = result.metrics
    shown = ranks_shown(min(result.world_size, max_ranks), result.world_size)
    return (f"{m['strategy']} · {m['model']} · {m['gpus']} x {m['gpu']} on {m['topology']}: "
            f"step {m['step_time_s'] * 1e3:.1f} ms, exposed comm {m['exposed_comm_s'] * 1e3:.1f} ms"
            + (f" ({shown})" if shown else ""))


def plot_timeline(result, ax=None, max_ranks: int = 8, title: str | None = None, legend: bool = True,
                  alpha: float = 1.0, height: float = 0.8, offset: float = 0.0, lane_index=None,
                  say_ranks: bool = True):
    """Gantt of the reported step: one lane per rank x stream, times in ms from the step start.

    When fewer ranks are drawn than the run has, the title says which ("ranks 0-3 of 8 shown"),
    also after a ``title`` of the caller's, unless ``say_ranks`` is False (a caller that says it
    once for several charts); the legend of op kinds sits right of the axes."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    lane_list = lanes(result, max_ranks)
    if ax is None:
        _, ax = plt.subplots(figsize=(FIGURE_WIDTH, 0.3 * len(lane_list) + 1.4), layout="constrained")
    index = lane_index or {lane: i for i, lane in enumerate(lane_list)}
    by_lane: dict[tuple[int, str], list] = {}
    for rank in range(min(result.world_size, max_ranks)):
        for op in result.step_ops(result.rank_of_lane(rank)):
            by_lane.setdefault((rank, op["stream"]), []).append(op)
    for lane, ops in by_lane.items():
        if lane not in index:
            continue
        y = index[lane]
        spans = [(op["start_s"] * 1e3, max(op["end_s"] - op["start_s"], 0) * 1e3) for op in ops]
        ax.broken_barh(spans, (y - height / 2 + offset, height),
                       facecolors=[op_color(op["name"], op["stream"]) for op in ops], edgecolor="white",
                       linewidth=0.2,
                       alpha=alpha)
    ax.set_yticks(range(len(index)))
    ax.set_yticklabels([f"rank {r} {s}" for r, s in index])
    ax.invert_yaxis()
    ax.set_xlabel("time in step (ms)")
    step_ms = result.metrics["step_time_s"] * 1e3
    ax.set_xlim(0, step_ms * 1.02)
    shown = ranks_shown(min(result.world_size, max_ranks), result.world_size) if say_ranks else ""
    if title is None:
        title = timeline_title(result, max_ranks if say_ranks else result.world_size)
    elif shown:
        title = f"{title} ({shown})"
    ax.set_title(title, fontsize=10, wrap=True)  # wrapped at the figure's edge, never cut there
    if legend:
        device_ops = {op["name"] for op in result.ops if op["stream"] != "host"}
        used = {parse_op_name(name).kind for name in device_ops if _parses(name)}
        handles = [Patch(color=c, label=k) for k, c in COLORS.items() if k in used]
        if any(stream == "host" for _rank, stream in index):
            handles.append(Patch(color=HOST_COLOR, label=HOST_LABEL))
        legend_beside(ax, handles)
    return ax


def _parses(name: str) -> bool:
    try:
        parse_op_name(name)
        return True
    except ValueError:
        return False


def memory_series(result, rank: int = 0):
    """(times in ms from the reported step's start, {category: bytes at each time}) for one rank."""
    lo, hi = result.window
    source = result.rank_of_lane(rank)
    events = sorted((m for m in result.memory if m["rank"] == source), key=lambda m: m["t_s"])
    current = dict.fromkeys(MEMORY_CATEGORIES, 0)
    times, series = [], {c: [] for c in MEMORY_CATEGORIES}
    for m in events:
        current[m["category"]] = m["bytes"]
        if m["t_s"] < lo:
            continue
        if m["t_s"] > hi:
            break
        times.append((m["t_s"] - lo) * 1e3)
        for c in MEMORY_CATEGORIES:
            series[c].append(current[c])
    if not times or times[0] > 0:
        # State at the window start, so the curve begins at t=0.
        state = dict.fromkeys(MEMORY_CATEGORIES, 0)
        for m in events:
            if m["t_s"] > lo:
                break
            state[m["category"]] = m["bytes"]
        times.insert(0, 0.0)
        for c in MEMORY_CATEGORIES:
            series[c].insert(0, state[c])
    times.append((hi - lo) * 1e3)
    for c in MEMORY_CATEGORIES:
        series[c].append(series[c][-1])
    return times, series


def plot_memory(result, ax=None, rank: int = 0, show_capacity: bool = True):
    """Stacked memory by category over the reported step, in GB, with the GPU's capacity; the legend
    sits right of the axes, off the curves."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(FIGURE_WIDTH, 3), layout="constrained")
    times, series = memory_series(result, rank)
    ax.stackplot(times, *[[b / 1e9 for b in series[c]] for c in MEMORY_CATEGORIES],
                 labels=list(MEMORY_CATEGORIES), colors=[MEMORY_COLORS[c] for c in MEMORY_CATEGORIES],
                 step="post", alpha=0.85)
    mem = result.metrics["memory"]
    if show_capacity and mem["peak_bytes"] > 0.5 * mem["capacity_bytes"]:
        ax.axhline(mem["capacity_bytes"] / 1e9, color="black", linestyle="--", linewidth=1,
                   label="capacity")  # the GPU is named in the title: a legend entry stays short
    ax.set_xlabel("time in step (ms)")
    ax.set_ylabel(f"memory, rank {rank} (GB)")
    short = "" if mem["fits"] else f" — does NOT fit, short by {mem['shortfall_bytes'] / 1e9:.2f} GB"
    ax.set_title(f"memory of one {result.metrics['gpu']}: tensors' peak {mem['peak_bytes'] / 1e9:.2f} GB"
                 + short)
    # Top of the stack first, as the eye reads the picture.
    handles, labels = ax.get_legend_handles_labels()
    legend_beside(ax, handles[::-1], labels=labels[::-1])
    ax.set_xlim(0, times[-1] if times else 1)
    return ax


def plot_overview(result, path=None, max_ranks: int = 4):
    """Timeline above memory in one figure, legends right of both; saved to ``path`` when given."""
    import matplotlib.pyplot as plt

    n_lanes = len(lanes(result, max_ranks))
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(FIGURE_WIDTH, 0.28 * n_lanes + 4.0), layout="constrained",
                                   gridspec_kw={"height_ratios": [max(n_lanes, 3), 4]}, sharex=True)
    plot_timeline(result, ax=ax1, max_ranks=max_ranks)
    plot_memory(result, ax=ax2)
    ax1.set_xlabel("")
    ax1.title.set_fontsize(10)
    ax2.title.set_fontsize(10)
    if path is not None:
        save_figure(fig, path, dpi=110)
    return fig


def picture_format(path) -> str:
    """The picture format a path asks for by its suffix (PNG when it has none); a suffix matplotlib
    cannot write is refused in one sentence, before anything is drawn or written."""
    from matplotlib.backend_bases import FigureCanvasBase

    path = check_output_path(path)
    fmt = path.suffix[1:].lower() or "png"
    supported = FigureCanvasBase.get_supported_filetypes()
    if fmt not in supported:
        raise OutputPathError(f"cannot write {path}: {fmt!r} is not a picture format matplotlib writes; "
                              f"end the name in one of {', '.join('.' + s for s in sorted(supported))}")
    return fmt


def save_figure(fig, path, **savefig_kwargs) -> None:
    """``fig.savefig`` whole or not at all: drawn into a temporary file beside ``path`` and renamed
    over it (:func:`zero_sim.vocabulary.files.atomic_output`), so a full disk or an interrupted
    draw leaves no truncated picture, and a link or a directory at ``path`` is refused."""
    fmt = picture_format(path)
    with atomic_output(path, "wb") as f:
        fig.savefig(f, format=fmt, **savefig_kwargs)


def plot_measured_step(ops, ax=None, step: int | None = None, rank: int = 0, heading: str = "measured"):
    """Gantt of one rank's streams in one measured step (the last by default), times from its start.

    ``ops`` are op records (:data:`zero_sim.vocabulary.records.OP_FIELDS`) of any ranks; the title
    is ``heading`` followed by the step shown."""
    import matplotlib.pyplot as plt

    ops = [op for op in ops if op.get("end_s") is not None and op.get("rank", rank) == rank]
    if ax is None:
        _, ax = plt.subplots(figsize=(FIGURE_WIDTH, 1.6), layout="constrained")
    if not ops:
        ax.text(0.5, 0.5, "this run recorded no ops", ha="center", transform=ax.transAxes)
        return ax
    step = max(op["step"] for op in ops) if step is None else step
    ops = [op for op in ops if op["step"] == step]
    t0 = min(op["start_s"] for op in ops)
    streams = stream_order(op["stream"] for op in ops)
    for y, stream in enumerate(streams):
        mine = [op for op in ops if op["stream"] == stream]
        ax.broken_barh([((op["start_s"] - t0) * 1e3, (op["end_s"] - op["start_s"]) * 1e3) for op in mine],
                       (y - 0.4, 0.8), facecolors=[op_color(op["name"]) for op in mine],
                       edgecolor="white", linewidth=0.2)
    ax.set_yticks(range(len(streams)), [f"rank {rank} {s}" for s in streams])
    ax.invert_yaxis()
    ax.set_xlabel("time in step (ms), measured")
    ax.set_title(f"{heading}, step {step}", fontsize=9)
    return ax


# ----------------------------------------------------------------------------- measured over predicted

PREDICTED_HATCH = "////"


def overlay_lanes(comparison, ranks=None) -> list[tuple[int, str]]:
    """(rank, stream) rows of an overlay: every stream either side used, host, compute, then comm."""
    ranks = list(range(min(comparison.run.world_size, 4))) if ranks is None else list(ranks)
    out = []
    for rank in ranks:
        streams = {op["stream"] for op in comparison.predicted_ops(rank)}
        streams |= {op["stream"] for op in comparison.measured_ops(rank)}
        out += [(rank, s) for s in stream_order(streams)]
    return out


def _overlay_title(comparison, label: str | None = None) -> str:
    s = comparison.summary
    err = s["step_error"]
    head = f"{label}: " if label else f"{s['strategy']} · {s['world_size']} ranks · {s['model']}: "
    return (f"{head}step predicted {s['predicted_step_s'] * 1e3:.1f} ms vs measured "
            f"{s['measured_step_s'] * 1e3:.1f} ms ({err * 100:+.0f}%), measured step {s['step']}")


def plot_overlay(comparison, ax=None, fig=None, ranks=None, title: str | None = None, legend: bool = True,
                 mark_backward: bool = True, label: str | None = None):
    """Measured ops drawn over predicted ones: one row per rank x stream, times in ms from the step start.

    Predicted ops are light, hatched, outlined bars the full height of the row; measured
    ops are solid, thinner bars drawn over them, both coloured by op kind as in
    :func:`plot_timeline`.  Vertical lines mark where backward ends (the backward /
    optimizer boundary) on each side: dashed predicted, solid measured."""
    import matplotlib.pyplot as plt

    lane_list = overlay_lanes(comparison, ranks)
    if ax is None:
        if fig is None:
            fig = plt.figure(figsize=(FIGURE_WIDTH, 0.42 * len(lane_list) + 2.0), layout="constrained")
        ax = fig.add_subplot()
    index = {lane: i for i, lane in enumerate(lane_list)}
    for (rank, stream), y in index.items():
        pred = [op for op in comparison.predicted_ops(rank) if op["stream"] == stream]
        meas = [op for op in comparison.measured_ops(rank) if op["stream"] == stream]
        if pred:
            colors = [op_color(op["name"]) for op in pred]
            ax.broken_barh([(op["start_s"] * 1e3, max(op["end_s"] - op["start_s"], 0) * 1e3) for op in pred],
                           (y - 0.42, 0.84), facecolors=[_light(c) for c in colors], edgecolors=colors,
                           linewidth=0.6, hatch=PREDICTED_HATCH)
        if meas:
            ax.broken_barh([(op["start_s"] * 1e3, max(op["end_s"] - op["start_s"], 0) * 1e3) for op in meas],
                           (y - 0.19, 0.38), facecolors=[op_color(op["name"]) for op in meas],
                           edgecolor="white", linewidth=0.2)
    ax.set_yticks(range(len(index)))
    ax.set_yticklabels([f"rank {r} {s}" for r, s in index])
    ax.set_ylim(len(index) - 0.5, -0.5)
    ax.set_xlim(0, overlay_span_s(comparison, [r for r, _ in lane_list]) * 1e3 * 1.02)
    ax.set_xlabel("time in step (ms); each rank from its own step start")
    if mark_backward:  # per rank, across that rank's rows only: ranks end backward at different times
        for rank in dict.fromkeys(r for r, _ in lane_list):
            ys = [y for (r, _), y in index.items() if r == rank]
            pred, meas = comparison.timing(rank)
            ax.vlines(pred["backward_end_s"] * 1e3, min(ys) - 0.5, max(ys) + 0.5, color="#444444",
                      linestyle="--", linewidth=1.1)
            ax.vlines(meas["backward_end_s"] * 1e3, min(ys) - 0.5, max(ys) + 0.5, color="black",
                      linewidth=1.1)
        for y in range(1, len(lane_list)):
            if lane_list[y][0] != lane_list[y - 1][0]:
                ax.axhline(y - 0.5, color="#cccccc", linewidth=0.8)
    ax.set_title(title or _overlay_title(comparison, label), fontsize=10)
    if legend:
        from matplotlib.transforms import offset_copy

        # A fixed distance under the axis, below the tick labels and the x label, whatever the figure's
        # height.
        below = offset_copy(ax.transAxes, fig=ax.figure, y=-34, units="points")
        ax.legend(handles=overlay_legend_handles([comparison], mark_backward), loc="upper center",
                  bbox_to_anchor=(0.5, 0.0), bbox_transform=below, ncol=6, fontsize=8, frameon=False)
    return ax


def overlay_span_s(comparison, ranks) -> float:
    """The longest step shown: the prediction's, or any shown rank's measured one (or its last op's end:
    a collective's completion is stamped by a watcher thread, which may run a moment after the step ended)."""
    measured = [comparison.step.step_time_s.get(r, 0.0) for r in ranks]
    ends = [op["end_s"] for r in ranks for op in comparison.measured_ops(r)]
    return max([comparison.summary["predicted_step_s"], *measured, *ends])


def _light(color: str, amount: float = 0.75) -> tuple[float, float, float]:
    from matplotlib.colors import to_rgb

    r, g, b = to_rgb(color)
    return (r + (1 - r) * amount, g + (1 - g) * amount, b + (1 - b) * amount)


def overlay_legend_handles(comparisons, mark_backward: bool = True) -> list:
    """Legend entries: which bars are predicted and which measured, then the op kinds used."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    grey = "#8C8C8C"
    handles = [Patch(facecolor=_light(grey), edgecolor=grey, hatch=PREDICTED_HATCH,
                     label="predicted (hatched, tall)"),
               Patch(facecolor=grey, label="measured (solid, thin)")]
    if mark_backward:
        handles += [Line2D([], [], color="#444444", linestyle="--", label="backward ends, predicted"),
                    Line2D([], [], color="black", label="backward ends, measured")]
    used = set()
    for c in comparisons:
        for rank in range(c.run.world_size):
            used |= {parse_op_name(op["name"]).kind for op in c.predicted_ops(rank) + c.measured_ops(rank)
                     if _parses(op["name"])}
    return handles + [Patch(color=col, label=k) for k, col in COLORS.items() if k in used]


def plot_overlay_pair(comp_a, comp_b, labels: tuple[str, str] | None = None, fig=None, ranks=None):
    """Two overlays stacked on one time axis (e.g. ZeRO-2 step above hook), one shared legend.

    Each panel marks its backward / optimizer boundary, predicted and measured, so what
    moved from the optimizer phase into backward can be read straight off the picture."""
    import matplotlib.pyplot as plt

    comps = (comp_a, comp_b)
    labels = labels or tuple(c.summary["strategy"] for c in comps)
    n_lanes = [len(overlay_lanes(c, ranks)) for c in comps]
    if fig is None:
        fig = plt.figure(figsize=(FIGURE_WIDTH, 0.42 * sum(n_lanes) + 3.0))
    axes = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [max(n, 1) for n in n_lanes]})
    for ax, comp, label in zip(axes, comps, labels, strict=True):
        plot_overlay(comp, ax=ax, ranks=ranks, legend=False, label=label)
        ax.xaxis.set_tick_params(labelbottom=True)
    axes[0].set_xlabel("")
    longest = max(overlay_span_s(c, {r for r, _ in overlay_lanes(c, ranks)}) for c in comps) * 1e3
    axes[0].set_xlim(0, longest * 1.02)
    fig.legend(handles=overlay_legend_handles(comps), loc="lower center", ncol=6, fontsize=8, frameon=False)
    fig.subplots_adjust(left=0.12, right=0.98, top=0.95, bottom=0.1 + 0.3 / max(sum(n_lanes), 1), hspace=0.45)
    return fig


__all__ = [
    "COLORS", "FIGURE_WIDTH", "MEMORY_COLORS", "OP_COLORS", "PREDICTED_HATCH", "STRATEGY_COLORS", "lanes",
    "legend_below", "legend_beside", "memory_series", "op_color", "overlay_lanes", "overlay_legend_handles",
    "overlay_span_s", "picture_format", "plot_measured_step", "plot_memory", "plot_overlay",
    "plot_overlay_pair", "plot_overview", "plot_timeline", "ranks_shown", "save_figure", "stream_order",
    "strategy_color", "timeline_title",
]
