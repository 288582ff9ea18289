"""The calibration's order statistics kernel (kernels/calibration.py: bisection over the row
until the bracket holds <= BAND values, a compaction, a sort of the band) against the contract,
calibration_keys_torch, bit for bit, and against Python's sort: fresh random samples whose rows take
every path (a band built after some steps; no step at all, the whole row already within BAND; the
bracket shrunk to one value by ties, no band), with NaN and infinities, signed zeros, widths that
are not powers of two, both ranks (K and the ceiling's) from 1 up to the width, and small bands
(many steps) as well as the launcher's default."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from litetopk.kernels.calibration import (
    BAND_PER_THREAD,
    calibration_keys_torch,
    calibration_keys_triton,
    kth_largest_scores_triton,
    order_tiling,
)
from litetopk.kernels.keys import NO_KEY

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def ref_kth_largest(row: list[float], rank: int) -> float:
    """The rank-th largest of a NaN-free row by Python's sort (-0.0 comes back as +0.0)."""
    return sorted(row, reverse=True)[rank - 1] + 0.0


ROW_KINDS = (
    "normal",
    "few values",
    "one value",
    "signed zeros",
    "mostly -inf",
    "some +inf",
    "a NaN",
    "wide range",
    "adjacent floats",
)


def adjacent_floats(rng: np.random.Generator, width: int, k: int, band: int) -> torch.Tensor:
    """A row whose bracket for rank k ends two values wide: the K-th best is 1 + 1 ulp, k - 1 values
    are 1 + 3 ulp, band - 1 are 1.0 (with 1 + 1 ulp: band values in [1, 1 + 1 ulp]), the rest below."""
    ulp = np.nextafter(np.float32(1), np.float32(2)) - np.float32(1)
    row = -1 - np.abs(rng.standard_normal(width)).astype(np.float32)
    if width >= k + band:
        row[: k - 1], row[k - 1], row[k : k - 1 + band] = 1 + 3 * ulp, 1 + ulp, 1.0
    return torch.from_numpy(rng.permutation(row))


def sample_rows(rng: np.random.Generator, width: int, k: int, band: int, kinds=ROW_KINDS) -> torch.Tensor:
    """float32 [len(kinds), width]: one calibration-like row of each kind, at random scales (`k`,
    `band`: the rank and band the adjacent-floats row is made for)."""
    rows = torch.from_numpy(rng.standard_normal((len(kinds), width)).astype(np.float32))
    rows *= torch.from_numpy(np.exp2(rng.integers(-8, 9, (len(kinds), 1))).astype(np.float32))
    for r, kind in enumerate(kinds):
        if kind == "few values":  # ties across the bracket: the band holds equal values
            rows[r] = rows[r].mul(2).round()
        elif kind == "one value":  # the bracket shrinks to one value while it holds the whole row
            rows[r] = float(rng.standard_normal())
        elif kind == "signed zeros":
            rows[r, rng.permutation(width)[: width // 2]] = -0.0
            rows[r, rng.permutation(width)[: width // 4]] = 0.0
        elif kind == "mostly -inf":  # outside the window
            rows[r, rng.permutation(width)[: width - width // 5]] = float("-inf")
        elif kind == "some +inf":
            rows[r, rng.permutation(width)[: int(rng.integers(1, 20))]] = float("inf")
        elif kind == "a NaN":
            rows[r, int(rng.integers(width))] = float("nan")
        elif kind == "wide range":  # scores over many binades: the bisection's exponent steps
            rows[r] *= torch.from_numpy(np.exp2(rng.integers(-60, 60, width)).astype(np.float32))
        elif kind == "adjacent floats":
            rows[r] = adjacent_floats(rng, width, k, band)
    return rows


# name -> (width, K, ceiling rank, band: None for the launcher's default, row values a thread)
CASES = {
    "K 512, ceiling 16, width 3000, default band": (3000, 512, 16, None, 64),
    "K 512, ceiling 8, width 2049, band 32, 16 values a thread": (2049, 512, 8, 32, 16),
    "K 1024, ceiling 1, width 1537, band 16": (1537, 1024, 1, 16, 64),
    "K 64, ceiling 64, width 100: the row within the band": (100, 64, 64, None, 64),
    "K = width, ceiling 3, width 700, band 64, 32 values a thread": (700, 700, 3, 64, 32),
}


def default_band(width: int, per_thread: int) -> int:
    """The launcher's band for rows of `width` values, `per_thread` of them a thread."""
    return BAND_PER_THREAD * order_tiling(width, per_thread)[1]


@pytest.mark.interpret
@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("offset", [0.0, 0.75])
def test_calibration_keys_equal_the_torch_contract(name, offset, seed):
    width, k, ceiling_rank, band, per_thread = CASES[name]
    scores = sample_rows(np.random.default_rng(seed), width, k, band or default_band(width, per_thread))
    want = calibration_keys_torch(scores, k, ceiling_rank, offset)
    got = calibration_keys_triton(scores.to(DEVICE), k, ceiling_rank, offset, band=band, per_thread=per_thread)
    for field, w, g in zip(("thresholds", "ceilings"), want, got):
        for r, kind in enumerate(ROW_KINDS):
            assert g[r].item() == w[r].item(), (
                f"{name}, offset {offset}, {kind} row: {field} {g[r].item()} vs {w[r].item()}"
            )
    nan_row = ROW_KINDS.index("a NaN")
    assert want[0][nan_row] == NO_KEY and want[1][nan_row] == NO_KEY, "a row holding a NaN gets no keys"


@pytest.mark.interpret
@pytest.mark.parametrize("name", list(CASES))
def test_kth_largest_scores_equal_a_sort(name, seed):
    width, k, ceiling_rank, band, per_thread = CASES[name]
    kinds = tuple(kind for kind in ROW_KINDS if kind != "a NaN")
    scores = sample_rows(np.random.default_rng(seed), width, k, band or default_band(width, per_thread), kinds)
    got = kth_largest_scores_triton(scores.to(DEVICE), (k, ceiling_rank), band=band, per_thread=per_thread).cpu()
    for r, kind in enumerate(kinds):
        want = [ref_kth_largest(scores[r].tolist(), rank) for rank in (k, ceiling_rank)]
        assert got[r].tolist() == want, f"{name}, {kind} row: got {got[r].tolist()}, want {want}"


@pytest.mark.interpret
def test_ranks_outside_the_row_are_refused():
    scores = torch.zeros(2, 100, device=DEVICE)
    for ranks in ((101, 1), (4, 0)):
        with pytest.raises(ValueError, match="1 <= rank <= width"):
            kth_largest_scores_triton(scores, ranks)
