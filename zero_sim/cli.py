"""``zero-sim``: the command line.

    zero-sim simulate --model gpt2-124m --strategy ddp --gpus 8 --topology pcie --json
    zero-sim presets
    zero-sim fit-nccl-tests table.txt
    zero-sim demo --out out/

Each subcommand is a :class:`Command`: a function that adds its flags and one that runs it.
``sim2real.cli`` adds the commands that need real runs (``calibrate``, ``validate``) to
:data:`COMMANDS` and is what the installed ``zero-sim`` script runs; ``python -m zero_sim``
offers the simulator's own commands without torch.

Every flag of ``simulate`` is a keyword of ``zero_sim.simulate()``.  Bad input gets one
sentence on stderr and exit status 2; a model that does not fit is a result
(``fits: false`` and the shortfall), not an error.  An output path that cannot be written
(a directory, a link, a device, a full disk, a directory that is not there) or an input file
that cannot be read gets the same one sentence and exit status 2; files are written whole or not at all
(:mod:`zero_sim.vocabulary.files`), and each command says where it wrote them.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from zero_sim.intervals.speed import interval_line
from zero_sim.plan.cli import plan_args, run_plan
from zero_sim.plan.fit_advice import as_flags, fit_advice
from zero_sim.scenario import ScenarioError, simulate
from zero_sim.scenario.pipeline import resolve
from zero_sim.scenario.settings import COMMON
from zero_sim.scenario.symmetry import EXPLICIT_UP_TO
from zero_sim.settings import add_flag
from zero_sim.strategies import STRATEGIES, all_knobs
from zero_sim.system.collectives import CollectiveError
from zero_sim.system.gpus import GPUS
from zero_sim.system.model_presets import PRESET_SOURCES, preset
from zero_sim.system.model_presets import PRESETS as MODELS
from zero_sim.system.nccl_tests import fit_nccl_tests, parse_nccl_tests
from zero_sim.system.stacks import DEFAULT_STACK, STACKS
from zero_sim.system.topology import PRESETS as TOPOLOGIES
from zero_sim.vocabulary.files import (
    InputPathError,
    OutputPathError,
    check_named_output,
    check_output_path,
    read_text_input,
)


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one sentence, exit 2, no usage dump
        raise UsageError(message[0].upper() + message[1:] + f"; see `{self.prog} --help`.")


def _add_simulate_flags(parser) -> None:
    for s in COMMON:
        add_flag(parser, s)
    for _name, owners in sorted(all_knobs().items()):
        knob = owners[0][1]
        which = ", ".join(sorted({o for o, _ in owners}))
        add_flag(parser, knob, f"[{which}] {knob.help}")


def _simulate_args(sim) -> None:
    _add_simulate_flags(sim)
    sim.add_argument("--json", action="store_true", help="print the metrics as one JSON object")
    sim.add_argument("--trace", type=Path, help="write a Chrome/Perfetto trace here")
    sim.add_argument("--plot", type=Path, help="write a timeline + memory PNG here")
    sim.add_argument("--trace-dir", type=Path, metavar="DIR",
                     help="write one Kineto trace per simulated rank here, rank-<r>.pt.trace.json "
                          "(Holistic Trace Analysis, Perfetto, TensorBoard; docs/traces.md)")


def _no_args(_parser) -> None:
    pass


def _fit_args(fit) -> None:
    fit.add_argument("file", type=Path)
    fit.add_argument("--collective", default="all_reduce",
                     choices=["all_reduce", "reduce_scatter", "all_gather"])
    fit.add_argument("--json", action="store_true")


def _demo_args(demo) -> None:
    demo.add_argument("--out", type=Path, default=Path("out"))


def _human(m: dict, given: dict | None = None) -> str:
    """The metrics as text; ``given`` (the settings given) makes each fit suggestion's command."""
    mem = m["memory"]
    ov = m["comm_overlap_fraction"]
    ph = m["phases"]
    mfu = f", MFU {m['mfu']:.0%}" if m.get("mfu") is not None else ""
    lines = [
        f"{m['strategy']} · {m['model']} ({m['params']:,} params{_trained(m)}) · "
        f"{m['gpus']} x {m['gpu']} on {m['topology']} · stack {m['stack']}",
        f"  {_verdict(mem)}",
        *_advice(m, given or {}),
        f"  step            {m['step_time_s'] * 1e3:10.2f} ms   ({m['tokens_per_s']:,.0f} tokens/s, "
        f"{m['tokens_per_s_per_gpu']:,.0f} per GPU, {m['tflops_per_gpu']:.1f} TFLOP/s per GPU{mfu})",
        *([f"  likely range    {interval}"] if (interval := interval_line(m)) else []),
        f"  compute         {m['compute_time_s'] * 1e3:10.2f} ms",
        f"  exposed comm    {m['exposed_comm_s'] * 1e3:10.2f} ms   (overlap "
        + (f"{ov:.0%}" if ov is not None else "n/a")
        + f", {m['comm_volume_bytes'] / 1e9:.3f} GB sent per rank)",
        f"  phases          forward {ph['forward_s'] * 1e3:.2f} ms + backward {ph['backward_s'] * 1e3:.2f} ms"
        f" + optimizer {ph['optimizer_s'] * 1e3:.2f} ms",
        _optimizer_phase(m),
        f"  memory          {mem['fit_verdict'].replace('_', ' ')}; model states "
        f"{mem['model_states_bytes'] / 1e9:.2f} GB, activations "
        f"{mem['activations_bytes'] / 1e9:.2f} GB, buffers {mem['buffers_bytes'] / 1e9:.2f} GB, "
        f"peak {mem['peak_bytes'] / 1e9:.2f} GB of tensors, "
        f"{mem['reserved_peak_bytes'] / 1e9:.2f} reserved of {mem['capacity_bytes'] / 1e9:.1f} GB",
    ]
    lines += _offloaded(m)
    lines += _host_bound(m)
    lines.append(f"  cluster         {m['cluster']}")
    lines += [f"  assumed         {note}" for note in m.get("stack_notes", [])]
    if m.get("precision"):
        lines.append(f"  assumed         {m['precision']}")
    if m.get("fp8"):
        lines.append(f"  assumed         {m['fp8']['summary']}")
    if m.get("zeropp"):
        lines.append(f"  ZeRO++          {m['zeropp']}")
    if m.get("calibration"):
        lines.append(f"  calibrated      {m['calibration']}")
    lines += [f"  config          {note}" for note in m.get("config_notes", [])]
    return "\n".join(lines)


# Below this share of the step spent waiting for the host, a step is not called host-bound.
HOST_BOUND_SHARE = 0.05


def _optimizer_phase(m: dict) -> str:
    """The optimizer phase split: waiting for the network (and host copies), the CPU's update when
    offloaded, and the update's own compute."""
    ph, cpu = m["phases"], m.get("cpu_update_s", 0.0)
    on_cpu = f"{cpu * 1e3:.2f} ms updating on the CPU + " if cpu else ""
    waits = "communication and host copies" if cpu else "communication"
    return (f"  optimizer phase {(ph['optimizer_wait_s'] - cpu) * 1e3:10.2f} ms waiting for {waits} + "
            f"{on_cpu}{ph['optimizer_update_s'] * 1e3:.2f} ms update")


def _offloaded(m: dict) -> list[str]:
    """Where offloaded states live and whether the nodes' RAM holds them."""
    if not m.get("offload"):
        return []
    mem = m["memory"]
    lines = [f"  offloaded       {m['offload']}"]
    if "host_bytes_per_node" in mem:
        per_rank, per_node = mem["host_bytes_per_rank"] / 1e9, mem["host_bytes_per_node"] / 1e9
        verdict = "" if mem["host_fits"] else " (DOES NOT FIT)"
        lines.append(f"  host memory     {per_rank:.2f} GB per rank, {per_node:.1f} GB per node of "
                     f"{mem['host_capacity_bytes'] / 1e9:,.0f} GB RAM{verdict}")
    if "nvme_bytes_per_node" in mem:  # ZeRO-Infinity's drives (zero_sim.strategies.nvme)
        lines.append(f"  NVMe            {mem['nvme_bytes_per_rank'] / 1e9:.2f} GB per rank, "
                     f"{mem['nvme_bytes_per_node'] / 1e9:.1f} GB per node; swaps take "
                     f"{m['nvme_swap_s'] * 1e3:.2f} ms of the step on the host")
    return lines


def _host_bound(m: dict) -> list[str]:
    """What to change when the GPU waits for its host to launch work (the CPU's offloaded update and
    NVMe swaps are waiting of another kind, said on their own lines)."""
    offloaded = m.get("cpu_update_s", 0.0) + m.get("nvme_swap_s", 0.0)
    waiting = (m.get("gpu_waiting_for_host_s") or 0.0) - offloaded
    step = m["step_time_s"]
    if step <= 0 or waiting < HOST_BOUND_SHARE * step:
        return []
    return [f"  host-bound      the GPU waits {waiting * 1e3:.2f} ms ({waiting / step:.0%} of the step) for "
            f"the host to launch work: fewer launches (torch.compile, CUDA graphs) or more work per launch "
            f"(a larger micro-batch) shorten the step"]


def _verdict(mem: dict) -> str:
    """The three-way verdict first (``fit_verdict``: fits, tight, does not fit; intervals/memory.py),
    then the estimate it rests on: the reserved peak against capacity with its 80% interval, and the
    tensors' peak beside it."""
    low, high = (b / 1e9 for b in mem["reserved_interval_bytes"])
    held = (f"{mem['reserved_peak_bytes'] / 1e9:.2f} GB reserved (80%: {low:.1f}-{high:.1f}) of "
            f"{mem['capacity_bytes'] / 1e9:.1f} GB (tensors' peak {mem['peak_bytes'] / 1e9:.2f} GB)")
    spare = (mem["capacity_bytes"] - mem["reserved_peak_bytes"]) / 1e9
    if not mem.get("host_fits", True) and mem["shortfall_bytes"] == 0:
        return (f"DOES NOT FIT in host memory by {mem['host_shortfall_bytes'] / 1e9:.1f} GB per node "
                f"(offloaded states); on the GPU: {held}")
    if mem["fit_verdict"] == "fits":
        return f"FITS with {spare:.2f} GB to spare: {held}"
    if mem["fit_verdict"] == "tight":
        estimate = (f"fits with {spare:.2f} GB to spare" if mem["fits"]
                    else f"{mem['shortfall_bytes'] / 1e9:.2f} GB over")
        return f"TIGHT (the 80% interval crosses the GPU's memory; the estimate {estimate}): {held}"
    return f"DOES NOT FIT by {mem['shortfall_bytes'] / 1e9:.2f} GB: {held}"


def _trained(m: dict) -> str:
    trained = m.get("trainable_params", m["params"])
    return "" if trained == m["params"] else f", {trained:,} trainable: LoRA {m['lora']}"


def _advice(m: dict, given: dict) -> list[str]:
    """The suggestions that fit, fastest first, each as the command to paste: the settings ``given``
    with the suggestion's applied."""
    if m["memory"]["fits"] or "fit_advice" not in m:
        return []
    if not m["fit_advice"]:
        return ["  to fit          no change tried (recompute, smaller micro-batch, another sharded "
                "strategy, offload, up to 16x the GPUs) fits"]
    lines = []
    for k, advice in enumerate(m["fit_advice"]):
        lead = "  to fit          " if k == 0 else " " * 18
        lines += [f"{lead}{advice['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU, "
                  f"{advice['spare_gb']:.1f} GB to spare:",
                  " " * 20 + shlex.join(["zero-sim", "simulate", *as_flags(given | advice["settings"])])]
    return lines


def _simulate(args) -> int:
    outputs = ("command", "json", "trace", "plot", "trace_dir")
    kwargs = {k: v for k, v in vars(args).items() if k not in outputs}
    # Output paths are checked before simulating: a bad one is refused at once, not after the run.
    if args.trace:
        check_named_output(args.trace)
    if args.plot:
        _check_picture_path(args.plot)
    if args.trace_dir:
        check_named_output(args.trace_dir, directory=True)
        check_output_path(args.trace_dir / "rank-0.pt.trace.json")
    if args.trace_dir and kwargs.get("explicit_ranks") is None:
        # Per-rank traces are read side by side (stragglers, load balance): each file is a rank the
        # simulator computed, never a copy of rank 0 (zero_sim/kineto.py), up to the usual eight.
        kwargs["explicit_ranks"] = resolve(**kwargs).settings.gpus <= EXPLICIT_UP_TO
    result = simulate(**kwargs)
    if not result.metrics["memory"]["fits"]:
        # The answer a user needs next: settings that fit, simulated, fastest first (plan/fit_advice.py).
        result.metrics["fit_advice"] = fit_advice({k: v for k, v in kwargs.items() if v is not None})
    wrote = []
    if args.trace:
        result.to_chrome_trace(args.trace)
        wrote.append(f"wrote trace to {args.trace} (open it at ui.perfetto.dev)")
    if args.plot:
        _save_plot(result, args.plot)
        wrote.append(f"wrote timeline and memory plot to {args.plot}")
    if args.trace_dir:
        from zero_sim.kineto import write_rank_traces

        files = write_rank_traces(result, args.trace_dir)
        wrote.append(f"wrote {len(files)} per-rank traces to {args.trace_dir} (read them with HTA's "
                     f"TraceAnalysis or open one at ui.perfetto.dev)")
    given = {k: v for k, v in kwargs.items() if v is not None}
    print(json.dumps(result.metrics) if args.json else _human(result.metrics, given))
    # With --json, stdout stays one JSON object; where the files went is said on stderr.
    for line in wrote:
        print(line, file=sys.stderr if args.json else sys.stdout)
    return 0


def _check_picture_path(path: Path) -> None:
    check_named_output(path)
    picture_format(path)


def picture_format(path: Path) -> str:
    from zero_sim.ui.plots import picture_format as fmt

    return fmt(path)


def _save_plot(result, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from zero_sim.ui.plots import plot_overview

    fig = plot_overview(result, path)
    plt.close(fig)


def _presets() -> int:
    print("models:")
    for name in sorted(MODELS):
        source = PRESET_SOURCES[name].shape if name in PRESET_SOURCES else ""
        print(f"  {name:14s} {preset(name).params:>16,d} params  {source}")
    print("topologies:")
    for name in sorted(TOPOLOGIES):
        print(f"  {name:17s} {TOPOLOGIES[name].description}")
    print("gpus:", ", ".join(GPUS))
    print("strategies:")
    for s in STRATEGIES.values():
        print(f"  {s.name:6s} {s.summary}")
    return 0


def _stacks() -> int:
    """Every software stack, the settings it fills and the default marked; sources in docs/stacks.md."""
    for stack in STACKS.values():
        mark = " (default)" if stack.name == DEFAULT_STACK else ""
        print(f"{stack.name}{mark}: {stack.summary}")
        print("    " + ", ".join(f"{k}={v}" for k, v in stack.settings().items()))
    return 0


def _fit(args) -> int:
    table = parse_nccl_tests(read_text_input(args.file, "nccl-tests file"), args.collective)
    fit = fit_nccl_tests(table)
    out = {"n_ranks": table.n_ranks, "latency_us": fit.latency_s * 1e6, "busbw_gbps": fit.busbw / 1e9,
           "max_rel_error": fit.max_rel_error,
           "rows": [{"size_bytes": r.size_bytes, "measured_us": r.time_us,
                     "fitted_us": fit.time(r.size_bytes) * 1e6}
                    for r in table.rows]}
    if args.json:
        print(json.dumps(out))
    else:
        print(f"{table.n_ranks} ranks: latency {out['latency_us']:.1f} us, "
              f"bus bandwidth {out['busbw_gbps']:.2f} GB/s, "
              f"worst error {fit.max_rel_error:.1%}")
        print(f"{'size (B)':>14} {'measured us':>12} {'fitted us':>10}")
        for row in out["rows"]:
            print(f"{row['size_bytes']:>14,d} {row['measured_us']:>12.1f} {row['fitted_us']:>10.1f}")
    return 0


def _demo(args) -> int:
    out: Path = args.out
    trace, plot = out / "demo_trace.json", out / "demo_timeline.png"
    check_named_output(out, directory=True)
    check_output_path(trace)
    picture_format(plot)
    result = simulate(model="gpt2-124m", gpus=8, topology="pcie", micro_batch=8)
    result.to_chrome_trace(trace)
    _save_plot(result, plot)
    print(_human(result.metrics))
    print(f"wrote {plot} and {trace} (open the trace at ui.perfetto.dev)")
    return 0


@dataclass(frozen=True)
class Command:
    """One subcommand: ``add_args(parser)`` declares its flags, ``run(args)`` returns the exit status."""

    help: str
    add_args: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


COMMANDS: dict[str, Command] = {
    "simulate": Command("simulate one configuration", _simulate_args, _simulate),
    "presets": Command("list model, topology and GPU presets and strategies", _no_args,
                       lambda _args: _presets()),
    "plan": Command("rank every strategy, knob, micro-batch and GPU count that fits a model on a cluster",
                    plan_args, run_plan),
    "stacks": Command("list the software stacks and the settings each fills", _no_args,
                      lambda _args: _stacks()),
    "fit-nccl-tests": Command("fit latency and bus bandwidth from nccl-tests output", _fit_args, _fit),
    "demo": Command("simulate the default scenario; write a PNG and a trace", _demo_args, _demo),
}


def build_parser(commands: dict[str, Command] = COMMANDS) -> argparse.ArgumentParser:
    parser = _Parser(prog="zero-sim", description="Simulate data-parallel training: DDP, ZeRO-1/2/3, FSDP.")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)
    for name, command in commands.items():
        command.add_args(sub.add_parser(name, help=command.help))
    return parser


def main(argv=None, commands: dict[str, Command] = COMMANDS) -> int:
    """Parse ``argv`` and run its command; bad input is one sentence on stderr and exit status 2."""
    parser = build_parser(commands)
    try:
        args = parser.parse_args(argv)
        if args.command not in commands:
            parser.print_help()
            return 2
        return commands[args.command].run(args)
    except (UsageError, ScenarioError, CollectiveError, OutputPathError, InputPathError, ValueError) as exc:
        print(f"zero-sim: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader left early (`zero-sim presets | head`): stop quietly, as shell tools do, and
        # point stdout at /dev/null so the interpreter's final flush does not complain either.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
