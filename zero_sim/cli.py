"""``zero-sim``: the command line.

    zero-sim simulate --model gpt2-124m --strategy ddp --gpus 8 --topology pcie --json
    zero-sim presets
    zero-sim fit-nccl-tests table.txt
    zero-sim demo --out out/
    zero-sim calibrate --nproc 2 --shape uniform --bandwidth-gbps 1 --out cal.json
    zero-sim calibrate --nccl-tests all_reduce_perf.txt --nvidia-smi-topo topo.txt --out box.json
    zero-sim validate --quick --report out/validation

Every flag of ``simulate`` is a keyword of ``zero_sim.simulate()``.  Bad input gets one
sentence on stderr and exit status 2; a model that does not fit is a result
(``fits: false`` and the shortfall), not an error.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from zero_sim.collectives import CollectiveError, fit_nccl_tests, parse_nccl_tests
from zero_sim.simulate import COMMON, ScenarioError, simulate
from zero_sim.strategies import STRATEGIES, all_knobs


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one sentence, exit 2, no usage dump
        raise UsageError(message[0].upper() + message[1:] + f"; see `{self.prog} --help`.")


def _add_setting(parser, name: str, default, help_text: str, kind: type, choices=None) -> None:
    flag = "--" + name.replace("_", "-")
    if kind is bool:
        parser.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=None,
                            help=f"{help_text} (default: {default})")
    else:
        parser.add_argument(flag, dest=name, type=kind, default=None, choices=choices,
                            help=f"{help_text} (default: {default})")


def _add_simulate_flags(parser) -> None:
    for s in COMMON:
        _add_setting(parser, s.name, s.default, s.help, s.kind, s.choices)
    for name, owners in sorted(all_knobs().items()):
        knob = owners[0][1]
        which = ", ".join(sorted({o for o, _ in owners}))
        _add_setting(parser, name, knob.default, f"[{which}] {knob.help}", knob.kind, knob.choices)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="zero-sim", description="Simulate data-parallel training: DDP, ZeRO-1/2/3, FSDP.")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)

    sim = sub.add_parser("simulate", help="simulate one configuration")
    _add_simulate_flags(sim)
    sim.add_argument("--json", action="store_true", help="print the metrics as one JSON object")
    sim.add_argument("--trace", type=Path, help="write a Chrome/Perfetto trace here")
    sim.add_argument("--plot", type=Path, help="write a timeline + memory PNG here")

    sub.add_parser("presets", help="list model, topology and GPU presets and strategies")

    fit = sub.add_parser("fit-nccl-tests", help="fit latency and bus bandwidth from nccl-tests output")
    fit.add_argument("file", type=Path)
    fit.add_argument("--collective", default="all_reduce", choices=["all_reduce", "reduce_scatter", "all_gather"])
    fit.add_argument("--json", action="store_true")

    demo = sub.add_parser("demo", help="simulate the default scenario; write a PNG and a trace")
    demo.add_argument("--out", type=Path, default=Path("out"))

    cal = sub.add_parser("calibrate", help="measure (or import) collective and compute times into a calibration file")
    cal.add_argument("--out", type=Path, required=True, help="calibration file to write (JSON)")
    cal.add_argument("--nproc", type=int, default=2, help="ranks to measure with on this machine")
    cal.add_argument("--shape", choices=["uniform", "two-nodes", "shared-bus"], default=None,
                     help="measure inside an emulated cluster of this shape (needs root and tc)")
    cal.add_argument("--bandwidth-gbps", type=float, default=None, help="the emulated links' rate, Gbit/s")
    cal.add_argument("--model", default="small", help="real_runs model preset whose layers are timed")
    cal.add_argument("--micro-batch", type=int, default=4, help="sequences per rank when timing layers")
    cal.add_argument("--max-bytes", default="32M", help="largest collective in the sweep")
    cal.add_argument("--nccl-tests", type=Path, action="append", default=[],
                     help="import an nccl-tests output file instead of measuring (repeatable: one per collective)")
    cal.add_argument("--nvidia-smi-topo", type=Path, default=None,
                     help="with --nccl-tests: also build a topology from `nvidia-smi topo -m` output")

    val = sub.add_parser("validate", help="predict, then run, a grid of real runs; report the errors")
    val.add_argument("--quick", action="store_true", help="a small grid fit for CI")
    val.add_argument("--report", type=Path, default=None, help="write report.md, validation.json and figures here")
    val.add_argument("--json", action="store_true", help="print the result as one JSON object")
    val.add_argument("--model", default="small")
    val.add_argument("--steps", type=int, default=None,
                     help="steps per run (default 12); the first is dropped and the median of the rest is measured")
    val.add_argument("--shape", choices=["uniform", "two-nodes", "shared-bus"], default="uniform")
    return parser


def _human(m: dict) -> str:
    mem = m["memory"]
    ov = m["comm_overlap_fraction"]
    lines = [
        f"{m['strategy']} · {m['model']} ({m['params']:,} params) · {m['gpus']} x {m['gpu']} on {m['topology']}",
        f"  step            {m['step_time_s'] * 1e3:10.2f} ms   ({m['tokens_per_s']:,.0f} tokens/s, "
        f"{m['tflops_per_gpu']:.1f} TFLOP/s per GPU)",
        f"  compute         {m['compute_time_s'] * 1e3:10.2f} ms",
        f"  exposed comm    {m['exposed_comm_s'] * 1e3:10.2f} ms   (overlap "
        + (f"{ov:.0%}" if ov is not None else "n/a") + f", {m['comm_volume_bytes'] / 1e9:.3f} GB sent per rank)",
        f"  phases          fwd {m['phases']['forward_s'] * 1e3:.2f} ms, bwd {m['phases']['backward_s'] * 1e3:.2f} ms, "
        f"opt {m['phases']['optimizer_s'] * 1e3:.2f} ms",
        f"  memory          model states {mem['model_states_bytes'] / 1e9:.2f} GB, activations "
        f"{mem['activations_bytes'] / 1e9:.2f} GB, buffers {mem['buffers_bytes'] / 1e9:.2f} GB, "
        f"peak {mem['peak_bytes'] / 1e9:.2f} of {mem['capacity_bytes'] / 1e9:.1f} GB",
    ]
    if not mem["fits"]:
        lines.append(f"  DOES NOT FIT: short by {mem['shortfall_bytes'] / 1e9:.2f} GB")
    return "\n".join(lines)


def _simulate(args) -> int:
    kwargs = {k: v for k, v in vars(args).items() if k not in ("command", "json", "trace", "plot")}
    result = simulate(**kwargs)
    if args.trace:
        result.to_chrome_trace(args.trace)
    if args.plot:
        _save_plot(result, args.plot)
    print(json.dumps(result.metrics) if args.json else _human(result.metrics))
    return 0


def _save_plot(result, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from zero_sim.plots import plot_overview

    path.parent.mkdir(parents=True, exist_ok=True)
    plot_overview(result, path)


def _presets() -> int:
    from zero_sim.hardware import GPUS
    from zero_sim.topology import PRESETS as TOPOS
    from zero_sim.workload import PRESETS as MODELS
    from zero_sim.workload import preset

    print("models:")
    for name in sorted(MODELS):
        print(f"  {name:14s} {preset(name).params:>16,d} params")
    print("topologies:")
    for name in sorted(TOPOS):
        print(f"  {name:17s} {TOPOS[name].description}")
    print("gpus:", ", ".join(GPUS))
    print("strategies:")
    for s in STRATEGIES.values():
        print(f"  {s.name:6s} {s.summary}")
    return 0


def _fit(args) -> int:
    if not args.file.is_file():
        raise UsageError(f"nccl-tests file {str(args.file)!r} does not exist; pass the path of saved output")
    table = parse_nccl_tests(args.file.read_text(errors="replace"), args.collective)
    fit = fit_nccl_tests(table)
    out = {"n_ranks": table.n_ranks, "latency_us": fit.latency_s * 1e6, "busbw_gbps": fit.busbw / 1e9,
           "max_rel_error": fit.max_rel_error,
           "rows": [{"size_bytes": r.size_bytes, "measured_us": r.time_us, "fitted_us": fit.time(r.size_bytes) * 1e6}
                    for r in table.rows]}
    if args.json:
        print(json.dumps(out))
    else:
        print(f"{table.n_ranks} ranks: latency {out['latency_us']:.1f} us, bus bandwidth {out['busbw_gbps']:.2f} GB/s, "
              f"worst error {fit.max_rel_error:.1%}")
        print(f"{'size (B)':>14} {'measured us':>12} {'fitted us':>10}")
        for row in out["rows"]:
            print(f"{row['size_bytes']:>14,d} {row['measured_us']:>12.1f} {row['fitted_us']:>10.1f}")
    return 0


def _demo(args) -> int:
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    result = simulate(model="gpt2-124m", strategy="ddp", gpus=8, topology="pcie", micro_batch=8)
    result.to_chrome_trace(out / "demo_trace.json")
    _save_plot(result, out / "demo_timeline.png")
    print(_human(result.metrics))
    print(f"wrote {out / 'demo_timeline.png'} and {out / 'demo_trace.json'} (open the trace at ui.perfetto.dev)")
    return 0


def _calibrate(args) -> int:
    from zero_sim import calibrate as cal

    if args.nccl_tests:
        fits = {}
        for path in args.nccl_tests:
            if not path.is_file():
                raise UsageError(f"nccl-tests file {str(path)!r} does not exist; pass the path of saved output")
            text = path.read_text(errors="replace")
            kind = next((k for k in cal.FITTED_COLLECTIVES if f"{k}_perf" in text or k in path.name), "all_reduce")
            fits[kind] = cal.fit_nccl_tests_text(text, kind)
        topology = None
        if args.nvidia_smi_topo is not None:
            if not args.nvidia_smi_topo.is_file():
                raise UsageError(f"file {str(args.nvidia_smi_topo)!r} does not exist; save `nvidia-smi topo -m` there")
            topology = cal.topology_from_imports(args.nvidia_smi_topo.read_text(errors="replace"), fits)
        result = cal.Calibration(fits, None, "nccl", {"source": ", ".join(str(p) for p in args.nccl_tests)},
                                 topology)
    else:
        if args.nproc < 1 or args.micro_batch < 1:
            raise UsageError("--nproc and --micro-batch must be positive integers")
        if (args.shape is None) != (args.bandwidth_gbps is None):
            raise UsageError("--shape and --bandwidth-gbps go together: give both to measure in an emulated "
                             "cluster, or neither for plain loopback")
        if args.bandwidth_gbps is not None and args.bandwidth_gbps <= 0:
            raise UsageError(f"--bandwidth-gbps must be positive, got {args.bandwidth_gbps}")
        result = cal.measure(args.nproc, args.model, args.micro_batch, None, args.shape, args.bandwidth_gbps,
                             args.max_bytes, on_line=print)
    result.save(args.out)
    print(result.describe())
    print(f"wrote {args.out}; use it with `zero-sim simulate --calibration {args.out}`")
    return 0


def _validate(args) -> int:
    from zero_sim import validate as v

    cases = v.QUICK_GRID if args.quick else v.FULL_GRID
    opts = v.Options(model=args.model, shape=args.shape,
                     **({} if args.steps is None else {"steps": args.steps}))
    result = v.run_validation(cases, opts, report_dir=args.report,
                              on_line=(lambda line: print(line, file=sys.stderr)) if args.json else print)
    if args.json:
        print(json.dumps(result, default=str))
    else:
        print(f"median |error| of step time: {result['median_abs_error']:.1%} over {len(result['cases'])} cases")
        if args.report:
            print(f"wrote {args.report / 'report.md'}")
    return 0


def main(argv=None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if args.command == "simulate":
            return _simulate(args)
        if args.command == "presets":
            return _presets()
        if args.command == "fit-nccl-tests":
            return _fit(args)
        if args.command == "demo":
            return _demo(args)
        if args.command == "calibrate":
            return _calibrate(args)
        if args.command == "validate":
            return _validate(args)
        parser.print_help()
        return 2
    except (UsageError, ScenarioError, CollectiveError) as exc:
        print(f"zero-sim: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:  # a real run or an emulated cluster that failed: its one sentence
        if type(exc).__name__ not in ("RunFailed", "ClusterUnavailable"):
            raise
        print(f"zero-sim: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:  # any other bad value that reached a model: still one sentence
        print(f"zero-sim: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
