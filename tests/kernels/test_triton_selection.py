"""The Triton selections (kernels/triton/selection.py) against a plain sort of each row.

Runs the real kernels in Triton's CPU interpreter without a GPU (tests/conftest.py), compiled with
one. The candidate top-K: both of its paths, the compacted one (at most 2 K keys at or above the
row's threshold) and the whole-row one (no threshold, or too many keys above it), rows with fewer
than K kept keys, an empty row, and stale keys past `kept` that must be ignored. The calibration's
order statistics: ties, signed zeros, infinities and a width that is not a power of two. The
one-kernel assembly: every field equal to selection.assemble_result's, and the same refusals.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from litetopk.kernels import InputError, SlotOverflowError
from litetopk.kernels.selection import NO_KEY, assemble_result, make_keys
from litetopk.kernels.triton.selection import (
    assemble_result_triton, calibration_keys_triton, kth_largest_scores_triton, select_topk_candidates_triton,
)

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


@pytest.mark.interpret
@pytest.mark.parametrize("offset", [0.0, 0.25])
def test_calibration_keys_kernel_equals_the_shared_torch_code(offset, seed):
    """calibration_keys_triton (one kernel) against ScoringBackend.calibration_keys (torch), on rows
    with ties, zeros of both signs, infinities, and a NaN (no threshold for that row)."""
    from litetopk.kernels.reference import ReferenceBackend

    rng = np.random.default_rng(seed)
    scores = sample_rows(rng, 3000)
    scores[1, 7] = float("nan")
    scores[2, :3000 - 20] = float("-inf")  # fewer than K finite: the K-th best is -inf, no threshold
    scores[0, :16] = float("inf")  # the ceiling (16th best) is +inf: no ceiling, a threshold
    want = ReferenceBackend().calibration_keys(scores, K, 16, offset)
    got = calibration_keys_triton(scores.to(DEVICE), K, 16, offset)
    for name, w, g in zip(("thresholds", "ceilings"), want, got):
        assert torch.equal(g.cpu(), w), f"offset {offset}, seed {seed}: {name} {g.cpu().tolist()} vs {w.tolist()}"
    assert want[0][1] == NO_KEY and want[0][2] == NO_KEY, "the NaN row and the -inf row must get no threshold"
    assert want[0][0] != NO_KEY and want[1][0] == NO_KEY, "row 0 must keep its threshold and lose its ceiling"


def sorted_top_keys(rng: np.random.Generator, rows: int, window: int, published: list[int]) -> torch.Tensor:
    """Keys [rows, K] as the selection stage hands them over: published[r] distinct positions of
    [0, window) with random scores, sorted descending, NO_KEY after them."""
    keys = torch.full((rows, K), NO_KEY, dtype=torch.int64)
    for r, n in enumerate(published):
        scores = torch.from_numpy(rng.standard_normal(n).astype(np.float32))
        positions = torch.from_numpy(rng.permutation(window)[:n])
        keys[r, :n] = make_keys(scores, positions).sort(descending=True).values
    return keys


@pytest.mark.interpret
def test_assemble_result_triton_equals_the_shared_assembly(seed):
    rng = np.random.default_rng(seed)
    batch, max_pages, window = 3, 40, 40 * 64
    block_table = torch.from_numpy(rng.permutation(1000)[:batch * max_pages].reshape(batch, max_pages)).int()
    row_to_batch = torch.tensor([0, 2, 1, 2, 0], dtype=torch.int32)
    status = torch.tensor([0, 0, 4, 0, 0], dtype=torch.int32)  # row 2 failed: publishes nothing
    keys = sorted_top_keys(rng, 5, window, [K, 300, K, 0, K])
    repaired = torch.tensor([0, 1, 0, 0, 0], dtype=torch.int32)
    candidates = torch.tensor([900, 300, 5, 0, 2**40])
    want = assemble_result(keys, row_to_batch, block_table, status, repaired, candidates)
    got = assemble_result_triton(*(t.to(DEVICE) for t in (keys, row_to_batch, block_table, status, repaired,
                                                          candidates)))
    for field in ("values", "raw_indices", "physical_indices", "counts", "status", "repaired", "candidates"):
        a, b = getattr(got, field).cpu(), getattr(want, field)
        assert a.dtype == b.dtype and torch.equal(a, b), f"seed {seed}: field {field} differs"


@pytest.mark.interpret
@pytest.mark.parametrize("page, error", [(-3, InputError), (2**25, SlotOverflowError)])
def test_assemble_result_triton_refuses_a_slot_it_cannot_publish(page, error, seed):
    rng = np.random.default_rng(seed)
    block_table = torch.arange(8, dtype=torch.int32)[None, :].clone()
    keys = sorted_top_keys(rng, 1, 8 * 64, [K])
    block_table[0, 5] = page  # some published position lies on page 5 (K of 512 positions are published)
    args = (keys, torch.zeros(1, dtype=torch.int32), block_table, torch.zeros(1, dtype=torch.int32),
            torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int64))
    with pytest.raises(error):
        assemble_result(*args)
    with pytest.raises(error):
        assemble_result_triton(*(t.to(DEVICE) for t in args))
