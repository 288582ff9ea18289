"""Paged key cache (docs/contract.md §2): `pack_kv_cache` / `unpack_kv_cache` against a byte layout
written here from the contract.

    page = 64 tokens in 4352 bytes: bytes [0, 4096) token t's 64 packed E2M1 bytes at t * 64,
    bytes [4096, 4352) token t's 4 scale bytes at 4096 + t * 4;
    logical position j of sequence b lives in page block_table[b, j // 64], token j % 64.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from litetopk.kernels import PAGE_BYTES, PAGE_SIZE, InputError, pack_kv_cache, unpack_kv_cache

VALUES_PER_TOKEN, SCALES_PER_TOKEN = 64, 4


def ref_pack_kv_cache(k_fp4: np.ndarray, k_scale: np.ndarray, block_table: np.ndarray, num_pages: int) -> np.ndarray:
    """The contract's byte layout, one byte at a time."""
    cache = np.zeros((num_pages, 4352), dtype=np.uint8)
    batch, length, _ = k_fp4.shape
    for b in range(batch):
        for j in range(length):
            page, t = block_table[b, j // 64], j % 64
            for i in range(VALUES_PER_TOKEN):
                cache[page, t * 64 + i] = k_fp4[b, j, i]
            for g in range(SCALES_PER_TOKEN):
                cache[page, 4096 + t * 4 + g] = k_scale[b, j, g]
    return cache


def random_sequences(seed: int, batch: int, length: int, spare_pages: int, extra_table_pages: int):
    """Random key bytes for `batch` sequences and a permuted block table with -1 past the pages used."""
    gen = np.random.default_rng(seed)
    used = -(-length // PAGE_SIZE)
    num_pages = batch * used + spare_pages
    perm = gen.permutation(num_pages)[: batch * used].reshape(batch, used)
    table = np.full((batch, used + extra_table_pages), -1, dtype=np.int32)
    table[:, :used] = perm
    k_fp4 = gen.integers(0, 256, size=(batch, length, VALUES_PER_TOKEN), dtype=np.uint8)
    k_scale = gen.integers(0, 256, size=(batch, length, SCALES_PER_TOKEN), dtype=np.uint8)
    return k_fp4, k_scale, table, num_pages


CASES = {
    "one sequence, one partial page": dict(batch=1, length=5, spare_pages=0, extra_table_pages=0),
    "one sequence, whole pages": dict(batch=1, length=128, spare_pages=2, extra_table_pages=1),
    "three sequences, last page partial": dict(batch=3, length=150, spare_pages=4, extra_table_pages=2),
    "five sequences, unused pages marked -1": dict(batch=5, length=64 * 3 + 1, spare_pages=7, extra_table_pages=3),
}


@pytest.mark.parametrize("case", list(CASES))
def test_pack_matches_contract_bytes(case, seed):
    k_fp4, k_scale, table, num_pages = random_sequences(seed, **CASES[case])
    cache = pack_kv_cache(torch.from_numpy(k_fp4), torch.from_numpy(k_scale), torch.from_numpy(table), num_pages)
    assert cache.dtype == torch.uint8 and tuple(cache.shape) == (num_pages, PAGE_BYTES), case
    want = ref_pack_kv_cache(k_fp4, k_scale, table, num_pages)
    diff = np.argwhere(cache.numpy() != want)
    assert diff.size == 0, (
        f"{case}, seed {seed}: bytes differ from the contract layout at (page, byte) {diff[:5].tolist()}"
    )


@pytest.mark.parametrize("case", list(CASES))
def test_unpack_inverts_pack(case, seed):
    k_fp4, k_scale, table, num_pages = random_sequences(seed, **CASES[case])
    length = k_fp4.shape[1]
    cache = pack_kv_cache(torch.from_numpy(k_fp4), torch.from_numpy(k_scale), torch.from_numpy(table), num_pages)
    values, scales = unpack_kv_cache(cache, torch.from_numpy(table), length)
    assert np.array_equal(values.numpy(), k_fp4), f"{case}, seed {seed}: values"
    assert np.array_equal(scales.numpy(), k_scale), f"{case}, seed {seed}: scales"
    # a shorter length reads a prefix
    short = max(1, length // 2)
    values, scales = unpack_kv_cache(cache, torch.from_numpy(table), short)
    assert np.array_equal(values.numpy(), k_fp4[:, :short]) and np.array_equal(scales.numpy(), k_scale[:, :short])


def test_unpack_reads_a_cache_laid_out_by_hand(seed):
    """unpack_kv_cache reads a cache written by the reference layout (not by pack_kv_cache)."""
    k_fp4, k_scale, table, num_pages = random_sequences(seed, batch=2, length=100, spare_pages=3, extra_table_pages=1)
    cache = torch.from_numpy(ref_pack_kv_cache(k_fp4, k_scale, table, num_pages))
    values, scales = unpack_kv_cache(cache, torch.from_numpy(table), 100)
    assert np.array_equal(values.numpy(), k_fp4) and np.array_equal(scales.numpy(), k_scale), f"seed {seed}"


def test_unused_pages_and_slots_are_zero(seed):
    k_fp4, k_scale, table, num_pages = random_sequences(seed, batch=2, length=70, spare_pages=3, extra_table_pages=2)
    k_fp4[:] = 0xFF
    k_scale[:] = 0xFF
    cache = pack_kv_cache(
        torch.from_numpy(k_fp4), torch.from_numpy(k_scale), torch.from_numpy(table), num_pages
    ).numpy()
    used = set(table[table >= 0].tolist())
    for page in range(num_pages):
        if page not in used:
            assert not cache[page].any(), f"spare page {page} must be zero"
    last = table[0, 1]  # tokens 64..69 used, 70..127 not
    assert (cache[last, : 6 * 64] == 0xFF).all() and not cache[last, 6 * 64 : 4096].any()
    assert (cache[last, 4096 : 4096 + 6 * 4] == 0xFF).all() and not cache[last, 4096 + 6 * 4 :].any()


def test_page_view_of_some_stacks_has_the_same_bytes(seed):
    """docs/contract.md §2: some stacks view the cache as [num_pages, 64, 1, 68]; the bytes are the same."""
    k_fp4, k_scale, table, num_pages = random_sequences(seed, batch=1, length=64, spare_pages=0, extra_table_pages=0)
    cache = pack_kv_cache(torch.from_numpy(k_fp4), torch.from_numpy(k_scale), torch.from_numpy(table), num_pages)
    view = cache.view(num_pages, 64, 1, 68)
    assert view.untyped_storage().data_ptr() == cache.untyped_storage().data_ptr()
    assert torch.equal(
        view.reshape(num_pages, -1)[:, :4096].reshape(num_pages, 64, 64)[table[0, 0]], torch.from_numpy(k_fp4[0])
    )


def _args(seed):
    k_fp4, k_scale, table, num_pages = random_sequences(seed, batch=2, length=100, spare_pages=1, extra_table_pages=1)
    return torch.from_numpy(k_fp4), torch.from_numpy(k_scale), torch.from_numpy(table), num_pages


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda k, s, t, n: (k, s, t.index_fill(1, torch.tensor([0]), -1), n), "outside"),
        (lambda k, s, t, n: (k, s, t.index_fill(1, torch.tensor([1]), n), n), "outside"),
        (lambda k, s, t, n: (k, s, torch.stack([t[0], t[0]]), n), "same physical page"),
        (lambda k, s, t, n: (k[:, :, :32], s, t, n), "k_fp4"),
        (lambda k, s, t, n: (k, s[:, :50], t, n), "k_scale"),
        (lambda k, s, t, n: (k.to(torch.int16), s, t, n), "uint8"),
        (lambda k, s, t, n: (k, s, t[:1], n), "block_table"),
        (lambda k, s, t, n: (k, s, t[:, :1], n), "pages"),
    ],
    ids=[
        "negative live page",
        "live page past the cache",
        "page used twice",
        "value bytes",
        "scale length",
        "dtype",
        "batch of block table",
        "too few pages",
    ],
)
def test_pack_rejects_bad_arguments(mutate, match, seed):
    with pytest.raises(InputError, match=match):
        pack_kv_cache(*mutate(*_args(seed)))


@pytest.mark.parametrize(
    "cache, table, match",
    [
        (torch.zeros(4, 4351, dtype=torch.uint8), torch.tensor([[0]], dtype=torch.int32), "kv_cache"),
        (torch.zeros(4, 4352, dtype=torch.int8), torch.tensor([[0]], dtype=torch.int32), "kv_cache"),
        (torch.zeros(4, 4352, dtype=torch.uint8), torch.tensor([[4]], dtype=torch.int32), "outside"),
        (torch.zeros(4, 4352, dtype=torch.uint8), torch.tensor([[-1]], dtype=torch.int32), "outside"),
    ],
    ids=["page bytes", "dtype", "page past the cache", "negative page"],
)
def test_unpack_rejects_bad_arguments(cache, table, match):
    with pytest.raises(InputError, match=match):
        unpack_kv_cache(cache, table, 10)
