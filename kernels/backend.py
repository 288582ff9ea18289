"""What a scoring backend provides; everything else (row checks, calibration, certificate and
repair, selection, assembly) is shared code, one file a stage, that `pipeline.py` runs.

Layer: backends (the interface every backend implements: reference.py, triton/, flydsl/; the stages
take a ScoringBackend). Imports only the types and utilities below it.

A backend scores keys exactly as docs/contract.md §1 says, in its own documented float32 order for
the head sum, and offers two ways to consume the scores:
- `score_dense`: the whole float32 [rows, max_end] matrix (column = position, -inf outside the
  row's window) for the dense baseline, or every stride-th column of it for calibration;
- `scan_candidates`: the fused LiteTopK scan: every key whose ordering key (keys.make_keys)
  is >= the row's threshold is appended to a bounded per-row buffer, and the threshold is only
  ever raised to a value no larger than the row's true K-th best key;
- `unsupported_rows`: the rows it cannot score exactly (RowStatus.UNSUPPORTED), or None;
  `scoring_faults` sets that bit and NONFINITE in the rows' status (a backend may do it in one launch).

The calibration sample's stride is part of the scan's contract: MAX_SAMPLE_STRIDE caps it for the
calibration stage (calibration.sample_stride) and for the self-calibrating scan alike (the Triton
scan kernels take it as an argument; calibration.py says how it was measured).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

import torch

from .errors import BackendUnavailableError
from .problem import PrefillProblem
from .status import RowStatus, set_status_bit

#: The sparsest calibration sample that keeps the scan's candidates inside 8 K (calibration.py, "Cost").
MAX_SAMPLE_STRIDE = 64


@dataclass(frozen=True)
class CandidateScan:
    """Result of `scan_candidates` for every row of a problem.

    keys int64 [rows, capacity]: appended ordering keys in the first min(appended, capacity) slots of a
    row, anything past them (never read: the Triton backend leaves them unwritten); appended int64
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
        self,
        problem: PrefillProblem,
        thresholds: torch.Tensor | None,
        capacity: int,
        ceilings: torch.Tensor | None = None,
        sample_size: int = 0,
    ) -> CandidateScan:
        """Fused scan of every position of each window (see module doc).

        `ceilings` (int64 keys [rows], optional) estimates a key above each row's K-th best; a
        backend may use it to range its threshold histogram. It never affects which keys are
        exact, only how fast the threshold rises. `sample_size` > 0 asks for a self-calibrating
        scan (thresholds None, no ceilings): it first scores about that many keys, the most recent
        keys its rows share, and takes its thresholds from them (calibration.py, "In the scan"); a
        backend that cannot raises BackendUnavailableError (self_calibration_unavailable)."""

    def sizing_calls(self, max_rows: int, max_batch: int) -> list[tuple[ScoringBackend, int, int]]:
        """The (backend, rows, sequences) of the calls whose workspaces bound every call's within these
        bounds (workspace.workspace_bytes runs each): one per scoring path the backend can take, at its
        largest shapes. A backend with one path: itself at the bounds. Each path's buffers_hold_windows is read
        once, at its largest call (workspace sizing), so it must give the same answer for that path's calls of
        fewer rows and sequences: a backend whose choice changes with the rows lists each choice here."""
        return [(self, max_rows, max_batch)]

    def buffers_hold_windows(self, problem: PrefillProblem) -> bool:
        """Whether LiteTopK should size the scan's candidate buffer to hold any window of `problem` (max_end
        keys a row) rather than capacity_factor * K: where the rows are few (a decode step), so the buffer
        is small, and several programs scan one row (their thresholds rise later). Default: no."""
        return False

    def calibration_for(self, problem: PrefillProblem, requested: str) -> str:
        """Where the scan's thresholds come from for `problem` when LiteTopKTuning asks for `requested`
        ("sample": the calibration stage; "scan": the scan's own sample): the requested one, or "sample"
        where this backend scores the problem with a scan that has no sample of its own (the same answer:
        both give lower bounds of the K-th best). Raises BackendUnavailableError where the backend has no
        self-calibrating scan at all."""
        if requested == "scan":
            raise self_calibration_unavailable(self)
        return requested

    def unsupported_rows(self, problem: PrefillProblem) -> torch.Tensor | None:
        """bool [rows]: rows this backend cannot score exactly (they get RowStatus.UNSUPPORTED and
        publish nothing), computed on the device; None when it scores every valid input."""
        return None

    def scoring_faults(self, problem: PrefillProblem, nonfinite: torch.Tensor) -> torch.Tensor:
        """int32 [rows] (a new tensor): problem.row_status with RowStatus.NONFINITE where bool
        `nonfinite` (the scoring's) holds and RowStatus.UNSUPPORTED where unsupported_rows does."""
        status = set_status_bit(problem.row_status, nonfinite, RowStatus.NONFINITE)
        unsupported = self.unsupported_rows(problem)
        return status if unsupported is None else set_status_bit(status, unsupported, RowStatus.UNSUPPORTED)


def self_calibration_unavailable(backend: ScoringBackend) -> BackendUnavailableError:
    """The error of a backend asked for a self-calibrating scan (scan_candidates' sample_size) that
    it does not implement."""
    return BackendUnavailableError(
        f"the {backend.name} backend has no self-calibrating scan (LiteTopKTuning(calibration='scan')); "
        "use calibration='sample' (the default) or the triton backend"
    )
