"""Stage 4, certificate and repair: which scanned rows are exact, and an exact rescan of the rest, on
the device (no host decision in the common case; CUDA-graph capturable).

Certificate, per row (CONTRACT §4): the buffer did not overflow (appended <= capacity) and it kept
at least min(K, window) keys. Then the K-th best kept key is >= the threshold, so every key that
beats it was kept: the selection over the buffer is exact. A row that fails is a capacity event:
OVERFLOW or UNDERFILLED (only for rows without an input fault, which report that fault alone).

Device repair (repair=True). Up to `repair_rows` failing rows (the first ones by index) are rescanned
at once with a buffer that holds their whole window (capacity max_end: it cannot overflow) from a
safe threshold (the K-th best key of an overflowed row's selection, state.top[row, K - 1]: K real keys
of its window, so a lower bound of its true K-th best; none for an underfilled row); certified rows get their answer, status 0 and repaired = 1, the rest
SELECTOR_FAILURE. The slots are fixed: a launch over `repair_rows` padding rows when nothing failed
costs a few microseconds. Rows beyond that capacity keep their capacity bit (they publish nothing);
`complete_repair` (operator check=True, outside graph capture) rescans them on a synchronizing path.

Launches (runs_triton_stages): the certificate is one kernel (kernels/triton/certify.py) plus the
selection; the repair is the slot choice + gather (one kernel, kernels/triton/repair.py), the subset's
operands (one), the rescan (prepare, buffer, two scoring variants, its outputs), its selection and the
scatter back (one). The torch code here is their twin on other devices.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from .backend import CandidateScan, ScoringBackend
from .devices import runs_triton_stages
from .selection import NO_KEY, select_candidates
from .status import CAPACITY_EVENTS, RowStatus, set_status_bit
from .validation import PrefillProblem

#: Rows the device repair rescans per call (each with a buffer of the whole window, max_end keys).
REPAIR_ROWS = 16


@dataclass
class Certified:
    """The pipeline's state after the certificate: the selection so far and each row's status.

    top int64 [rows, K] sorted keys; status int32 [rows]; repaired int32 [rows]; the scan and its
    overflow bool [rows], from which a repair takes its safe thresholds."""

    top: torch.Tensor
    status: torch.Tensor
    repaired: torch.Tensor
    scan: CandidateScan
    overflow: torch.Tensor


def certify(problem: PrefillProblem, scan: CandidateScan, capacity: int, status: torch.Tensor) -> Certified:
    """Certificate bits of every row (module docstring) and the selection of its candidates."""
    if runs_triton_stages(problem.device):
        from .triton.certify import certificate_triton

        status, kept, overflow, repaired = certificate_triton(problem, scan.appended, capacity, status)
    else:
        status, kept, overflow, repaired = certificate_torch(problem, scan.appended, capacity, status)
    top = select_candidates(scan.keys, kept, scan.thresholds, problem.topk)
    return Certified(top=top, status=status, repaired=repaired, scan=scan, overflow=overflow)


def certificate_torch(problem: PrefillProblem, appended: torch.Tensor, capacity: int, status: torch.Tensor):
    """(status int32 with OVERFLOW / UNDERFILLED for rows without a bit, kept int64, overflow bool,
    repaired int32 zeros) [rows] of a scan's appended counts (module docstring), in torch ops; the
    Triton twin is kernels/triton/certify.py."""
    kept = appended.clamp(max=capacity)
    overflow = appended > capacity
    underfilled = ~overflow & (kept < problem.window_lengths.clamp(max=problem.topk))
    answerable = status == 0
    status = set_status_bit(status, overflow & answerable, RowStatus.OVERFLOW)
    status = set_status_bit(status, underfilled & answerable, RowStatus.UNDERFILLED)
    return status, kept, overflow, problem.scratch.zeros(problem.num_rows, torch.int32)


def _capacity_only(status: torch.Tensor) -> torch.Tensor:
    return (status != 0) & ((status & ~int(CAPACITY_EVENTS)) == 0)


def repair_on_device(problem: PrefillProblem, backend: ScoringBackend, state: Certified,
                     repair_rows: int = REPAIR_ROWS) -> None:
    """Rescan up to `repair_rows` capacity-event rows exactly (module docstring), updating `state`.
    The slot choice and the scatter back run as two Triton kernels where devices.runs_triton_stages
    says so (kernels/triton/repair.py), in torch ops elsewhere; the rescan is the backend's scan."""
    rows = problem.num_rows
    slots = min(rows, repair_rows)
    if slots == 0:
        return
    if runs_triton_stages(problem.device):
        from .triton.repair import repair_scatter_triton, repair_slots_triton

        chosen, picked, safe, gathered = repair_slots_triton(problem, state.status, state.overflow, state.top, slots)
        sub = replace(problem, **gathered, parent=problem, parent_rows=picked)
        capacity = max(sub.max_end, 1)
        scan = backend.scan_candidates(sub, safe, capacity)
        # capacity >= every window: nothing overflows, every appended key is kept
        top = select_candidates(scan.keys, scan.appended, scan.thresholds, sub.topk)
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
    for name, fixed in (("top", top),
                        ("status", torch.where(certified, 0, int(RowStatus.SELECTOR_FAILURE)).to(torch.int32)),
                        ("repaired", torch.ones_like(chosen, dtype=torch.int32))):
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
    return select_candidates(scan.keys, kept, scan.thresholds, sub.topk), certified
