"""validation.py's per-row checks in one kernel (Triton; CUDA devices and the interpreter).

Math (validation._row_status and the effective windows, the torch code this kernel equals, tested):
    INVALID_ROW   b outside [0, batch), start < 0, start > end, or end > max_pages * 64
    INVALID_PAGE  (not INVALID_ROW) a page id of block_table[b, first:last] is < 0 or >= num_pages,
                  first = start // 64, last = max(ceil(end / 64), first)
    NONFINITE     a NaN or inf among the row's 64 head weights (float32)
and the effective metadata: (row_to_batch, starts, ends) of rows without a bit, zeros otherwise,
written as one int32 [3, rows] tensor so that validation copies it to the host in one transfer.
On a CUDA device this replaces ~40 small torch launches by one. Tiling: one program per row; the
row's pages are read BLOCK_PAGES at a time (work grows with the window's pages).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..cache_layout import NUM_HEADS, PAGE_SIZE
from ..status import RowStatus

BLOCK_PAGES = 256


@triton.jit
def row_checks_kernel(
    block_table_ptr, batch, max_pages, num_pages,   # int32 [batch, max_pages]; ints
    window_limit,                                   # max_pages * PAGE (int64 where it needs to be)
    weights_ptr, rtb_ptr, starts_ptr, ends_ptr,     # float32 [rows, H]; int32 [rows] x3
    status_ptr, effective_ptr, rows,                # int32 [rows]; int32 [3, rows]
    INVALID_ROW: tl.constexpr, INVALID_PAGE: tl.constexpr, NONFINITE: tl.constexpr,
    H: tl.constexpr, PAGE: tl.constexpr, BLOCK_PAGES: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    b = tl.load(rtb_ptr + row).to(tl.int64)
    start = tl.load(starts_ptr + row).to(tl.int64)
    end = tl.load(ends_ptr + row).to(tl.int64)
    bad_row = (b < 0) | (b >= batch) | (start < 0) | (start > end) | (end > window_limit)
    bad_pages = 0
    if bad_row == 0:
        first = start // PAGE
        last = tl.maximum((end + PAGE - 1) // PAGE, first)
        for p0 in range(first, last, BLOCK_PAGES):
            offs = p0 + tl.arange(0, BLOCK_PAGES)
            inside = offs < last
            pages = tl.load(block_table_ptr + b * max_pages + offs, mask=inside, other=0)
            bad_pages += tl.sum((inside & ((pages < 0) | (pages >= num_pages))).to(tl.int32), axis=0)
    weights = tl.load(weights_ptr + row * H + tl.arange(0, H))
    nonfinite = tl.sum(((weights != weights) | (tl.abs(weights) == float("inf"))).to(tl.int32), axis=0) > 0
    status = tl.where(bad_row, INVALID_ROW, 0)
    status |= tl.where((bad_row == 0) & (bad_pages > 0), INVALID_PAGE, 0)
    status |= tl.where(nonfinite, NONFINITE, 0)
    tl.store(status_ptr + row, status)
    ok = status == 0
    tl.store(effective_ptr + row, tl.where(ok, b, 0).to(tl.int32))
    tl.store(effective_ptr + rows + row, tl.where(ok, start, 0).to(tl.int32))
    tl.store(effective_ptr + 2 * rows + row, tl.where(ok, end, 0).to(tl.int32))


def row_checks_triton(block_table: torch.Tensor, num_pages: int, weights: torch.Tensor, row_to_batch: torch.Tensor,
                      starts: torch.Tensor, ends: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(status int32 [rows], effective int32 [3, rows] = row_to_batch, starts, ends of rows without a
    status bit, zeros elsewhere) of validated-shape inputs (weights float32 [rows, 64]); the module
    docstring says which bit means what."""
    rows = row_to_batch.shape[0]
    status = torch.empty(rows, dtype=torch.int32, device=weights.device)
    effective = torch.empty(3, rows, dtype=torch.int32, device=weights.device)
    if rows:
        batch, max_pages = block_table.shape
        row_checks_kernel[(rows,)](
            block_table, batch, max_pages, num_pages, max_pages * PAGE_SIZE, weights, row_to_batch, starts, ends,
            status, effective, rows,
            INVALID_ROW=int(RowStatus.INVALID_ROW), INVALID_PAGE=int(RowStatus.INVALID_PAGE),
            NONFINITE=int(RowStatus.NONFINITE), H=NUM_HEADS, PAGE=PAGE_SIZE, BLOCK_PAGES=BLOCK_PAGES, num_warps=4,
        )
    return status, effective
