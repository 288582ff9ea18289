"""The LiteTopK method and the dense baseline, written once for every backend (CONTRACT.md §4).

LiteTopK, per row:
1. Calibrate: score a strided sample of the window (positions j with j % stride == 0, stride =
   max_end // sample_size) densely and take the K-th best sampled score T. At least K keys of
   the window score >= T, so every true top-K key does: "score >= T" is a safe threshold. A
   sample of fewer than K keys gives no threshold.
2. Fused scan: the backend appends every key >= the threshold to a bounded buffer of
   `capacity` keys and only ever raises the threshold to keys it has seen.
3. Certify: no overflow (appended <= capacity) and at least min(K, window) keys kept. Then the
   K-th best kept key is >= the threshold, so every key that beats it was kept: exact.
4. Select the K best keys (selection.py) and map pages.
Rows that fail step 3 are capacity events: with repair=True they are rescanned exactly (safe
threshold: the K-th best kept key of an overflowed row, none for an underfilled one; capacity:
the whole window) and counted in `repaired`; with repair=False they keep their status bit and
publish nothing. A rescan that still cannot certify sets SELECTOR_FAILURE.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .backend import ScoringBackend
from .result import TopKResult
from .selection import NO_KEY, kth_key, select_topk_dense, select_topk_keys
from .status import RowStatus
from .validation import PrefillProblem

#: Largest rescan buffer (keys) the repair stage allocates at once; rows are grouped to fit.
REPAIR_BUFFER_KEYS = 2**24


@dataclass(frozen=True)
class LiteTopKTuning:
    """Knobs of the LiteTopK method; the defaults are the production settings.

    sample_size: keys per row scored for calibration (the sample stride is max_end // sample_size).
    capacity_factor: candidate buffer = capacity_factor * K keys per row, unless
      candidate_capacity is given.
    calibration_offset: added to every calibrated threshold score. Fault injection for tests of
      the underfill certificate; production value 0.0.
    """

    sample_size: int = 4096
    capacity_factor: int = 8
    candidate_capacity: int | None = None
    calibration_offset: float = 0.0

    def capacity(self, topk: int) -> int:
        return self.candidate_capacity if self.candidate_capacity is not None else self.capacity_factor * topk


def calibrate(
    problem: PrefillProblem, backend: ScoringBackend, tuning: LiteTopKTuning
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(thresholds, ceilings) int64 keys [rows] from a strided sample of every window.

    The sample is every stride-th position (stride = max_end // sample_size), scored densely
    into [rows, max_end / stride]. With T = the K-th best sampled score, the threshold key
    admits exactly the scores >= T: at least K keys of the window score >= T, so every true
    top-K key does (a safe threshold). NO_KEY where a row has fewer than K sampled keys (or a
    NaN among them: the scan flags the row). The ceiling is the key of the sample's
    max(1, K / (2 stride))-th best score, an estimate above the true K-th best, which ranges the
    scan's threshold histogram (None without a sample).
    """
    k = problem.topk
    no_threshold = torch.full((problem.num_rows,), NO_KEY, dtype=torch.int64, device=problem.device)
    stride = problem.max_end // tuning.sample_size if tuning.sample_size > 0 else 0
    if stride < 2 or -(-problem.max_end // stride) < k:
        return no_threshold, None  # the sample would be (nearly) the whole window, or too small
    sample, _ = backend.score_dense(problem, stride)
    return backend.calibration_keys(sample, k, max(1, k // (2 * stride)), tuning.calibration_offset)


def _rescan_exact(problem: PrefillProblem, backend: ScoringBackend, safe: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(top keys [rows, K], certified bool [rows]) of every row of `problem` by a scan whose
    buffer holds the whole window, starting from the safe thresholds `safe`."""
    capacity = max(int(problem.window_lengths.max()), 1)
    group = max(1, REPAIR_BUFFER_KEYS // capacity)
    tops, certified = [], []
    for begin in range(0, problem.num_rows, group):
        rows = torch.arange(begin, min(begin + group, problem.num_rows), device=problem.device)
        sub = problem.subset(rows)
        scan = backend.scan_candidates(sub, safe[rows], capacity)
        kept = scan.appended.clamp(max=capacity)
        ok = (scan.appended <= capacity) & (kept >= sub.window_lengths.clamp(max=sub.topk)) & ~scan.nonfinite
        tops.append(select_topk_keys(scan.keys, sub.topk))
        certified.append(ok)
    return torch.cat(tops), torch.cat(certified)


def run_litetopk(
    problem: PrefillProblem, backend: ScoringBackend, *, repair: bool, tuning: LiteTopKTuning
) -> TopKResult:
    """The LiteTopK method (module docstring) on a validated problem."""
    k = problem.topk
    capacity = tuning.capacity(k)
    thresholds, ceilings = calibrate(problem, backend, tuning)
    scan = backend.scan_candidates(problem, thresholds, capacity, ceilings=ceilings)
    status = problem.row_status | torch.where(scan.nonfinite, int(RowStatus.NONFINITE), 0).to(torch.int32)
    kept = scan.appended.clamp(max=capacity)
    overflow = scan.appended > capacity
    underfilled = ~overflow & (kept < problem.window_lengths.clamp(max=k))
    # Capacity events only matter for rows that could be answered: a row failed for its input
    # (e.g. NONFINITE) reports that fault alone, as the dense path does.
    answerable = status == 0
    status |= torch.where(overflow & answerable, int(RowStatus.OVERFLOW), 0).to(torch.int32)
    status |= torch.where(underfilled & answerable, int(RowStatus.UNDERFILLED), 0).to(torch.int32)
    capacity_only = (status & ~int(RowStatus.OVERFLOW | RowStatus.UNDERFILLED)) == 0
    failing = (status != 0) & capacity_only
    top = backend.select_candidates(scan, k)  # launched before the host sync below, which it overlaps
    any_failed = bool(failing.any())  # the one host sync after the scan
    repaired = torch.zeros(problem.num_rows, dtype=torch.int32, device=problem.device)
    if repair and any_failed:
        failed = torch.nonzero(failing).flatten()
        safe = torch.where(overflow[failed], kth_key(scan.keys[failed], k), NO_KEY)
        fixed, certified = _rescan_exact(problem.subset(failed), backend, safe)
        top[failed] = fixed
        status[failed] = torch.where(certified, 0, int(RowStatus.SELECTOR_FAILURE)).to(torch.int32)
        repaired[failed] = 1
    return backend.assemble_result(top, problem.row_to_batch, problem.block_table, status, repaired, scan.appended)


def run_dense(problem: PrefillProblem, backend: ScoringBackend, *, selector: str) -> TopKResult:
    """The dense baseline: the whole score matrix, then an exact top-K of it."""
    scores, nonfinite = backend.score_dense(problem)
    top = select_topk_dense(scores, problem.topk, selector)
    status = problem.row_status | torch.where(nonfinite, int(RowStatus.NONFINITE), 0).to(torch.int32)
    repaired = torch.zeros(problem.num_rows, dtype=torch.int32, device=problem.device)
    return backend.assemble_result(top, problem.row_to_batch, problem.block_table, status, repaired,
                                   problem.window_lengths)
