"""Exact selections of the LiteTopK pipeline, one program per row (Triton; sm_90 and the interpreter).

1. select_topk_candidates_triton: the top-K of the scan's candidate buffer.
2. kth_largest_scores_triton / calibration_keys_triton: order statistics of the calibration sample
   (a bisection, below), the second also turning them into the calibration's threshold keys.
3. assemble_result_triton: selection.assemble_result (split keys, page mapping, counts) in one kernel.

Math. The buffer row holds `kept` ordering keys (selection.make_keys: integer order = the
contract's total order, all distinct) followed by NO_KEY; the answer is its K largest keys, sorted
descending, NO_KEY padded. The scan's final threshold key T is at or below the row's K-th best
key, so the answer lies among the keys >= T (every kept key when the row has no threshold).
Where at most SMALL keys pass T (the common case: a few bins of the scan's histogram above K),
the program compacts them (a prefix sum gives each its slot in a per-row scratch row) and runs a
bitonic top-K (tl.topk) over SMALL keys; otherwise over the whole row (FULL keys). Both give the
same keys: the order is total, so there is nothing to break.

Tiling: one program per row; FULL = the buffer width rounded up to a power of two (>= K), SMALL =
2 K. Work per row grows with the candidate count's power of two, never with the window. Limits:
K a power of two (SUPPORTED_TOPK); keys int64 as selection.py makes them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..cache_layout import PAGE_SIZE
from ..result import TopKResult
from ..selection import refuse_unmappable_slot
from .scoring import NO_KEY_C, _ordered_bits, _scores_of_keys, _scores_of_ordered


@triton.jit
def select_topk_candidates_kernel(
    keys_ptr, capacity, kept_ptr, thr_ptr,          # int64 [rows, capacity]; int64 [rows] x2
    scratch_ptr, out_ptr,                           # int64 [rows, SMALL]; int64 [rows, TOPK]
    TOPK: tl.constexpr, FULL: tl.constexpr, SMALL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, FULL)
    kept = tl.load(kept_ptr + row)
    live = offs < kept
    keys = tl.load(keys_ptr + row * capacity + offs, mask=live, other=NO_KEY_C)
    offs_top = tl.arange(0, TOPK)
    if SMALL < FULL:
        passing = live & (keys >= tl.load(thr_ptr + row))
        n_passing = tl.sum(passing.to(tl.int32), axis=0)
        if n_passing <= SMALL:
            slot = tl.cumsum(passing.to(tl.int32), axis=0) - 1
            tl.store(scratch_ptr + row * SMALL + slot, keys, mask=passing)
            tl.debug_barrier()  # the row's scratch, written above by every thread, is read below
            offs_small = tl.arange(0, SMALL)
            small = tl.load(scratch_ptr + row * SMALL + offs_small, mask=offs_small < n_passing, other=NO_KEY_C)
            tl.store(out_ptr + row * TOPK + offs_top, tl.topk(small, TOPK))
        else:
            tl.store(out_ptr + row * TOPK + offs_top, tl.topk(keys, TOPK))
    else:
        tl.store(out_ptr + row * TOPK + offs_top, tl.topk(keys, TOPK))


def select_topk_candidates_triton(keys: torch.Tensor, kept: torch.Tensor, thresholds: torch.Tensor,
                                  k: int) -> torch.Tensor:
    """int64 [rows, k]: the k largest of the first kept[r] keys of each row of `keys` [rows, capacity]
    (selection.make_keys), sorted descending, NO_KEY padded. thresholds int64 [rows] must be at or
    below each row's k-th best kept key (NO_KEY: none), as the LiteTopK scan's final thresholds are."""
    rows, capacity = keys.shape
    out = torch.empty(rows, k, dtype=torch.int64, device=keys.device)
    if rows == 0:
        return out
    full = triton.next_power_of_2(max(capacity, k))
    small = min(2 * k, full)
    scratch = torch.empty(rows if small < full else 1, small, dtype=torch.int64, device=keys.device)
    select_topk_candidates_kernel[(rows,)](
        keys.contiguous(), capacity, kept.to(torch.int64).contiguous(), thresholds.contiguous(), scratch, out,
        TOPK=k, FULL=full, SMALL=small, num_warps=max(4, min(16, full // 512)),
    )
    return out


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


def _kth_largest(scores: torch.Tensor, ranks: tuple[int, int], offset: float, keys: bool) -> torch.Tensor:
    rows, width = scores.shape
    if width < max(ranks):
        raise ValueError(f"rank {max(ranks)} of rows of {width} values")
    out = torch.empty(rows, 2, dtype=torch.int64 if keys else torch.float32, device=scores.device)
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


def calibration_keys_triton(sample: torch.Tensor, k: int, ceiling_rank: int,
                            offset: float) -> tuple[torch.Tensor, torch.Tensor]:
    """ScoringBackend.calibration_keys in one kernel: (thresholds, ceilings) int64 [rows] of
    the calibration sample float32 [rows, n] (the K-th best plus `offset`, and the ceiling_rank-th
    best, as score-floor keys; NO_KEY where the K-th best is not finite or the row holds a NaN, and
    for a ceiling that is not finite)."""
    keys = _kth_largest(sample, (k, ceiling_rank), offset, keys=True)
    return keys[:, 0], keys[:, 1]


FLAG_NEGATIVE_PAGE = 1
FLAG_SLOT_BEYOND_INT32 = 2


@triton.jit
def assemble_result_kernel(
    keys_ptr, status_ptr, row_to_batch_ptr, block_table_ptr, max_pages,   # int64 [rows, K]; int32 ...
    values_ptr, raw_ptr, physical_ptr, counts_ptr, flags_ptr,            # outputs; int32 [1] OR of faults
    TOPK: tl.constexpr, PAGE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, TOPK)
    keys = tl.load(keys_ptr + row * TOPK + offs)
    live = (keys != NO_KEY_C) & (tl.load(status_ptr + row) == 0)
    scores = _scores_of_keys(keys)
    positions = 4294967295 - (keys & 4294967295)  # int64, < 2^31 for a live key
    batch = tl.load(row_to_batch_ptr + row).to(tl.int64)
    pages = tl.load(block_table_ptr + batch * max_pages + positions // PAGE, mask=live, other=0).to(tl.int64)
    slots = pages * PAGE + positions % PAGE  # int64: never wraps
    faults = tl.where(live & (pages < 0), 1, 0) | tl.where(live & (slots > 2147483647), 2, 0)
    tl.atomic_or(flags_ptr, tl.max(faults, axis=0), sem="relaxed")
    tl.store(values_ptr + row * TOPK + offs, tl.where(live, scores, float("-inf")))
    tl.store(raw_ptr + row * TOPK + offs, tl.where(live, positions, -1).to(tl.int32))
    tl.store(physical_ptr + row * TOPK + offs, tl.where(live & (faults == 0), slots, -1).to(tl.int32))
    tl.store(counts_ptr + row, tl.sum(live.to(tl.int32), axis=0))


def assemble_result_triton(top_keys: torch.Tensor, row_to_batch: torch.Tensor, block_table: torch.Tensor,
                           status: torch.Tensor, repaired: torch.Tensor, candidates: torch.Tensor) -> TopKResult:
    """selection.assemble_result in one kernel (the same fields, bit for bit), then one host sync
    on the fault flags: a published position on a negative page raises InputError, a slot beyond
    int32 SlotOverflowError (validation already fails such rows; this is the last guard)."""
    rows, k = top_keys.shape
    dev = top_keys.device
    values = torch.empty(rows, k, dtype=torch.float32, device=dev)
    raw = torch.empty(rows, k, dtype=torch.int32, device=dev)
    physical = torch.empty(rows, k, dtype=torch.int32, device=dev)
    counts = torch.empty(rows, dtype=torch.int32, device=dev)
    flags = torch.zeros(1, dtype=torch.int32, device=dev)
    status = status.to(torch.int32).contiguous()
    if rows:
        assemble_result_kernel[(rows,)](
            top_keys.contiguous(), status, row_to_batch.contiguous(), block_table.contiguous(), block_table.shape[1],
            values, raw, physical, counts, flags, TOPK=k, PAGE=PAGE_SIZE, num_warps=4)
    fault = int(flags)
    if fault:
        refuse_unmappable_slot(bool(fault & FLAG_SLOT_BEYOND_INT32))
    return TopKResult(values=values, raw_indices=raw, physical_indices=physical, counts=counts, status=status,
                      repaired=repaired.to(torch.int32), candidates=candidates.clamp(max=2**31 - 1).to(torch.int32))
