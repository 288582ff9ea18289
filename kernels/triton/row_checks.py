"""The row checks stage in one kernel: the Triton twin of kernels/row_checks.py (CUDA devices and
the interpreter; the same bits, tested).

Math: kernels/row_checks.py (INVALID_ROW, INVALID_PAGE, SLOT_OVERFLOW, NONFINITE, the effective
metadata int32 [3, rows], the sequences' ends and the zeroed words). On a CUDA device this replaces
~40 small torch launches by one, and it is the call's first launch: the sequences' ends and the zeroed
words cost no launch of their own.
Tiling: programs [0, S) one sequence each (S = max(batch, 1)), reading every row BLOCK_ROWS at a time
(the decode's keys per sequence; program 0 also zeroes the first ZEROED_WORDS words); programs
[S, S + rows) one row each, its pages read BLOCK_PAGES at a time (work grows with the window's pages).
The sequences come first in the grid: their loop over the rows is the launch's longest program.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..cache_layout import NUM_HEADS, PAGE_SIZE
from ..row_checks import FIRST_UNMAPPABLE_PAGE, ZEROED_WORDS, RowChecks
from ..status import RowStatus
from ..workspace import Scratch

BLOCK_PAGES = 256
BLOCK_ROWS = 1024


@triton.jit
def _in_range(b, start, end, batch, window_limit):
    """A row's (sequence, window) is in range: not INVALID_ROW."""
    return (b >= 0) & (b < batch) & (start >= 0) & (start <= end) & (end <= window_limit)


@triton.jit
def _check_row(row, block_table_ptr, batch, max_pages, num_pages, window_limit, weights_ptr, rtb_ptr, starts_ptr,
               ends_ptr, status_ptr, effective_ptr, rows, INVALID_ROW: tl.constexpr, INVALID_PAGE: tl.constexpr,
               NONFINITE: tl.constexpr, SLOT_OVERFLOW: tl.constexpr, H: tl.constexpr, PAGE: tl.constexpr,
               BLOCK_PAGES: tl.constexpr, FIRST_UNMAPPABLE: tl.constexpr):
    """Row `row`'s status bits and effective metadata."""
    b = tl.load(rtb_ptr + row).to(tl.int64)
    start = tl.load(starts_ptr + row).to(tl.int64)
    end = tl.load(ends_ptr + row).to(tl.int64)
    bad_row = _in_range(b, start, end, batch, window_limit) == 0
    bad_pages = 0
    unmappable = 0
    if bad_row == 0:
        first = start // PAGE
        last = tl.maximum((end + PAGE - 1) // PAGE, first)
        for p0 in range(first, last, BLOCK_PAGES):
            offs = p0 + tl.arange(0, BLOCK_PAGES)
            inside = offs < last
            pages = tl.load(block_table_ptr + b * max_pages + offs, mask=inside, other=0)
            bad_pages += tl.sum((inside & ((pages < 0) | (pages >= num_pages))).to(tl.int32), axis=0)
            unmappable += tl.sum((inside & (pages >= FIRST_UNMAPPABLE)).to(tl.int32), axis=0)
    weights = tl.load(weights_ptr + row * H + tl.arange(0, H))
    nonfinite = tl.sum(((weights != weights) | (tl.abs(weights) == float("inf"))).to(tl.int32), axis=0) > 0
    status = tl.where(bad_row, INVALID_ROW, 0)
    status |= tl.where((bad_row == 0) & (bad_pages > 0), INVALID_PAGE, 0)
    status |= tl.where((bad_row == 0) & (unmappable > 0), SLOT_OVERFLOW, 0)
    status |= tl.where(nonfinite, NONFINITE, 0)
    tl.store(status_ptr + row, status)
    ok = status == 0
    tl.store(effective_ptr + row, tl.where(ok, b, 0).to(tl.int32))
    tl.store(effective_ptr + rows + row, tl.where(ok, start, 0).to(tl.int32))
    tl.store(effective_ptr + 2 * rows + row, tl.where(ok, end, 0).to(tl.int32))


@triton.jit
def _sequence_end(b, batch, window_limit, rtb_ptr, starts_ptr, ends_ptr, rows, sequence_ends_ptr, zeroed_ptr,
                  ZEROED: tl.constexpr, BLOCK_ROWS: tl.constexpr):
    """sequence_ends[b] (the largest end of b's windows in range), zeroed[ZEROED + b] = 0, and program 0
    of the sequences zeroes zeroed[:ZEROED]."""
    end_max = tl.zeros([BLOCK_ROWS], dtype=tl.int32)
    for r0 in range(0, rows, BLOCK_ROWS):
        offs = r0 + tl.arange(0, BLOCK_ROWS)
        live = offs < rows
        row_b = tl.load(rtb_ptr + offs, mask=live, other=-1)
        start = tl.load(starts_ptr + offs, mask=live, other=0)
        end = tl.load(ends_ptr + offs, mask=live, other=0)
        mine = live & (row_b == b) & _in_range(row_b, start, end, batch, window_limit)
        end_max = tl.maximum(end_max, tl.where(mine, end, 0))
    tl.store(sequence_ends_ptr + b, tl.max(end_max, axis=0), mask=b < batch)
    tl.store(zeroed_ptr + ZEROED + b, 0, mask=b < batch)
    offs_z = tl.arange(0, ZEROED)
    tl.store(zeroed_ptr + offs_z, tl.zeros([ZEROED], dtype=tl.int32), mask=(offs_z >= 0) & (b == 0))


@triton.jit
def row_checks_kernel(
    block_table_ptr, batch, max_pages, num_pages,   # int32 [batch, max_pages]; ints
    window_limit,                                   # max_end: every window end must be <= it
    weights_ptr, rtb_ptr, starts_ptr, ends_ptr,     # float32 [rows, H]; int32 [rows] x3
    status_ptr, effective_ptr, rows,                # int32 [rows]; int32 [3, rows]
    sequence_ends_ptr, zeroed_ptr, sequences,       # int32 [batch]; int32 [ZEROED + batch]; max(batch, 1)
    INVALID_ROW: tl.constexpr, INVALID_PAGE: tl.constexpr, NONFINITE: tl.constexpr, SLOT_OVERFLOW: tl.constexpr,
    H: tl.constexpr, PAGE: tl.constexpr, BLOCK_PAGES: tl.constexpr, FIRST_UNMAPPABLE: tl.constexpr,
    ZEROED: tl.constexpr, BLOCK_ROWS: tl.constexpr,
):
    pid = tl.program_id(0)
    if pid < sequences:
        _sequence_end(pid, batch, window_limit, rtb_ptr, starts_ptr, ends_ptr, rows, sequence_ends_ptr, zeroed_ptr,
                      ZEROED, BLOCK_ROWS)
    else:
        _check_row((pid - sequences).to(tl.int64), block_table_ptr, batch, max_pages, num_pages, window_limit,
                   weights_ptr, rtb_ptr, starts_ptr, ends_ptr, status_ptr, effective_ptr, rows, INVALID_ROW,
                   INVALID_PAGE, NONFINITE, SLOT_OVERFLOW, H, PAGE, BLOCK_PAGES, FIRST_UNMAPPABLE)


def row_checks_triton(block_table: torch.Tensor, num_pages: int, weights: torch.Tensor, row_to_batch: torch.Tensor,
                      starts: torch.Tensor, ends: torch.Tensor, max_end: int, scratch: Scratch | None = None) -> RowChecks:
    """kernels.row_checks.row_checks_torch in one kernel, its outputs from `scratch` (None: the allocator)."""
    rows = row_to_batch.shape[0]
    batch, max_pages = block_table.shape
    scratch = scratch if scratch is not None else Scratch(weights.device)
    checked = RowChecks(status=scratch.empty(rows, torch.int32), effective=scratch.empty((3, rows), torch.int32),
                        sequence_ends=scratch.empty(batch, torch.int32),
                        zeroed=scratch.empty(ZEROED_WORDS + batch, torch.int32))
    sequences = max(batch, 1)
    row_checks_kernel[(sequences + rows,)](
        block_table, batch, max_pages, num_pages, max_end, weights, row_to_batch, starts, ends,
        checked.status, checked.effective, rows, checked.sequence_ends, checked.zeroed, sequences,
        INVALID_ROW=int(RowStatus.INVALID_ROW), INVALID_PAGE=int(RowStatus.INVALID_PAGE),
        NONFINITE=int(RowStatus.NONFINITE), SLOT_OVERFLOW=int(RowStatus.SLOT_OVERFLOW), H=NUM_HEADS, PAGE=PAGE_SIZE,
        BLOCK_PAGES=BLOCK_PAGES, FIRST_UNMAPPABLE=FIRST_UNMAPPABLE_PAGE, ZEROED=ZEROED_WORDS, BLOCK_ROWS=BLOCK_ROWS,
        num_warps=4,
    )
    return checked
