"""The Triton selections against a plain sort of each row.

Runs the real kernels in Triton's CPU interpreter without a GPU (tests/conftest.py), compiled with
one. The candidate top-K (kernels/selection.py: the radix select): the compacted path
(at most 2 K keys at or above the row's threshold) and the whole-row one (no threshold, or too many
keys above it), rows with fewer than K kept keys, an empty row, and stale keys past `kept` that must
be ignored, against Python's sort (independent of the torch twin tests/kernels/test_radix_select.py uses). The
calibration's
order statistics: ties, signed zeros, infinities and a width that is not a power of two. The
one-kernel assembly (kernels/assembly.py): every field equal to the torch assembly's
(kernels/assembly.py), and the same status bits for a slot that cannot be published.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from litetopk.kernels import RowStatus
from litetopk.kernels.assembly import assemble_into_torch, assemble_into_triton, assemble_result, result_buffers
from litetopk.kernels.calibration import calibration_keys_torch, calibration_keys_triton, kth_largest_scores_triton
from litetopk.kernels.keys import NO_KEY, make_keys
from litetopk.kernels.selection import select_topk_candidates_radix

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
    live_rows = [sorted(keys[r, : kept[r]].tolist(), reverse=True) for r in range(len(kept))]
    thresholds = torch.tensor([NO_KEY if rank is None else live_rows[r][rank - 1] for r, rank in enumerate(ranks)])
    got = select_topk_candidates_radix(keys.to(DEVICE), torch.tensor(kept).to(DEVICE), thresholds.to(DEVICE), K)
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
    """calibration_keys_triton (one kernel) against calibration.calibration_keys_torch, on rows
    with ties, zeros of both signs, infinities, and a NaN (no threshold for that row)."""
    rng = np.random.default_rng(seed)
    scores = sample_rows(rng, 3000)
    scores[1, 7] = float("nan")
    scores[2, : 3000 - 20] = float("-inf")  # fewer than K finite: the K-th best is -inf, no threshold
    scores[0, :16] = float("inf")  # the ceiling (16th best) is +inf: no ceiling, a threshold
    want = calibration_keys_torch(scores, K, 16, offset)
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


FIELDS = ("values", "raw_indices", "physical_indices", "counts", "status")


def assemble_both(keys, row_to_batch, block_table, status, repaired=None, candidates=None) -> tuple[dict, dict]:
    """(torch twin's buffers, Triton twin's buffers, moved to the CPU) of the same inputs (repaired and
    candidates: zeros unless given)."""
    rows, k = keys.shape
    repaired = torch.zeros(rows, dtype=torch.int32) if repaired is None else repaired
    candidates = torch.zeros(rows, dtype=torch.int64) if candidates is None else candidates
    want = result_buffers(rows, k, keys.device, None)
    assemble_into_torch(keys, row_to_batch, block_table, status, repaired, candidates, want)
    got = result_buffers(rows, k, torch.device(DEVICE), None)
    assemble_into_triton(*(t.to(DEVICE) for t in (keys, row_to_batch, block_table, status, repaired, candidates)), got)
    return want, {name: t.cpu() for name, t in got.items()}


@pytest.mark.interpret
def test_assemble_result_triton_equals_the_shared_assembly(seed):
    rng = np.random.default_rng(seed)
    batch, max_pages, window = 3, 40, 40 * 64
    block_table = torch.from_numpy(rng.permutation(1000)[: batch * max_pages].reshape(batch, max_pages)).int()
    row_to_batch = torch.tensor([0, 2, 1, 2, 0], dtype=torch.int32)
    status = torch.tensor([0, 0, 4, 0, 0], dtype=torch.int32)  # row 2 failed: publishes nothing
    keys = sorted_top_keys(rng, 5, window, [K, 300, K, 0, K])
    repaired = torch.tensor([0, 1, 0, 0, 1], dtype=torch.int32)
    candidates = torch.tensor([900, 300, 5, 0, 2**40])
    want, got = assemble_both(keys, row_to_batch, block_table, status, repaired, candidates)
    for field in (*FIELDS, "repaired", "candidates"):
        a, b = got[field], want[field]
        assert a.dtype == b.dtype and torch.equal(a, b), f"seed {seed}: field {field} differs"
    assert want["counts"].tolist() == [K, 300, 0, 0, K] and want["status"].tolist() == [0, 0, 4, 0, 0]
    # The full stage (torch on this device): repaired copied, candidates clamped to int32.
    result = assemble_result(keys, row_to_batch, block_table, status, repaired, candidates)
    for field in (*FIELDS, "repaired", "candidates"):
        assert torch.equal(getattr(result, field), want[field]), field
    assert result.repaired.tolist() == [0, 1, 0, 0, 1] and result.candidates.dtype == torch.int32
    assert result.candidates.tolist() == [900, 300, 5, 0, 2**31 - 1]


@pytest.mark.interpret
def test_the_dense_paths_form_is_written_by_both_twins(seed):
    """The dense path's assembly: repaired=None (nothing repaired) and candidates given as the windows (starts, ends):
    both twins write 0 and the window lengths into poisoned buffers, every field as with the tensors."""
    rng = np.random.default_rng(seed)
    block_table = torch.from_numpy(rng.permutation(200)[:80].reshape(2, 40)).int()
    row_to_batch = torch.tensor([1, 0, 1], dtype=torch.int32)
    status = torch.tensor([0, 0, 4], dtype=torch.int32)
    keys = sorted_top_keys(rng, 3, 40 * 64, [K, 100, K])
    candidates = torch.tensor([2560, 100, 2560])
    want = result_buffers(3, K, keys.device, None)
    assemble_into_torch(keys, row_to_batch, block_table, status, torch.zeros(3, dtype=torch.int32), candidates, want)
    starts = torch.tensor([0, 2000, 60], dtype=torch.int32)  # the windows, whose lengths are `candidates`
    ends = starts + candidates.int()
    for twin, device in ((assemble_into_torch, "cpu"), (assemble_into_triton, DEVICE)):
        for counted in (candidates.to(device), (starts.to(device), ends.to(device))):
            got = result_buffers(3, K, torch.device(device), None)
            got["repaired"].fill_(-7)
            got["candidates"].fill_(-7)
            inputs = (t.to(device) for t in (keys, row_to_batch, block_table, status))
            twin(*inputs, None, counted, got)
            form = "windows" if isinstance(counted, tuple) else "counts"
            for name, tensor in got.items():
                assert torch.equal(tensor.cpu(), want[name]), f"seed {seed}: {twin.__name__} ({form}) field {name}"


@pytest.mark.interpret
@pytest.mark.parametrize(
    "page, bit",
    [(-3, RowStatus.INVALID_PAGE), (2**25, RowStatus.SLOT_OVERFLOW), (2**31 // 64 + 1000, RowStatus.SLOT_OVERFLOW)],
)
def test_assembly_twins_flag_a_slot_they_cannot_publish(page, bit, seed):
    """A published position on a negative page or a page whose slots are beyond int32: that row
    gets the bit and publishes nothing (no exception, nothing read on the host); the other row,
    which never touches the page, is published and mapped as usual."""
    rng = np.random.default_rng(seed)
    block_table = torch.arange(16, dtype=torch.int32).view(2, 8).clone()
    keys = sorted_top_keys(rng, 2, 8 * 64, [K, K])  # K of 512 positions: every page is published
    block_table[0, 5] = page
    row_to_batch = torch.tensor([0, 1], dtype=torch.int32)
    want, got = assemble_both(keys, row_to_batch, block_table, torch.zeros(2, dtype=torch.int32))
    for field in FIELDS:
        assert torch.equal(got[field], want[field]), f"page {page}: field {field} differs between the twins"
    for buffers in (want, got):
        assert buffers["status"].tolist() == [int(bit), 0]
        assert buffers["counts"].tolist() == [0, K]
        assert (buffers["values"][0] == float("-inf")).all()
        assert (buffers["raw_indices"][0] == -1).all() and (buffers["physical_indices"][0] == -1).all()
        raw = buffers["raw_indices"][1].long()
        assert torch.equal(buffers["physical_indices"][1].long(), block_table[1, raw // 64].long() * 64 + raw % 64)


@pytest.mark.interpret
def test_assembly_twins_publish_the_last_int32_slots_exactly(seed):
    """Page 2^25 - 1 holds slots up to 2^31 - 1: published, exact, no wrap."""
    rng = np.random.default_rng(seed)
    block_table = torch.arange(8, dtype=torch.int32)[None, :].clone()
    block_table[0, 3] = 2**25 - 1
    keys = sorted_top_keys(rng, 1, 8 * 64, [K])
    want, got = assemble_both(keys, torch.zeros(1, dtype=torch.int32), block_table, torch.zeros(1, dtype=torch.int32))
    for field in FIELDS:
        assert torch.equal(got[field], want[field]), field
    raw = want["raw_indices"][0].long()
    assert want["status"].tolist() == [0] and want["counts"].tolist() == [K]
    assert torch.equal(want["physical_indices"][0].long(), block_table[0, raw // 64].long() * 64 + raw % 64)
    assert int(want["physical_indices"][0].max()) == 2**31 - 1
