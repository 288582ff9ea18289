"""The scoring kernels' schedule, built on the device (torch ops: no host round trip, capturable).

A program of the scoring kernels (scoring.py, scoring_gluon.py) owns up to BLOCK_ROWS rows of one
sequence and walks the union of their windows. The schedule says which:
    rows  int32 [programs, BLOCK_ROWS]  row indices, -1 padding; lanes fill from the first
    batch int32 [programs]              the rows' sequence
    span  int32 [programs, 2]           (smallest start, largest end) of the rows' windows
Rows are grouped by sequence and ordered by start inside it (consecutive rows of a causal prefill
share most keys), BLOCK_ROWS to a program, and the programs with the longest spans come first (the
tail of the grid is short work). Rows with an empty window (rows at fault, the first tokens of a
causal prefill) form programs of their own, last among the live ones, with span (0, 1): in dense
mode they write -inf across their rows (nothing else covers those rows), in scan mode they find
nothing. The grid has `max_programs` programs, a bound from shapes alone; the programs past the
ones used have no rows and span (0, 0), and do no work in either mode.

Cost: ~20 small launches over [rows] (a sort, a cumsum, scatters), independent of the window.
"""

from __future__ import annotations

import torch


def max_programs(rows: int, batch: int, block_rows: int) -> int:
    """Programs of a schedule of `rows` rows over `batch` sequences: every sequence, and the group
    of empty rows, wastes at most block_rows - 1 lanes."""
    if rows == 0:
        return 0
    groups = min(batch, rows) + 1
    return (rows + groups * (block_rows - 1)) // block_rows


def build_schedule(row_to_batch: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor, batch: int,
                   block_rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(rows, batch, span) of the module docstring for effective row metadata (int32 [rows] each;
    rows with an empty window have row_to_batch 0), on their device."""
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
    return (prog_rows[by_work].contiguous(), prog_batch[:programs][by_work].to(torch.int32).contiguous(),
            span[by_work].to(torch.int32).contiguous())


def build_row_schedule(row_to_batch: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor,
                       block_rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The schedule of a handful of rows (the repair's): one row a program, in row order, span =
    the row's window ((0, 0) for an empty one: no work). Five launches instead of build_schedule's
    twenty; for scan mode only (an empty row's dense columns are not written)."""
    n = row_to_batch.shape[0]
    prog_rows = torch.full((n, block_rows), -1, dtype=torch.int32, device=row_to_batch.device)
    prog_rows[:, 0] = torch.arange(n, dtype=torch.int32, device=row_to_batch.device)
    live = ends > starts
    span = torch.stack([torch.where(live, starts, 0), torch.where(live, ends, 0)], dim=1)
    return prog_rows, row_to_batch.to(torch.int32).contiguous(), span.to(torch.int32).contiguous()
