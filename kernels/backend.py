"""What a scoring backend provides; everything else (calibration, certificate, selection, page
mapping, repair) is shared code in `pipeline.py` and `selection.py`.

A backend scores keys exactly as CONTRACT.md §1 says, in its own documented float32 order for
the head sum, and offers two ways to consume the scores:
- `score_dense`: the whole float32 [rows, max_end] matrix (column = position, -inf outside the
  row's window) for the dense baseline, or every stride-th column of it for calibration;
- `scan_candidates`: the fused LiteTopK scan: every key whose ordering key (selection.make_keys)
  is >= the row's threshold is appended to a bounded per-row buffer, and the threshold is only
  ever raised to a value no larger than the row's true K-th best key;
- `select_candidates`, `kth_largest_scores`, `calibration_keys` and `assemble_result`: the exact
  selections and the page mapping of the pipeline (shared torch code below and in selection.py
  unless the backend has a faster kernel for them; every implementation returns the same answer,
  bit for bit).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

import torch

from .result import TopKResult
from .selection import NO_KEY, assemble_result, score_floor_keys, select_topk_keys
from .validation import PrefillProblem


@dataclass(frozen=True)
class CandidateScan:
    """Result of `scan_candidates` for every row of a problem.

    keys int64 [rows, capacity]: appended ordering keys, NO_KEY past the end; appended int64
    [rows]: how many keys passed (more than capacity means the buffer overflowed and some were
    dropped); thresholds int64 [rows]: the final (tightened) threshold keys; nonfinite bool
    [rows]: a NaN/inf score was seen inside the row's window.
    """

    keys: torch.Tensor
    appended: torch.Tensor
    thresholds: torch.Tensor
    nonfinite: torch.Tensor


class ScoringBackend(abc.ABC):
    """One way to score FP4 keys; see the module docstring for the contract of each method."""

    name: str = "abstract"

    @abc.abstractmethod
    def check_device(self, device: torch.device) -> None:
        """Raise BackendUnavailableError when this backend cannot run on `device` here."""

    @abc.abstractmethod
    def score_dense(self, problem: PrefillProblem, stride: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """(scores float32 [rows, ceil(max_end / stride)], nonfinite bool [rows]): column c is
        position c * stride, -inf outside each window; nonfinite marks rows with a NaN/inf score
        among those positions of the window. stride > 1 is the calibration sample."""

    @abc.abstractmethod
    def scan_candidates(
        self, problem: PrefillProblem, thresholds: torch.Tensor, capacity: int,
        ceilings: torch.Tensor | None = None,
    ) -> CandidateScan:
        """Fused scan of every position of each window (see module doc).

        `ceilings` (int64 keys [rows], optional) estimates a key above each row's K-th best; a
        backend may use it to range its threshold histogram. It never affects which keys are
        exact, only how fast the threshold rises."""

    def select_candidates(self, scan: CandidateScan, k: int) -> torch.Tensor:
        """int64 [rows, k]: the k largest keys of each row of scan.keys (its first min(appended,
        capacity) entries; NO_KEY after them), sorted descending, NO_KEY padded. A backend may
        use scan.thresholds, which are at or below the k-th best key of every row whose scan
        certifies (other rows are repaired or publish nothing)."""
        return select_topk_keys(scan.keys, k)

    def kth_largest_scores(self, scores: torch.Tensor, ranks: tuple[int, int]) -> torch.Tensor:
        """float32 [rows, 2]: the ranks[i]-th largest (1-based) value of each row of float32
        `scores` [rows, n >= max(ranks)] (calibration: the sample's K-th best and its ceiling).
        Exact for rows without NaN (callers check NaN themselves); -0.0 may come back as +0.0."""
        best = torch.topk(scores, max(ranks), dim=1, largest=True, sorted=True).values
        return best[:, [rank - 1 for rank in ranks]]

    def calibration_keys(self, sample: torch.Tensor, k: int, ceiling_rank: int,
                         offset: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
        """(thresholds, ceilings) int64 keys [rows] of the calibration sample float32 [rows, n]
        (pipeline.calibrate): the score-floor key of the sample's k-th best score plus `offset`, and
        of its ceiling_rank-th best; NO_KEY where that k-th best is not finite or the sample row
        holds a NaN, and for a ceiling that is not finite."""
        kth, ceiling = self.kth_largest_scores(sample, (k, ceiling_rank)).unbind(dim=1)
        kth = kth + offset
        usable = torch.isfinite(kth) & ~torch.isnan(sample).any(dim=1)
        return (
            torch.where(usable, score_floor_keys(kth), NO_KEY),
            torch.where(usable & torch.isfinite(ceiling), score_floor_keys(ceiling), NO_KEY),
        )

    def assemble_result(self, top_keys: torch.Tensor, row_to_batch: torch.Tensor, block_table: torch.Tensor,
                        status: torch.Tensor, repaired: torch.Tensor, candidates: torch.Tensor) -> TopKResult:
        """selection.assemble_result: sorted keys [rows, K] -> TopKResult (split, page mapping,
        counts; rows with a status bit publish nothing)."""
        return assemble_result(top_keys, row_to_batch, block_table, status, repaired, candidates)
