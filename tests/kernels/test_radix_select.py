"""The radix-select candidate top-K (kernels/triton/radix_select.py) against torch's top-K of each
row's passing keys (selection.select_topk_keys), bit for bit, at both supported K.

Runs the real kernel in Triton's CPU interpreter where no GPU exists (tests/conftest.py). Each case
draws a buffer of ordering keys (selection.make_keys of random float32 scores at distinct random
positions, stale keys past `kept`) and thresholds as the scan makes them (score floors at or below
the K-th best kept key), shaped to reach one path of the kernel: the compacted scratch row (at
most 2 K passing keys) or the whole row, zero / one / several radix passes, the bit-0 pass.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from litetopk.kernels.selection import NO_KEY, make_keys, score_floor_keys, select_topk_keys
from litetopk.kernels.triton.radix_select import select_topk_candidates_radix
from litetopk.kernels.triton.selection import select_topk_candidates_triton

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def ref_select(keys: torch.Tensor, kept: torch.Tensor, thresholds: torch.Tensor, k: int) -> torch.Tensor:
    """select_topk_keys over each row's first kept[r] keys at or above thresholds[r]."""
    live = torch.arange(keys.shape[1])[None, :] < kept[:, None]
    return select_topk_keys(torch.where(live & (keys >= thresholds[:, None]), keys, NO_KEY), k)


def buffer_of(scores: np.ndarray, rng: np.random.Generator) -> torch.Tensor:
    """Ordering keys of float32 scores [rows, capacity] at distinct random positions per row."""
    rows, capacity = scores.shape
    positions = np.stack([rng.choice(1 << 22, capacity, replace=False) for _ in range(rows)])
    return make_keys(torch.from_numpy(scores.astype(np.float32)), torch.from_numpy(positions))


def floor_at_rank(keys: torch.Tensor, kept: torch.Tensor, rank: int | None) -> torch.Tensor:
    """Per row: the score floor of its rank-th best kept key (as the scan's thresholds are), or
    NO_KEY for rank None or rows with fewer kept keys."""
    out = []
    for r in range(keys.shape[0]):
        row = torch.sort(keys[r, : int(kept[r])], descending=True).values
        if rank is None or row.numel() < rank:
            out.append(NO_KEY)
        else:  # the key's high 32 bits are its ordered score bits: floor = those bits, lowest position part
            out.append(int(row[rank - 1]) & ~0xFFFFFFFF)
    return torch.tensor(out, dtype=torch.int64)


def gaussian(rng, rows, capacity, k):
    return rng.standard_normal((rows, capacity))


def tail_of_window(rng, rows, capacity, k):
    """Scores like the scan's candidates: the top of a window of normal scores (one binade)."""
    return 2.5 + np.abs(rng.standard_normal((rows, capacity))) * 0.6


def tied_scores(rng, rows, capacity, k):
    """Heavy ties: 7 distinct scores; the K-th key is decided by positions (the low 32 bits)."""
    return rng.integers(-3, 4, (rows, capacity)).astype(np.float64)


def signed_zeros(rng, rows, capacity, k):
    """Half -0.0, half +0.0 (make_keys folds them into one score) and some negative scores."""
    scores = np.where(rng.random((rows, capacity)) < 0.5, -0.0, 0.0)
    scores[:, ::5] = -np.abs(rng.standard_normal((rows, len(range(0, capacity, 5)))))
    return scores


def one_bucket(rng, rows, capacity, k):
    """All keys but one in the lowest first-pass bucket: one huge score stretches the span."""
    scores = 1.0 + rng.random((rows, capacity)) * 1e-6
    scores[:, 3] = 3e38
    return scores


def negative(rng, rows, capacity, k):
    return -np.exp(rng.standard_normal((rows, capacity)) * 4)


# name -> (scores, kept per row as a fraction of capacity or an int, threshold rank in units of k or None)
CASES = {
    "scan thresholds, compacted (<= 2K pass)": (tail_of_window, [1.0, 0.6], 1.2),
    "threshold at the K-th key": (gaussian, [0.8, 0.5], 1.0),
    "no threshold, whole row (> 2K pass)": (gaussian, [1.0, 0.75], None),
    "threshold below 2K keys: whole row": (gaussian, [1.0, 1.0], 2.5),
    "heavy ties in score, positions decide": (tied_scores, [1.0, 0.6], 1.3),
    "-0.0 and +0.0 fold, negative scores": (signed_zeros, [1.0, 0.7], 1.1),
    "all keys in one first-pass bucket": (one_bucket, [0.6, 1.0], 1.3),
    "negative scores only": (negative, [0.9, 0.4], 1.5),
    "fewer than K kept, and an empty row": (gaussian, [300, 0], None),
    "exactly K kept": (gaussian, ["k", "k"], 1.0),
}


# K = 1024 on the cases whose shape depends on K (the interpreter's tl.sort of 1024 keys is slow).
AT_1024 = ["scan thresholds, compacted (<= 2K pass)", "no threshold, whole row (> 2K pass)",
           "heavy ties in score, positions decide", "all keys in one first-pass bucket", "exactly K kept"]


@pytest.mark.interpret
@pytest.mark.parametrize("name, k", [(name, 512) for name in CASES] + [(name, 1024) for name in AT_1024])
def test_radix_select_equals_torch_topk(name, k, seed):
    make_scores, kept_spec, rank = CASES[name]
    rng = np.random.default_rng(seed)
    capacity = 3 * k
    keys = buffer_of(make_scores(rng, 2, capacity, k), rng)
    kept = torch.tensor([k if f == "k" else (f if isinstance(f, int) else int(f * capacity)) for f in kept_spec])
    thresholds = floor_at_rank(keys, kept, None if rank is None else int(rank * k))
    got = select_topk_candidates_radix(keys.to(DEVICE), kept.to(DEVICE), thresholds.to(DEVICE), k)
    want = ref_select(keys, kept, thresholds, k)
    assert got.dtype == torch.int64 and got.shape == (2, k), name
    for r in range(2):
        assert torch.equal(got[r].cpu(), want[r]), f"{name}, K={k}: row {r} (kept {int(kept[r])})"


@pytest.mark.interpret
def test_radix_select_equals_the_bitonic_kernel_and_writes_out(seed):
    """The same keys as select_topk_candidates_triton; `out` with a row stride is written in place,
    its other columns untouched; int32 kept; thresholds at score floors from score_floor_keys."""
    rng = np.random.default_rng(seed)
    k, capacity = 512, 1536
    scores = rng.standard_normal((2, capacity)).astype(np.float32)
    keys = buffer_of(scores, rng)
    kept = torch.tensor([capacity, 700], dtype=torch.int32)
    kth = torch.tensor([np.sort(scores[r, : int(kept[r])])[::-1][k + 40] for r in range(2)])
    thresholds = score_floor_keys(kth)
    wide = torch.full((2, 2 * k), 7, dtype=torch.int64, device=DEVICE)
    out = wide[:, 1 : 1 + k]
    got = select_topk_candidates_radix(keys.to(DEVICE), kept.to(DEVICE), thresholds.to(DEVICE), k, out=out)
    assert got.data_ptr() == out.data_ptr()
    old = select_topk_candidates_triton(keys.to(DEVICE), kept.to(DEVICE), thresholds.to(DEVICE), k)
    assert torch.equal(out.cpu(), old.cpu())
    assert torch.equal(out.cpu(), ref_select(keys, kept.long(), thresholds, k))
    assert bool((wide[:, 0] == 7).all()) and bool((wide[:, 1 + k :] == 7).all()), "columns outside out written"


@pytest.mark.interpret
def test_radix_select_refuses_a_bad_k_or_out():
    keys = torch.zeros(2, 8, dtype=torch.int64, device=DEVICE)
    kept = torch.zeros(2, dtype=torch.int64, device=DEVICE)
    with pytest.raises(ValueError, match="power of two"):
        select_topk_candidates_radix(keys, kept, kept, 500)
    with pytest.raises(ValueError, match="int64 \\[2, 512\\]"):
        select_topk_candidates_radix(keys, kept, kept, 512, out=torch.empty(2, 256, dtype=torch.int64, device=DEVICE))
