"""Stage 2, calibration: a safe threshold for every row's fused scan from a strided sample (torch;
Triton twin of the order statistics in kernels/triton/calibration.py, the same bits).

Math. The sample is every stride-th position of the window (stride = min(max_end // sample_size,
MAX_SAMPLE_STRIDE), from a static bound: no host round trip), scored densely by the backend into
[rows, ceil(max_end / stride)].
With T = the K-th best sampled score, at least K keys of the window score >= T, so every true top-K
key does: "score >= T" is a safe threshold (its score-floor key, selection.score_floor_keys). NO_KEY
where a row has fewer than K sampled keys or a NaN among them (the scan flags the row). The ceiling
is the key of the sample's max(1, K / (2 stride))-th best score, an estimate above the true K-th
best, which ranges the scan's threshold histogram (None without a sample).

Cost. The scan raises its threshold itself as it goes (scoring.py), so the sample only sets where it
starts: a sparser sample costs less to score and order but starts the scan looser, so it appends
more candidates (about K x stride before the first raise). Measured on the H200 at Q = 8192
(bench/results/scan-tuning-h200-v12*.json): 2,048 samples instead of 4,096 save 0.45 ms a call at
65,536 keys (calibration 0.68 vs 1.15 ms; candidates 2,781 vs 2,228 of 4,096 for K = 512); at
196,608 keys a stride above 64 overflows the buffer of some rows (2,048 samples, stride 96: 4 rows
repaired, +1.7 ms), hence the cap: stride 64 (3,072 samples) saves 0.86 ms there.

The two parts (bench/probes/calibration_probe.py times them apart): the sample's scoring is tensor-core
work (~0.28 ms for 8,192 rows x 2,048 samples on the H200, in proportion to the samples); the order
statistics (calibration_keys: the Triton twin bisects each row only until ~128 values remain in its
bracket, then sorts those, ~50 us by its instruction count, where the previous 32-step bisection over
the whole row needed >= 0.18 ms) are the small part. Reasoning and limits: kernels/triton/calibration.py.

In the scan (LiteTopKTuning(calibration="scan"); pipeline.run_litetopk skips this stage). The same
lower bound from a subset, taken by the scan itself (kernels/triton/scan_calibration.py):
each program first scores n_sample contiguous key tiles (max(sample_size / 64, tiles /
MAX_SAMPLE_STRIDE) tiles, at most the candidate buffer) ending with its rows' earliest window end
(the most recent keys all of them see where the windows overlap), keeping every key, bisects a threshold with
at least K of them at or above it and the histogram's range from them, drops the sampled keys below
it and scans the rest. Nothing is scored twice and nothing is launched for it: the sample's scoring
and the order statistics above leave the call. A contiguous sample of the most recent keys and not a
spread one: a permuted tile order cost the Gluon scan loop 62-135 more instructions a step (its
addresses stop being affine, offline SASS), and real indexer scores lean to recent keys (the
benchmark's Gaussian data has no such lean). bench/probes/candidate_model.py models the candidates
of both: within 2 % of each other from 65,536 to 262,144 keys. Only the Triton backend has it.
"""

from __future__ import annotations

import torch

from .backend import ScoringBackend
from .devices import runs_triton_stages
from .selection import NO_KEY, score_floor_keys
from .validation import PrefillProblem
from .workspace import Scratch


def calibrate(problem: PrefillProblem, backend: ScoringBackend, sample_size: int,
              offset: float = 0.0) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(thresholds, ceilings) int64 keys [rows] (module docstring); `offset` is added to every
    calibrated threshold score (fault injection for tests; 0.0 in production)."""
    k = problem.topk
    stride = sample_stride(problem.max_end, sample_size, k)
    if stride == 0:
        return problem.scratch.full(problem.num_rows, NO_KEY, torch.int64), None
    sample, _ = backend.score_dense(problem, stride)
    return calibration_keys(sample, k, max(1, k // (2 * stride)), offset, scratch=problem.scratch)


MAX_SAMPLE_STRIDE = 64  # the sparsest sample that keeps the scan's candidates inside 8 K (module docstring)


def sample_stride(max_end: int, sample_size: int, k: int) -> int:
    """The stride of the calibration sample for the window bound `max_end`: max_end // sample_size,
    at most MAX_SAMPLE_STRIDE; 0: no sample (the sample would be (nearly) the whole window, stride
    < 2, or hold fewer than K keys)."""
    stride = min(max_end // sample_size, MAX_SAMPLE_STRIDE) if sample_size > 0 else 0
    return 0 if stride < 2 or -(-max_end // stride) < k else stride


def shape_changes(max_end: int, sample_size: int, k: int) -> list[int]:
    """The window bounds e <= max_end after which the calibration's shapes jump (sorted, max_end
    included): the largest e without a sample, and for each stride the largest e sampled with it.
    Between two of them every buffer of a call grows with e (the sample has ceil(e / stride)
    columns; without a sample the candidate buffer holds max(capacity, e) keys), so the largest
    call at any e <= max_end is the largest at one of these (workspace.workspace_bytes)."""
    if sample_size <= 0:
        return [max_end]
    ends = {max_end}
    unsampled = min(max_end, 2 * sample_size - 1)  # stride < 2
    for stride in range(2, min(max_end // sample_size, MAX_SAMPLE_STRIDE) + 1):
        # the last e of this stride (the capped stride holds every e from its first to max_end)
        last = max_end if stride == MAX_SAMPLE_STRIDE else min(max_end, (stride + 1) * sample_size - 1)
        if sample_stride(last, sample_size, k):
            ends.add(last)
        if sample_size < k:  # e in [stride * sample_size, last] goes without a sample while ceil(e / stride) < k
            unsampled = max(unsampled, min(last, stride * (k - 1)))
    ends.add(unsampled)
    return sorted(ends)


def calibration_keys(sample: torch.Tensor, k: int, ceiling_rank: int, offset: float = 0.0,
                     scratch: Scratch | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(thresholds, ceilings) int64 keys [rows] of the calibration sample float32 [rows, n]: the
    score-floor key of the sample's k-th best score plus `offset`, and of its ceiling_rank-th best;
    NO_KEY where that k-th best is not finite or the sample row holds a NaN, and for a ceiling that is
    not finite. `scratch`: where the Triton twin's output comes from (None: the allocator)."""
    if runs_triton_stages(sample.device):
        from .triton.calibration import calibration_keys_triton

        return calibration_keys_triton(sample, k, ceiling_rank, offset, scratch=scratch)
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
