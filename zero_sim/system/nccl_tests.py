"""nccl-tests output read back: its table of sizes and times, and a latency + bus-bandwidth
line fitted to it.

nccl-tests prints, per size, the time and ``algbw = S / t`` and ``busbw = algbw x factor``
(:mod:`zero_sim.vocabulary.collectives`); the group size is read back from that factor.
The fit minimises relative error so that small and large sizes count alike.
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


_NUM = r"[0-9][0-9,]*(?:\.[0-9]+)?"


def parse_nccl_tests(text: str, collective: str = ALL_REDUCE) -> NcclTestsTable:
    """Read an nccl-tests ``*_perf`` table: native output, or the condensed form (size, count,
    time, algbw, busbw [, in-place time, algbw, busbw]) of seed 002.  Out-of-place columns are used."""
    rows = []
    n_ranks = None
    m = re.search(r"nranks\s+(\d+)", text)
    if m:
        n_ranks = int(m.group(1))
    for line in text.splitlines():
        tokens = line.replace("\u202f", "").split()
        if not tokens or not re.fullmatch(_NUM, tokens[0]):
            continue
        numbers = []
        for tok in tokens:
            if re.fullmatch(_NUM, tok):
                numbers.append(float(tok.replace(",", "")))
            elif tok.lstrip("-").isdigit():
                numbers.append(float(tok))
        words = [t for t in tokens if not re.fullmatch(_NUM, t) and not t.lstrip("-").isdigit()]
        # Native nccl-tests: size count type redop root time algbw busbw #wrong ...
        if words and len(numbers) >= 6:
            size, time_us, algbw, busbw = numbers[0], numbers[3], numbers[4], numbers[5]
        elif not words and len(numbers) >= 5:
            size, time_us, algbw, busbw = numbers[0], numbers[2], numbers[3], numbers[4]
        else:
            continue
        if size <= 0 or time_us <= 0 or algbw <= 0 or busbw <= 0:
            continue
        rows.append(NcclTestsRow(int(size), time_us, algbw, busbw))
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

    sizes = np.array([r.size_bytes for r in table.rows], dtype=float)
    times = np.array([r.time_us * 1e-6 for r in table.rows])
    # t_i = a + b * factor * S_i; divide each equation by t_i.
    design = np.stack([1.0 / times, table.factor * sizes / times], axis=1)
    (latency, inv_bw), *_ = np.linalg.lstsq(design, np.ones_like(times), rcond=None)
    if inv_bw <= 0:
        raise CollectiveError("the nccl-tests times do not grow with size; check the table's columns")
    latency = max(float(latency), 0.0)
    busbw = 1.0 / float(inv_bw)
    predicted = latency + table.factor * sizes / busbw
    rel = tuple(float(x) for x in (predicted - times) / times)
    return LatencyBandwidthFit(latency, busbw, table.factor, max(abs(x) for x in rel), rel)
