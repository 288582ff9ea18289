"""Stage 3, certificate: which scanned rows are exact, in one Triton launch (CUDA) or torch ops
(elsewhere), the same bits (tested), then the selection of their candidates (selection.py).

Layer: stage (pipeline.run_litetopk runs `certify`; repair.py rescans the rows it fails). Reading
order: the kernel, its launcher (certificate_triton), the torch twin (certificate_torch), then
`certify`, which picks between them (devices.runs_triton_stages) and selects.

Certificate, per row (docs/contract.md §4): the buffer did not overflow (appended <= capacity) and it
kept at least min(K, window) keys. Then the K-th best kept key is >= the threshold, so every key that
beats it was kept: the selection over the buffer is exact. A row that fails is a capacity event:
OVERFLOW or UNDERFILLED (only for rows without an input fault, which report that fault alone).

Math, per row: kept = min(appended, capacity); overflow = appended > capacity; underfilled = not
overflow and kept < min(window, K); rows without a bit (status 0) get OVERFLOW / UNDERFILLED;
repaired = 0. Tiling (the kernel): BLOCK rows a program; one launch instead of ~10 small torch ops.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .backend import CandidateScan
from .devices import runs_triton_stages
from .problem import PrefillProblem
from .scratch import Scratch
from .selection import select_candidates
from .status import RowStatus, set_status_bit

BLOCK = 256


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


@triton.jit
def certificate_kernel(
    status_ptr,
    appended_ptr,
    starts_ptr,
    ends_ptr,
    rows,
    capacity,
    status_out_ptr,
    kept_ptr,
    overflow_ptr,
    repaired_ptr,
    TOPK: tl.constexpr,
    OVERFLOW: tl.constexpr,
    UNDERFILLED: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < rows
    status = tl.load(status_ptr + offs, mask=mask, other=0)
    appended = tl.load(appended_ptr + offs, mask=mask, other=0)
    window = (tl.load(ends_ptr + offs, mask=mask, other=0) - tl.load(starts_ptr + offs, mask=mask, other=0)).to(
        tl.int64
    )
    kept = tl.minimum(appended, capacity)
    overflow = appended > capacity
    underfilled = (appended <= capacity) & (kept < tl.minimum(window, TOPK))
    answerable = status == 0
    status |= tl.where(overflow & answerable, OVERFLOW, 0)
    status |= tl.where(underfilled & answerable, UNDERFILLED, 0)
    tl.store(status_out_ptr + offs, status, mask=mask)
    tl.store(kept_ptr + offs, kept, mask=mask)
    tl.store(overflow_ptr + offs, overflow.to(tl.int8), mask=mask)
    tl.store(repaired_ptr + offs, tl.zeros([BLOCK], tl.int32), mask=mask)


def certificate_triton(problem, appended: torch.Tensor, capacity: int, status: torch.Tensor):
    """(status int32, kept int64, overflow bool, repaired int32 zeros) [rows]: certificate_torch in one
    launch."""
    rows = problem.num_rows
    scratch: Scratch = problem.scratch
    out = (
        scratch.empty(rows, torch.int32),
        scratch.empty(rows, torch.int64),
        scratch.empty(rows, torch.int8),
        scratch.empty(rows, torch.int32),
    )
    if rows:
        certificate_kernel[(triton.cdiv(rows, BLOCK),)](
            status,
            appended,
            problem.starts,
            problem.ends,
            rows,
            capacity,
            *out,
            TOPK=problem.topk,
            OVERFLOW=int(RowStatus.OVERFLOW),
            UNDERFILLED=int(RowStatus.UNDERFILLED),
            BLOCK=BLOCK,
        )
    new_status, kept, overflow, repaired = out
    return new_status, kept, overflow.view(torch.bool), repaired


def certificate_torch(problem: PrefillProblem, appended: torch.Tensor, capacity: int, status: torch.Tensor):
    """(status int32 with OVERFLOW / UNDERFILLED for rows without a bit, kept int64, overflow bool,
    repaired int32 zeros) [rows] of a scan's appended counts (module docstring), in torch ops; the
    Triton twin is certificate_triton."""
    kept = appended.clamp(max=capacity)
    overflow = appended > capacity
    underfilled = ~overflow & (kept < problem.window_lengths.clamp(max=problem.topk))
    answerable = status == 0
    status = set_status_bit(status, overflow & answerable, RowStatus.OVERFLOW)
    status = set_status_bit(status, underfilled & answerable, RowStatus.UNDERFILLED)
    return status, kept, overflow, problem.scratch.zeros(problem.num_rows, torch.int32)


def certify(problem: PrefillProblem, scan: CandidateScan, capacity: int, status: torch.Tensor) -> Certified:
    """Certificate bits of every row (module docstring) and the selection of its candidates."""
    if runs_triton_stages(problem.device):
        status, kept, overflow, repaired = certificate_triton(problem, scan.appended, capacity, status)
    else:
        status, kept, overflow, repaired = certificate_torch(problem, scan.appended, capacity, status)
    top = select_candidates(scan.keys, kept, scan.thresholds, problem.topk, problem.scratch)
    return Certified(top=top, status=status, repaired=repaired, scan=scan, overflow=overflow)
