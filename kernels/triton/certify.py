"""The scan's outputs and the certificate's bits in one kernel each: the Triton twins of the torch code
in kernels/triton/backend.py (finish_scan_torch) and kernels/certify.py (certificate_torch), the same
bits, tested. One launch each instead of ~10 small torch ops.

Math, per row:
    finish_scan_kernel  final threshold key = max(threshold, score_floor_key(raised)) where the scan
                        raised its threshold score (raised > thr), else the threshold; appended as
                        int64; nonfinite as bool (selection.score_floor_keys: ordered bits << 32)
    certificate_kernel  kept = min(appended, capacity); overflow = appended > capacity; underfilled =
                        not overflow and kept < min(window, K); rows without a bit (status 0) get
                        OVERFLOW / UNDERFILLED; repaired = 0
Tiling: BLOCK rows a program.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..status import RowStatus
from ..workspace import Scratch
from .keys import NO_KEY_C, _ordered_bits

BLOCK = 256


@triton.jit
def finish_scan_kernel(thresholds_ptr, threshold_stride, thr_ptr, raised_ptr, appended_ptr, nonfinite_ptr, rows,
                       final_ptr, appended64_ptr, nonfinite_out_ptr, BLOCK: tl.constexpr, HAS_THRESHOLDS: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < rows
    if HAS_THRESHOLDS:
        threshold = tl.load(thresholds_ptr + offs * threshold_stride, mask=mask, other=0)
        thr = tl.load(thr_ptr + offs, mask=mask, other=0.0)
    else:  # a self-calibrating scan's: every threshold NO_KEY, its score -inf (no thr buffer)
        threshold = tl.full([BLOCK], NO_KEY_C, tl.int64)
        thr = tl.full([BLOCK], float("-inf"), tl.float32)
    raised = tl.load(raised_ptr + offs, mask=mask, other=0.0)
    floor = _ordered_bits(raised) << 32
    tl.store(final_ptr + offs, tl.where(raised > thr, tl.maximum(threshold, floor), threshold), mask=mask)
    tl.store(appended64_ptr + offs, tl.load(appended_ptr + offs, mask=mask, other=0).to(tl.int64), mask=mask)
    tl.store(nonfinite_out_ptr + offs, (tl.load(nonfinite_ptr + offs, mask=mask, other=0) != 0).to(tl.int8), mask=mask)


def finish_scan_triton(thresholds: torch.Tensor | None, scan: dict, scratch: Scratch):
    """(final threshold keys int64, appended int64, nonfinite bool) [rows] of a scan's raw outputs
    (scoring.scan_buffers' dict after the scan), in one launch; `thresholds` may be strided, or None
    for NO_KEY everywhere (a self-calibrating scan: no thr buffer is read)."""
    rows = scan["raised"].shape[0]
    final = scratch.empty(rows, torch.int64)
    appended = scratch.empty(rows, torch.int64)
    nonfinite = scratch.empty(rows, torch.int8)
    if rows:
        finish_scan_kernel[(triton.cdiv(rows, BLOCK),)](
            thresholds if thresholds is not None else final, thresholds.stride(0) if thresholds is not None else 0,
            scan.get("thr", scan["raised"]), scan["raised"], scan["appended"], scan["nonfinite"], rows,  # (no "thr": not read)
            final, appended, nonfinite, BLOCK=BLOCK, HAS_THRESHOLDS=thresholds is not None)
    return final, appended, nonfinite.view(torch.bool)


@triton.jit
def certificate_kernel(status_ptr, appended_ptr, starts_ptr, ends_ptr, rows, capacity,
                       status_out_ptr, kept_ptr, overflow_ptr, repaired_ptr,
                       TOPK: tl.constexpr, OVERFLOW: tl.constexpr, UNDERFILLED: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < rows
    status = tl.load(status_ptr + offs, mask=mask, other=0)
    appended = tl.load(appended_ptr + offs, mask=mask, other=0)
    window = (tl.load(ends_ptr + offs, mask=mask, other=0) - tl.load(starts_ptr + offs, mask=mask, other=0)).to(tl.int64)
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
    """(status int32, kept int64, overflow bool, repaired int32 zeros) [rows]: kernels/certify.py's
    certificate_torch in one launch."""
    rows = problem.num_rows
    scratch: Scratch = problem.scratch
    out = (scratch.empty(rows, torch.int32), scratch.empty(rows, torch.int64), scratch.empty(rows, torch.int8),
           scratch.empty(rows, torch.int32))
    if rows:
        certificate_kernel[(triton.cdiv(rows, BLOCK),)](
            status, appended, problem.starts, problem.ends, rows, capacity, *out, TOPK=problem.topk,
            OVERFLOW=int(RowStatus.OVERFLOW), UNDERFILLED=int(RowStatus.UNDERFILLED), BLOCK=BLOCK)
    new_status, kept, overflow, repaired = out
    return new_status, kept, overflow.view(torch.bool), repaired
