"""Stage 1, row checks: which rows of a prefill call can be answered, in one Triton launch (CUDA) or
torch ops (elsewhere), the same bits (tested).

Layer: stage (validation.validate_prefill runs it: the call's first launch). Reading order: the
kernel, its launcher (row_checks_triton), the torch twin (row_checks_torch), then `row_checks`, the
one line that picks between them (devices.runs_triton_stages).

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
                      the device with atomics (problem.py says which)
Everything stays on the inputs' device: nothing here waits for the device or reads it on the host.

Tiling (the kernel): programs [0, S) one sequence each (S = max(batch, 1)), reading every row
BLOCK_ROWS at a time (the decode's keys per sequence; program 0 also zeroes the first ZEROED_WORDS
words); programs [S, S + rows) one row each, its pages read BLOCK_PAGES at a time (work grows with the
window's pages). The sequences come first in the grid: their loop over the rows is the launch's
longest program. On a CUDA device this one launch replaces ~40 small torch launches.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .cache_layout import NUM_HEADS, PAGE_SIZE
from .devices import runs_triton_stages
from .problem import ZEROED_WORDS
from .scratch import Scratch
from .status import RowStatus, set_status_bit

#: Smallest page id whose slots (page * PAGE_SIZE + offset) are all beyond int32.
FIRST_UNMAPPABLE_PAGE = 2**31 // PAGE_SIZE
BLOCK_PAGES = 256
BLOCK_ROWS = 1024


class RowChecks(NamedTuple):
    """What the row checks give the call (module docstring)."""

    status: torch.Tensor  # int32 [rows]
    effective: torch.Tensor  # int32 [3, rows]: row_to_batch, starts, ends (zeros for a row with a bit)
    sequence_ends: torch.Tensor  # int32 [batch]
    zeroed: torch.Tensor  # int32 [ZEROED_WORDS + batch], zeros


@triton.jit
def _in_range(b, start, end, batch, window_limit):
    """A row's (sequence, window) is in range: not INVALID_ROW."""
    return (b >= 0) & (b < batch) & (start >= 0) & (start <= end) & (end <= window_limit)


@triton.jit
def _check_row(
    row,
    block_table_ptr,
    batch,
    max_pages,
    num_pages,
    window_limit,
    weights_ptr,
    rtb_ptr,
    starts_ptr,
    ends_ptr,
    status_ptr,
    effective_ptr,
    rows,
    INVALID_ROW: tl.constexpr,
    INVALID_PAGE: tl.constexpr,
    NONFINITE: tl.constexpr,
    SLOT_OVERFLOW: tl.constexpr,
    H: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_PAGES: tl.constexpr,
    FIRST_UNMAPPABLE: tl.constexpr,
):
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
def _sequence_end(
    b,
    batch,
    window_limit,
    rtb_ptr,
    starts_ptr,
    ends_ptr,
    rows,
    sequence_ends_ptr,
    zeroed_ptr,
    ZEROED: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
):
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
    block_table_ptr,
    batch,
    max_pages,
    num_pages,  # int32 [batch, max_pages]; ints
    window_limit,  # max_end: every window end must be <= it
    weights_ptr,
    rtb_ptr,
    starts_ptr,
    ends_ptr,  # float32 [rows, H]; int32 [rows] x3
    status_ptr,
    effective_ptr,
    rows,  # int32 [rows]; int32 [3, rows]
    sequence_ends_ptr,
    zeroed_ptr,
    sequences,  # int32 [batch]; int32 [ZEROED + batch]; max(batch, 1)
    INVALID_ROW: tl.constexpr,
    INVALID_PAGE: tl.constexpr,
    NONFINITE: tl.constexpr,
    SLOT_OVERFLOW: tl.constexpr,
    H: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_PAGES: tl.constexpr,
    FIRST_UNMAPPABLE: tl.constexpr,
    ZEROED: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
):
    pid = tl.program_id(0)
    if pid < sequences:
        _sequence_end(
            pid,
            batch,
            window_limit,
            rtb_ptr,
            starts_ptr,
            ends_ptr,
            rows,
            sequence_ends_ptr,
            zeroed_ptr,
            ZEROED,
            BLOCK_ROWS,
        )
    else:
        _check_row(
            (pid - sequences).to(tl.int64),
            block_table_ptr,
            batch,
            max_pages,
            num_pages,
            window_limit,
            weights_ptr,
            rtb_ptr,
            starts_ptr,
            ends_ptr,
            status_ptr,
            effective_ptr,
            rows,
            INVALID_ROW,
            INVALID_PAGE,
            NONFINITE,
            SLOT_OVERFLOW,
            H,
            PAGE,
            BLOCK_PAGES,
            FIRST_UNMAPPABLE,
        )


def row_checks_triton(
    block_table: torch.Tensor,
    num_pages: int,
    weights: torch.Tensor,
    row_to_batch: torch.Tensor,
    starts: torch.Tensor,
    ends: torch.Tensor,
    max_end: int,
    scratch: Scratch | None = None,
) -> RowChecks:
    """row_checks_torch in one kernel, its outputs from `scratch` (None: the allocator)."""
    rows = row_to_batch.shape[0]
    batch, max_pages = block_table.shape
    scratch = scratch if scratch is not None else Scratch(weights.device)
    checked = RowChecks(
        status=scratch.empty(rows, torch.int32),
        effective=scratch.empty((3, rows), torch.int32),
        sequence_ends=scratch.empty(batch, torch.int32),
        zeroed=scratch.empty(ZEROED_WORDS + batch, torch.int32),
    )
    sequences = max(batch, 1)
    row_checks_kernel[(sequences + rows,)](
        block_table,
        batch,
        max_pages,
        num_pages,
        max_end,
        weights,
        row_to_batch,
        starts,
        ends,
        checked.status,
        checked.effective,
        rows,
        checked.sequence_ends,
        checked.zeroed,
        sequences,
        INVALID_ROW=int(RowStatus.INVALID_ROW),
        INVALID_PAGE=int(RowStatus.INVALID_PAGE),
        NONFINITE=int(RowStatus.NONFINITE),
        SLOT_OVERFLOW=int(RowStatus.SLOT_OVERFLOW),
        H=NUM_HEADS,
        PAGE=PAGE_SIZE,
        BLOCK_PAGES=BLOCK_PAGES,
        FIRST_UNMAPPABLE=FIRST_UNMAPPABLE_PAGE,
        ZEROED=ZEROED_WORDS,
        BLOCK_ROWS=BLOCK_ROWS,
        num_warps=4,
    )
    return checked


def row_checks_torch(
    block_table: torch.Tensor,
    num_pages: int,
    weights: torch.Tensor,
    row_to_batch: torch.Tensor,
    starts: torch.Tensor,
    ends: torch.Tensor,
    max_end: int,
) -> RowChecks:
    """row_checks in torch ops (any device)."""
    batch, max_pages = block_table.shape
    b, s, e = row_to_batch.long(), starts.long(), ends.long()
    bad_row = (b < 0) | (b >= batch) | (s < 0) | (s > e) | (e > max_end)
    status = set_status_bit(torch.zeros_like(row_to_batch), bad_row, RowStatus.INVALID_ROW)
    # Pages a row reads: [first, last) with first = s // 64, last = ceil(e / 64); empty when s == e.
    safe_b = torch.where(bad_row, 0, b)
    first = torch.where(bad_row, 0, s // PAGE_SIZE)
    last = torch.where(bad_row, 0, (e + PAGE_SIZE - 1) // PAGE_SIZE).clamp_min(first)
    for bad_page, bit in (
        ((block_table < 0) | (block_table >= num_pages), RowStatus.INVALID_PAGE),
        (block_table >= FIRST_UNMAPPABLE_PAGE, RowStatus.SLOT_OVERFLOW),
    ):
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


def row_checks(
    block_table: torch.Tensor,
    num_pages: int,
    weights: torch.Tensor,
    row_to_batch: torch.Tensor,
    starts: torch.Tensor,
    ends: torch.Tensor,
    max_end: int,
    scratch: Scratch | None = None,
) -> RowChecks:
    """The RowChecks of shape-checked inputs (weights float32 [rows, 64]); the module docstring says
    which bit means what. Runs the Triton twin where devices.runs_triton_stages says so (its outputs
    from `scratch`; None: the allocator), the torch twin elsewhere."""
    if runs_triton_stages(weights.device):
        return row_checks_triton(block_table, num_pages, weights, row_to_batch, starts, ends, max_end, scratch=scratch)
    return row_checks_torch(block_table, num_pages, weights, row_to_batch, starts, ends, max_end)
