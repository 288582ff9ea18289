"""The calibration stage's order statistics in one kernel per row: the Triton twin of
kernels/calibration.py's kth_largest_scores / calibration_keys (CUDA devices and the interpreter;
the same bits, tested).

Math: a bisection over the float32 bits mapped to an order-preserving int32 (32 counting passes over
the row held in registers) finds the ranks[i]-th largest value exactly; with KEYS the same program
turns them into the calibration's threshold keys. Tiling: one program per row, the whole row at once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..workspace import Scratch
from .scoring import NO_KEY_C, _ordered_bits, _scores_of_ordered


@triton.jit
def kth_largest_scores_kernel(
    scores_ptr, width, out_ptr, offset,             # float32 [rows, width]; float32 or int64 [rows, 2]
    RANK_A: tl.constexpr, RANK_B: tl.constexpr, BLOCK: tl.constexpr, KEYS: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    scores = tl.load(scores_ptr + row * width + offs, mask=offs < width, other=0.0)
    ordered = tl.where(offs < width, _ordered_bits(scores).to(tl.int32), -2147483648)  # padding: below every float
    rank = tl.where(tl.arange(0, 2) == 0, RANK_A, RANK_B)
    # Bisection for the largest t with count(ordered >= t) >= rank: 32 halvings of the int32 range.
    lo = tl.full([2], -2147483648, dtype=tl.int64)
    hi = tl.full([2], 2147483647, dtype=tl.int64)
    for _ in range(32):
        mid = lo + (hi - lo + 1) // 2
        count = tl.sum((ordered[None, :] >= mid.to(tl.int32)[:, None]).to(tl.int32), axis=1)  # mid fits int32
        lo = tl.where(count >= rank, mid, lo)
        hi = tl.where(count >= rank, hi, mid - 1)
    found = _scores_of_ordered(lo.to(tl.int32))
    if KEYS:  # ScoringBackend.calibration_keys, per row
        nans = tl.sum((scores != scores).to(tl.int32), axis=0)
        first = tl.arange(0, 2) == 0
        found = tl.where(first, found + offset, found)
        kth = tl.zeros([2], dtype=tl.float32) + tl.sum(tl.where(first, found, 0.0), axis=0)  # both lanes
        usable = (kth == kth) & (tl.abs(kth) != float("inf")) & (nans == 0)  # the row gets a threshold
        finite = (found == found) & (tl.abs(found) != float("inf"))
        keys = tl.where(finite & usable, _ordered_bits(found) << 32, NO_KEY_C)
        tl.store(out_ptr + row * 2 + tl.arange(0, 2), keys)
    else:
        tl.store(out_ptr + row * 2 + tl.arange(0, 2), found)


def _kth_largest(scores: torch.Tensor, ranks: tuple[int, int], offset: float, keys: bool,
                 scratch: Scratch | None = None) -> torch.Tensor:
    rows, width = scores.shape
    if width < max(ranks):
        raise ValueError(f"rank {max(ranks)} of rows of {width} values")
    scratch = scratch if scratch is not None else Scratch(scores.device)
    out = scratch.empty((rows, 2), torch.int64 if keys else torch.float32)
    if rows:
        block = triton.next_power_of_2(width)
        kth_largest_scores_kernel[(rows,)](scores.contiguous(), width, out, offset, RANK_A=ranks[0],
                                           RANK_B=ranks[1], BLOCK=block, KEYS=keys,
                                           num_warps=max(4, min(16, block // 1024)))
    return out


def kth_largest_scores_triton(scores: torch.Tensor, ranks: tuple[int, int]) -> torch.Tensor:
    """float32 [rows, 2]: the ranks[i]-th largest value of each row of float32 `scores` [rows, n]
    (1-based, n >= max(ranks)), exactly, as torch.topk orders finite values and infinities (-0.0
    and +0.0 tie and come back as +0.0). NaN orders above +inf (positive sign bit) or below -inf:
    callers that care check for NaN themselves. A bisection over the float32 bits mapped to an
    order-preserving int32 (32 counting passes over the row held in registers)."""
    return _kth_largest(scores, ranks, 0.0, keys=False)


def calibration_keys_triton(sample: torch.Tensor, k: int, ceiling_rank: int, offset: float,
                            scratch: Scratch | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """ScoringBackend.calibration_keys in one kernel: (thresholds, ceilings) int64 [rows] of
    the calibration sample float32 [rows, n] (the K-th best plus `offset`, and the ceiling_rank-th
    best, as score-floor keys; NO_KEY where the K-th best is not finite or the row holds a NaN, and
    for a ceiling that is not finite). The output comes from `scratch` (None: the allocator)."""
    keys = _kth_largest(sample, (k, ceiling_rank), offset, keys=True, scratch=scratch)
    return keys[:, 0], keys[:, 1]


