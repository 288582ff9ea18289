"""The repair's operands: a subset problem's decoded queries and schedule, gathered from its parent's
operands (the Triton backend's, backend.Operands), in one Triton launch (CUDA) or torch ops
(elsewhere), the same bits (tested).

Layer: backends (triton/; TritonBackend.operands calls `subset_operands` for a problem made by the
repair, repair.py). Reading order: the kernel, its launcher (subset_operands_triton), the torch twin
(subset_operands_torch), then `subset_operands`, the one line that picks between them
(devices.runs_triton_stages).

Math, per slot (one row of the subset, problem.parent_rows[slot] of the parent): the row's decoded
queries (q_lo, q_hi int8 [64, 128], wq, rowfac, q_unsupported) copied from the parent's operands;
q_wide = the parent's and the window is not empty; and its schedule: one row a program in row order,
span = the window ((0, 0) for a padding slot: no work), the narrow / wide variant by the decode flags
(schedule.py's Schedule). Tiling: one program per slot; slots are few (repair.REPAIR_ROWS).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..devices import runs_triton_stages
from ..scratch import Scratch
from .operands import FLAG_WIDE
from .schedule import Schedule, _store_span, with_variants


@triton.jit
def subset_operands_kernel(
    parent_rows_ptr,
    rtb_ptr,
    starts_ptr,
    ends_ptr,
    flags_ptr,  # int64 [slots]; int32 [slots] x3; int32 [2]
    q_lo_ptr,
    q_hi_ptr,
    wq_ptr,
    rowfac_ptr,
    q_wide_ptr,
    q_unsupported_ptr,  # the parent's operands
    sub_lo_ptr,
    sub_hi_ptr,
    sub_wq_ptr,
    sub_rowfac_ptr,
    sub_wide_ptr,
    sub_unsupported_ptr,
    rows_ptr,
    batch_ptr,
    span_ptr,
    prog_wide_ptr,
    narrow_rows_ptr,
    narrow_span_ptr,
    wide_rows_ptr,
    wide_span_ptr,
    BLOCK_ROWS: tl.constexpr,
    LANES: tl.constexpr,
    WIDE: tl.constexpr,
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
    _store_span(
        span_ptr, narrow_span_ptr, wide_span_ptr, slot, tl.where(live, start, 0), tl.where(live, end, 0), wide, True
    )


def subset_operands_triton(problem, parent, block_rows: int):
    """(q_lo, q_hi, wq, rowfac, q_wide, q_unsupported, Schedule) of the subset `problem` (its rows
    problem.parent_rows of the parent's Operands `parent`), one launch."""
    scratch: Scratch = problem.scratch
    n = problem.num_rows
    i32 = torch.int32
    gathered = [
        scratch.empty((n, 64, 128), torch.int8),
        scratch.empty((n, 64, 128), torch.int8),
        scratch.empty((n, 64), torch.float32),
        scratch.empty(n, torch.float32),
        scratch.empty(n, torch.int8),
        scratch.empty(n, torch.int8),
    ]
    schedule = [
        scratch.empty((n, block_rows), i32),
        scratch.empty(n, i32),
        scratch.empty((n, 2), i32),
        scratch.empty(n, torch.int8),
    ]
    variants = tuple((scratch.empty((n, block_rows), i32), scratch.empty((n, 2), i32)) for _ in range(2))
    if n:
        subset_operands_kernel[(n,)](
            problem.parent_rows,
            problem.row_to_batch,
            problem.starts,
            problem.ends,
            parent.keys.flags,
            parent.q_lo,
            parent.q_hi,
            parent.wq,
            parent.rowfac,
            parent.q_wide.view(torch.int8),
            parent.q_unsupported.view(torch.int8),
            *gathered,
            *schedule,
            variants[0][0],
            variants[0][1],
            variants[1][0],
            variants[1][1],
            BLOCK_ROWS=block_rows,
            LANES=triton.next_power_of_2(block_rows),
            WIDE=FLAG_WIDE,
        )
    q_lo, q_hi, wq, rowfac, q_wide, q_unsupported = gathered
    return (
        q_lo,
        q_hi,
        wq,
        rowfac,
        q_wide.view(torch.bool),
        q_unsupported.view(torch.bool),
        Schedule(*schedule, variants=variants),
    )


def subset_operands_torch(problem, parent, block_rows: int):
    """subset_operands_triton in torch ops (any device)."""
    rows = problem.parent_rows
    n = problem.num_rows
    live = problem.ends > problem.starts
    q_wide = parent.q_wide[rows] & live
    prog_rows = torch.full((n, block_rows), -1, dtype=torch.int32, device=rows.device)
    prog_rows[:, 0] = torch.arange(n, dtype=torch.int32, device=rows.device)
    span = torch.stack([torch.where(live, problem.starts, 0), torch.where(live, problem.ends, 0)], dim=1)
    schedule = with_variants(
        prog_rows,
        problem.row_to_batch.to(torch.int32).contiguous(),
        span.to(torch.int32).contiguous(),
        q_wide,
        parent.keys.flags,
    )
    return (
        parent.q_lo[rows],
        parent.q_hi[rows],
        parent.wq[rows],
        parent.rowfac[rows],
        q_wide,
        parent.q_unsupported[rows],
        schedule,
    )


def subset_operands(problem, parent, block_rows: int):
    """(q_lo, q_hi, wq, rowfac, q_wide, q_unsupported, Schedule) of the subset `problem` (module
    docstring): the Triton twin where devices.runs_triton_stages says so, the torch twin elsewhere."""
    if runs_triton_stages(problem.device):
        return subset_operands_triton(problem, parent, block_rows)
    return subset_operands_torch(problem, parent, block_rows)
