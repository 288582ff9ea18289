"""The scan's outputs: the Triton backend's scan state -> the CandidateScan every stage reads, in one
Triton launch (CUDA) or torch ops (elsewhere), the same bits (tested).

Layer: backends (triton/; backend.py's TritonBackend.scan_candidates calls `finish_scan`). Reading
order: the kernel, its launcher (finish_scan_triton), the torch twin (finish_scan_torch), then
`finish_scan`, the one line that picks between them (devices.runs_triton_stages).

Math, per row: final threshold key = max(threshold, score_floor_key(raised)) where the scan raised
its threshold score (raised > thr, thr the threshold key's score: scoring.prepare_scan_triton's, computed
again here), else the threshold; appended as int64; nonfinite as bool
(keys.score_floor_keys: ordered bits << 32). A self-calibrating scan has no thresholds: NO_KEY and a
threshold score of -inf everywhere. Tiling: BLOCK rows a program; one launch instead of ~10 small
torch ops.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..devices import runs_triton_stages
from ..keys import NO_KEY, NO_KEY_C, _ordered_bits, _scores_of_keys, score_floor_keys, split_keys
from ..scratch import Scratch

BLOCK = 256


@triton.jit
def finish_scan_kernel(
    thresholds_ptr,
    threshold_stride,
    raised_ptr,
    appended_ptr,
    nonfinite_ptr,
    rows,
    final_ptr,
    appended64_ptr,
    nonfinite_out_ptr,
    BLOCK: tl.constexpr,
    HAS_THRESHOLDS: tl.constexpr,
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < rows
    if HAS_THRESHOLDS:
        threshold = tl.load(thresholds_ptr + offs * threshold_stride, mask=mask, other=0)
    else:  # a self-calibrating scan's: every threshold NO_KEY
        threshold = tl.full([BLOCK], NO_KEY_C, tl.int64)
    thr = _scores_of_keys(threshold)  # the threshold's score, as the scan took it (-inf for NO_KEY)
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
            thresholds if thresholds is not None else final,
            thresholds.stride(0) if thresholds is not None else 0,
            scan["raised"],
            scan["appended"],
            scan["nonfinite"],
            rows,
            final,
            appended,
            nonfinite,
            BLOCK=BLOCK,
            HAS_THRESHOLDS=thresholds is not None,
        )
    return final, appended, nonfinite.view(torch.bool)


def finish_scan_torch(thresholds: torch.Tensor | None, scan: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(final threshold keys int64, appended int64, nonfinite bool) [rows] of a scan's raw outputs: the
    threshold, raised to the score-floor key of the scan's raised threshold score where it rose (torch;
    Triton twin: finish_scan_triton)."""
    raised = scan["raised"]
    if thresholds is None:  # a self-calibrating scan's: NO_KEY (-inf) everywhere
        thresholds = torch.full_like(raised, NO_KEY, dtype=torch.int64)
    thr = split_keys(thresholds)[0]  # the threshold's score, as the scan took it (-inf for NO_KEY)
    final = torch.maximum(thresholds, torch.where(raised > thr, score_floor_keys(raised), NO_KEY))
    return final, scan["appended"].long(), scan["nonfinite"].bool()


def finish_scan(thresholds: torch.Tensor | None, scan: dict, scratch: Scratch):
    """(final threshold keys int64, appended int64, nonfinite bool) [rows] of a scan's raw outputs
    (module docstring): the Triton twin where devices.runs_triton_stages says so, the torch twin
    elsewhere."""
    if runs_triton_stages(scan["raised"].device):
        return finish_scan_triton(thresholds, scan, scratch)
    return finish_scan_torch(thresholds, scan)
