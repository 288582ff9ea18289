"""Stage 2, calibration: a safe threshold for every row's fused scan from a strided sample (torch;
Triton twin of the order statistics in kernels/triton/calibration.py, the same bits).

Math. The sample is every stride-th position of the window (stride = max_end // sample_size, a
static bound: no host round trip), scored densely by the backend into [rows, ceil(max_end / stride)].
With T = the K-th best sampled score, at least K keys of the window score >= T, so every true top-K
key does: "score >= T" is a safe threshold (its score-floor key, selection.score_floor_keys). NO_KEY
where a row has fewer than K sampled keys or a NaN among them (the scan flags the row). The ceiling
is the key of the sample's max(1, K / (2 stride))-th best score, an estimate above the true K-th
best, which ranges the scan's threshold histogram (None without a sample).
"""

from __future__ import annotations

import torch

from .backend import ScoringBackend
from .devices import runs_triton_stages
from .selection import NO_KEY, score_floor_keys
from .validation import PrefillProblem


def calibrate(problem: PrefillProblem, backend: ScoringBackend, sample_size: int,
              offset: float = 0.0) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(thresholds, ceilings) int64 keys [rows] (module docstring); `offset` is added to every
    calibrated threshold score (fault injection for tests; 0.0 in production)."""
    k = problem.topk
    no_threshold = torch.full((problem.num_rows,), NO_KEY, dtype=torch.int64, device=problem.device)
    stride = problem.max_end // sample_size if sample_size > 0 else 0
    if stride < 2 or -(-problem.max_end // stride) < k:
        return no_threshold, None  # the sample would be (nearly) the whole window, or too small
    sample, _ = backend.score_dense(problem, stride)
    return calibration_keys(sample, k, max(1, k // (2 * stride)), offset)


def calibration_keys(sample: torch.Tensor, k: int, ceiling_rank: int,
                     offset: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(thresholds, ceilings) int64 keys [rows] of the calibration sample float32 [rows, n]: the
    score-floor key of the sample's k-th best score plus `offset`, and of its ceiling_rank-th best;
    NO_KEY where that k-th best is not finite or the sample row holds a NaN, and for a ceiling that is
    not finite."""
    if runs_triton_stages(sample.device):
        from .triton.calibration import calibration_keys_triton

        return calibration_keys_triton(sample, k, ceiling_rank, offset)
    return calibration_keys_torch(sample, k, ceiling_rank, offset)


def calibration_keys_torch(sample: torch.Tensor, k: int, ceiling_rank: int,
                           offset: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """calibration_keys in torch ops (any device)."""
    best = torch.topk(sample, max(k, ceiling_rank), dim=1, largest=True, sorted=True).values
    kth, ceiling = best[:, k - 1], best[:, ceiling_rank - 1]
    kth = kth + offset
    usable = torch.isfinite(kth) & ~torch.isnan(sample).any(dim=1)
    return (
        torch.where(usable, score_floor_keys(kth), NO_KEY),
        torch.where(usable & torch.isfinite(ceiling), score_floor_keys(ceiling), NO_KEY),
    )
