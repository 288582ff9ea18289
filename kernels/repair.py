"""Stage 4, repair: an exact rescan of the rows the certificate failed, on the device (no host decision
in the common case; CUDA-graph capturable); its bookkeeping in two Triton launches (CUDA) or torch ops
(elsewhere), the same bits (tested).

Layer: stage (pipeline.run_litetopk runs `repair_on_device`, and `complete_repair` with check=True).
Reading order: the slot choice's kernel and launcher (repair_slots_triton), the scatter's kernel and
launcher (repair_scatter_triton), then `repair_on_device`, which picks between them and its torch twin
(devices.runs_triton_stages), and `complete_repair`. The rescan itself is the backend's scan; the
subset's operands are the backend's (triton/subset.py for the Triton backend).

Device repair (repair=True). Up to `repair_rows` failing rows (the first ones by index) are rescanned
at once with a buffer that holds their whole window (capacity max_end: it cannot overflow) from a
safe threshold (the K-th best key of an overflowed row's selection, state.top[row, K - 1]: K real keys
of its window, so a lower bound of its true K-th best; none for an underfilled row); certified rows
get their answer, status 0 and repaired = 1, the rest SELECTOR_FAILURE. The slots are fixed: a launch
over `repair_rows` padding rows when nothing failed costs a few microseconds. Rows beyond that capacity
keep their capacity bit (they publish nothing); `complete_repair` (operator check=True, outside graph
capture) rescans them on a synchronizing path.

Math, per slot s of `slots` (the first capacity-event rows by index: status != 0 and no bit besides
OVERFLOW | UNDERFILLED, padded with `rows`, no row):
    repair_slots_kernel    chosen[s], and the subset problem of the chosen rows: q_fp4, q_scale,
                           weights, row_status gathered, (row_to_batch, starts, ends) zero for a
                           padding slot, and the safe threshold: an overflowed row's K-th best kept
                           key top[row, K - 1] (K real keys of its window: a lower bound of its true
                           K-th best), NO_KEY otherwise
    repair_scatter_kernel  per live slot: the rescan's certificate (not overflowed, at least
                           min(K, window) keys kept, no nonfinite score); top[row] = its answer,
                           status[row] = 0 if certified else SELECTOR_FAILURE, repaired[row] = 1
Tiling: one program per slot; slots are few (REPAIR_ROWS).

Launches where the Triton stages run: the slot choice + gather (one), the subset's operands (the
backend's; one for Triton), the rescan (prepare, buffer, two scoring variants, its outputs), its
selection and the scatter back (one).
"""

from __future__ import annotations

from dataclasses import replace

import torch
import triton
import triton.language as tl

from .backend import ScoringBackend
from .certify import Certified, certificate_torch
from .devices import runs_triton_stages
from .keys import NO_KEY, NO_KEY_C
from .problem import PrefillProblem
from .scratch import Scratch
from .selection import select_candidates
from .status import CAPACITY_EVENTS, RowStatus

#: Rows the device repair rescans per call (each with a buffer of the whole window, max_end keys).
REPAIR_ROWS = 16
BLOCK = 1024  # rows a slot's program reads per step when it looks for its row


@triton.jit
def repair_slots_kernel(
    status_ptr,
    overflow_ptr,
    top_ptr,
    rows,  # int32 [rows], int8 [rows], int64 [rows, TOPK]
    q_ptr,
    qs_ptr,
    w_ptr,
    rtb_ptr,
    starts_ptr,
    ends_ptr,
    row_status_ptr,  # the problem's rows
    chosen_ptr,
    picked_ptr,
    safe_ptr,  # int64 [slots] x3
    sub_q_ptr,
    sub_qs_ptr,
    sub_w_ptr,
    sub_rtb_ptr,
    sub_starts_ptr,
    sub_ends_ptr,
    sub_status_ptr,
    TOPK: tl.constexpr,
    CAPACITY: tl.constexpr,
    BLOCK: tl.constexpr,
):
    slot = tl.program_id(0)
    found = rows
    seen = 0
    for r0 in range(0, rows, BLOCK):
        offs_r = r0 + tl.arange(0, BLOCK)
        status = tl.load(status_ptr + offs_r, mask=offs_r < rows, other=0)
        failing = ((status != 0) & ((status & ~CAPACITY) == 0)).to(tl.int32)
        nth = seen + tl.cumsum(failing, axis=0) - 1  # the failing row's slot
        found = tl.minimum(found, tl.min(tl.where((failing != 0) & (nth == slot), offs_r, rows), axis=0))
        seen += tl.sum(failing, axis=0)
    live = found < rows
    row = tl.where(live, found, 0).to(tl.int64)
    tl.store(chosen_ptr + slot, found.to(tl.int64))
    tl.store(picked_ptr + slot, row)
    overflowed = tl.load(overflow_ptr + row) != 0
    tl.store(safe_ptr + slot, tl.where(overflowed, tl.load(top_ptr + row * TOPK + TOPK - 1), NO_KEY_C))
    offs_q = tl.arange(0, 4096)  # q_fp4 [64, 64] bytes
    tl.store(sub_q_ptr + slot * 4096 + offs_q, tl.load(q_ptr + row * 4096 + offs_q))
    offs_s = tl.arange(0, 256)  # q_scale [64, 4]
    tl.store(sub_qs_ptr + slot * 256 + offs_s, tl.load(qs_ptr + row * 256 + offs_s))
    offs_h = tl.arange(0, 64)
    tl.store(sub_w_ptr + slot * 64 + offs_h, tl.load(w_ptr + row * 64 + offs_h))
    tl.store(sub_rtb_ptr + slot, tl.where(live, tl.load(rtb_ptr + row), 0))
    tl.store(sub_starts_ptr + slot, tl.where(live, tl.load(starts_ptr + row), 0))
    tl.store(sub_ends_ptr + slot, tl.where(live, tl.load(ends_ptr + row), 0))
    tl.store(sub_status_ptr + slot, tl.load(row_status_ptr + row))


def repair_slots_triton(problem, status: torch.Tensor, overflow: torch.Tensor, top: torch.Tensor, slots: int):
    """(chosen, picked (chosen, 0 for a padding slot), safe: int64 [slots], and the subset's tensors by
    PrefillProblem field name) of the module docstring, in one launch."""
    scratch: Scratch = problem.scratch
    i32 = torch.int32
    chosen = scratch.empty(slots, torch.int64)
    picked = scratch.empty(slots, torch.int64)
    safe = scratch.empty(slots, torch.int64)
    sub = dict(
        q_fp4=scratch.empty((slots, 64, 64), torch.uint8),
        q_scale=scratch.empty((slots, 64, 4), torch.uint8),
        weights=scratch.empty((slots, 64), torch.float32),
        row_to_batch=scratch.empty(slots, i32),
        starts=scratch.empty(slots, i32),
        ends=scratch.empty(slots, i32),
        row_status=scratch.empty(slots, i32),
    )
    repair_slots_kernel[(slots,)](
        status,
        overflow.view(torch.int8),
        top,
        problem.num_rows,
        problem.q_fp4,
        problem.q_scale,
        problem.weights,
        problem.row_to_batch,
        problem.starts,
        problem.ends,
        problem.row_status,
        chosen,
        picked,
        safe,
        *sub.values(),
        TOPK=problem.topk,
        CAPACITY=int(CAPACITY_EVENTS),
        BLOCK=BLOCK,
    )
    return chosen, picked, safe, sub


@triton.jit
def repair_scatter_kernel(
    chosen_ptr,
    rows,
    sub_top_ptr,
    appended_ptr,
    nonfinite_ptr,
    starts_ptr,
    ends_ptr,
    capacity,
    top_ptr,
    status_ptr,
    repaired_ptr,  # the state, updated in place
    TOPK: tl.constexpr,
    SELECTOR_FAILURE: tl.constexpr,
):
    slot = tl.program_id(0)
    row = tl.load(chosen_ptr + slot)
    if row < rows:
        appended = tl.load(appended_ptr + slot)
        window = (tl.load(ends_ptr + slot) - tl.load(starts_ptr + slot)).to(tl.int64)
        kept = tl.minimum(appended, capacity)
        certified = (appended <= capacity) & (kept >= tl.minimum(window, TOPK)) & (tl.load(nonfinite_ptr + slot) == 0)
        offs = tl.arange(0, TOPK)
        tl.store(top_ptr + row * TOPK + offs, tl.load(sub_top_ptr + slot * TOPK + offs))
        tl.store(status_ptr + row, tl.where(certified, 0, SELECTOR_FAILURE))
        tl.store(repaired_ptr + row, 1)


def repair_scatter_triton(chosen: torch.Tensor, sub, scan, sub_top: torch.Tensor, capacity: int, state) -> None:
    """Write the rescan's answers into `state` (certify.Certified) in place: module docstring."""
    slots = chosen.shape[0]
    repair_scatter_kernel[(slots,)](
        chosen,
        state.status.shape[0],
        sub_top,
        scan.appended,
        scan.nonfinite.view(torch.int8),
        sub.starts,
        sub.ends,
        capacity,
        state.top,
        state.status,
        state.repaired,
        TOPK=sub.topk,
        SELECTOR_FAILURE=int(RowStatus.SELECTOR_FAILURE),
    )


def _capacity_only(status: torch.Tensor) -> torch.Tensor:
    return (status != 0) & ((status & ~int(CAPACITY_EVENTS)) == 0)


def repair_on_device(
    problem: PrefillProblem, backend: ScoringBackend, state: Certified, repair_rows: int = REPAIR_ROWS
) -> None:
    """Rescan up to `repair_rows` capacity-event rows exactly (module docstring), updating `state`.
    The slot choice and the scatter back run as two Triton kernels where devices.runs_triton_stages
    says so (repair_slots_triton, repair_scatter_triton), in torch ops elsewhere; the rescan is the
    backend's scan."""
    rows = problem.num_rows
    slots = min(rows, repair_rows)
    if slots == 0:
        return
    if runs_triton_stages(problem.device):
        chosen, picked, safe, gathered = repair_slots_triton(problem, state.status, state.overflow, state.top, slots)
        sub = replace(problem, **gathered, parent=problem, parent_rows=picked)
        capacity = max(sub.max_end, 1)
        scan = backend.scan_candidates(sub, safe, capacity)
        # capacity >= every window: nothing overflows, every appended key is kept
        top = select_candidates(scan.keys, scan.appended, scan.thresholds, sub.topk, sub.scratch)
        repair_scatter_triton(chosen, sub, scan, top, capacity, state)
        return
    failing = _capacity_only(state.status)
    index = torch.arange(rows, device=problem.device)
    chosen = torch.sort(torch.where(failing, index, rows)).values[:slots]  # failing rows first, then `rows`
    live = chosen < rows
    picked = torch.where(live, chosen, 0)
    # An overflowed row's K-th best kept key: K real keys of its window, so at most its true K-th best.
    safe = torch.where(state.overflow[picked], state.top[picked, problem.topk - 1], NO_KEY)
    top, certified = _rescan(problem.subset(picked, live), backend, safe)
    # Scatter back through a spare row (index `rows`) that takes the padding slots.
    target = torch.where(live, chosen, rows)
    for name, fixed in (
        ("top", top),
        ("status", torch.where(certified, 0, int(RowStatus.SELECTOR_FAILURE)).to(torch.int32)),
        ("repaired", torch.ones_like(chosen, dtype=torch.int32)),
    ):
        held = getattr(state, name)
        extended = torch.cat([held, held[:1]])
        extended.index_copy_(0, target, fixed)
        setattr(state, name, extended[:rows])


def complete_repair(problem: PrefillProblem, backend: ScoringBackend, state: Certified) -> None:
    """Rescan every capacity-event row left after the device repair, in groups of REPAIR_ROWS: reads
    the status on the host (a synchronizing path: never under CUDA graph capture)."""
    while bool(_capacity_only(state.status).any()):
        repair_on_device(problem, backend, state)


def _rescan(sub: PrefillProblem, backend: ScoringBackend, safe: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(top keys [rows, K], certified bool [rows]) of every row of `sub` by a scan whose buffer holds
    any window (max_end keys), from the safe thresholds `safe`."""
    capacity = max(sub.max_end, 1)
    scan = backend.scan_candidates(sub, safe, capacity)
    status, kept, _, _ = certificate_torch(sub, scan.appended, capacity, torch.zeros_like(sub.row_status))
    certified = (status == 0) & ~scan.nonfinite
    return select_candidates(scan.keys, kept, scan.thresholds, sub.topk, sub.scratch), certified
