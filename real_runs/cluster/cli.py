"""``python -m real_runs.cluster``: run ``real_runs.train`` (or ``--module``) in an emulated cluster.

Everything that can be checked is checked before anything is built: the shape, whether
this machine can build it, and the training options.  Bad input and a machine that cannot
build the cluster exit with status 2 and one sentence; a failed run with status 1.  Ctrl-C
(SIGINT), SIGTERM and SIGHUP, at any point, tear the cluster down and exit with one sentence
and status 128 + the signal (130, 143, 129), the shells' convention; no traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys

from .. import options
from ..launch import RunFailed, out_of, run_outputs
from .emulated import EmulatedCluster, stamp_run_json
from .namespaces import ClusterUnavailable, unavailable_reason
from .shapes import SHAPES, ClusterShape
from .signals import Stopped, stopping_on_signals


def make_parser() -> argparse.ArgumentParser:
    p = options.ArgParser(prog="python -m real_runs.cluster",
                          usage="%(prog)s --shape SHAPE --bandwidth-gbps G --nproc N [options] "
                                "-- MODULE_ARGS...",
                          description="Run real_runs.train (or --module) on ranks in an emulated cluster.")
    p.add_argument("--shape", required=True, help=", ".join(SHAPES))
    p.add_argument("--bandwidth-gbps", type=float, required=True, help="rate of the shaped link(s), Gbit/s")
    p.add_argument("--latency-ms", type=float, default=0.0,
                   help="one-way delay added on shaped links (netem)")
    p.add_argument("--nproc", type=int, required=True, help="ranks")
    p.add_argument("--module", default="real_runs.train", help="the torchrun entry to run")
    p.add_argument("--timeout-s", type=float, default=600.0)
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        with stopping_on_signals():
            return _main(argv)
    except KeyboardInterrupt:
        return _stopped_by(signal.SIGINT)
    except Stopped as e:
        return _stopped_by(e.signum)


def _stopped_by(signum: int) -> int:
    # Said only once the with-blocks have unwound, so it is true: the cluster is gone.
    print(f"error: stopped by {signal.Signals(signum).name} before the run finished; "
          f"nothing of the emulated cluster is left.", file=sys.stderr)
    return 128 + signum


def _main(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ours, rest = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    try:
        args = make_parser().parse_args(ours)
        cluster = EmulatedCluster(args.nproc, ClusterShape(args.shape, args.bandwidth_gbps, args.latency_ms),
                                  on_line=print)
        # Before the module's own checks, which may import torch: a machine that cannot
        # build the cluster says so at once.
        why = unavailable_reason(latency=args.latency_ms > 0)
        if why:
            print(f"error: {why}", file=sys.stderr)
            return 2
        if args.module == "real_runs.train":
            options.validate(options.make_parser().parse_args(rest), args.nproc)
    except (options.BadInput, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    # A training run's folder is cleared first and marked failed if anything below fails.
    outputs = run_outputs(out_of(rest)) if args.module == "real_runs.train" else contextlib.nullcontext()
    try:
        with outputs:
            with cluster:
                print(f"cluster: {cluster.describe()}", flush=True)
                cluster.run_module(args.module, rest, on_line=print, timeout_s=args.timeout_s)
            if args.module == "real_runs.train":
                stamp_run_json(out_of(rest), cluster)
    except ClusterUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except RunFailed as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0
