"""The LiteTopK method and the dense baseline, written once for every backend (docs/contract.md §4, §6).

Layer: method (the operator and workspace.py run it; it runs the stages and takes a backend).

The stages, one file each (torch code beside its Triton twin and the line that picks between them,
devices.runs_triton_stages), every one on the inputs' device and the caller's current stream, with
sizes from shapes and static bounds only, so that a call needs no host round trip and can be
captured in a CUDA graph:
    validation.py       the host checks, then the row checks (row_checks.py: per-row faults, each
                        sequence's keys and the zeroed words of the stages' device accumulators; the
                        call's first launch), run by the operator before this module
    calibration.py      a safe threshold per row from a strided sample      (the backend scores it;
                        with LiteTopKTuning(calibration="scan") the scan takes it from its own first tiles)
    (backend)           the fused scan: candidates above the threshold      (scan_candidates)
    certify.py          the certificate, then the selection of the candidates (selection.py: exact top-K)
    repair.py           the exact rescan of capacity events, on the device
    assembly.py         keys -> values, raw and physical indices, counts, into caller-owned `out`
    dense_selection.py  the dense baseline's exact top-K of its score matrix (run_dense)
Rows that fail the certificate are capacity events: with repair=True the device repair rescans them
exactly (up to repair.REPAIR_ROWS per call; `check=True` finishes any beyond that on a synchronizing
path and then raises for faulty rows); with repair=False they keep their status bit and publish
nothing. Each stage runs inside a profiler range "litetopk.<stage>" for timelines (profiling.stage_range).
Every stage takes its explicit buffers from `problem.scratch` (scratch.py): the caller's workspace
when one is given, torch's allocator otherwise; the published result goes into `out` or new tensors.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from .assembly import assemble_result
from .backend import ScoringBackend
from .calibration import calibrate, sample_size_for
from .certify import certify
from .dense_selection import select_topk_dense, select_topk_exact
from .problem import PrefillProblem
from .profiling import stage_range
from .repair import REPAIR_ROWS, complete_repair, repair_on_device
from .result import TopKResult

CALIBRATIONS = ("sample", "scan")


#: LiteTopKTuning.dense_route_bytes' default: decode calls of up to 32 MiB of scores (128 rows x 65,536 keys, 256 x
#: 32,768) take the dense route (bench/JOURNAL.md 20)
DENSE_ROUTE_BYTES = 32 << 20


@dataclass(frozen=True)
class LiteTopKTuning:
    """Knobs of the LiteTopK method; the defaults are the production settings.

    calibration: where the scan's thresholds come from. "sample": a separate calibration stage
      scores a strided sample first (calibration.py); "scan": the scan calibrates itself from a
      sample of its own most recent key tiles, scored once (calibration.py, "In the scan"; backends
      that have no such scan raise BackendUnavailableError).
    sample_size: keys per row scored for calibration (the sample stride is max_end // sample_size,
      at most backend.MAX_SAMPLE_STRIDE; the default is measured in calibration.py). A decode-shaped
      call (a candidate buffer that holds every window: the Triton backend's paged mode) of few rows
      takes a denser sample, max(sample_size, min(8192, 262144 / rows rounded up to a power of two)):
      8,192 keys up to 32 rows, 4,096 up to 64 (calibration.sample_size_for). With
      calibration="scan": at least this many keys of each program's span (in whole key tiles).
    capacity_factor: candidate buffer = capacity_factor * K keys per row, unless
      candidate_capacity is given.
    calibration_offset: added to every calibrated threshold score. Fault injection for tests of
      the underfill certificate; production value 0.0.
    repair_rows: capacity-event rows the device repair rescans per call (repair.py).
    dense_route_bytes: a call whose candidate buffer holds the windows (a decode call: the Triton
      backend's paged mode) and whose score matrix (rows x max_end x 4 bytes) is at most this many bytes
      takes the dense route: the backend's dense scores, then the exact selector of the dense path
      (dense_selection.select_topk_exact: its radix selector on CUDA), no calibration, scan, certificate
      or repair; the same answer (`candidates` then counts each row's window). 0: never. The default,
      DENSE_ROUTE_BYTES, is measured (H100, bench/JOURNAL.md 20).
    """

    calibration: str = "sample"
    sample_size: int = 2048
    capacity_factor: int = 8
    candidate_capacity: int | None = None
    calibration_offset: float = 0.0
    repair_rows: int = REPAIR_ROWS
    dense_route_bytes: int = DENSE_ROUTE_BYTES

    def __post_init__(self):
        if self.calibration not in CALIBRATIONS:
            raise ValueError(f"calibration={self.calibration!r} is not one of {CALIBRATIONS}")
        if self.calibration == "scan" and self.sample_size < 1:
            raise ValueError(
                f"calibration='scan' needs sample_size >= 1 (got {self.sample_size}): the scan "
                "calibrates itself from that many keys"
            )
        if self.calibration == "scan" and self.calibration_offset != 0.0:
            raise ValueError("calibration_offset applies to calibration='sample' only (the calibration stage)")
        if self.dense_route_bytes < 0:
            raise ValueError(f"dense_route_bytes must be >= 0 (0: never), got {self.dense_route_bytes}")

    def capacity(self, topk: int) -> int:
        return self.candidate_capacity if self.candidate_capacity is not None else self.capacity_factor * topk

    def takes_dense_route(self, rows: int, max_end: int, holds_windows: bool) -> bool:
        """Whether a call of `rows` rows, window bound `max_end`, takes the dense route (dense_route_bytes)."""
        return holds_windows and rows * max_end * 4 <= self.dense_route_bytes


def run_litetopk(
    problem: PrefillProblem,
    backend: ScoringBackend,
    *,
    repair: bool,
    tuning: LiteTopKTuning,
    out: Mapping[str, torch.Tensor] | None = None,
    check: bool = False,
) -> TopKResult:
    """The LiteTopK method (module docstring) on a validated problem; at decode sizes, with
    LiteTopKTuning.dense_route_bytes, its dense route (run_dense with the exact selector)."""
    capacity = tuning.capacity(problem.topk)
    holds_windows = backend.buffers_hold_windows(problem)
    if tuning.takes_dense_route(problem.num_rows, problem.max_end, holds_windows):
        return run_dense(problem, backend, selector="exact", out=out, check=check)
    if tuning.candidate_capacity is None and holds_windows:
        capacity = max(capacity, problem.max_end)  # (a decode step: rows x max_end x 8 bytes, rows <= 4 x batch)
    # the call's sample: a denser one where the buffer holds the windows and the rows are few (calibration.py)
    sample_size = sample_size_for(tuning.sample_size, problem.num_rows, holds_windows)
    if backend.calibration_for(problem, tuning.calibration) == "scan":  # the scan's own sample sets its thresholds
        with stage_range("litetopk.scan"):
            scan = backend.scan_candidates(problem, None, capacity, sample_size=sample_size)
    else:
        with stage_range("litetopk.calibrate"):
            thresholds, ceilings = calibrate(problem, backend, sample_size, tuning.calibration_offset)
        if ceilings is None and tuning.candidate_capacity is None:
            # No sample (windows shorter than 2 x sample_size): the buffer holds any window, so that no
            # row needs a repair; at most 2 x sample_size keys a row.
            capacity = max(capacity, problem.max_end)
        with stage_range("litetopk.scan"):
            scan = backend.scan_candidates(problem, thresholds, capacity, ceilings=ceilings)
    with stage_range("litetopk.certify"):
        state = certify(problem, scan, capacity, backend.scoring_faults(problem, scan.nonfinite))
    # A buffer that holds any window cannot overflow, and a scan whose thresholds are lower bounds of the
    # K-th best keeps at least min(K, window) keys: no capacity event, so no repair is launched (unless a
    # test shifts the calibrated thresholds, calibration_offset).
    capacity_events = capacity < problem.max_end or tuning.calibration_offset != 0.0
    if repair and capacity_events:
        with stage_range("litetopk.repair"):
            repair_on_device(problem, backend, state, tuning.repair_rows)
            if check:  # a data-dependent number of rescans: outside the workspace (scratch.Scratch)
                with problem.scratch.from_allocator():
                    complete_repair(problem, backend, state)
    with stage_range("litetopk.assemble"):
        result = assemble_result(
            state.top, problem.row_to_batch, problem.block_table, state.status, state.repaired, scan.appended, out
        )
    return result.raise_for_status() if check else result


def run_dense(
    problem: PrefillProblem,
    backend: ScoringBackend,
    *,
    selector: str,
    out: Mapping[str, torch.Tensor] | None = None,
    check: bool = False,
) -> TopKResult:
    """The dense baseline: the whole score matrix, then an exact top-K of it (ties across the K-th
    place settled exactly: dense_selection.settle_ties, on the device where the Triton stages run).
    selector "exact" (LiteTopK's dense route): dense_selection.select_topk_exact."""
    with stage_range("litetopk.dense_score"):
        scores, nonfinite = backend.score_dense(problem)
    with stage_range("litetopk.dense_select"):
        if selector == "exact":  # LiteTopK's dense route: the stage's own exact selector
            top = select_topk_exact(scores, problem.topk, problem.scratch)
        else:
            top = select_topk_dense(scores, problem.topk, selector)
    status = backend.scoring_faults(problem, nonfinite)
    with stage_range("litetopk.assemble"):  # nothing repaired on the dense path
        result = assemble_result(
            top, problem.row_to_batch, problem.block_table, status, None, (problem.starts, problem.ends), out
        )
    return result.raise_for_status() if check else result
