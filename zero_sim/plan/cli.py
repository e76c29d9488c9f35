"""``zero-sim plan``: the fastest way to train a model on a cluster, and whether it fits.

    zero-sim plan --model llama3-8b --gpus 16,32 --topology p4d-efa --seq-len 4096 --global-batch 256

It searches strategies x their main knobs x recompute x micro-batch (x gradient accumulation
when ``--global-batch`` is fixed) x GPU counts (:mod:`zero_sim.plan.search`) and prints a
ranked table, the fastest candidate that fits first: tokens/s per GPU with its likely range,
MFU, step time, reserved memory against capacity (what "fits" compares), exposed
communication and the settings to use.  Rows within 5% of the fastest are marked ``≈``, too
close to call.  When nothing fits it says what would: the first change, found by trying them
(:mod:`zero_sim.plan.fit_advice`).  ``--json`` and ``--csv`` print the whole table instead; progress
shows on a terminal's stderr otherwise.  Candidates the simulator refuses are counted in the
header, and the line under it says why, in one sentence.

Its flags are ``simulate``'s, built from the one schema (:mod:`zero_sim.scenario.settings`,
ZeRO++'s knobs for the zero3 candidates), so both take the same values; where plan searches a
list of values instead of taking one (``--gpus 8,16,32``), that meaning is declared once, in
:data:`TRIED`, and a value named twice is tried once.
"""

from __future__ import annotations

import json
import math
import sys

import pandas as pd

from zero_sim.plan.executors import dask_executor, default_executor
from zero_sim.plan.fit_advice import as_flags, fit_advice
from zero_sim.plan.planner import FITS, REFUSED
from zero_sim.plan.search import MICRO_BATCHES, SIMULATED, PlanError, search, search_space
from zero_sim.scenario import resolve
from zero_sim.scenario.settings import COMMON, SHAPE_SETTINGS
from zero_sim.settings import add_flag, integer_flag, whole_number
from zero_sim.strategies import STRATEGIES, accepting, all_knobs
from zero_sim.strategies.capabilities import ZEROPP as ZEROPP_FEATURE
from zero_sim.system.workload import RECOMPUTE_MODES

# The size budget of one search: at about 3 ms a candidate to bound, a larger one takes minutes.
MAX_CANDIDATES = 20_000
ZEROPP = ("zero_quantized_weights", "zero_hpz_partition_size", "zero_quantized_gradients")
SHARED = ("model", "params", "seq_len", "topology", "gpu", "stack", "precision", "reduce_dtype",
          "grad_accum_dtype", "bandwidth_gbps", "node_bandwidth_gbps", "calibration", "lora_rank",
          "lora_targets", "lora_base", "peft_config",
          "offload_optimizer", "offload_params", "host_memory_gb", *SHAPE_SETTINGS)


def _counts(text: str, flag: str) -> list[int]:
    """The whole numbers of a list flag (``8,16,32``), each once, in the order given."""
    values = [whole_number(v) for v in str(text).split(",") if v.strip()]
    if not all(isinstance(v, int) for v in values):
        raise PlanError(f"{flag} takes whole numbers separated by commas, such as 8,16,32; "
                        f"got {text!r}")
    if not values or min(values) <= 0:
        raise PlanError(f"{flag} takes positive whole numbers separated by commas; got {text!r}")
    return _once(values)


def _names(text: str | None, known, flag: str) -> list[str] | None:
    """The names of a list flag (``zero3,fsdp``), each once, in the order given; None if not given."""
    if text is None:
        return None
    names = [v.strip().lower() for v in text.split(",") if v.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise PlanError(f"{flag} takes names from {', '.join(known)} separated by commas; got {text!r}")
    return _once(names)


def _once(values: list) -> list:
    # A value named twice (--gpus 8,8) is one candidate: trying it twice would print the same row twice.
    return list(dict.fromkeys(values))


# Where plan's flag means something other than simulate's, its meaning is declared here, once: a
# list of values to try (simulate's takes one value), in place of the schema's setting of that name.
TRIED = {
    "micro_batch": ("--micro-batch", ",".join(map(str, MICRO_BATCHES)),
                    f"micro-batches to try (default {','.join(map(str, MICRO_BATCHES))})"),
    "strategy": ("--strategies", None, f"strategies to try (default {','.join(STRATEGIES)})"),
    "gpus": ("--gpus", "8", "GPU counts to try, e.g. 8 or 16,32,64 (default 8)"),
    "recompute": ("--recompute", None, f"recompute modes to try (default {','.join(RECOMPUTE_MODES)})"),
}
# Plan's own defaults where they differ from simulate's (None: the schema's, decided by simulate()).
DEFAULTS = {"model": "gpt2-1.5b", "topology": "dgx-a100"}


def plan_args(parser) -> None:
    """Plan's flags: the settings every candidate shares from the one schema
    (:data:`zero_sim.scenario.settings.COMMON`), as ``simulate`` takes them; the ones it searches
    as lists (:data:`TRIED`); ZeRO++'s knobs for the zero3 candidates; its own outputs."""
    for setting in COMMON:
        if setting.name in TRIED:
            flag, default, help_text = TRIED[setting.name]
            parser.add_argument(flag, dest=flag[2:].replace("-", "_"), default=default, help=help_text)
        elif setting.name in SHARED:
            add_flag(parser, setting, default=DEFAULTS.get(setting.name))
        if setting.name == "micro_batch":
            parser.add_argument("--global-batch", dest="global_batch", type=integer_flag, default=None,
                                help="sequences per optimizer step, fixed: each micro-batch accumulates "
                                     "to it")
    knobs = all_knobs()
    for name in ZEROPP:
        add_flag(parser, knobs[name][0][1], f"on every zero3 candidate: {knobs[name][0][1].help}")
    parser.add_argument("--top", type=integer_flag, default=10, help="rows to rank and show (default 10)")
    parser.add_argument("--json", action="store_true", help="print every candidate as JSON")
    parser.add_argument("--csv", action="store_true", help="print every candidate as CSV")
    parser.add_argument("--workers", type=integer_flag, default=None,
                        help="processes to simulate on (default: cores)")
    parser.add_argument("--dask-scheduler", dest="dask_scheduler", default=None, metavar="ADDRESS",
                        help="run the simulations on a Dask cluster (tcp://host:8786; needs zero-sim[dask])")


def _zeropp(args, strategies: list[str] | None) -> dict:
    """ZeRO++'s settings given, for the zero3 candidates (the planner never turns them on itself)."""
    given = {k: getattr(args, k) for k in ZEROPP if getattr(args, k, None) is not None}
    takers = " or ".join(accepting(ZEROPP_FEATURE))
    if given and strategies is not None and not set(accepting(ZEROPP_FEATURE)) & set(strategies):
        raise PlanError(f"the ZeRO++ flags apply to {takers}, which --strategies leaves out; "
                        f"add {takers} or drop them")
    return given


def zeropp_label(zeropp: dict) -> str:
    """The header's note of ZeRO++ on the zero3 candidates: ``qwZ, hpZ 8, qgZ``."""
    parts = (["qwZ"] if zeropp.get("zero_quantized_weights") else []) + (
        [f"hpZ {zeropp['zero_hpz_partition_size']}"] if (zeropp.get("zero_hpz_partition_size") or 1) > 1
        else []) + (["qgZ"] if zeropp.get("zero_quantized_gradients") else [])
    return f" · zero3 with ZeRO++ {', '.join(parts)}" if parts else ""


def _space(args) -> tuple[dict, list[dict], str]:
    if args.top <= 0:
        raise PlanError(f"--top must be a positive whole number, got {args.top}")
    base = {k: getattr(args, k) for k in SHARED if getattr(args, k, None) is not None}
    # One scenario checked first, so that a misspelt model or topology is one sentence, not 400.
    stack = resolve(**base, gpus=_counts(args.gpus, "--gpus")[0]).settings.stack
    strategies = _names(args.strategies, list(STRATEGIES), "--strategies")
    zeropp = _zeropp(args, strategies)
    space = search_space(base, _counts(args.gpus, "--gpus"), _counts(args.micro_batch, "--micro-batch"),
                         args.global_batch, strategies,
                         _names(args.recompute, list(RECOMPUTE_MODES), "--recompute") or RECOMPUTE_MODES)
    space = [s | zeropp if s["strategy"] in accepting(ZEROPP_FEATURE) else s for s in space]
    base = base | {"zeropp": zeropp}
    if len(space) > MAX_CANDIDATES:
        raise PlanError(f"this search has {len(space):,} candidates, beyond the budget of "
                        f"{MAX_CANDIDATES:,}; narrow it with fewer --gpus counts, --micro-batch values, "
                        f"--strategies or --recompute")
    return base, space, stack


def _progress(args, total: int):
    if args.json or args.csv or not sys.stderr.isatty():
        return None, None
    from tqdm import tqdm

    # Shown only once the plan has run two seconds: a quick answer prints without a bar's flicker.
    bar = tqdm(total=total, desc="candidates", unit="candidate", file=sys.stderr, delay=2)
    return bar, (lambda done, _total: bar.update(done - bar.n))


def run_plan(args) -> int:
    base, space, stack = _space(args)
    executor = dask_executor(args.dask_scheduler) if args.dask_scheduler else \
        default_executor(len(space), args.workers)
    bar, progress = _progress(args, len(space))
    try:
        table = search(space, args.top, executor, progress)
    finally:
        if bar is not None:
            bar.close()
        if executor is not None and not args.dask_scheduler:
            executor.shutdown()
    if args.csv:
        print(table.to_csv(), end="")
    elif args.json:
        facts = {"stack": stack, "precision": base.get("precision", "mixed")}
        print(json.dumps({"summary": summary(table, args.top) | facts,
                          "candidates": _records(table)}, default=str))
    else:
        print(format_plan(table, base, args.top, stack))
    return 0


def _records(table: pd.DataFrame) -> list[dict]:
    clean = table.astype(object).where(table.notna(), None)
    return [{"rank": i, **row} for i, row in zip(clean.index, clean.to_dict("records"), strict=True)]


def summary(table: pd.DataFrame, top: int) -> dict:
    settled = table["settled"].value_counts().to_dict()
    fits = table[table["outcome"] == FITS]
    return {"candidates": len(table), "settled": settled, "fit": len(fits), "top": top,
            "fastest": _records(fits.head(1))[0] if len(fits) else None}


def _row_text(rank: int, r: dict) -> str:
    close = "≈" if r.get("too_close_to_call") else " "
    likely = (f"{r['tokens_per_s_low'] / r['gpus']:,.0f}-{r['tokens_per_s_high'] / r['gpus']:,.0f}"
              if _number(r.get("tokens_per_s_low")) else "-")
    mfu = f"{r['mfu']:.0%}" if _number(r.get("mfu")) else "-"
    settings = f"{r['knobs']}, recompute {r['recompute']}"
    accum = int(r.get("grad_accum") or 1)
    return (f"{rank:>4}{close} {r['strategy']:6} {r['gpus']:>5} {r['micro_batch']:>3} {accum:>5} "
            f"{r['tokens_per_s'] / r['gpus']:>10,.0f} {likely:>15} {mfu:>4} {r['step_ms']:>10,.1f} "
            f"{r['reserved_GB']:>6.1f}/{r['capacity_GB']:<5.1f} {_margin(r):>11} "
            f"{r['exposed_comm_ms']:>9,.1f}  {settings}")


def _margin(r: dict) -> str:
    """GB to spare, and ``tight`` where the reserved memory's 80% interval crosses the capacity."""
    if not _number(r.get("spare_GB")):
        return "-"
    return f"{r['spare_GB']:.1f}" + (" tight" if r.get("fit_verdict") == "tight" else "")


def _number(value) -> bool:
    return isinstance(value, int | float) and not math.isnan(value)


def format_plan(table: pd.DataFrame, base: dict, top: int, stack: str) -> str:
    counts = table["outcome"].value_counts().to_dict()
    simulated = int((table["settled"] == SIMULATED).sum())
    tuned = base.get("lora_rank") or base.get("peft_config")
    lora = (f" · LoRA {'r=' + str(base['lora_rank']) if base.get('lora_rank') else base['peft_config']}"
            if tuned else "")
    lora += _offloaded(base)
    fp8 = " · fp8 (block linear GEMMs in float8, tensorwise; fsdp also with fp8_all_gather)" \
        if base.get("precision") == "fp8" else ""
    lines = [f"plan · {base.get('model', base.get('params'))}{lora}{fp8} on {base['topology']}"
             f"{zeropp_label(base.get('zeropp') or {})} · stack {stack} · "
             f"{len(table):,} candidates, {simulated:,} simulated; "
             + ", ".join(f"{what}: {n:,}" for what, n in counts.items())]
    lines += _refusals(table)
    fitting = table[table["outcome"] == FITS]
    if fitting.empty:
        lines += _nothing_fits(table)
        return "\n".join(lines)
    best = fitting.iloc[0]
    accum = int(best.get("grad_accum") or 1)
    lines.append(f"fastest that fits: {best['strategy']} ({best['knobs']}, recompute {best['recompute']}) on "
                 f"{best['gpus']} GPUs, micro-batch {best['micro_batch']} x {accum} accumulation: "
                 f"{best['tokens_per_s'] / best['gpus']:,.0f} tokens/s per GPU, "
                 f"{best['reserved_GB']:.1f} of {best['capacity_GB']:.1f} GB reserved")
    lines.append(f"{'rank':>5} {'strat':6} {'gpus':>5} {'mb':>3} {'accum':>5} {'tok/s/GPU':>10} "
                 f"{'likely (80%)':>15} {'MFU':>4} {'step ms':>10} {'reserved GB':>12} {'spare GB':>11} "
                 f"{'exposed ms':>9}  "
                 f"settings")
    for rank, r in zip(fitting.index[:top], fitting.head(top).to_dict("records"), strict=True):
        lines.append(_row_text(rank, r))
    lines.append("≈ within 5% of the fastest: too close to call, so those with more memory to spare come "
                 "first. Reserved GB (tensors' peak + allocator reserve + context) is what must fit; "
                 "tight: its 80% interval crosses the GPU's memory (docs/memory.md).")
    return "\n".join(lines)


# Where an offload setting puts the states it moves off the GPU, in the header's words.
OFFLOAD_PLACES = {"cpu": "the CPU", "nvme": "NVMe"}


def _offloaded(base: dict) -> str:
    """The header's note of offloaded states: `` · optimizer and weights offloaded to the CPU``."""
    states = (("offload_optimizer", "optimizer"), ("offload_params", "weights"))
    moved = [(what, base[key]) for key, what in states if base.get(key) not in (None, "none")]
    if not moved:
        return ""
    if len({place for _, place in moved}) == 1:
        return f" · {' and '.join(what for what, _ in moved)} offloaded to {OFFLOAD_PLACES[moved[0][1]]}"
    return " · " + " and ".join(f"{what} offloaded to {OFFLOAD_PLACES[place]}" for what, place in moved)


def _refusals(table: pd.DataFrame) -> list[str]:
    """Why the candidates the simulator refused cannot run, in one sentence: the commonest reason
    and how many candidates it refuses, then how many other reasons there are (each row's own is
    in ``--csv``).  When no candidate can run, :func:`_nothing_fits` says why instead."""
    refused = table.loc[table["outcome"] == REFUSED, "error"].dropna()
    if refused.empty or len(refused) == len(table):
        return []
    reasons = refused.value_counts()
    if len(reasons) == 1:
        return [f"cannot run: {len(refused):,} candidates, because {reasons.index[0]}"]
    others = len(reasons) - 1
    plural = "s" if others > 1 else ""
    return [f"cannot run: {len(refused):,} candidates, {reasons.iloc[0]:,} of them because "
            f"{reasons.index[0]}; {len(refused) - reasons.iloc[0]:,} for {others} other reason{plural} "
            f"(--csv's error column gives each)"]


def _nothing_fits(table: pd.DataFrame) -> list[str]:
    sized = table.dropna(subset=["reserved_GB"])
    if sized.empty:
        reason = table["error"].dropna()
        return [f"nothing can run: {reason.iloc[0] if len(reason) else 'every candidate was refused'}"]
    leanest = sized.sort_values("reserved_GB").iloc[0]
    lines = [f"nothing fits: the leanest candidate ({leanest['strategy']}, {leanest['knobs']}, recompute "
             f"{leanest['recompute']}, micro-batch {leanest['micro_batch']}, {leanest['gpus']} GPUs) needs "
             f"at least {leanest['reserved_GB']:.1f} GB of {leanest['capacity_GB']:.1f} GB"]
    scenario = {k: _plain(v) for k, v in leanest.items() if k in _SCENARIO_KEYS and _present(v)}
    advice = fit_advice(scenario)
    if advice:
        lines.append(f"it would fit with {' '.join(as_flags(advice[0]['settings']))} "
                     f"({advice[0]['spare_gb']:.1f} GB to spare)")
    else:
        lines.append("no change tried (recompute, smaller micro-batch, another sharded strategy, offload, up "
                     "to 16x the GPUs) makes it fit")
    return lines


def _plain(value):
    """A table cell as the Python value simulate() takes: numpy scalars unwrapped, 4.0 as 4."""
    value = value.item() if hasattr(value, "item") else value
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _present(value) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


_SCENARIO_KEYS = set(SHARED) | {"gpus", "micro_batch", "grad_accum", "strategy", "recompute",
                                 "fp8_all_gather"} | {
    k.name for s in STRATEGIES.values() for k in s.knobs}


__all__ = ["MAX_CANDIDATES", "format_plan", "plan_args", "run_plan", "summary"]

