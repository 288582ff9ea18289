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
Per sequence b, as the call's first launch (so that no later stage needs a launch of its own for them):
    sequence_ends[b]  the largest end of a window of sequence b that is not INVALID_ROW (0 for none):
                      the key positions [0, sequence_ends[b]) that any row of b may read, an upper bound
                      of its effective windows (a row with a bad page or weight counts: its window is in
                      range, and a stage that reads it skips bad pages)
    zeroed            int32 [ZEROED_WORDS + batch] of zeros: the words later stages accumulate into on
                      the device with atomics (decode.py's flag summary, then one word a sequence)
Everything stays on the inputs' device: nothing here waits for the device or reads it on the host.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .cache_layout import PAGE_SIZE
from .devices import runs_triton_stages
from .status import RowStatus, set_status_bit
from .workspace import Scratch

#: Smallest page id whose slots (page * PAGE_SIZE + offset) are all beyond int32.
FIRST_UNMAPPABLE_PAGE = 2**31 // PAGE_SIZE
#: The zeroed words before the per-sequence ones (module docstring: decode.py's flag summary).
ZEROED_WORDS = 4


class RowChecks(NamedTuple):
    """What the row checks give the call (module docstring)."""

    status: torch.Tensor  # int32 [rows]
    effective: torch.Tensor  # int32 [3, rows]: row_to_batch, starts, ends (zeros for a row with a bit)
    sequence_ends: torch.Tensor  # int32 [batch]
    zeroed: torch.Tensor  # int32 [ZEROED_WORDS + batch], zeros


def row_checks(block_table: torch.Tensor, num_pages: int, weights: torch.Tensor, row_to_batch: torch.Tensor,
               starts: torch.Tensor, ends: torch.Tensor, max_end: int, scratch: Scratch | None = None) -> RowChecks:
    """The RowChecks of shape-checked inputs (weights float32 [rows, 64]); the module docstring says
    which bit means what. Runs the Triton twin where devices.runs_triton_stages says so (its outputs
    from `scratch`; None: the allocator), the torch code below elsewhere."""
    if runs_triton_stages(weights.device):
        from .triton.row_checks import row_checks_triton

        return row_checks_triton(block_table, num_pages, weights, row_to_batch, starts, ends, max_end, scratch=scratch)
    return row_checks_torch(block_table, num_pages, weights, row_to_batch, starts, ends, max_end)


def row_checks_torch(block_table: torch.Tensor, num_pages: int, weights: torch.Tensor, row_to_batch: torch.Tensor,
                     starts: torch.Tensor, ends: torch.Tensor, max_end: int) -> RowChecks:
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
    sequence_ends = torch.zeros(batch, dtype=torch.int32, device=weights.device)
    if batch:
        sequence_ends.scatter_reduce_(0, safe_b, torch.where(bad_row, 0, e).to(torch.int32), "amax")
    zeroed = torch.zeros(ZEROED_WORDS + batch, dtype=torch.int32, device=weights.device)
    return RowChecks(status, effective, sequence_ends, zeroed)
