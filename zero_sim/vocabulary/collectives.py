"""What a collective's figures mean, as both the simulator and the microbenchmarks count them.

nccl-tests defines ``algbw = S / t`` for a buffer of ``S`` bytes and ``busbw = algbw x
factor``, where the factor is the bytes each rank sends per byte of buffer under a ring:
``2(n-1)/n`` for all_reduce, ``(n-1)/n`` for reduce_scatter and all_gather (``S`` the whole
gathered or reduced buffer), 1 for broadcast, ``(n-1)/n`` for alltoall (``S`` each rank's
buffer, of which it keeps ``1/n``; nccl-tests ``src/alltoall.cu``).  A sweep that reports busbw
and a model that predicts it must use the same factor, so it is written here once.
"""

from __future__ import annotations

from zero_sim.vocabulary import ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, BROADCAST, COLLECTIVES, REDUCE_SCATTER

# A call of at most this many bytes is a "small call": its time is per-call work (launch,
# handshakes), not bytes.  The microbenchmark times such calls thirty in a row and the
# calibration reads their CPU time as per-call cost.
SMALL_CALL_MAX_BYTES = 64 * 1024


def bus_factor(kind: str, n: int) -> float:
    """nccl-tests' busbw / algbw ratio: bytes each rank sends per byte of buffer (0 for one rank)."""
    if n <= 1:
        return 0.0
    if kind == ALL_REDUCE:
        return 2.0 * (n - 1) / n
    if kind in (REDUCE_SCATTER, ALL_GATHER, ALL_TO_ALL):
        return (n - 1) / n
    if kind == BROADCAST:
        return 1.0
    raise ValueError(f"unknown collective {kind!r}; expected one of {', '.join(COLLECTIVES)}")
