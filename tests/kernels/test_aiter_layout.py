"""AITER's cache ABI (docs/cache-layouts.md) and any page stride, on every CPU-testable backend.

The AITER byte layout is written here from AITER's public writers (`indexer_k_fp4_paged_preshuffle`,
`quant_q_fp4_preshuffle` in ROCm/aiter op_tests/test_flydsl_pa_mqa_logits_fp4_prefill.py), one byte
at a time:
    kv_cache[p, 0, g, t, b]                    = byte g * 16 + b of token t's packed values
    kv_scale[p, 0, g, (t % 16) * 4 + t // 16]  = token t's scale byte of group g
    q_scale[r, 0, g, h % 16, h // 16]          = head h's scale byte of group g
Checks: the converters against that, byte-for-byte round trips, both layouts decode to the same
keys, strided caches accepted in place, and the operator's answer bit for bit the same for the
same keys in every layout (reference backend, and the Triton backend under the interpreter).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from litetopk.kernels import InputError, dense_topk_prefill, litetopk_prefill, pack_kv_cache, unpack_kv_cache
from litetopk.kernels.aiter_layout import (
    aiter_pages_from_litetopk,
    litetopk_pages_from_aiter,
    pack_kv_cache_aiter,
    shuffle_q_scale_aiter,
    unpack_kv_cache_aiter,
    unshuffle_q_scale_aiter,
)
from litetopk.kernels.cache_layout import describe_kv_cache
from litetopk.kernels.mxfp4 import dequantize_mxfp4
from tests.kernels.test_cache_layout import random_sequences
from tests.problems import make_problem, results_equal


def ref_aiter_pages(k_fp4: np.ndarray, k_scale: np.ndarray, table: np.ndarray, num_pages: int):
    """AITER's writer, one byte at a time (module docstring)."""
    values = np.zeros((num_pages, 1, 4, 64, 16), dtype=np.uint8)
    scales = np.zeros((num_pages, 1, 4, 64), dtype=np.uint8)
    batch, length, _ = k_fp4.shape
    for b in range(batch):
        for j in range(length):
            p, t = table[b, j // 64], j % 64
            for g in range(4):
                values[p, 0, g, t, :] = k_fp4[b, j, g * 16 : (g + 1) * 16]
                scales[p, 0, g, (t % 16) * 4 + t // 16] = k_scale[b, j, g]
    return values, scales


CASES = {
    "one partial page": dict(batch=1, length=5, spare_pages=0, extra_table_pages=0),
    "three sequences, last page partial": dict(batch=3, length=150, spare_pages=4, extra_table_pages=2),
}


@pytest.mark.parametrize("case", list(CASES))
def test_pack_kv_cache_aiter_matches_aiter_bytes(case, seed):
    k_fp4, k_scale, table, num_pages = random_sequences(seed, **CASES[case])
    values, scales = pack_kv_cache_aiter(
        torch.from_numpy(k_fp4), torch.from_numpy(k_scale), torch.from_numpy(table), num_pages
    )
    want_values, want_scales = ref_aiter_pages(k_fp4, k_scale, table, num_pages)
    assert np.array_equal(values.numpy(), want_values), f"{case}: values, seed {seed}"
    assert np.array_equal(scales.numpy(), want_scales), f"{case}: scales, seed {seed}"
    back = unpack_kv_cache_aiter(values, scales, torch.from_numpy(table), k_fp4.shape[1])
    assert np.array_equal(back[0].numpy(), k_fp4) and np.array_equal(back[1].numpy(), k_scale), f"{case}: unpack"


def test_page_converters_round_trip_byte_for_byte(seed):
    gen = torch.Generator().manual_seed(seed)
    ours = torch.randint(0, 256, (7, 4352), dtype=torch.uint8, generator=gen)
    values, scales = aiter_pages_from_litetopk(ours)
    assert torch.equal(litetopk_pages_from_aiter(values, scales), ours), f"ours -> aiter -> ours, seed {seed}"
    again = aiter_pages_from_litetopk(litetopk_pages_from_aiter(values, scales))
    assert torch.equal(again[0], values) and torch.equal(again[1], scales), f"aiter -> ours -> aiter, seed {seed}"


def test_both_layouts_decode_to_the_same_keys(seed):
    k_fp4, k_scale, table, num_pages = random_sequences(seed, batch=2, length=130, spare_pages=3, extra_table_pages=1)
    table_t = torch.from_numpy(table)
    ours = pack_kv_cache(torch.from_numpy(k_fp4), torch.from_numpy(k_scale), table_t, num_pages)
    values, scales = aiter_pages_from_litetopk(ours)
    a = dequantize_mxfp4(*unpack_kv_cache(ours, table_t, 130), torch.float64)
    b = dequantize_mxfp4(*unpack_kv_cache(values, table_t, 130, kv_scale=scales), torch.float64)
    assert torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0)), f"seed {seed}"


def ref_shuffle_q_scale(q_scale: np.ndarray) -> np.ndarray:
    out = np.zeros((q_scale.shape[0], 1, 4, 16, 4), dtype=np.uint8)
    for r in range(q_scale.shape[0]):
        for h in range(64):
            for g in range(4):
                out[r, 0, g, h % 16, h // 16] = q_scale[r, h, g]
    return out


def test_q_scale_shuffle_matches_aiter_and_round_trips(seed):
    q_scale = np.random.default_rng(seed).integers(0, 256, size=(3, 64, 4), dtype=np.uint8)
    shuffled = shuffle_q_scale_aiter(torch.from_numpy(q_scale))
    assert np.array_equal(shuffled.numpy(), ref_shuffle_q_scale(q_scale)), f"seed {seed}"
    assert np.array_equal(unshuffle_q_scale_aiter(shuffled).numpy(), q_scale), f"round trip, seed {seed}"


def in_padded_slab(pages: torch.Tensor, stride: int, offset: int = 0, *, seed: int) -> torch.Tensor:
    """`pages` [P, ...] copied into a slab whose pages lie `stride` bytes apart, at `offset`; the
    returned view is not contiguous and the padding bytes are random, drawn from `seed` (never read)."""
    flat = pages.reshape(pages.shape[0], -1)
    gen = torch.Generator().manual_seed(seed)
    slab = torch.randint(0, 256, (pages.shape[0], stride), dtype=torch.uint8, generator=gen)
    slab[:, offset : offset + flat.shape[1]] = flat
    return slab[:, offset : offset + flat.shape[1]].view(pages.shape)


def cache_layouts(cache: torch.Tensor, seed: int) -> dict[str, dict]:
    """The same keys in every accepted layout: operator keyword arguments for each (padding drawn from `seed`)."""
    values, scales = aiter_pages_from_litetopk(cache)
    return {
        "ours [pages, 4352]": dict(kv_cache=cache),
        "ours [pages, 64, 1, 68]": dict(kv_cache=cache.view(-1, 64, 1, 68)),
        "ours, 4608-byte pages (vLLM)": dict(kv_cache=in_padded_slab(cache, 4608, seed=seed)),
        "ours, slice of a per-block slab": dict(
            kv_cache=in_padded_slab(cache, 3 * 4352 + 64, offset=4352 + 32, seed=seed + 1)
        ),
        "aiter": dict(kv_cache=values, kv_scale=scales),
        "aiter, padded pages": dict(
            kv_cache=in_padded_slab(values, 4096 + 512, seed=seed + 2),
            kv_scale=in_padded_slab(scales, 320, seed=seed + 3),
        ),
    }


def test_strided_caches_are_described_in_place(seed):
    cache = make_problem(seed, seq_lens=[100], rows_per_seq=1).kv_cache
    for name, kw in cache_layouts(cache, seed).items():
        described = describe_kv_cache(kw["kv_cache"], kw.get("kv_scale"))
        assert described.values.data_ptr() == kw["kv_cache"].data_ptr(), f"{name}: values copied"
        if "kv_scale" in kw:
            assert described.scales.data_ptr() == kw["kv_scale"].data_ptr(), f"{name}: scales copied"
        assert described.value_page_stride == kw["kv_cache"].stride(0), name


BAD_CACHES = {
    "overlapping pages": (lambda c: c.reshape(-1).as_strided((c.shape[0], 4352), (4000, 1)), None, "pages overlap"),
    "page bytes transposed": (lambda c: c.view(-1, 64, 68).transpose(1, 2), None, "must be contiguous"),
    "aiter values without kv_scale": (lambda c: aiter_pages_from_litetopk(c)[0], None, "4352"),
    "kv_scale with our cache": (lambda c: c, lambda c: aiter_pages_from_litetopk(c)[1], "1, 4, 64, 16"),
    "kv_scale page count": (
        lambda c: aiter_pages_from_litetopk(c)[0],
        lambda c: aiter_pages_from_litetopk(c)[1][1:],
        "one page per kv_cache page",
    ),
    "kv_scale dtype": (
        lambda c: aiter_pages_from_litetopk(c)[0],
        lambda c: aiter_pages_from_litetopk(c)[1].int(),
        "uint8",
    ),
}


@pytest.mark.parametrize("case", list(BAD_CACHES))
def test_bad_caches_say_what_to_change(case, seed):
    cache = make_problem(seed, seq_lens=[100], rows_per_seq=1).kv_cache
    make_values, make_scales, message = BAD_CACHES[case]
    with pytest.raises(InputError, match=message):
        describe_kv_cache(make_values(cache), None if make_scales is None else make_scales(cache))


def run_layout(op, p, layout: dict, backend: str):
    args = list(p.args())
    args[2] = layout["kv_cache"]
    return op(*args, topk=p.topk, weight_scale=p.weight_scale, backend=backend, kv_scale=layout.get("kv_scale"))


@pytest.mark.parametrize("op", [litetopk_prefill, dense_topk_prefill], ids=["litetopk", "dense"])
def test_reference_answers_every_layout_bit_for_bit(op, seed):
    p = make_problem(seed, seq_lens=[700, 300], rows_per_seq=2, causal=False, spread=2)
    layouts = cache_layouts(p.kv_cache, seed)
    first = run_layout(op, p, layouts["ours [pages, 4352]"], "reference")
    assert int(first.counts.sum()) > 0, f"seed {seed}: the case must publish keys"
    for name, layout in layouts.items():
        differ = results_equal(first, run_layout(op, p, layout, "reference"))
        assert not differ, f"{name}: {differ} differ from our contiguous layout, seed {seed}"


@pytest.mark.interpret
def test_triton_answers_every_layout_bit_for_bit(seed):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    p = make_problem(seed, seq_lens=[650], rows_per_seq=2, spread=1).to(device)
    layouts = cache_layouts(p.kv_cache.cpu(), seed)
    first = run_layout(litetopk_prefill, p, {"kv_cache": p.kv_cache}, "triton")
    assert int(first.counts.sum()) > 0, f"seed {seed}: the case must publish keys"
    for name in ("ours, slice of a per-block slab", "aiter", "aiter, padded pages"):
        layout = {k: v.to(device) if v.is_contiguous() else in_device(v, device) for k, v in layouts[name].items()}
        differ = results_equal(first, run_layout(litetopk_prefill, p, layout, "triton"))
        assert not differ, f"{name}: {differ} differ from our contiguous layout, seed {seed}"


def in_device(view: torch.Tensor, device: str) -> torch.Tensor:
    """The strided `view` rebuilt on `device` with the same strides and storage offset."""
    storage = view.untyped_storage()
    base = torch.empty(0, dtype=torch.uint8).set_(storage).to(device)
    return base.as_strided(view.shape, view.stride(), view.storage_offset())
