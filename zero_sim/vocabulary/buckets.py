"""Gradient buckets: which tensors are reduced together, as torch DDP lays them out.

A bucket's number is part of an op's name (``all_reduce B3``), so the simulator and the
real runs must cut the same model into the same buckets; both call :func:`fill_buckets`.

The rule (torch's ``DistributedDataParallel``, also DeepSpeed's reduce buckets): tensors
are taken in the order backward produces their gradients, i.e. reverse parameter order,
and a bucket closes when the next tensor would take it past the cap; a tensor larger than
the cap gets a bucket of its own.  At torch's default cap of 25 MiB the first bucket is
capped at 1 MiB, so the first all-reduce starts early in backward; any other cap applies
to every bucket.  A cap of zero or less puts every tensor in its own bucket.
"""

from __future__ import annotations

from collections.abc import Sequence

MiB = 1 << 20  # torch's bucket_cap_mb counts MiB
DEFAULT_BUCKET_MB = 25.0
FIRST_BUCKET_MB = 1.0


def bucket_caps(bucket_mb: float) -> tuple[float, float | None]:
    """(cap, first bucket's cap) in bytes; the first bucket has its own cap only at the default."""
    cap = bucket_mb * MiB
    return cap, (min(FIRST_BUCKET_MB * MiB, cap) if bucket_mb == DEFAULT_BUCKET_MB else None)


def fill_buckets(sizes_bytes: Sequence[float], cap_bytes: float, first_cap_bytes: float | None = None
                 ) -> list[list[int]]:
    """Cut tensors of ``sizes_bytes`` (given in the order their gradients are produced) into
    buckets; returns each bucket's positions in ``sizes_bytes``, in that order."""
    buckets: list[list[int]] = []
    current: list[int] = []
    filled = 0.0
    for i, nbytes in enumerate(sizes_bytes):
        cap = first_cap_bytes if first_cap_bytes is not None and not buckets else cap_bytes
        if current and (cap <= 0 or filled + nbytes > cap):
            buckets.append(current)
            current, filled = [], 0.0
        current.append(i)
        filled += nbytes
    if current:
        buckets.append(current)
    return buckets
