"""Where the FlyDSL kernel reads a key, checked on the host (no gfx950 device needed).

The kernel computes every key address with kernels/flydsl/key_addressing.py (`key_value_word`,
`key_scale_byte`) on the operands `cache_operands` builds; here the same functions run on torch
int64 tensors over the same operands, for caches in both formats at random page strides and
offsets, and must land on exactly the bytes docs/contract.md §2 gives for the key (ref: our contiguous
page matrix, read with `page_values` / `page_scales`). `launch_arguments` is checked the same way:
the tile loop's addressing, driven by the arguments the backend would launch with, reads every key
of every window.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from litetopk.kernels import InputError
from litetopk.kernels.aiter_layout import aiter_pages_from_litetopk
from litetopk.kernels.cache_layout import (
    CACHE_FORMATS,
    PAGE_BYTES,
    PAGE_SIZE,
    SCALE_BYTES,
    describe_kv_cache,
    page_scales,
    page_values,
)
from litetopk.kernels.flydsl import launch_arguments
from litetopk.kernels.flydsl.key_addressing import KEY_ADDRESSING, cache_operands, key_scale_byte, key_value_word
from litetopk.kernels.validation import validate_prefill
from tests.kernels.test_aiter_layout import in_padded_slab
from tests.problems import make_problem

GROUPS = torch.arange(SCALE_BYTES)


def _in_slab(pages: torch.Tensor, rng: np.random.Generator, pad_words: int, align: int) -> torch.Tensor:
    """`pages` in place inside a random slab: page stride and offset random multiples of `align`."""
    page_bytes = pages[0].numel()
    offset = align * int(rng.integers(0, pad_words + 1))
    stride = page_bytes + offset + align * int(rng.integers(0, pad_words + 1))
    return in_padded_slab(pages, stride, offset, seed=int(rng.integers(2**31)))


def cache_in_layout(
    name: str, ours: torch.Tensor, rng: np.random.Generator
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(kv_cache, kv_scale) holding the keys of our contiguous page matrix `ours` in layout `name`."""
    values, scales = aiter_pages_from_litetopk(ours)
    return {
        "ours [pages, 4352]": lambda: (ours, None),
        "ours [pages, 64, 1, 68]": lambda: (ours.view(-1, PAGE_SIZE, 1, 68), None),
        "ours, 4608-byte pages (vLLM)": lambda: (in_padded_slab(ours, 4608, seed=int(rng.integers(2**31))), None),
        "ours, random stride and offset": lambda: (_in_slab(ours, rng, 300, 4), None),
        "aiter": lambda: (values, scales),
        "aiter, random strides and offsets (odd scale stride)": lambda: (
            _in_slab(values, rng, 300, 4),
            _in_slab(scales, rng, 40, 1),
        ),
    }[name]()


LAYOUTS = [
    "ours [pages, 4352]",
    "ours [pages, 64, 1, 68]",
    "ours, 4608-byte pages (vLLM)",
    "ours, random stride and offset",
    "aiter",
    "aiter, random strides and offsets (odd scale stride)",
]


def _read_keys(value_words, scale_bytes, value_page_words, scale_page_stride, cache_format, page, token):
    """(values uint8 [n, 64], scales uint8 [n, 4]) of keys (page[i], token[i]) read exactly as the
    kernel's lane groups 0..3 do: 4 words of values and one scale byte each."""
    addressing = KEY_ADDRESSING[cache_format]
    page, token = page.long()[:, None], token.long()[:, None]
    words = key_value_word(addressing, page, token, GROUPS[None, :], value_page_words)  # [n, 4 groups]
    values = value_words[words[..., None] + torch.arange(4)].view(torch.uint8)  # [n, 4 groups, 16]
    scales = scale_bytes[key_scale_byte(addressing, page, token, GROUPS[None, :], scale_page_stride)]
    return values.reshape(len(page), -1), scales


@pytest.mark.parametrize("cache_format", CACHE_FORMATS)
def test_key_addressing_is_the_described_layout_in_words(cache_format):
    ours = torch.zeros(2, PAGE_BYTES, dtype=torch.uint8)
    cache = describe_kv_cache(*((ours, None) if cache_format == "litetopk" else aiter_pages_from_litetopk(ours)))
    addressing = KEY_ADDRESSING[cache_format]
    described = (
        cache.value_token_stride,
        cache.value_group_stride,
        cache.scale_offset,
        cache.scale_group_stride,
        cache.interleaved_scales,
    )
    ours_words = (
        addressing.token_words * 4,
        addressing.group_words * 4,
        addressing.scale_offset,
        addressing.scale_group_stride,
        addressing.interleaved_scales,
    )
    assert ours_words == described, f"{cache_format}: kernel addressing {ours_words} != describe_kv_cache {described}"


@pytest.mark.parametrize("layout", LAYOUTS)
def test_kernel_addresses_read_exactly_each_keys_bytes(layout, seed):
    rng = np.random.default_rng(seed)
    pages = int(rng.integers(1, 9))
    ours = torch.from_numpy(rng.integers(0, 256, (pages, PAGE_BYTES), dtype=np.uint8))
    kv_cache, kv_scale = cache_in_layout(layout, ours, rng)
    cache = describe_kv_cache(kv_cache, kv_scale)
    value_words, scale_bytes, value_page_words, scale_page_stride = cache_operands(cache)
    assert value_words.data_ptr() == kv_cache.data_ptr(), f"{layout}: the value operand is not the caller's memory"
    assert scale_bytes.data_ptr() == (kv_cache if kv_scale is None else kv_scale).data_ptr(), (
        f"{layout}: the scale operand is not the caller's memory"
    )
    page = torch.from_numpy(rng.integers(0, pages, 2000))
    token = torch.from_numpy(rng.integers(0, PAGE_SIZE, 2000))
    values, scales = _read_keys(
        value_words, scale_bytes, value_page_words, scale_page_stride, cache.format, page, token
    )
    bad_values = (values != page_values(ours)[page, token]).any(1)
    bad_scales = (scales != page_scales(ours)[page, token]).any(1)
    assert not bad_values.any(), (
        f"{layout}, seed {seed}: wrong value bytes for (page, token) "
        f"{list(zip(page[bad_values][:3].tolist(), token[bad_values][:3].tolist()))}"
    )
    assert not bad_scales.any(), (
        f"{layout}, seed {seed}: wrong scale bytes for (page, token) "
        f"{list(zip(page[bad_scales][:3].tolist(), token[bad_scales][:3].tolist()))}"
    )


@pytest.mark.parametrize(
    "layout", ["ours, random stride and offset", "aiter", "aiter, random strides and offsets (odd scale stride)"]
)
@pytest.mark.parametrize("scan", [False, True], ids=["dense", "scan"])
def test_launch_arguments_address_every_window_key(layout, scan, seed):
    """The arguments the backend launches with, fed through the kernel's tile-loop addressing
    (page = block_table[batch * max_pages + pos // 64], token = pos % 64), read every key of
    every window; the grid covers every row and sampled position."""
    rng = np.random.default_rng(seed)
    p = make_problem(
        seed, seq_lens=[int(rng.integers(65, 400)), int(rng.integers(1, 200))], rows_per_seq=3, causal=False
    )
    kv_cache, kv_scale = cache_in_layout(layout, p.kv_cache, rng)
    problem = validate_prefill(p.q_fp4, p.q_scale, kv_cache, *p.args()[3:], topk=p.topk, kv_scale=kv_scale)
    rows, columns = problem.num_rows, problem.max_end
    int64 = torch.zeros(rows, dtype=torch.int64)
    args = launch_arguments(
        problem,
        scan=scan,
        out=torch.empty(rows, 8 if scan else columns),
        out_cols=8 if scan else columns,
        stride=1,
        thresholds_in=int64,
        thresholds=int64,
        appended=int64,
        histogram=torch.zeros(rows * 64, dtype=torch.int32),
        nonfinite=torch.zeros(rows, dtype=torch.int32),
    )
    assert args["CACHE_FORMAT"] == problem.cache.format and args["SCAN"] == scan, f"{layout}: compile-time constants"
    assert args["grid_x"] * 4 >= rows and args["grid_y"] * 256 >= columns, (
        f"{layout}: grid {args['grid_x']}x{args['grid_y']}"
    )
    row = torch.repeat_interleave(torch.arange(rows), (args["ends"] - args["starts"]).long())
    pos = torch.cat([torch.arange(s, e) for s, e in zip(args["starts"].tolist(), args["ends"].tolist())]).long()
    assert pos.numel() > 0, f"seed {seed}: the case must have keys"
    batch = args["row_to_batch"].long()[row]
    page = args["block_table"].long()[batch * args["max_pages"] + pos // PAGE_SIZE]
    values, scales = _read_keys(
        args["kv_value_words"],
        args["kv_scale_bytes"],
        args["value_page_words"],
        args["scale_page_stride"],
        args["CACHE_FORMAT"],
        page,
        pos % PAGE_SIZE,
    )
    want_page = p.block_table.long()[batch, pos // PAGE_SIZE]
    assert torch.equal(values, page_values(p.kv_cache)[want_page, pos % PAGE_SIZE]), f"{layout}, seed {seed}: values"
    assert torch.equal(scales, page_scales(p.kv_cache)[want_page, pos % PAGE_SIZE]), f"{layout}, seed {seed}: scales"


MISALIGNED = {
    "ours, pages at an odd offset": lambda ours, aiter, seed: (in_padded_slab(ours, 4608, offset=2, seed=seed), None),
    "ours, stride 4354": lambda ours, aiter, seed: (in_padded_slab(ours, 4354, seed=seed), None),
    "aiter values, stride 4098": lambda ours, aiter, seed: (in_padded_slab(aiter[0], 4098, seed=seed), aiter[1]),
}


@pytest.mark.parametrize("case", list(MISALIGNED))
def test_value_pages_not_word_aligned_say_what_to_change(case, seed):
    ours = torch.zeros(3, PAGE_BYTES, dtype=torch.uint8)
    cache = describe_kv_cache(*MISALIGNED[case](ours, aiter_pages_from_litetopk(ours), seed))
    with pytest.raises(InputError, match=r"flydsl.*multiple of 4"):
        cache_operands(cache)
