"""random_problem (kernels/problems.py): valid inputs of litetopk_prefill, reproducible by seed."""

from __future__ import annotations

import pytest
import torch

from litetopk.kernels import PAGE_SIZE, litetopk_prefill, random_problem, unpack_kv_cache


@pytest.mark.parametrize("causal", [True, False])
def test_the_reference_answers_a_random_problem_with_no_row_fault(seed, causal):
    p = random_problem(4, [700, 300], 512, seed=seed, causal=causal)
    result = litetopk_prefill(*p.args(), **p.kwargs(), backend="reference")
    assert result.status.tolist() == [0] * 4, f"seed {seed} causal {causal}: {result.status.tolist()}"
    for i, (start, end) in enumerate(zip(p.starts.tolist(), p.ends.tolist())):
        count = min(p.topk, end - start)
        got = result.raw_indices[i, :count].tolist()
        assert int(result.counts[i]) == count, (
            f"seed {seed} row {i}: count {int(result.counts[i])}, window {end - start}"
        )
        assert len(set(got)) == count and all(start <= j < end for j in got), f"seed {seed} row {i}"


def test_windows_lie_in_their_sequences_and_causal_rows_end_in_the_last_page(seed):
    lens = [900, 130, 2050]
    p = random_problem(6, lens, 1024, seed=seed)
    rtb, st, en = p.row_to_batch.tolist(), p.starts.tolist(), p.ends.tolist()
    assert rtb == [0, 0, 1, 1, 2, 2]
    for i, b in enumerate(rtb):
        # raw positions t in [4n - 256, 4n) give ends (t + 1) // 4 in [n - 64, n]
        assert st[i] == 0 and lens[b] - PAGE_SIZE <= en[i] <= lens[b], f"seed {seed} row {i}: [{st[i]}, {en[i]})"


def test_same_seed_same_problem_other_seed_other_keys(seed):
    a, b, c = (random_problem(2, 500, seed=s) for s in (seed, seed, seed + 1))
    assert all(torch.equal(x, y) for x, y in zip(a.args(), b.args())), f"seed {seed} is not reproducible"
    assert not torch.equal(a.kv_cache, c.kv_cache), f"seeds {seed} and {seed + 1} gave the same cache"


def ref_key_bytes(cache: torch.Tensor, table: torch.Tensor, b: int, j: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values [64], scales [4]) of key j of sequence b, read from the cache as docs/contract.md §2 lays
    it out: page table[b, j // 64], token j % 64; a page's 64 x 64 value bytes, then its 64 x 4 scales."""
    page, token = int(table[b, j // PAGE_SIZE]), j % PAGE_SIZE
    values = cache[page, token * 64 : (token + 1) * 64]
    scales = cache[page, PAGE_SIZE * 64 + token * 4 : PAGE_SIZE * 64 + (token + 1) * 4]
    return values, scales


def test_pages_are_permuted_and_unpack_to_the_keys_the_table_names(seed):
    p = random_problem(2, [200, 200], seed=seed)
    table = p.block_table
    live = table[table >= 0]
    assert len(set(live.tolist())) == len(live), f"seed {seed}: a physical page is shared"
    assert not torch.equal(live, torch.arange(len(live), dtype=live.dtype)), f"seed {seed}: pages are in order"
    k_fp4, k_scale = unpack_kv_cache(p.kv_cache, table, 200)
    assert k_fp4.shape == (2, 200, 64) and k_scale.shape == (2, 200, 4)
    for b in range(2):
        for j in range(200):
            values, scales = ref_key_bytes(p.kv_cache, table, b, j)
            assert torch.equal(k_fp4[b, j], values) and torch.equal(k_scale[b, j], scales), (
                f"seed {seed}: key {j} of sequence {b} is not the one its table entry names"
            )
    assert not torch.equal(k_fp4[0], k_fp4[1]), f"seed {seed}: the two sequences hold the same keys"
    assert bool((k_scale > 0).all()), f"seed {seed}: a key without its scales (the page's scale bytes unwritten)"


def test_device_and_dtype_options():
    p = random_problem(2, 100, device="cpu", weights_dtype=torch.bfloat16, weight_scale=0.5)
    assert p.weights.dtype == torch.bfloat16 and p.kwargs() == {"topk": 512, "weight_scale": 0.5}
    assert all(t.device.type == "cpu" for t in p.args())


@pytest.mark.parametrize("rows, keys", [(3, [10, 10]), (0, 10), (2, []), (2, [0])])
def test_rows_that_do_not_split_evenly_or_empty_sequences_are_refused(rows, keys):
    with pytest.raises(ValueError):
        random_problem(rows, keys)
