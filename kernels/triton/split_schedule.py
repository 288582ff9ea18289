"""The decode path's schedule: rows grouped by sequence, their key tiles split evenly over a fixed grid
(one Triton launch on CUDA; the torch code below is its twin elsewhere, the same values, tested).

A decode-shaped call holds few rows a sequence (next_n = 1-4, MTP) over long windows: one program a row
group, as the prefill schedule (schedule.py) makes, would leave most SMs idle (one row: one program). Here
the work is the key tiles of every row group, laid end to end, and each of the scoring kernel's
`programs` programs takes an equal contiguous share of them, crossing groups where its share does
(paged_scoring.py): one row keeps every SM busy, and the rows of a group share each key tile they read.

Row groups. Consecutive rows of the same (effective) sequence form a run; a run is cut into groups of
at most BLOCK_ROWS rows, in row order. Sequence-major rows (the engines' decode layout: the next_n rows
of request b together) give one group a request at BLOCK_ROWS >= next_n; interleaved rows give more,
smaller groups (still exact, less key sharing). Rows at fault have empty windows (row_checks.py) and
join the runs of sequence 0; they read nothing.
    groups        int32 [1]               the groups used, G (<= rows)
    group_row     int32 [rows]            group g's first row (its rows are group_row[g] + lane)
    group_count   int32 [rows]            its rows, 1..BLOCK_ROWS (0 past G)
    group_span    int32 [rows, 2]         (smallest start, largest end) of its rows' non-empty windows,
                                          (0, 0) for none or past G
    tile_offset   int32 [rows + 1]        prefix sums of the groups' key tiles in scan mode: group g's
                                          tiles [span start // 64, ceil(span end / 64)) are the global
                                          tiles [tile_offset[g], tile_offset[g + 1]); total at [rows]
    faults        int8 [FAULT_SETS, 2, rows] zeroed: the scoring launches' per-row fault flags, one set a
                                          launch kind (paged_scoring.py): [set, 0] a NaN / inf score in the
                                          window, [set, 1] an unsupported key in it (1: seen; the programs of
                                          a row only ever store 1, so no atomics; [set, 0] reads as bool)
    appended, hist, raised                the scan's shared per-row state (paged_scoring.py), set up for the
                  int32 [rows], int32 [rows, num_bins], float32 [rows]: counts zeroed, raised -inf (no
                                          program has raised the row's threshold yet)
Dense mode (score matrix and calibration sample) needs no prefix: every group has the same tiles
(columns), so its share is arithmetic (paged_scoring.py).
Limits: BLOCK_ROWS 1 or 2 (a group's span is the min / max over its lanes).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..cache_layout import PAGE_SIZE
from ..devices import runs_triton_stages
from ..scratch import Scratch

BLOCK = 1024  # rows (groups) the schedule kernel reads at a time
FAULT_SETS = 3  # per-row fault words: the calibration sample's launch, the scan's, the dense scores'


@dataclass(frozen=True)
class SplitSchedule:
    """What the paged scoring kernel launches over (module docstring)."""

    groups: torch.Tensor  # int32 [1]
    group_row: torch.Tensor  # int32 [rows]
    group_count: torch.Tensor  # int32 [rows]
    group_span: torch.Tensor  # int32 [rows, 2]
    tile_offset: torch.Tensor  # int32 [rows + 1]
    faults: torch.Tensor  # int8 [FAULT_SETS, 2, rows], zeroed
    appended: torch.Tensor  # int32 [rows], zeroed
    hist: torch.Tensor  # int32 [rows, num_bins], zeroed
    raised: torch.Tensor  # float32 [rows], -inf
    block_rows: int

    @property
    def max_groups(self) -> int:
        return self.group_row.shape[0]


@triton.jit
def _max(a, b):
    return tl.maximum(a, b)


@triton.jit
def split_schedule_kernel(
    rtb_ptr,
    starts_ptr,
    ends_ptr,
    rows,  # int32 [rows] x3: effective row metadata
    groups_ptr,
    group_row_ptr,
    group_count_ptr,
    group_span_ptr,  # outputs (module docstring)
    tile_offset_ptr,
    faults_ptr,
    fault_words,
    appended_ptr,
    hist_ptr,
    raised_ptr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK: tl.constexpr,
    KEYS: tl.constexpr,
    NB: tl.constexpr,
):
    _split_schedule(
        rtb_ptr,
        starts_ptr,
        ends_ptr,
        rows,
        groups_ptr,
        group_row_ptr,
        group_count_ptr,
        group_span_ptr,
        tile_offset_ptr,
        faults_ptr,
        fault_words,
        appended_ptr,
        hist_ptr,
        raised_ptr,
        BLOCK_ROWS,
        BLOCK,
        KEYS,
        NB,
    )


@triton.jit
def _split_schedule(
    rtb_ptr,
    starts_ptr,
    ends_ptr,
    rows,
    groups_ptr,
    group_row_ptr,
    group_count_ptr,
    group_span_ptr,
    tile_offset_ptr,
    faults_ptr,
    fault_words,
    appended_ptr,
    hist_ptr,
    raised_ptr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK: tl.constexpr,
    KEYS: tl.constexpr,
    NB: tl.constexpr,
):
    """The schedule in one program (module docstring): split_schedule_kernel's, and the paged mode's
    prologue's first program (paged.py: beside the queries' decode, one launch)."""
    offs = tl.arange(0, BLOCK)
    for f0 in range(0, fault_words, BLOCK):
        tl.store(faults_ptr + f0 + offs, tl.zeros([BLOCK], tl.int8), mask=f0 + offs < fault_words)
    # the scan's shared state (the scan launches after the calibration: no launch of its own to set it up)
    for r0 in range(0, rows, BLOCK):
        row = r0 + offs
        live = row < rows
        tl.store(appended_ptr + row, tl.zeros([BLOCK], tl.int32), mask=live)
        tl.store(raised_ptr + row, tl.full([BLOCK], float("-inf"), tl.float32), mask=live)
    for w0 in range(0, rows * NB, BLOCK):
        tl.store(hist_ptr + w0 + offs, tl.zeros([BLOCK], tl.int32), mask=w0 + offs < rows * NB)
    schedule = (groups_ptr, group_row_ptr, group_count_ptr, group_span_ptr, tile_offset_ptr)
    if BLOCK_ROWS == 1:  # a group a row: its span its window, in one pass (no groups written and read back)
        _one_row_groups(starts_ptr, ends_ptr, rows, schedule, BLOCK, KEYS)
    else:
        _row_groups(rtb_ptr, starts_ptr, ends_ptr, rows, schedule, BLOCK_ROWS, BLOCK, KEYS)


@triton.jit
def _one_row_groups(starts_ptr, ends_ptr, rows, schedule, BLOCK: tl.constexpr, KEYS: tl.constexpr):
    """_row_groups at BLOCK_ROWS = 1: group g is row g (count 1), its span the row's window ((0, 0) where empty)."""
    groups_ptr, group_row_ptr, group_count_ptr, _, tile_offset_ptr = schedule
    offs = tl.arange(0, BLOCK)
    tiles_before = 0
    tl.store(tile_offset_ptr, 0)
    for r0 in range(0, rows, BLOCK):
        row = r0 + offs
        live = row < rows
        start = tl.load(starts_ptr + row, mask=live, other=0)
        end = tl.load(ends_ptr + row, mask=live, other=0)
        window = live & (end > start)
        tl.store(group_row_ptr + row, row, mask=live)
        tl.store(group_count_ptr + row, tl.full([BLOCK], 1, tl.int32), mask=live)
        tiles_before = _store_spans(
            row, live, tl.where(window, start, 0), tl.where(window, end, 0), schedule, tiles_before, KEYS
        )
    tl.store(groups_ptr, rows)


@triton.jit
def _row_groups(
    rtb_ptr, starts_ptr, ends_ptr, rows, schedule, BLOCK_ROWS: tl.constexpr, BLOCK: tl.constexpr, KEYS: tl.constexpr
):
    """The groups (runs of one sequence, cut every BLOCK_ROWS rows, carried across blocks of rows: written, then read
    back for their spans) and their spans and tile offsets into `schedule` (groups_ptr, group_row_ptr,
    group_count_ptr, group_span_ptr, tile_offset_ptr)."""
    groups_ptr, group_row_ptr, group_count_ptr, _, tile_offset_ptr = schedule
    offs = tl.arange(0, BLOCK)
    run_start = 0
    groups = 0
    for r0 in range(0, rows, BLOCK):
        row = r0 + offs
        live = row < rows
        b = tl.load(rtb_ptr + row, mask=live, other=-2)
        prev = tl.load(rtb_ptr + row - 1, mask=live & (row > 0), other=-1)
        following = tl.load(rtb_ptr + row + 1, mask=row + 1 < rows, other=-3)
        new_run = live & ((row == 0) | (b != prev))
        starts_run = tl.associative_scan(tl.where(new_run, row, -1), 0, _max)
        starts_run = tl.where(starts_run >= 0, starts_run, run_start)
        lane = (row - starts_run) % BLOCK_ROWS
        first = live & (lane == 0)
        group = groups + tl.cumsum(first.to(tl.int32), 0) - 1
        last = live & ((row + 1 == rows) | (following != b) | (lane == BLOCK_ROWS - 1))
        tl.store(group_row_ptr + group, row, mask=first)
        tl.store(group_count_ptr + group, lane + 1, mask=last)
        run_start = tl.max(tl.where(new_run, row, run_start), 0)
        groups += tl.sum(first.to(tl.int32), 0)
    tl.store(groups_ptr, groups)
    tl.debug_barrier()  # the groups' rows above are read below, by other threads of this program
    # Spans and the prefix of their key tiles (groups past the used ones: (0, 0), 0 tiles, count 0).
    tiles_before = 0
    tl.store(tile_offset_ptr, 0)
    for g0 in range(0, rows, BLOCK):
        group = g0 + offs
        in_grid = group < rows
        used = group < groups
        first_row = tl.load(group_row_ptr + group, mask=used, other=0)
        count = tl.load(group_count_ptr + group, mask=used, other=0)
        lo = tl.full([BLOCK], 2**31 - 1, tl.int32)
        hi = tl.zeros([BLOCK], tl.int32)
        for lane in tl.static_range(BLOCK_ROWS):
            in_group = used & (lane < count)
            start = tl.load(starts_ptr + first_row + lane, mask=in_group, other=0)
            end = tl.load(ends_ptr + first_row + lane, mask=in_group, other=0)
            window = in_group & (end > start)
            lo = tl.where(window, tl.minimum(lo, start), lo)
            hi = tl.where(window, tl.maximum(hi, end), hi)
        tl.store(group_row_ptr + group, first_row, mask=in_grid & ~used)
        tl.store(group_count_ptr + group, count, mask=in_grid & ~used)
        tiles_before = _store_spans(group, in_grid, lo, hi, schedule, tiles_before, KEYS)


@triton.jit
def _store_spans(group, in_grid, lo, hi, schedule, tiles_before, KEYS: tl.constexpr):
    """Store the spans of a block of groups (lo, hi: their windows' union; hi 0 where none, then (0, 0)) and the
    prefix of their key tiles after the `tiles_before` of the groups before them; return the tiles up to them."""
    _, _, _, group_span_ptr, tile_offset_ptr = schedule
    any_window = hi > 0
    lo = tl.where(any_window, lo, 0)
    tiles = tl.where(any_window, tl.cdiv(hi, KEYS) - lo // KEYS, 0)
    tl.store(group_span_ptr + 2 * group, lo, mask=in_grid)
    tl.store(group_span_ptr + 2 * group + 1, hi, mask=in_grid)
    tl.store(tile_offset_ptr + group + 1, tiles_before + tl.cumsum(tiles, 0), mask=in_grid)
    return tiles_before + tl.sum(tiles, 0)


def _buffers(rows: int, num_bins: int, scratch: Scratch) -> tuple[torch.Tensor, ...]:
    i32 = torch.int32
    return (
        scratch.empty(1, i32),
        scratch.empty(rows, i32),
        scratch.empty(rows, i32),
        scratch.empty((rows, 2), i32),
        scratch.empty(rows + 1, i32),
        scratch.empty((FAULT_SETS, 2, rows), torch.int8),
        scratch.empty(rows, i32),
        scratch.empty((rows, num_bins), i32),
        scratch.empty(rows, torch.float32),
    )


def split_schedule_launch(
    row_to_batch: torch.Tensor,
    starts: torch.Tensor,
    ends: torch.Tensor,
    block_rows: int,
    num_bins: int,
    scratch: Scratch,
) -> tuple[SplitSchedule, tuple, dict]:
    """(the SplitSchedule's buffers from `scratch`, not yet written; the arguments and constexprs of
    _split_schedule that write them): for split_schedule_kernel, and for a launch that runs the schedule
    beside other work (paged.py's prologue)."""
    rows = row_to_batch.shape[0]
    out = _buffers(rows, num_bins, scratch)
    args = (row_to_batch, starts, ends, rows, *out[:5], out[5], out[5].numel(), *out[6:])
    return (
        SplitSchedule(*out, block_rows=block_rows),
        args,
        dict(BLOCK_ROWS=block_rows, BLOCK=BLOCK, KEYS=PAGE_SIZE, NB=num_bins),
    )


def build_split_schedule_triton(
    row_to_batch: torch.Tensor,
    starts: torch.Tensor,
    ends: torch.Tensor,
    block_rows: int,
    num_bins: int,
    scratch: Scratch,
) -> SplitSchedule:
    """The SplitSchedule (module docstring) of effective row metadata (int32 [rows] each) in one launch
    of one program; buffers from `scratch`."""
    schedule, args, constants = split_schedule_launch(row_to_batch, starts, ends, block_rows, num_bins, scratch)
    split_schedule_kernel[(1,)](*args, **constants, num_warps=4)
    return schedule


def build_split_schedule_torch(
    row_to_batch: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor, block_rows: int, num_bins: int
) -> SplitSchedule:
    """build_split_schedule in torch ops (any device; the same values)."""
    rows = row_to_batch.shape[0]
    dev = row_to_batch.device
    index = torch.arange(rows, device=dev)
    new_run = torch.ones(rows, dtype=torch.bool, device=dev)
    new_run[1:] = row_to_batch[1:] != row_to_batch[:-1]
    run_start = torch.cummax(torch.where(new_run, index, 0), dim=0).values
    lane = (index - run_start) % block_rows
    first = lane == 0
    group = torch.cumsum(first.long(), dim=0) - 1
    groups = first.sum().to(torch.int32).reshape(1)
    group_row = torch.zeros(rows, dtype=torch.int32, device=dev)
    group_count = torch.zeros(rows, dtype=torch.int32, device=dev)
    group_row[group[first]] = index[first].to(torch.int32)
    group_count.scatter_reduce_(0, group, (lane + 1).to(torch.int32), "amax")
    window = ends > starts
    big = torch.iinfo(torch.int32).max
    lo = torch.full((rows,), big, dtype=torch.int32, device=dev)
    hi = torch.zeros(rows, dtype=torch.int32, device=dev)
    lo.scatter_reduce_(0, group, torch.where(window, starts, big), "amin")
    hi.scatter_reduce_(0, group, torch.where(window, ends, 0), "amax")
    any_window = hi > 0
    lo = torch.where(any_window, lo, 0)
    tiles = torch.where(any_window, -(-hi // PAGE_SIZE) - lo // PAGE_SIZE, 0)
    tile_offset = torch.nn.functional.pad(torch.cumsum(tiles, dim=0), (1, 0)).to(torch.int32)
    faults = torch.zeros((FAULT_SETS, 2, rows), dtype=torch.int8, device=dev)
    return SplitSchedule(
        groups,
        group_row,
        group_count,
        torch.stack([lo, hi], dim=1).contiguous(),
        tile_offset,
        faults,
        torch.zeros(rows, dtype=torch.int32, device=dev),
        torch.zeros((rows, num_bins), dtype=torch.int32, device=dev),
        torch.full((rows,), float("-inf"), device=dev),
        block_rows=block_rows,
    )


def build_split_schedule(
    row_to_batch: torch.Tensor,
    starts: torch.Tensor,
    ends: torch.Tensor,
    block_rows: int,
    num_bins: int,
    scratch: Scratch,
) -> SplitSchedule:
    """The SplitSchedule of effective row metadata (with the scan's state for `num_bins` histogram bins):
    the Triton kernel where devices.runs_triton_stages says so, the torch code elsewhere."""
    if block_rows not in (1, 2):
        raise ValueError(f"block_rows={block_rows}: the split schedule groups 1 or 2 rows")
    if runs_triton_stages(row_to_batch.device):
        return build_split_schedule_triton(row_to_batch, starts, ends, block_rows, num_bins, scratch)
    return build_split_schedule_torch(row_to_batch, starts, ends, block_rows, num_bins)
