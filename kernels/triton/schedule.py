"""The scoring kernels' schedule, built on the device (three Triton launches on CUDA; the torch code
below is its twin elsewhere, the same bits, tested): no host round trip, capturable.

Layer: backends (triton/; backend.py builds it, subset.py writes the repair's).

A program of the scoring kernels (scoring.py, scoring_gluon.py) owns up to BLOCK_ROWS rows of one
sequence and walks the union of their windows. The schedule (class Schedule) says which:
    rows     int32 [programs, BLOCK_ROWS]  row indices, -1 padding; lanes fill from the first
    batch    int32 [programs]              the rows' sequence
    span     int32 [programs, 2]           (smallest start, largest end) of the rows' windows
    q_wide   int8 [programs]               a row of the program holds a wide query vector
    variants ((rows, span) narrow, (rows, span) wide): the schedule for the scoring kernel's narrow
             and wide variant; the one that does not apply (a device flag: some live vector is wide,
             or none is) gets rows -1 and spans (0, 0), so its programs do no work and write nothing.
Rows are grouped by sequence and ordered by start inside it (consecutive rows of a causal prefill
share most keys; ties keep row order), BLOCK_ROWS to a program, and the programs with the longest
spans come first (ties keep program order; the tail of the grid is short work). Rows with an empty
window (rows at fault, the first tokens of a causal prefill) form programs of their own, last among
the live ones, with span (0, 1): in dense mode they write -inf across their rows (nothing else
covers those rows), in scan mode they find nothing. The grid has `max_programs` programs, a bound
from shapes alone; the programs past the ones used have no rows and span (0, 0), and do no work.

Triton (runs_triton_stages): the two sorts are ranks (a row's place = the rows ordered before it). In
general they are counted in RANK_BLOCK x RANK_TILE tiles: rows^2 compares over rows / RANK_BLOCK
programs, 67 M at 8,192 rows, and 64 times that at 65,536 rows, where a radix sort would win. Ordered
input takes a fast path, decided by each program for its own block (no host decision, no grid-wide
flag; programs on either path agree, as both give the exact rank): where the block's own rows are in
order and every row before it sorts before them, every row after it after them, a place is the rank
inside the block plus counts of the rows around it. The check reads all rows once a program, SCAN at a
time (rows^2 / RANK_BLOCK loads, L2-resident, ~20 instructions a row read, no pairwise compares);
blocks out of order skip it. A causal prefill (each sequence's rows in row order, starts not
decreasing; the empty rows anywhere, their group sorting last) takes it in every block. The order
kernel's fast path is the same for spans whose lengths do not decrease from program to program (a
causal prefill's: later rows, longer windows; the empty rows' programs, last, rank last either way),
read SCAN programs at a time. At 8,192 rows the three launches run ~5 M warp instructions on this
path and ~50 M on the general one (SASS, bench/NOTES.md; ~53 M and ~126 us before the fast paths).
    schedule_rank_kernel      each row's place in (sequence, start, row) order; marks first lanes (int8)
    schedule_programs_kernel  each program's rows, sequence, span, q_wide and span length, in that order, and
                              the programs used (a program sums the first lanes before its block, FLAGS at a time)
    schedule_order_kernel     each used program's place by span length (a rank over the used ones); writes
                              the Schedule
The repair's schedule (one row a program, row order) is written by subset.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..devices import runs_triton_stages
from ..scratch import Scratch
from .operands import FLAG_WIDE

BLOCK = 64  # rows a program of schedule_programs_kernel lays out
# The two ranks: RANK_BLOCK rows (programs) a program ranks, against RANK_TILE others at a time. Small
# blocks give the grid several programs an SM (8,192 rows: 512 programs), which the rows^2 compares need
# to hide their latency: with 64 x 64 tiles (128 programs, one an SM) the ranks took 0.19 + 0.08 ms on the
# H200 at 8,192 rows (bench/results/stage-trace-*-v13*.json). With its fast path schedule_rank_kernel takes
# 103-118 registers (64 without, fast_paths=False): 4 programs an SM, one wave up to 8,448 rows.
RANK_BLOCK = 16
RANK_TILE = 256
FLAGS = 4096  # first-lane flags (int8) schedule_programs_kernel sums at a time
SCAN = 1024  # rows (programs) a fast path's check reads at a time


@dataclass(frozen=True)
class Schedule:
    """What the scoring kernels launch over (module docstring)."""

    rows: torch.Tensor  # int32 [programs, block_rows]
    batch: torch.Tensor  # int32 [programs]
    span: torch.Tensor  # int32 [programs, 2]
    q_wide: torch.Tensor  # int8 [programs]
    variants: tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]

    @property
    def programs(self) -> int:
        return self.rows.shape[0]


def max_programs(rows: int, batch: int, block_rows: int) -> int:
    """Programs of a schedule of `rows` rows over `batch` sequences: every sequence, and the group
    of empty rows, wastes at most block_rows - 1 lanes."""
    if rows == 0:
        return 0
    groups = min(batch, rows) + 1
    return (rows + groups * (block_rows - 1)) // block_rows


def build_schedule(
    row_to_batch: torch.Tensor,
    starts: torch.Tensor,
    ends: torch.Tensor,
    batch: int,
    block_rows: int,
    q_wide: torch.Tensor,
    flags: torch.Tensor,
    scratch: Scratch,
) -> Schedule:
    """The Schedule (module docstring) of effective row metadata (int32 [rows] each; rows with an
    empty window have row_to_batch 0), bool `q_wide` [rows] (a live row with a wide query vector)
    and the decode summary `flags` int32 [2] (the variant is wide where FLAG_WIDE is in flags[0] |
    flags[1]). Runs the Triton kernels where devices.runs_triton_stages says so, torch elsewhere."""
    if runs_triton_stages(row_to_batch.device):
        return build_schedule_triton(row_to_batch, starts, ends, batch, block_rows, q_wide, flags, scratch)
    return build_schedule_torch(row_to_batch, starts, ends, batch, block_rows, q_wide, flags)


def with_variants(
    rows: torch.Tensor, batch: torch.Tensor, span: torch.Tensor, q_wide: torch.Tensor, flags: torch.Tensor
) -> Schedule:
    """A Schedule from its rows, batch and span (torch): q_wide [rows] gathered per program, and the
    narrow / wide variants from the decode summary `flags`."""
    prog_q_wide = torch.where(rows >= 0, q_wide[rows.clamp_min(0).long()], False).any(dim=1)
    wide = (((flags[0] | flags[1]) & FLAG_WIDE) != 0).to(torch.int32).view(1, 1)
    variants = tuple(
        (torch.where(on.bool(), rows, -1).contiguous(), (span * on).contiguous()) for on in (1 - wide, wide)
    )
    return Schedule(rows, batch, span, prog_q_wide.to(torch.int8).contiguous(), variants)


def build_schedule_torch(row_to_batch, starts, ends, batch: int, block_rows: int, q_wide, flags) -> Schedule:
    """build_schedule in torch ops (any device; ~25 launches)."""
    n = row_to_batch.shape[0]
    dev = row_to_batch.device
    programs = max_programs(n, batch, block_rows)
    live = ends > starts
    group = torch.where(live, row_to_batch.long(), batch)  # the empty rows: one group after the sequences
    order = torch.argsort((group << 32) | torch.where(live, starts.long(), 0), stable=True)
    group_of = group[order]
    index = torch.arange(n, device=dev)
    opens = torch.ones(n, dtype=torch.bool, device=dev)
    opens[1:] = group_of[1:] != group_of[:-1]
    group_first = torch.cummax(torch.where(opens, index, 0), dim=0).values
    lane = (index - group_first) % block_rows
    first_lane = lane == 0
    program = torch.cumsum(first_lane, dim=0) - 1
    prog_rows = torch.full((programs * block_rows,), -1, dtype=torch.int32, device=dev)
    prog_rows[program * block_rows + lane] = order.to(torch.int32)
    prog_rows = prog_rows.view(programs, block_rows)
    # Per program (scatters into one spare slot, `programs`, for rows that are not a program's first).
    target = torch.where(first_lane, program, programs)
    prog_batch = torch.zeros(programs + 1, dtype=torch.int64, device=dev)
    prog_batch[target] = torch.where(group_of < batch, group_of, 0)
    prog_start = torch.zeros(programs + 1, dtype=torch.int64, device=dev)
    prog_start[target] = torch.where(live, starts.long(), 0)[order]  # empty windows: span (0, 1)
    prog_end = torch.zeros(programs, dtype=torch.int64, device=dev)
    prog_end.scatter_reduce_(0, program, ends.long()[order], reduce="amax")
    empty_group = torch.zeros(programs + 1, dtype=torch.bool, device=dev)
    empty_group[target] = group_of == batch
    prog_end = torch.where(empty_group[:programs], 1, prog_end)
    span = torch.stack([prog_start[:programs], prog_end], dim=1)
    by_work = torch.argsort(span[:, 0] - span[:, 1], stable=True)  # longest first; unused programs (0) last
    return with_variants(
        prog_rows[by_work].contiguous(),
        prog_batch[:programs][by_work].to(torch.int32).contiguous(),
        span[by_work].to(torch.int32).contiguous(),
        q_wide,
        flags,
    )


@triton.jit
def _group_and_key(rtb_ptr, starts_ptr, ends_ptr, offs, mask, batch):
    """(live, group, sort key) of rows `offs`: the window is not empty, the sequence (batch for an empty
    window) and group << 32 | start (0 for an empty window), the torch code's argsort key."""
    start = tl.load(starts_ptr + offs, mask=mask, other=0)
    live = tl.load(ends_ptr + offs, mask=mask, other=0) > start
    group = tl.where(live, tl.load(rtb_ptr + offs, mask=mask, other=0), batch)
    return live, group, (group.to(tl.int64) << 32) | tl.where(live, start, 0).to(tl.int64)


@triton.jit
def _count_before(key_i, group_i, offs_i, key_j, group_j, offs_j, mask_j):
    """Of the rows j (one tile), per row i: (rows before it in (key, row) order, rows of earlier groups)."""
    before = (key_j[None, :] < key_i[:, None]) | (
        (key_j[None, :] == key_i[:, None]) & (offs_j[None, :] < offs_i[:, None])
    )
    place = tl.sum((before & mask_j[None, :]).to(tl.int32), axis=1)
    lower = tl.sum(((group_j[None, :] < group_i[:, None]) & mask_j[None, :]).to(tl.int32), axis=1)
    return place, lower


@triton.jit
def _rows_around_in_order(rtb_ptr, starts_ptr, ends_ptr, n, batch, row0, row1, key_min, key_max, SCAN: tl.constexpr):
    """(in_order, live_before, group0_before, live_after) of the rows outside [row0, row1): whether the live
    rows before it have keys in [0, key_min] and those after it in [key_max, empty_key); the live rows
    before it, those of them in key_min's group, and the live rows after it. Reads SCAN rows at a time."""
    empty_key = (tl.full([], 0, tl.int64) + batch) << 32
    group0 = (key_min >> 32).to(tl.int32)
    out_of_order = tl.zeros([SCAN], dtype=tl.int32)
    live_before = tl.zeros([SCAN], dtype=tl.int32)
    group0_before = tl.zeros([SCAN], dtype=tl.int32)
    live_after = tl.zeros([SCAN], dtype=tl.int32)
    for j0 in range(0, row0, SCAN):
        offs_j = j0 + tl.arange(0, SCAN)
        live_j, group_j, key_j = _group_and_key(rtb_ptr, starts_ptr, ends_ptr, offs_j, offs_j < row0, batch)
        out_of_order |= (live_j & ((key_j < 0) | (key_j > key_min))).to(tl.int32)
        live_before += live_j.to(tl.int32)
        group0_before += (live_j & (group_j == group0)).to(tl.int32)
    for j0 in range(row1, n, SCAN):
        offs_j = j0 + tl.arange(0, SCAN)
        live_j, group_j, key_j = _group_and_key(rtb_ptr, starts_ptr, ends_ptr, offs_j, offs_j < n, batch)
        out_of_order |= (live_j & ((key_j < key_max) | (key_j >= empty_key))).to(tl.int32)
        live_after += live_j.to(tl.int32)
    return (
        tl.max(out_of_order, axis=0) == 0,
        tl.sum(live_before, axis=0),
        tl.sum(group0_before, axis=0),
        tl.sum(live_after, axis=0),
    )


@triton.jit
def _count_before_all(rtb_ptr, starts_ptr, ends_ptr, n, batch, offs_i, BLOCK: tl.constexpr, TILE: tl.constexpr):
    """_count_before over all n rows, TILE at a time: per row i its place and the rows of earlier groups."""
    live_i, group_i, key_i = _group_and_key(rtb_ptr, starts_ptr, ends_ptr, offs_i, offs_i < n, batch)
    place = tl.zeros([BLOCK], dtype=tl.int32)
    lower = tl.zeros([BLOCK], dtype=tl.int32)
    for j0 in range(0, n, TILE):
        offs_j = j0 + tl.arange(0, TILE)
        mask_j = offs_j < n
        live_j, group_j, key_j = _group_and_key(rtb_ptr, starts_ptr, ends_ptr, offs_j, mask_j, batch)
        place_j, lower_j = _count_before(key_i, group_i, offs_i, key_j, group_j, offs_j, mask_j)
        place += place_j
        lower += lower_j
    return place, lower


@triton.jit
def schedule_rank_kernel(
    rtb_ptr,
    starts_ptr,
    ends_ptr,
    n,
    batch,  # int32 [n] x3 (effective metadata); ints
    order_ptr,
    group_at_ptr,
    first_at_ptr,  # int32 [n] x2, int8 [n], by place: row, group, first lane
    BLOCK_ROWS: tl.constexpr,
    BLOCK: tl.constexpr,
    TILE: tl.constexpr,
    SCAN: tl.constexpr,
    FAST_PATHS: tl.constexpr,
):
    row0 = tl.program_id(0) * BLOCK
    offs_i = row0 + tl.arange(0, BLOCK)
    mask_i = offs_i < n
    live_i, group_i, key_i = _group_and_key(rtb_ptr, starts_ptr, ends_ptr, offs_i, mask_i, batch)
    if FAST_PATHS:
        # Sorted input: the block's own rows counted, the others follow from where they are. Tried where the
        # block's live rows are in key order (the live rows ahead of each are the rows before it) with keys in
        # [0, empty_key), taken where the rows around them are in order too (every block of sorted input).
        empty_key = (tl.full([], 0, tl.int64) + batch) << 32  # an empty row's key, above every live row's
        place, lower = _count_before(key_i, group_i, offs_i, key_i, group_i, offs_i, mask_i)
        live_ahead = tl.cumsum(live_i.to(tl.int32), axis=0) - live_i.to(tl.int32)
        in_order = (
            tl.max((live_i & ((place != live_ahead) | (key_i < 0) | (key_i >= empty_key))).to(tl.int32), axis=0) == 0
        )
        key_min = tl.min(tl.where(live_i, key_i, empty_key - 1), axis=0)
        key_max = tl.max(tl.where(live_i, key_i, 0), axis=0)
        live_before = tl.full([], 0, tl.int32)
        group0_before = tl.full([], 0, tl.int32)
        live_after = tl.full([], 0, tl.int32)
        if in_order:
            in_order, live_before, group0_before, live_after = _rows_around_in_order(
                rtb_ptr, starts_ptr, ends_ptr, n, batch, row0, row0 + BLOCK, key_min, key_max, SCAN
            )
        if in_order:
            # Before a live row: the live rows before the block (of earlier groups: those not in the block's
            # first live group when it is in it); before an empty row: the rows before the block and the live
            # rows after it (of earlier groups: every live row).
            place += tl.where(live_i, live_before, row0 + live_after)
            lower += tl.where(
                live_i, live_before - tl.where(group_i == (key_min >> 32), group0_before, 0), live_before + live_after
            )
        else:
            place, lower = _count_before_all(rtb_ptr, starts_ptr, ends_ptr, n, batch, offs_i, BLOCK, TILE)
    else:
        place, lower = _count_before_all(rtb_ptr, starts_ptr, ends_ptr, n, batch, offs_i, BLOCK, TILE)
    tl.store(order_ptr + place, offs_i, mask=mask_i)
    tl.store(group_at_ptr + place, group_i, mask=mask_i)
    tl.store(first_at_ptr + place, ((place - lower) % BLOCK_ROWS == 0).to(tl.int8), mask=mask_i)


@triton.jit
def schedule_programs_kernel(
    order_ptr,
    group_at_ptr,
    first_at_ptr,
    n,
    batch,  # schedule_rank_kernel's outputs (first_at int8)
    starts_ptr,
    ends_ptr,
    q_wide_ptr,  # int32 [n] x2, int8 [n]
    rows_ptr,
    prog_batch_ptr,
    span_ptr,
    prog_q_wide_ptr,  # by program (sort order): [P, BLOCK_ROWS], [P], [P, 2], [P]
    # int32 [P]: span length (0: empty rows); int32 [1]: programs used
    length_ptr,
    used_ptr,
    BLOCK_ROWS: tl.constexpr,
    LANES: tl.constexpr,
    BLOCK: tl.constexpr,
    FLAGS: tl.constexpr,
):
    pid = tl.program_id(0)
    offs_r = pid * BLOCK + tl.arange(0, BLOCK)
    mask_r = offs_r < n
    first = tl.load(first_at_ptr + offs_r, mask=mask_r, other=0).to(tl.int32)
    earlier = 0
    for j0 in range(0, pid * BLOCK, FLAGS):  # first lanes at earlier places: programs before this block's
        offs_j = j0 + tl.arange(0, FLAGS)
        earlier += tl.sum(tl.load(first_at_ptr + offs_j, mask=offs_j < pid * BLOCK, other=0).to(tl.int32), axis=0)
    program = earlier + tl.cumsum(first, axis=0) - 1
    opens = mask_r & (first != 0)
    group = tl.load(group_at_ptr + offs_r, mask=mask_r, other=-1)
    # A program's rows: the places r .. r + BLOCK_ROWS - 1 of its first lane r that are in its group.
    offs_l = tl.arange(0, LANES)
    at = offs_r[:, None] + offs_l[None, :]
    lane_ok = opens[:, None] & (offs_l[None, :] < BLOCK_ROWS) & (at < n)
    lane_ok &= tl.load(group_at_ptr + at, mask=lane_ok, other=-1) == group[:, None]
    rows = tl.where(lane_ok, tl.load(order_ptr + at, mask=lane_ok, other=0), -1)
    ends = tl.load(ends_ptr + rows, mask=lane_ok, other=0)
    empty = group == batch
    prog_end = tl.where(empty, 1, tl.maximum(tl.max(ends, axis=1), 0))
    first_row = tl.load(order_ptr + offs_r, mask=opens, other=0)  # the smallest start of its program
    prog_start = tl.where(empty, 0, tl.load(starts_ptr + first_row, mask=opens, other=0))
    q_wide = tl.max(tl.load(q_wide_ptr + rows, mask=lane_ok, other=0).to(tl.int32), axis=1)
    tl.store(
        rows_ptr + program[:, None] * BLOCK_ROWS + offs_l[None, :],
        rows,
        mask=opens[:, None] & (offs_l[None, :] < BLOCK_ROWS),
    )
    tl.store(prog_batch_ptr + program, tl.where(empty, 0, group), mask=opens)
    tl.store(span_ptr + program * 2, prog_start, mask=opens)
    tl.store(span_ptr + program * 2 + 1, prog_end, mask=opens)
    tl.store(prog_q_wide_ptr + program, q_wide.to(tl.int8), mask=opens)
    # The order kernel's sort key. The empty rows' programs (the last ones) get 0, not their span's 1: either
    # way they rank last in program order, and 0 keeps them out of the live programs' lengths.
    tl.store(length_ptr + program, tl.where(empty, 0, prog_end - prog_start), mask=opens)
    tl.store(used_ptr, earlier + tl.sum(first, axis=0), mask=pid == tl.num_programs(0) - 1)


@triton.jit
def _store_span(span_ptr, narrow_span_ptr, wide_span_ptr, at, start, end, wide, mask):
    """Write (start, end) at program `at` of the schedule, and of the variant that applies ((0, 0) in the other)."""
    tl.store(span_ptr + at * 2, start, mask=mask)
    tl.store(span_ptr + at * 2 + 1, end, mask=mask)
    tl.store(narrow_span_ptr + at * 2, tl.where(wide, 0, start), mask=mask)
    tl.store(narrow_span_ptr + at * 2 + 1, tl.where(wide, 0, end), mask=mask)
    tl.store(wide_span_ptr + at * 2, tl.where(wide, start, 0), mask=mask)
    tl.store(wide_span_ptr + at * 2 + 1, tl.where(wide, end, 0), mask=mask)


@triton.jit
def _count_longer(length_p, offs_p, length_q, offs_q):
    """Of the programs q (one tile), per program p: those with longer spans, or as long and earlier."""
    before = (length_q[None, :] > length_p[:, None]) | (
        (length_q[None, :] == length_p[:, None]) & (offs_q[None, :] < offs_p[:, None])
    )
    return tl.sum(before.to(tl.int32), axis=1)


@triton.jit
def _count_longer_all(length_ptr, used, length_p, offs_p, BLOCK: tl.constexpr, TILE: tl.constexpr):
    """_count_longer over the used programs, TILE at a time (the last tile's places past `used` read length
    -1: shorter than any, never counted)."""
    place = tl.zeros([BLOCK], dtype=tl.int32)
    for q0 in range(0, used, TILE):
        offs_q = q0 + tl.arange(0, TILE)
        place += _count_longer(length_p, offs_p, tl.load(length_ptr + offs_q, mask=offs_q < used, other=-1), offs_q)
    return place


@triton.jit
def _lengths_around_in_order(length_ptr, used, p0, p1, length_min, length_max, SCAN: tl.constexpr):
    """(in_order, at_min_before, longer_after, at_max_after) of the used programs outside [p0, p1): whether
    those before are at most length_min long and those after at least length_max (or 0: the empty rows'
    programs); those before as long as length_min, and those after longer than length_max and as long.
    Reads SCAN programs at a time."""
    out_of_order = tl.zeros([SCAN], dtype=tl.int32)
    at_min_before = tl.zeros([SCAN], dtype=tl.int32)
    longer_after = tl.zeros([SCAN], dtype=tl.int32)
    at_max_after = tl.zeros([SCAN], dtype=tl.int32)
    for q0 in range(0, p0, SCAN):
        offs_q = q0 + tl.arange(0, SCAN)
        length_q = tl.load(length_ptr + offs_q, mask=offs_q < p0, other=0)
        out_of_order |= (length_q > length_min).to(tl.int32)
        at_min_before += (length_q == length_min).to(tl.int32)
    for q0 in range(p1, used, SCAN):
        offs_q = q0 + tl.arange(0, SCAN)
        length_q = tl.load(length_ptr + offs_q, mask=offs_q < used, other=0)
        out_of_order |= ((length_q > 0) & (length_q < length_max)).to(tl.int32)
        longer_after += (length_q > length_max).to(tl.int32)
        at_max_after += (length_q == length_max).to(tl.int32)
    return (
        tl.max(out_of_order, axis=0) == 0,
        tl.sum(at_min_before, axis=0),
        tl.sum(longer_after, axis=0),
        tl.sum(at_max_after, axis=0),
    )


@triton.jit
def schedule_order_kernel(
    length_ptr,
    used_ptr,
    programs,
    flags_ptr,  # schedule_programs_kernel's; int; int32 [2] (decode summary)
    rows_ptr,
    prog_batch_ptr,
    span_ptr,
    prog_q_wide_ptr,  # schedule_programs_kernel's outputs
    out_rows_ptr,
    out_batch_ptr,
    out_span_ptr,
    out_q_wide_ptr,  # the Schedule, by place
    narrow_rows_ptr,
    narrow_span_ptr,
    wide_rows_ptr,
    wide_span_ptr,
    BLOCK_ROWS: tl.constexpr,
    LANES: tl.constexpr,
    BLOCK: tl.constexpr,
    TILE: tl.constexpr,
    SCAN: tl.constexpr,
    WIDE: tl.constexpr,
    FAST_PATHS: tl.constexpr,
):
    p0 = tl.program_id(0) * BLOCK
    offs_p = p0 + tl.arange(0, BLOCK)
    mask_p = offs_p < programs
    used = tl.load(used_ptr)
    valid_p = offs_p < used  # programs past the used ones: no rows, span (0, 0)
    length_p = tl.load(length_ptr + offs_p, mask=valid_p, other=-1)
    # A used program's place: the used programs with longer spans, or as long and earlier; the others (the
    # empty rows' programs, last and 0 long, and the unused ones) keep theirs.
    live_p = length_p > 0
    if FAST_PATHS:
        # Lengths that do not decrease (a causal prefill: later rows, longer windows): the block's own programs
        # counted, the others follow from where they are. Tried where the block's live lengths do not
        # decrease, taken where the programs around them are in order too.
        place = _count_longer(length_p, offs_p, length_p, offs_p)
        length_prev = tl.load(length_ptr + offs_p - 1, mask=live_p & (offs_p > 0), other=0)
        in_order = tl.max((live_p & (length_p < length_prev)).to(tl.int32), axis=0) == 0
        length_min = tl.min(tl.where(live_p, length_p, 2**31 - 1), axis=0)
        length_max = tl.max(length_p, axis=0)
        at_min_before = tl.full([], 0, tl.int32)
        longer_after = tl.full([], 0, tl.int32)
        at_max_after = tl.full([], 0, tl.int32)
        if in_order:
            in_order, at_min_before, longer_after, at_max_after = _lengths_around_in_order(
                length_ptr, used, p0, p0 + BLOCK, length_min, length_max, SCAN
            )
        if in_order:
            # Before the block: none longer, the ones as long as the block's shortest; after it: every live one
            # longer than its longest, and the ones as long unless the program is the longest.
            place += (
                tl.where(length_p == length_min, at_min_before, 0)
                + longer_after
                + tl.where(length_p < length_max, at_max_after, 0)
            )
        else:
            place = _count_longer_all(length_ptr, used, length_p, offs_p, BLOCK, TILE)
    else:
        place = _count_longer_all(length_ptr, used, length_p, offs_p, BLOCK, TILE)
    place = tl.where(live_p, place, offs_p)
    start_p = tl.load(span_ptr + offs_p * 2, mask=valid_p, other=0)
    end_p = tl.load(span_ptr + offs_p * 2 + 1, mask=valid_p, other=0)
    offs_l = tl.arange(0, LANES)
    lanes = mask_p[:, None] & (offs_l[None, :] < BLOCK_ROWS)
    rows = tl.load(rows_ptr + offs_p[:, None] * BLOCK_ROWS + offs_l[None, :], mask=lanes & valid_p[:, None], other=-1)
    wide = ((tl.load(flags_ptr) | tl.load(flags_ptr + 1)) & WIDE) != 0
    out_lanes = out_rows_ptr + place[:, None] * BLOCK_ROWS + offs_l[None, :]
    tl.store(out_lanes, rows, mask=lanes)
    tl.store(narrow_rows_ptr + place[:, None] * BLOCK_ROWS + offs_l[None, :], tl.where(wide, -1, rows), mask=lanes)
    tl.store(wide_rows_ptr + place[:, None] * BLOCK_ROWS + offs_l[None, :], tl.where(wide, rows, -1), mask=lanes)
    tl.store(out_batch_ptr + place, tl.load(prog_batch_ptr + offs_p, mask=valid_p, other=0), mask=mask_p)
    tl.store(out_q_wide_ptr + place, tl.load(prog_q_wide_ptr + offs_p, mask=valid_p, other=0), mask=mask_p)
    _store_span(out_span_ptr, narrow_span_ptr, wide_span_ptr, place, start_p, end_p, wide, mask_p)


def build_schedule_triton(
    row_to_batch, starts, ends, batch: int, block_rows: int, q_wide, flags, scratch: Scratch, *, fast_paths: bool = True
) -> Schedule:
    """build_schedule in three launches (module docstring); buffers from `scratch`. fast_paths=False
    compiles the kernels without their ordered-input paths (tests: the general ranks on any input)."""
    n = row_to_batch.shape[0]
    programs = max_programs(n, batch, block_rows)
    i32 = torch.int32
    out = [
        scratch.empty((programs, block_rows), i32),
        scratch.empty(programs, i32),
        scratch.empty((programs, 2), i32),
        scratch.empty(programs, torch.int8),
    ]
    variants = tuple((scratch.empty((programs, block_rows), i32), scratch.empty((programs, 2), i32)) for _ in range(2))
    if n:
        order, group_at = scratch.empty(n, i32), scratch.empty(n, i32)
        first_at = scratch.empty(n, torch.int8)
        by_program = [
            scratch.empty((programs, block_rows), i32),
            scratch.empty(programs, i32),
            scratch.empty((programs, 2), i32),
            scratch.empty(programs, torch.int8),
        ]
        length, used = scratch.empty(programs, i32), scratch.empty(1, i32)
        lanes = triton.next_power_of_2(block_rows)
        schedule_rank_kernel[(triton.cdiv(n, RANK_BLOCK),)](
            row_to_batch,
            starts,
            ends,
            n,
            batch,
            order,
            group_at,
            first_at,
            BLOCK_ROWS=block_rows,
            BLOCK=RANK_BLOCK,
            TILE=RANK_TILE,
            SCAN=SCAN,
            FAST_PATHS=fast_paths,
        )
        schedule_programs_kernel[(triton.cdiv(n, BLOCK),)](
            order,
            group_at,
            first_at,
            n,
            batch,
            starts,
            ends,
            q_wide.view(torch.int8),
            *by_program,
            length,
            used,
            BLOCK_ROWS=block_rows,
            LANES=lanes,
            BLOCK=BLOCK,
            FLAGS=FLAGS,
        )
        schedule_order_kernel[(triton.cdiv(programs, RANK_BLOCK),)](
            length,
            used,
            programs,
            flags,
            *by_program,
            *out,
            variants[0][0],
            variants[0][1],
            variants[1][0],
            variants[1][1],
            BLOCK_ROWS=block_rows,
            LANES=lanes,
            BLOCK=RANK_BLOCK,
            TILE=RANK_TILE,
            SCAN=SCAN,
            WIDE=FLAG_WIDE,
            FAST_PATHS=fast_paths,
        )
    return Schedule(*out, variants=variants)
