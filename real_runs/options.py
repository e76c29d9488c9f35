"""What a real run is asked to do: ``real_runs.train``'s command line, its checks, and the
checks every real_runs entry point shares.

Everything here runs before any rank starts, so bad input is refused with one sentence
(:class:`BadInput`, exit status 2) instead of a traceback from each of N processes.
:func:`train_argv` is the one place a training command line is built, for the launcher,
the emulated cluster and validation alike.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from zero_sim.vocabulary import REAL_STRATEGIES
from zero_sim.vocabulary.buckets import DEFAULT_BUCKET_MB
from zero_sim.vocabulary.real_strategies import NO_LORA

from .lora_targets import DEFAULT_ALPHA, DEFAULT_TARGETS, MAX_RANK, BadTarget, parse_targets
from .precision import DEFAULT_PRECISION, PRECISIONS
from .presets import PRESETS


class BadInput(Exception):
    """Raised with one sentence for the user; the process exits with status 2."""


class ArgParser(argparse.ArgumentParser):
    """An argument parser whose errors are one :class:`BadInput` sentence, not a usage dump."""

    def error(self, message: str):
        raise BadInput(f"{message[0].upper()}{message[1:]}.")


def check_preset(model: str, seq_len: int | None) -> int:
    """The sequence length to use for ``model`` (its maximum when ``None``); refuses unknown
    presets and lengths the preset's position table cannot hold."""
    if model not in PRESETS:
        raise BadInput(f"Unknown model preset {model!r}; choose one of {', '.join(PRESETS)}.")
    cfg = PRESETS[model]
    seq_len = cfg.max_seq if seq_len is None else seq_len
    if not 1 <= seq_len <= cfg.max_seq:
        raise BadInput(f"--seq-len must be between 1 and {cfg.max_seq} for the {model} preset.")
    return seq_len


def make_parser() -> argparse.ArgumentParser:
    p = ArgParser(prog="python -m real_runs.train",
                  description="Train the small GPT under one strategy and record what happened.")
    p.add_argument("--strategy", required=True, help=", ".join(REAL_STRATEGIES))
    p.add_argument("--model", default="tiny", help=", ".join(PRESETS))
    p.add_argument("--global-batch", type=int, default=8, help="sequences per step, split across ranks")
    p.add_argument("--seq-len", type=int, default=None,
                   help="tokens per sequence (default: the preset's maximum)")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--precision", choices=tuple(PRECISIONS), default=DEFAULT_PRECISION,
                   help="fp32; bf16 weights and gradients with fp32 master weights and Adam state; or amp "
                        "(fp32 weights, the forward under torch.autocast in bf16)")
    p.add_argument("--bucket-mb", type=float, default=DEFAULT_BUCKET_MB,
                   help="gradient bucket cap (ddp, zero1, zero2); at the default the first bucket is 1 MiB")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--lora-rank", type=int, default=None,
                   help="fine-tune with LoRA adapters of this rank: every weight of the model frozen")
    p.add_argument("--lora-targets", default=None,
                   help=f"with --lora-rank: the projections given adapters, peft's names (q_proj,v_proj), "
                        f"short ones (q,v,o,fc,down), the block's own (qkv,proj,fc,out) or all-linear "
                        f"(default {DEFAULT_TARGETS})")
    p.add_argument("--lora-alpha", type=float, default=DEFAULT_ALPHA,
                   help="with --lora-rank: the adapters' output is scaled by alpha / rank (peft's default 8)")
    p.add_argument("--out", default="out/real_run")
    p.add_argument("--trace", action="store_true",
                   help="also write a torch.profiler trace per rank to <out>/traces/rank<r>.pt.trace.json")
    p.add_argument("--profile-memory", action="store_true",
                   help="with --trace: add allocations and tensor shapes to the traces (slower, larger)")
    p.add_argument("--save-state", action="store_true",
                   help="write whole params and Adam moments to state.pt")
    p.add_argument("--timeout-s", type=float, default=90.0, help="give up on a collective after this long")
    p.add_argument("--nproc", type=int, default=1, help="ranks to start when not already under torchrun")
    p.add_argument("--fail-rank", type=int, default=None, help="fault injection: the rank that fails")
    p.add_argument("--fail-at-step", type=int, default=0, help="fault injection: the step it fails in")
    p.add_argument("--fail-mode", choices=("raise", "kill", "abort", "stall"), default="raise",
                   help="raise a Python error, die of SIGKILL, abort as a native crash would, "
                        "or stall for --stall-s seconds and carry on, as a straggler would")
    p.add_argument("--stall-s", type=float, default=10.0, help="fault injection: how long a stall lasts")
    return p


def validate(args: argparse.Namespace, world: int) -> None:
    """Check everything that can be checked before any rank talks to another."""
    if args.strategy not in REAL_STRATEGIES:
        raise BadInput(f"Unknown strategy {args.strategy!r}; choose one of {', '.join(REAL_STRATEGIES)}.")
    args.seq_len = check_preset(args.model, args.seq_len)
    if args.steps < 1 or args.global_batch < 1:
        raise BadInput("--steps and --global-batch must be positive.")
    if args.global_batch % world:
        raise BadInput(f"--global-batch {args.global_batch} does not split evenly across {world} ranks.")
    if args.device == "cuda" and not _cuda_available():
        raise BadInput("--device cuda was asked for but this machine has no CUDA device.")
    if args.nproc < 1:
        raise BadInput("--nproc must be at least 1.")
    if args.stall_s < 0:
        raise BadInput("--stall-s must be zero or more.")
    if args.profile_memory and not args.trace:
        raise BadInput("--profile-memory adds memory events to the --trace profiler traces; add --trace too.")
    check_lora(args)
    check_out(args.out)


def check_lora(args: argparse.Namespace) -> None:
    """LoRA's options, as the simulator checks its own; sets ``args.lora_targets`` to the short names
    (``q,v``) that run.json records."""
    if args.lora_rank is None:
        if args.lora_targets is not None:
            raise BadInput("--lora-targets names where adapters go, but no --lora-rank says their size; "
                           "give --lora-rank (16 is common) or leave --lora-targets out.")
        return
    if not 1 <= args.lora_rank <= MAX_RANK:
        raise BadInput(f"--lora-rank must be an integer from 1 to {MAX_RANK}, got {args.lora_rank}.")
    if not args.lora_alpha > 0:
        raise BadInput(f"--lora-alpha must be positive, got {args.lora_alpha}.")
    if args.strategy in NO_LORA:
        raise BadInput(NO_LORA[args.strategy])
    try:
        args.lora_targets = ",".join(parse_targets(args.lora_targets or DEFAULT_TARGETS))
    except BadTarget as e:
        raise BadInput(f"{e}.") from None


# Rank files and run.json of the larger presets take a few MB, traces tens; below this much
# free space a run would train every step and then fail to write what it learned.
MIN_FREE_MB = 50


def check_out(out: str) -> None:
    """``--out`` must take files and have room for them, checked before the first step
    rather than found out after the last; creates the folder."""
    path = Path(out)
    probe = path / f".write-check.{os.getpid()}.tmp"
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        # Rank 0, clearing the previous run's leftovers, may already have taken it away.
        probe.unlink(missing_ok=True)
        stat = os.statvfs(path) if hasattr(os, "statvfs") else None
    except OSError as e:
        raise BadInput(f"--out {out} is not writable: {e.strerror or e}; choose another folder.") from None
    free_mb = stat.f_bavail * stat.f_frsize / 2**20 if stat is not None else float("inf")
    if free_mb < MIN_FREE_MB:
        raise BadInput(f"--out {out} has only {free_mb:.0f} MB free and a run needs at least "
                       f"{MIN_FREE_MB} MB; choose another folder.")


def _cuda_available() -> bool:
    import torch  # only here: every other check answers without loading torch

    return torch.cuda.is_available()


def as_flags(options: dict) -> list[str]:
    """Keyword options as command-line flags: ``global_batch=16`` -> ``--global-batch 16``;
    ``True`` is a bare flag, ``False`` and ``None`` are left out."""
    argv = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value not in (False, None):
            argv += [flag, str(value)]
    return argv


def train_argv(strategy: str, nproc: int, out: str | os.PathLike, options: dict) -> list[str]:
    """train's command line for these options, checked: ValueError (one sentence) on bad input."""
    argv = ["--strategy", strategy, "--out", str(out), *as_flags(options)]
    try:
        validate(make_parser().parse_args(argv), nproc)
    except BadInput as e:
        raise ValueError(str(e)) from None
    return argv
