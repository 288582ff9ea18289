"""The row checks stage in one kernel: the Triton twin of kernels/row_checks.py (CUDA devices and
the interpreter; the same bits, tested).

Math: kernels/row_checks.py (INVALID_ROW, INVALID_PAGE, SLOT_OVERFLOW, NONFINITE and the effective
metadata int32 [3, rows]). On a CUDA device this replaces ~40 small torch launches by one.
Tiling: one program per row; the row's pages are read BLOCK_PAGES at a time (work grows with the
window's pages).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..cache_layout import NUM_HEADS, PAGE_SIZE
from ..row_checks import FIRST_UNMAPPABLE_PAGE
from ..status import RowStatus
from ..workspace import Scratch

BLOCK_PAGES = 256


@triton.jit
def row_checks_kernel(
    block_table_ptr, batch, max_pages, num_pages,   # int32 [batch, max_pages]; ints
    window_limit,                                   # max_end: every window end must be <= it
    weights_ptr, rtb_ptr, starts_ptr, ends_ptr,     # float32 [rows, H]; int32 [rows] x3
    status_ptr, effective_ptr, rows,                # int32 [rows]; int32 [3, rows]
    INVALID_ROW: tl.constexpr, INVALID_PAGE: tl.constexpr, NONFINITE: tl.constexpr, SLOT_OVERFLOW: tl.constexpr,
    H: tl.constexpr, PAGE: tl.constexpr, BLOCK_PAGES: tl.constexpr, FIRST_UNMAPPABLE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    b = tl.load(rtb_ptr + row).to(tl.int64)
    start = tl.load(starts_ptr + row).to(tl.int64)
    end = tl.load(ends_ptr + row).to(tl.int64)
    bad_row = (b < 0) | (b >= batch) | (start < 0) | (start > end) | (end > window_limit)
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


def row_checks_triton(block_table: torch.Tensor, num_pages: int, weights: torch.Tensor, row_to_batch: torch.Tensor,
                      starts: torch.Tensor, ends: torch.Tensor, max_end: int,
                      scratch: Scratch | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """kernels.row_checks.row_checks_torch in one kernel: (status int32 [rows], effective int32 [3, rows]),
    from `scratch` (None: the allocator)."""
    rows = row_to_batch.shape[0]
    scratch = scratch if scratch is not None else Scratch(weights.device)
    status = scratch.empty(rows, torch.int32)
    effective = scratch.empty((3, rows), torch.int32)
    if rows:
        batch, max_pages = block_table.shape
        row_checks_kernel[(rows,)](
            block_table, batch, max_pages, num_pages, max_end, weights, row_to_batch, starts, ends,
            status, effective, rows,
            INVALID_ROW=int(RowStatus.INVALID_ROW), INVALID_PAGE=int(RowStatus.INVALID_PAGE),
            NONFINITE=int(RowStatus.NONFINITE), SLOT_OVERFLOW=int(RowStatus.SLOT_OVERFLOW), H=NUM_HEADS, PAGE=PAGE_SIZE,
            BLOCK_PAGES=BLOCK_PAGES, FIRST_UNMAPPABLE=FIRST_UNMAPPABLE_PAGE, num_warps=4,
        )
    return status, effective
