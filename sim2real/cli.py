"""``zero-sim``, the installed command: the simulator's subcommands plus those that run real ranks.

    zero-sim calibrate --nproc 2 --shape uniform --bandwidth-gbps 1 --out cal.json
    zero-sim calibrate --nccl-tests all_reduce_perf.txt --nvidia-smi-topo topo.txt --out box.json
    zero-sim calibrate --device cuda --nproc 8 --model gpt2-350m --out gpu.json
    zero-sim validate --quick --report out/validation
    zero-sim validate --sample 30 --seed 7 --report out/validation   # 30 cases drawn at random
    zero-sim validate --published            # predict published GPU runs; no run is started
    zero-sim validate --published --points my_points.toml   # your own measurements, same format
    zero-sim validate --repredict out.json   # a kept validation's cases, predicted again by this code

A real run or an emulated cluster that fails ends with its one sentence and exit status 1;
bad input, as everywhere, with one sentence and exit status 2.  Ctrl-C, SIGTERM and SIGHUP stop
the ranks and tear any emulated cluster down, then say so in one line and exit with 128 + the
signal, the shells' convention.
"""

from __future__ import annotations

import json
import secrets
import signal
import sys
from pathlib import Path

from tqdm import tqdm

from real_runs.cluster import SHAPES, ClusterUnavailable, Stopped, stopping_on_signals, unavailable_reason
from real_runs.launch import RunFailed
from real_runs.precision import TIMED, default_precision
from sim2real import measure
from sim2real import validate as v
from sim2real.gpu_grid import gpu_grid
from sim2real.overlay import compare, load_run
from sim2real.replay import predict_run
from sim2real.repredict import format_repredicted, repredict
from sim2real.sampling import FULL_GRID, QUICK_GRID, sample_cases
from sim2real.validate_report import headline
from zero_sim import cli
from zero_sim.calibration import Calibration, fit_nccl_tests_text, topology_from_imports
from zero_sim.calibration.format import FITTED_COLLECTIVES
from zero_sim.calibration.from_traces import calibration_from_traces
from zero_sim.published.fit import refit, write_fit
from zero_sim.published.report import format_report, published_report, report_json
from zero_sim.system.run_overheads import FIT_FILE
from zero_sim.vocabulary.files import check_named_output


def _calibrate_args(cal) -> None:
    cal.add_argument("--out", type=Path, required=True, help="calibration file to write (JSON)")
    cal.add_argument("--nproc", type=int, default=2, help="ranks to measure with on this machine")
    cal.add_argument("--shape", choices=SHAPES, default=None,
                     help="measure inside an emulated cluster of this shape (needs root and tc)")
    cal.add_argument("--bandwidth-gbps", type=float, default=None, help="the emulated links' rate, Gbit/s")
    cal.add_argument("--model", default="small", help="real_runs model preset whose layers are timed")
    cal.add_argument("--micro-batch", type=int, default=4, help="sequences per rank when timing layers")
    cal.add_argument("--max-bytes", default="32M", help="largest collective in the sweep")
    cal.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                     help="measure gloo ranks on this CPU, or one rank per GPU over NCCL")
    cal.add_argument("--precision", choices=TIMED, default=None,
                     help="precision the layers are timed in (default: fp32 on cpu, bf16 on cuda)")
    cal.add_argument("--nccl-tests", type=Path, action="append", default=[],
                     help="import an nccl-tests output file instead of measuring "
                          "(repeatable: one per collective)")
    cal.add_argument("--nvidia-smi-topo", type=Path, default=None,
                     help="with --nccl-tests: also build a topology from `nvidia-smi topo -m` output")
    cal.add_argument("--from-trace", type=Path, nargs="+", default=None, metavar="PATH",
                     help="fit from PyTorch profiler traces of your own GPU run instead of measuring: "
                          ".json or .json.gz files, or folders of them (see docs/calibration.md)")
    cal.add_argument("--untraced-step-ms", type=float, default=None,
                     help="with --from-trace: the step time the same run shows without the profiler (from "
                          "its logs), so the profiler's own host cost is taken out of the host times")
    cal.add_argument("--tokens", type=int, default=None,
                     help="with --from-trace: tokens per rank per step the traced run computed "
                          "(micro-batch x sequence length), to use its layer times (read from run.json "
                          "for real_runs traces)")


def _imported(args) -> Calibration:
    fits = {}
    for path in args.nccl_tests:
        if not path.is_file():
            raise cli.UsageError(f"nccl-tests file {str(path)!r} does not exist; "
                                 f"pass the path of saved output")
        text = path.read_text(errors="replace")
        kind = next((k for k in FITTED_COLLECTIVES if f"{k}_perf" in text or k in path.name), "all_reduce")
        fits[kind] = fit_nccl_tests_text(text, kind)
    topology = None
    if args.nvidia_smi_topo is not None:
        if not args.nvidia_smi_topo.is_file():
            raise cli.UsageError(f"file {str(args.nvidia_smi_topo)!r} does not exist; "
                                 f"save `nvidia-smi topo -m` there")
        topology = topology_from_imports(args.nvidia_smi_topo.read_text(errors="replace"), fits)
    return Calibration(fits, None, "nccl", {"source": ", ".join(str(p) for p in args.nccl_tests)}, topology)


def _measured(args) -> Calibration:
    if args.nproc < 1 or args.micro_batch < 1:
        raise cli.UsageError("--nproc and --micro-batch must be positive integers")
    if (args.shape is None) != (args.bandwidth_gbps is None):
        raise cli.UsageError("--shape and --bandwidth-gbps go together: give both to measure in an emulated "
                             "cluster, or neither for plain loopback")
    if args.bandwidth_gbps is not None and args.bandwidth_gbps <= 0:
        raise cli.UsageError(f"--bandwidth-gbps must be positive, got {args.bandwidth_gbps}")
    if args.device == "cuda":
        if args.shape is not None:
            raise cli.UsageError("--shape emulates a cluster of CPU ranks; a GPU calibration measures the "
                                 "GPUs' own links, so leave --shape out with --device cuda")
        have = v.cuda_devices()
        if have < args.nproc:
            raise cli.UsageError(f"--device cuda --nproc {args.nproc} needs {args.nproc} CUDA device(s); "
                                 f"this machine has {have}")
    precision = args.precision or default_precision(args.device)
    return measure.measure(args.nproc, args.model, args.micro_batch, None, args.shape, args.bandwidth_gbps,
                           args.max_bytes, on_line=print, device=args.device, precision=precision)


def _from_traces(args) -> int:
    if args.tokens is not None and args.tokens < 1:
        raise cli.UsageError(f"--tokens must be a positive number of tokens per rank, got {args.tokens}")
    if args.untraced_step_ms is not None and not 0 < args.untraced_step_ms < 1e7:
        raise cli.UsageError(f"--untraced-step-ms must be a positive time in milliseconds, got "
                             f"{args.untraced_step_ms}")
    # A bar on a terminal while large traces are read (bytes of each file as it streams).
    with tqdm(unit="B", unit_scale=True, desc="reading traces", leave=False,
              disable=not sys.stderr.isatty()) as bar:
        def progress(done: int, total: int) -> None:
            bar.total, bar.n = total, done
            bar.refresh()

        findings = calibration_from_traces(args.from_trace, tokens=args.tokens, on_progress=progress,
                                           untraced_step_ms=args.untraced_step_ms)
    findings.calibration.save(args.out)
    print(findings.report())
    print(f"wrote {args.out}; use it with `zero-sim simulate --calibration {args.out}`")
    return 0


def _calibrate(args) -> int:
    check_named_output(args.out)  # before measuring: a bad path is refused at once
    if args.from_trace:
        if args.nccl_tests:
            raise cli.UsageError("--from-trace and --nccl-tests are two sources of one calibration; give one")
        return _from_traces(args)
    result = _imported(args) if args.nccl_tests else _measured(args)
    result.save(args.out)
    print(result.describe())
    print(f"wrote {args.out}; use it with `zero-sim simulate --calibration {args.out}`")
    return 0


def _validate_args(val) -> None:
    val.add_argument("--quick", action="store_true",
                     help="three fixed cases on the two smaller models, three strategies on three "
                          "shapes (minutes; for CI)")
    val.add_argument("--sample", type=int, default=None, metavar="K",
                     help="draw K cases at random from every strategy, N 2-4, cluster shape, bandwidth "
                          "0.3-5 Gbit/s, bucket size 1-50 MB and model tiny/small/medium (the judge); "
                          "without it, the fixed 32-case grid")
    val.add_argument("--seed", type=int, default=None,
                     help="the random seed of --sample (printed, so a sample can be drawn again); "
                          "default: one drawn now")
    val.add_argument("--published", action="store_true",
                     help="predict published GPU measurements instead of running anything "
                          "(see docs/published.md)")
    val.add_argument("--points", type=Path, default=None, metavar="FILE",
                     help="with --published: a TOML file of points in the same format as "
                          "zero_sim/published/points.toml (default: that file)")
    val.add_argument("--refit", action="store_true",
                     help="with --published: fit the whole-run overhead per GPU generation and the "
                          "prediction intervals again, leave one source out, and write them "
                          "(zero_sim/system/run_overheads.json)")
    val.add_argument("--repredict", type=Path, nargs="+", default=None, metavar="FILE",
                     help="predict again, with this code, the cases of validations run with --keep "
                          "(their --json output or a report's validation.json) and print old and new "
                          "errors side by side; nothing runs")
    val.add_argument("--trace", type=Path, default=None, metavar="RUN_DIR",
                     help="replay a traced real run (real_runs --trace: run.json beside traces/) from the "
                          "calibration its own traces give, and print the error per phase; nothing runs")
    val.add_argument("--report", type=Path, default=None,
                     help="write report.md, validation.json and figures here")
    val.add_argument("--json", action="store_true", help="print the result as one JSON object")
    val.add_argument("--model", default="small")
    val.add_argument("--steps", type=int, default=None,
                     help=f"steps per run (default {v.Options.steps}); "
                          f"the first is dropped and the median of the rest is measured")
    val.add_argument("--shape", choices=SHAPES, default="uniform")
    val.add_argument("--keep", action="store_true",
                     help="keep the runs' files (removed at the end otherwise) and say where they are")
    val.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                     help="cuda: run the GPU grid on this box's GPUs over NCCL in bf16 (every strategy, "
                          "N = 1, 2, 4 ... G, buckets 25 and 4 MB, gpt2-124m and gpt2-350m)")
    val.add_argument("--precision", choices=TIMED, default=None,
                     help="the runs' precision (default: fp32 on cpu, bf16 on cuda)")


def _validate_published(args) -> int:
    if args.refit:
        if args.points is not None:
            raise v.ValidationError("--refit fits the shipped table's overheads; leave out --points")
        fit = refit()
        write_fit(fit)
        print(f"wrote {FIT_FILE.name}: overheads {fit['overheads']}, pooled {fit['pooled']:.3f}")
    report = published_report(args.points)
    print(json.dumps(report_json(report), default=str) if args.json else format_report(report))
    return 0


def _validate_repredicted(args) -> int:
    if args.published or args.quick or args.sample is not None or args.device != "cpu":
        raise v.ValidationError("--repredict predicts kept cases again and runs nothing; "
                                "leave out --published, --quick, --sample and --device")
    result = repredict(args.repredict)
    print(json.dumps(result, default=str) if args.json else format_repredicted(result))
    return 0


def _validate_trace(args) -> int:
    """Self-consistency before any what-if: the traced run replayed from its own traces' calibration."""
    run_dir = args.trace.parent if args.trace.name == "traces" else args.trace
    if not (run_dir / "run.json").is_file() or not (run_dir / "traces").is_dir():
        raise v.ValidationError(f"{str(args.trace)!r} is not a traced real run (run.json beside a traces/ "
                                f"folder, as `python -m real_runs.train --trace` leaves it); for a trace of "
                                f"your own run use `zero-sim calibrate --from-trace` instead")
    findings = calibration_from_traces([run_dir / "traces"])
    run = load_run(run_dir)
    comparison = compare(run, predict_run(run.run, findings.calibration))
    if args.json:
        print(json.dumps({"summary": comparison.summary,
                          "phases": comparison.phases.reset_index().to_dict("records"),
                          "not_found": findings.not_found}, default=str))
        return 0
    print(findings.report())
    print(comparison.pretty("phases").to_string())
    print(f"step: predicted {comparison.summary['predicted_step_s'] * 1e3:.2f} ms, measured "
          f"{comparison.summary['measured_step_s'] * 1e3:.2f} ms ({comparison.summary['step_error']:+.0%})")
    return 0


def _validate(args) -> int:
    if args.trace is not None:
        return _validate_trace(args)
    if args.repredict is not None:
        return _validate_repredicted(args)
    if args.published:
        return _validate_published(args)
    if args.points is not None:
        raise v.ValidationError("--points names published measurements to predict; give --published too")
    say = (lambda line: print(line, file=sys.stderr)) if args.json else print
    if args.report:
        check_named_output(args.report, directory=True)
    if args.device == "cuda":
        cases, sample = _gpu_cases(args)
    else:
        cases, sample = _chosen_cases(args, say)
    opts = v.Options(model=args.model, shape=args.shape, device=args.device,
                     precision=args.precision or default_precision(args.device),
                     **({} if args.steps is None else {"steps": args.steps}))
    result = v.run_validation(cases, opts, report_dir=args.report, keep=args.keep, on_line=say, sample=sample)
    if args.json:
        print(json.dumps(result, default=str))
    else:
        print(headline(result))
        if args.report:
            print(f"wrote {args.report / 'report.md'}")
        if result["files"]:
            print(f"kept the runs' files in {result['files']}")
    return 0


def _gpu_cases(args) -> tuple[tuple, None]:
    """The GPU grid for every GPU of this box (sim2real.gpu_grid); the CPU grids' options do not apply."""
    if args.quick or args.sample is not None or args.seed is not None:
        raise v.ValidationError("--quick, --sample and --seed draw from the emulated CPU cluster's space; "
                                "--device cuda runs the GPU grid, so leave them out")
    have = v.cuda_devices()
    if have < 1:
        raise v.ValidationError("--device cuda was asked for but this machine has no CUDA device")
    return gpu_grid(have), None


def _chosen_cases(args, say) -> tuple[tuple, dict | None]:
    """The cases to run and, for a sample, how they were drawn (the seed is said at once)."""
    if args.sample is None:
        if args.seed is not None:
            raise v.ValidationError("--seed draws a --sample; give --sample K too")
        return (QUICK_GRID if args.quick else FULL_GRID), None
    if args.quick:
        raise v.ValidationError("--quick is a fixed small sample; give either --quick or --sample K")
    seed = args.seed if args.seed is not None else secrets.randbelow(10**6)
    latency_reason = unavailable_reason(latency=True)
    try:
        cases = sample_cases(args.sample, seed, with_latency=latency_reason is None)
    except ValueError as exc:
        raise v.ValidationError(str(exc)) from None
    latency = "latency sampled" if latency_reason is None else f"no latency: {latency_reason}"
    say(f"drew {len(cases)} cases with --seed {seed} ({latency})")
    return cases, {"k": args.sample, "seed": seed, "latency": latency}


COMMANDS: dict[str, cli.Command] = {
    **cli.COMMANDS,
    "calibrate": cli.Command("measure (or import) collective and compute times into a calibration file",
                             _calibrate_args, _calibrate),
    "validate": cli.Command("predict, then run, a grid of real runs; report the errors",
                            _validate_args, _validate),
}


def main(argv=None) -> int:
    try:
        with stopping_on_signals():
            return cli.main(argv, COMMANDS)
    except (RunFailed, ClusterUnavailable) as exc:  # a real run or an emulated cluster that failed
        print(f"zero-sim: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return _stopped_by(signal.SIGINT)
    except Stopped as stop:
        return _stopped_by(stop.signum)


def _stopped_by(signum: int) -> int:
    # Said once the with-blocks have unwound: the ranks and any emulated cluster are gone.
    print(f"zero-sim: stopped by {signal.Signals(signum).name}; every run it started was stopped too.",
          file=sys.stderr)
    return 128 + signum


if __name__ == "__main__":
    sys.exit(main())
