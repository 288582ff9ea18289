"""The device repair's bookkeeping in three small kernels: the Triton twins of kernels/certify.py's
torch code (slot choice and scatter) and of the Triton backend's subset operands (the same bits, tested).

Math (kernels/certify.py's docstring): the repair rescans `slots` rows, the first capacity-event rows
by index (status != 0 and no bit besides OVERFLOW | UNDERFILLED), padded with `rows` (no row):
    repair_slots_kernel    chosen[s], and the subset problem of the chosen rows: q_fp4, q_scale,
                           weights, row_status gathered, (row_to_batch, starts, ends) zero for a
                           padding slot, and the safe threshold: an overflowed row's K-th best kept
                           key top[row, K - 1] (K real keys of its window: a lower bound of its true
                           K-th best), NO_KEY otherwise
    subset_operands_kernel the subset's decoded queries gathered from its parent's operands, and its
                           schedule: one row a program in row order, span = the window ((0, 0) for
                           a padding slot: no work), the narrow / wide variant by the decode flags
    repair_scatter_kernel  per live slot: the rescan's certificate (not overflowed, at least
                           min(K, window) keys kept, no nonfinite score); top[row] = its answer,
                           status[row] = 0 if certified else SELECTOR_FAILURE, repaired[row] = 1
Tiling: one program per slot; slots are few (certify.REPAIR_ROWS).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..status import CAPACITY_EVENTS, RowStatus
from ..workspace import Scratch
from .decode import FLAG_WIDE
from .schedule import Schedule, _store_span, with_variants
from .keys import NO_KEY_C

BLOCK = 1024  # rows a slot's program reads per step when it looks for its row


@triton.jit
def repair_slots_kernel(
    status_ptr, overflow_ptr, top_ptr, rows,            # int32 [rows], int8 [rows], int64 [rows, TOPK]
    q_ptr, qs_ptr, w_ptr, rtb_ptr, starts_ptr, ends_ptr, row_status_ptr,  # the problem's rows
    chosen_ptr, picked_ptr, safe_ptr,                   # int64 [slots] x3
    sub_q_ptr, sub_qs_ptr, sub_w_ptr, sub_rtb_ptr, sub_starts_ptr, sub_ends_ptr, sub_status_ptr,
    TOPK: tl.constexpr, CAPACITY: tl.constexpr, BLOCK: tl.constexpr,
):
    slot = tl.program_id(0)
    found = rows
    seen = 0
    for r0 in range(0, rows, BLOCK):
        offs_r = r0 + tl.arange(0, BLOCK)
        status = tl.load(status_ptr + offs_r, mask=offs_r < rows, other=0)
        failing = ((status != 0) & ((status & ~CAPACITY) == 0)).to(tl.int32)
        nth = seen + tl.cumsum(failing, axis=0) - 1  # the failing row's slot
        found = tl.minimum(found, tl.min(tl.where((failing != 0) & (nth == slot), offs_r, rows), axis=0))
        seen += tl.sum(failing, axis=0)
    live = found < rows
    row = tl.where(live, found, 0).to(tl.int64)
    tl.store(chosen_ptr + slot, found.to(tl.int64))
    tl.store(picked_ptr + slot, row)
    overflowed = tl.load(overflow_ptr + row) != 0
    tl.store(safe_ptr + slot, tl.where(overflowed, tl.load(top_ptr + row * TOPK + TOPK - 1), NO_KEY_C))
    offs_q = tl.arange(0, 4096)  # q_fp4 [64, 64] bytes
    tl.store(sub_q_ptr + slot * 4096 + offs_q, tl.load(q_ptr + row * 4096 + offs_q))
    offs_s = tl.arange(0, 256)  # q_scale [64, 4]
    tl.store(sub_qs_ptr + slot * 256 + offs_s, tl.load(qs_ptr + row * 256 + offs_s))
    offs_h = tl.arange(0, 64)
    tl.store(sub_w_ptr + slot * 64 + offs_h, tl.load(w_ptr + row * 64 + offs_h))
    tl.store(sub_rtb_ptr + slot, tl.where(live, tl.load(rtb_ptr + row), 0))
    tl.store(sub_starts_ptr + slot, tl.where(live, tl.load(starts_ptr + row), 0))
    tl.store(sub_ends_ptr + slot, tl.where(live, tl.load(ends_ptr + row), 0))
    tl.store(sub_status_ptr + slot, tl.load(row_status_ptr + row))


def repair_slots_triton(problem, status: torch.Tensor, overflow: torch.Tensor, top: torch.Tensor, slots: int):
    """(chosen, picked (chosen, 0 for a padding slot), safe: int64 [slots], and the subset's tensors by
    PrefillProblem field name) of the module docstring, in one launch."""
    scratch: Scratch = problem.scratch
    i32 = torch.int32
    chosen = scratch.empty(slots, torch.int64)
    picked = scratch.empty(slots, torch.int64)
    safe = scratch.empty(slots, torch.int64)
    sub = dict(q_fp4=scratch.empty((slots, 64, 64), torch.uint8), q_scale=scratch.empty((slots, 64, 4), torch.uint8),
               weights=scratch.empty((slots, 64), torch.float32), row_to_batch=scratch.empty(slots, i32),
               starts=scratch.empty(slots, i32), ends=scratch.empty(slots, i32), row_status=scratch.empty(slots, i32))
    repair_slots_kernel[(slots,)](
        status, overflow.view(torch.int8), top, problem.num_rows, problem.q_fp4, problem.q_scale, problem.weights,
        problem.row_to_batch, problem.starts, problem.ends, problem.row_status, chosen, picked, safe, *sub.values(),
        TOPK=problem.topk, CAPACITY=int(CAPACITY_EVENTS), BLOCK=BLOCK)
    return chosen, picked, safe, sub


@triton.jit
def subset_operands_kernel(
    parent_rows_ptr, rtb_ptr, starts_ptr, ends_ptr, flags_ptr,   # int64 [slots]; int32 [slots] x3; int32 [2]
    q_lo_ptr, q_hi_ptr, wq_ptr, rowfac_ptr, q_wide_ptr, q_unsupported_ptr,  # the parent's operands
    sub_lo_ptr, sub_hi_ptr, sub_wq_ptr, sub_rowfac_ptr, sub_wide_ptr, sub_unsupported_ptr,
    rows_ptr, batch_ptr, span_ptr, prog_wide_ptr, narrow_rows_ptr, narrow_span_ptr, wide_rows_ptr, wide_span_ptr,
    BLOCK_ROWS: tl.constexpr, LANES: tl.constexpr, WIDE: tl.constexpr,
):
    slot = tl.program_id(0)
    row = tl.load(parent_rows_ptr + slot)
    offs = tl.arange(0, 8192)  # a row's decoded queries: int8 [64, 128]
    tl.store(sub_lo_ptr + slot * 8192 + offs, tl.load(q_lo_ptr + row * 8192 + offs))
    tl.store(sub_hi_ptr + slot * 8192 + offs, tl.load(q_hi_ptr + row * 8192 + offs))
    offs_h = tl.arange(0, 64)
    tl.store(sub_wq_ptr + slot * 64 + offs_h, tl.load(wq_ptr + row * 64 + offs_h))
    tl.store(sub_rowfac_ptr + slot, tl.load(rowfac_ptr + row))
    start = tl.load(starts_ptr + slot)
    end = tl.load(ends_ptr + slot)
    live = end > start
    q_wide = (tl.load(q_wide_ptr + row) != 0) & live
    tl.store(sub_wide_ptr + slot, q_wide.to(tl.int8))
    tl.store(sub_unsupported_ptr + slot, tl.load(q_unsupported_ptr + row))
    # The schedule: program `slot` holds row `slot` alone.
    offs_l = tl.arange(0, LANES)
    lanes = offs_l < BLOCK_ROWS
    lane_rows = tl.where(offs_l == 0, slot, -1)
    wide = ((tl.load(flags_ptr) | tl.load(flags_ptr + 1)) & WIDE) != 0
    tl.store(rows_ptr + slot * BLOCK_ROWS + offs_l, lane_rows, mask=lanes)
    tl.store(narrow_rows_ptr + slot * BLOCK_ROWS + offs_l, tl.where(wide, -1, lane_rows), mask=lanes)
    tl.store(wide_rows_ptr + slot * BLOCK_ROWS + offs_l, tl.where(wide, lane_rows, -1), mask=lanes)
    tl.store(batch_ptr + slot, tl.load(rtb_ptr + slot))
    tl.store(prog_wide_ptr + slot, q_wide.to(tl.int8))
    _store_span(span_ptr, narrow_span_ptr, wide_span_ptr, slot, tl.where(live, start, 0), tl.where(live, end, 0), wide,
                True)


def subset_operands_torch(problem, parent, block_rows: int):
    """subset_operands_triton in torch ops (any device)."""
    rows = problem.parent_rows
    n = problem.num_rows
    live = problem.ends > problem.starts
    q_wide = parent.q_wide[rows] & live
    prog_rows = torch.full((n, block_rows), -1, dtype=torch.int32, device=rows.device)
    prog_rows[:, 0] = torch.arange(n, dtype=torch.int32, device=rows.device)
    span = torch.stack([torch.where(live, problem.starts, 0), torch.where(live, problem.ends, 0)], dim=1)
    schedule = with_variants(prog_rows, problem.row_to_batch.to(torch.int32).contiguous(), span.to(torch.int32).contiguous(),
                             q_wide, parent.keys.flags)
    return (parent.q_lo[rows], parent.q_hi[rows], parent.wq[rows], parent.rowfac[rows], q_wide,
            parent.q_unsupported[rows], schedule)


def subset_operands_triton(problem, parent, block_rows: int):
    """(q_lo, q_hi, wq, rowfac, q_wide, q_unsupported, Schedule) of the subset `problem` (its rows
    problem.parent_rows of the parent's Operands `parent`), one launch."""
    scratch: Scratch = problem.scratch
    n = problem.num_rows
    i32 = torch.int32
    gathered = [scratch.empty((n, 64, 128), torch.int8), scratch.empty((n, 64, 128), torch.int8),
                scratch.empty((n, 64), torch.float32), scratch.empty(n, torch.float32), scratch.empty(n, torch.int8),
                scratch.empty(n, torch.int8)]
    schedule = [scratch.empty((n, block_rows), i32), scratch.empty(n, i32), scratch.empty((n, 2), i32),
                scratch.empty(n, torch.int8)]
    variants = tuple((scratch.empty((n, block_rows), i32), scratch.empty((n, 2), i32)) for _ in range(2))
    if n:
        subset_operands_kernel[(n,)](
            problem.parent_rows, problem.row_to_batch, problem.starts, problem.ends, parent.keys.flags,
            parent.q_lo, parent.q_hi, parent.wq, parent.rowfac, parent.q_wide.view(torch.int8),
            parent.q_unsupported.view(torch.int8), *gathered, *schedule, variants[0][0], variants[0][1],
            variants[1][0], variants[1][1], BLOCK_ROWS=block_rows, LANES=triton.next_power_of_2(block_rows),
            WIDE=FLAG_WIDE)
    q_lo, q_hi, wq, rowfac, q_wide, q_unsupported = gathered
    return (q_lo, q_hi, wq, rowfac, q_wide.view(torch.bool), q_unsupported.view(torch.bool),
            Schedule(*schedule, variants=variants))


@triton.jit
def repair_scatter_kernel(
    chosen_ptr, rows, sub_top_ptr, appended_ptr, nonfinite_ptr, starts_ptr, ends_ptr, capacity,
    top_ptr, status_ptr, repaired_ptr,                   # the state, updated in place
    TOPK: tl.constexpr, SELECTOR_FAILURE: tl.constexpr,
):
    slot = tl.program_id(0)
    row = tl.load(chosen_ptr + slot)
    if row < rows:
        appended = tl.load(appended_ptr + slot)
        window = (tl.load(ends_ptr + slot) - tl.load(starts_ptr + slot)).to(tl.int64)
        kept = tl.minimum(appended, capacity)
        certified = (appended <= capacity) & (kept >= tl.minimum(window, TOPK)) & (tl.load(nonfinite_ptr + slot) == 0)
        offs = tl.arange(0, TOPK)
        tl.store(top_ptr + row * TOPK + offs, tl.load(sub_top_ptr + slot * TOPK + offs))
        tl.store(status_ptr + row, tl.where(certified, 0, SELECTOR_FAILURE))
        tl.store(repaired_ptr + row, 1)


def repair_scatter_triton(chosen: torch.Tensor, sub, scan, sub_top: torch.Tensor, capacity: int, state) -> None:
    """Write the rescan's answers into `state` (certify.Certified) in place: module docstring."""
    slots = chosen.shape[0]
    repair_scatter_kernel[(slots,)](
        chosen, state.status.shape[0], sub_top, scan.appended, scan.nonfinite.view(torch.int8), sub.starts, sub.ends,
        capacity, state.top, state.status, state.repaired, TOPK=sub.topk,
        SELECTOR_FAILURE=int(RowStatus.SELECTOR_FAILURE))
