"""Stage 1, row checks: which rows of a prefill call can be answered (torch; Triton twin in
kernels/triton/row_checks.py, the same bits).

Math, per row i with b = row_to_batch[i], [s, e) = [starts[i], ends[i]):
    INVALID_ROW    b outside [0, batch), s < 0, s > e, or e > max_end
    INVALID_PAGE   (not INVALID_ROW) a page id of block_table[b, first:last] is < 0 or >= num_pages,
                   first = s // 64, last = max(ceil(e / 64), first)
    SLOT_OVERFLOW  (not INVALID_ROW) a page id of that range is >= 2^25: every slot of such a page,
                   page * 64 + offset, is beyond int32 (slots are int64 and never wrap)
    NONFINITE      a NaN or inf among the row's 64 head weights (float32)
and the effective metadata: (row_to_batch, starts, ends) of rows without a bit, zeros otherwise
(int32 [3, rows]), so backends, which assume valid input, never read through a bad row.
Everything stays on the inputs' device: nothing here waits for the device or reads it on the host.
"""

from __future__ import annotations

import torch

from .cache_layout import PAGE_SIZE
from .devices import runs_triton_stages
from .status import RowStatus, set_status_bit
from .workspace import Scratch

#: Smallest page id whose slots (page * PAGE_SIZE + offset) are all beyond int32.
FIRST_UNMAPPABLE_PAGE = 2**31 // PAGE_SIZE


def row_checks(block_table: torch.Tensor, num_pages: int, weights: torch.Tensor, row_to_batch: torch.Tensor,
               starts: torch.Tensor, ends: torch.Tensor, max_end: int,
               scratch: Scratch | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(status int32 [rows], effective int32 [3, rows]) of shape-checked inputs (weights float32
    [rows, 64]); the module docstring says which bit means what. Runs the Triton twin where
    devices.runs_triton_stages says so (its outputs from `scratch`; None: the allocator), the torch
    code below elsewhere."""
    if runs_triton_stages(weights.device):
        from .triton.row_checks import row_checks_triton

        return row_checks_triton(block_table, num_pages, weights, row_to_batch, starts, ends, max_end, scratch=scratch)
    return row_checks_torch(block_table, num_pages, weights, row_to_batch, starts, ends, max_end)


def row_checks_torch(block_table: torch.Tensor, num_pages: int, weights: torch.Tensor, row_to_batch: torch.Tensor,
                     starts: torch.Tensor, ends: torch.Tensor, max_end: int) -> tuple[torch.Tensor, torch.Tensor]:
    """row_checks in torch ops (any device)."""
    batch, max_pages = block_table.shape
    b, s, e = row_to_batch.long(), starts.long(), ends.long()
    bad_row = (b < 0) | (b >= batch) | (s < 0) | (s > e) | (e > max_end)
    status = set_status_bit(torch.zeros_like(row_to_batch), bad_row, RowStatus.INVALID_ROW)
    # Pages a row reads: [first, last) with first = s // 64, last = ceil(e / 64); empty when s == e.
    safe_b = torch.where(bad_row, 0, b)
    first = torch.where(bad_row, 0, s // PAGE_SIZE)
    last = torch.where(bad_row, 0, (e + PAGE_SIZE - 1) // PAGE_SIZE).clamp_min(first)
    for bad_page, bit in (((block_table < 0) | (block_table >= num_pages), RowStatus.INVALID_PAGE),
                          (block_table >= FIRST_UNMAPPABLE_PAGE, RowStatus.SLOT_OVERFLOW)):
        if batch == 0:
            break
        prefix = torch.nn.functional.pad(bad_page.to(torch.int32).cumsum(dim=1), (1, 0))  # [batch, max_pages + 1]
        status = set_status_bit(status, (prefix[safe_b, last] - prefix[safe_b, first] > 0) & ~bad_row, bit)
    status = set_status_bit(status, ~torch.isfinite(weights).all(dim=1), RowStatus.NONFINITE)
    ok = status == 0
    effective = torch.stack([torch.where(ok, t, 0) for t in (row_to_batch, starts, ends)]).to(torch.int32)
    return status, effective
