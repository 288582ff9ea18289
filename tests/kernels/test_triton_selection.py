"""The Triton selections (kernels/triton/selection.py) against a plain sort of each row.

Runs the real kernels in Triton's CPU interpreter without a GPU (tests/conftest.py), compiled with
one. The candidate top-K: both of its paths, the compacted one (at most 2 K keys at or above the
row's threshold) and the whole-row one (no threshold, or too many keys above it), rows with fewer
than K kept keys, an empty row, and stale keys past `kept` that must be ignored. The calibration's
order statistics: ties, signed zeros, infinities and a width that is not a power of two.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from litetopk.kernels.selection import NO_KEY, make_keys
from litetopk.kernels.triton.selection import kth_largest_scores_triton, select_topk_candidates_triton

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
K = 512
CAPACITY = 2048  # > 2 K: the kernel has both paths


def ref_top_keys(row_keys: list[int], k: int) -> list[int]:
    """The k largest keys, descending, NO_KEY padded: Python's sort, independent of torch.topk."""
    top = sorted(row_keys, reverse=True)[:k]
    return top + [NO_KEY] * (k - len(top))


def random_buffer(rng: np.random.Generator, kept: list[int]) -> torch.Tensor:
    """Distinct ordering keys of random float32 scores (some tied) at distinct positions; entries
    past kept[r] hold stale random keys (the kernel must read only the first kept[r])."""
    rows = len(kept)
    scores = torch.from_numpy(rng.standard_normal((rows, CAPACITY)).astype(np.float32))
    scores[:, ::7] = scores[:, :1]  # ties in score: the position decides
    positions = torch.from_numpy(np.stack([rng.permutation(1 << 20)[:CAPACITY] for _ in range(rows)]))
    return make_keys(scores, positions)


# name -> (kept per row, threshold rank per row: the threshold is the row's (rank)-th best kept key,
#          None for no threshold (NO_KEY))
CASES = {
    "compacted: threshold at the K-th key": ([CAPACITY, 1500], [K, K]),
    "compacted: threshold below the K-th key": ([CAPACITY, 1800], [K + 300, 2 * K]),
    "whole row: no threshold": ([CAPACITY, 1200], [None, None]),
    "whole row: more than 2K keys above the threshold": ([CAPACITY, CAPACITY], [2 * K + 1, CAPACITY]),
    "fewer than K kept, and an empty row": ([300, 0], [None, None]),
}


@pytest.mark.interpret
@pytest.mark.parametrize("name", list(CASES))
def test_select_topk_candidates_equals_a_sort(name, seed):
    kept, ranks = CASES[name]
    keys = random_buffer(np.random.default_rng(seed), kept)
    live_rows = [sorted(keys[r, :kept[r]].tolist(), reverse=True) for r in range(len(kept))]
    thresholds = torch.tensor([NO_KEY if rank is None else live_rows[r][rank - 1] for r, rank in enumerate(ranks)])
    got = select_topk_candidates_triton(keys.to(DEVICE), torch.tensor(kept).to(DEVICE), thresholds.to(DEVICE), K)
    assert got.shape == (len(kept), K), name
    for r in range(len(kept)):
        want = ref_top_keys(live_rows[r], K)
        assert got[r].tolist() == want, f"{name}: row {r} (kept {kept[r]}, threshold rank {ranks[r]})"


def sample_rows(rng: np.random.Generator, width: int) -> torch.Tensor:
    """Calibration-like samples: random scores; a row mostly outside its window (-inf); one of
    few distinct values (ties); signed zeros; a row with a few +inf."""
    rows = torch.from_numpy(rng.standard_normal((5, width)).astype(np.float32))
    rows[1, : width - 600] = float("-inf")
    rows[2] = rows[2].mul(3).round()
    rows[3, ::2] = -0.0
    rows[3, 1::2] = 0.0
    rows[3, :100] = torch.from_numpy(rng.standard_normal(100).astype(np.float32))
    rows[4, :20] = float("inf")
    return rows


@pytest.mark.interpret
@pytest.mark.parametrize("width", [3000, 4096])
def test_kth_largest_scores_equals_a_sort(width, seed):
    scores = sample_rows(np.random.default_rng(seed), width)
    ranks = (K, 16)
    got = kth_largest_scores_triton(scores.to(DEVICE), ranks).cpu()
    for r in range(scores.shape[0]):
        ordered = sorted(scores[r].tolist(), reverse=True)
        want = [ordered[rank - 1] + 0.0 for rank in ranks]  # -0.0 comes back as +0.0
        assert got[r].tolist() == want, f"width {width}, row {r}: got {got[r].tolist()}, want {want}"
