"""nccl-tests output read back: its table of sizes and times, and a latency + bus-bandwidth
line fitted to it.

nccl-tests prints, per size, the time and ``algbw = S / t`` and ``busbw = algbw x factor``
(:mod:`zero_sim.vocabulary.collectives`); the group size is read back from that factor.
The fit minimises relative error so that small and large sizes count alike.

Pasted output is often damaged (a wrapped line, a stray character), so reading is strict: a
row is read by its layout, a row that does not fit it (or whose algbw is not its size over
its time) is refused with its line number, and a fit beyond physics (a bus bandwidth above
10 TB/s, a latency below zero) is refused too, each in one :class:`CollectiveError` sentence,
never a table read with its columns shifted.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from zero_sim.system.collectives import CollectiveError
from zero_sim.vocabulary import ALL_REDUCE
from zero_sim.vocabulary.collectives import bus_factor


@dataclass(frozen=True)
class NcclTestsRow:
    size_bytes: int
    time_us: float
    algbw_gbps: float
    busbw_gbps: float


@dataclass(frozen=True)
class NcclTestsTable:
    rows: tuple[NcclTestsRow, ...]
    n_ranks: int  # inferred from busbw / algbw when the header does not say
    factor: float


@dataclass(frozen=True)
class LatencyBandwidthFit:
    latency_s: float
    busbw: float  # bytes/s
    factor: float
    max_rel_error: float
    rel_errors: tuple[float, ...]

    def time(self, nbytes: float) -> float:
        return self.latency_s + self.factor * nbytes / self.busbw


# A number as nccl-tests prints it (580.2, 13698) or as people paste it (13,698): digits in
# groups of three when commas are used, no sign, no exponent.  Anything else in a column that
# must hold a number makes the row wrong, not a row of other columns.
_NUM = re.compile(r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_]*")  # a datatype (float, bfloat16) or a reduction (sum)
_ROOT = re.compile(r"-?\d+")

# nccl-tests prints algbw = size / time (GB/s, time in us), rounded to 0.01 GB/s and the time to
# at most 0.05%; a row off by more than this was garbled or its columns were read wrong.
_ALGBW_ABS_TOLERANCE = 0.011
_ALGBW_REL_TOLERANCE = 0.02


def _is_number(token: str) -> bool:
    return _NUM.fullmatch(token) is not None


def _number(token: str) -> float:
    return float(token.replace(",", ""))


def _row_error(lineno: int, problem: str) -> CollectiveError:
    return CollectiveError(f"line {lineno} of the nccl-tests output {problem}; fix or delete that line")


def _columns(tokens: list[str], lineno: int) -> tuple[str, str, str, str]:
    """(size, time, algbw, busbw) of a data row, by its layout, never by guessing which tokens are numbers.

    Native rows: ``size count type [redop] [root] time algbw busbw #wrong`` then the in-place
    ``time algbw busbw #wrong`` (redop and root as the nccl-tests version prints them).
    Condensed rows (as the 'GPT Adventures, Part 4' blog post prints them):
    ``size count time algbw busbw [time algbw busbw]``, all numbers."""
    if len(tokens) > 2 and _WORD.fullmatch(tokens[2]):
        i = 4 if len(tokens) > 3 and _WORD.fullmatch(tokens[3]) else 3
        rest = tokens[i:]
        if len(rest) in (5, 9) and _ROOT.fullmatch(rest[0]):
            rest = rest[1:]
        if len(rest) not in (4, 8):
            raise _row_error(lineno, f"has {len(tokens)} columns, which is no nccl-tests layout "
                                     f"(size count type redop root time algbw busbw #wrong ...)")
        return tokens[0], rest[0], rest[1], rest[2]
    bad = next((t for t in tokens if not _is_number(t)), None)
    if bad is not None:
        raise _row_error(lineno, f"has {bad!r} where a number belongs")
    if len(tokens) < 5:
        raise _row_error(lineno, f"has {len(tokens)} columns; a row is size count time algbw busbw")
    return tokens[0], tokens[2], tokens[3], tokens[4]


def _parse_row(line: str, lineno: int) -> NcclTestsRow | None:
    """The row on a data line; None for a row nccl-tests itself leaves empty (a size too small to
    show a bandwidth at two decimals).  A malformed row is refused, naming its line."""
    tokens = line.split()
    fields = dict(zip(("size", "time", "algbw", "busbw"), _columns(tokens, lineno), strict=True))
    for name, token in fields.items():
        if not _is_number(token):
            raise _row_error(lineno, f"has {token!r} as its {name}, which is not a number")
    size, time_us, algbw, busbw = (_number(fields[k]) for k in ("size", "time", "algbw", "busbw"))
    if size <= 0 or time_us <= 0 or algbw <= 0 or busbw <= 0:
        return None
    expected = size / time_us / 1e3
    if abs(algbw - expected) > _ALGBW_ABS_TOLERANCE + _ALGBW_REL_TOLERANCE * expected:
        raise _row_error(lineno, f"says algbw {algbw:g} GB/s, but its size over its time is "
                                 f"{expected:.3g} GB/s, so a column is garbled or shifted")
    return NcclTestsRow(int(size), time_us, algbw, busbw)


def parse_nccl_tests(text: str, collective: str = ALL_REDUCE) -> NcclTestsTable:
    """Read an nccl-tests ``*_perf`` table: native output, or the condensed form (size, count,
    time, algbw, busbw [, in-place time, algbw, busbw]) of the 'GPT Adventures, Part 4:
    Distribute It' blog post.  Out-of-place columns are used.

    A data line is one that starts with a digit (comments start with ``#``); one that does
    not parse as a row of either layout, or whose algbw is not its size over its time, is
    refused with a sentence naming the line, rather than read with its columns shifted."""
    rows = []
    n_ranks = None
    m = re.search(r"nranks\s+(\d+)", text)
    if m:
        n_ranks = int(m.group(1))
        if n_ranks < 1:
            raise CollectiveError(f"the nccl-tests output says nranks {n_ranks}; "
                                  f"a group has at least one rank")
    for lineno, line in enumerate(text.splitlines(), start=1):
        line = line.replace("\u202f", "")
        if not line.strip()[:1].isdigit():
            continue
        row = _parse_row(line, lineno)
        if row is not None:
            rows.append(row)
    if len(rows) < 2:
        raise CollectiveError("no nccl-tests rows found: expected lines like "
                              "'8388608 2097152 580.2 14.46 14.46' or native all_reduce_perf output "
                              "with at least two message sizes")
    factor = sorted(r.busbw_gbps / r.algbw_gbps for r in rows)[len(rows) // 2]
    if n_ranks is None:
        n_ranks = _ranks_from_factor(collective, factor)
    return NcclTestsTable(tuple(rows), n_ranks, bus_factor(collective, n_ranks) if n_ranks > 1 else factor)


def _ranks_from_factor(kind: str, factor: float) -> int:
    best_n, best_err = 2, math.inf
    for n in range(2, 4097):
        err = abs(bus_factor(kind, n) - factor)
        if err < best_err:
            best_n, best_err = n, err
    return best_n


def fit_nccl_tests(table: NcclTestsTable) -> LatencyBandwidthFit:
    """Fit ``t = latency + factor*S/busbw`` minimising *relative* error at every size.

    Relative (not absolute) least squares, so the 8 MB point counts as much as the 1 GB one:
    the fit has to hold where latency matters, not only where bandwidth does.
    """
    import numpy as np

    if len({r.size_bytes for r in table.rows}) < 2:
        raise CollectiveError("the nccl-tests table has fewer than two distinct message sizes; "
                              "run it over a range of sizes (-b 8M -e 1G -f 2)")
    sizes = np.array([r.size_bytes for r in table.rows], dtype=float)
    times = np.array([r.time_us * 1e-6 for r in table.rows])
    # t_i = a + b * factor * S_i; divide each equation by t_i.
    design = np.stack([1.0 / times, table.factor * sizes / times], axis=1)
    (latency, inv_bw), *_ = np.linalg.lstsq(design, np.ones_like(times), rcond=None)
    if not inv_bw > 0:
        raise CollectiveError("the nccl-tests times do not grow with size; check the table's columns")
    busbw = 1.0 / float(inv_bw)
    _check_physical(float(latency), busbw, float(times.min()))
    latency = max(float(latency), 0.0)
    predicted = latency + table.factor * sizes / busbw
    rel = tuple(float(x) for x in (predicted - times) / times)
    return LatencyBandwidthFit(latency, busbw, table.factor, max(abs(x) for x in rel), rel)


# No link moves 10 TB/s (NVLink 5 is 0.9 TB/s per GPU): a fit beyond it comes from a garbled table.
MAX_BUSBW = 10e12
# A fitted latency a little below zero is noise around a latency too small to see at these sizes
# and is read as zero; one below -5% of the fastest row means the times do not follow the line.
NEGATIVE_LATENCY_NOISE = 0.05


def _check_physical(latency_s: float, busbw: float, fastest_s: float) -> None:
    if not (math.isfinite(latency_s) and math.isfinite(busbw)) or busbw > MAX_BUSBW:
        raise CollectiveError(f"the nccl-tests fit gives a bus bandwidth of {busbw / 1e9:,.0f} GB/s, beyond "
                              f"any link ({MAX_BUSBW / 1e12:.0f} TB/s); check the table for garbled rows")
    if latency_s < -NEGATIVE_LATENCY_NOISE * fastest_s:
        raise CollectiveError(f"the nccl-tests fit gives a negative latency ({latency_s * 1e6:.1f} us): the "
                              f"times do not follow latency + size / bandwidth; check the table for "
                              f"garbled rows")
