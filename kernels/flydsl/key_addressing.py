"""Where the FlyDSL scoring kernel reads a key, in either cache format (docs/cache-layouts.md).

Layer: backends (flydsl/; imports the formats only, no flydsl).

The kernel (score_fp4.py) takes a cache as two operands built here by `cache_operands`:
    value_words   int32, the cache's value bytes as words from the first byte of page 0
    scale_bytes   uint8, the cache's scale bytes from the first byte of page 0
(for our format both are the one page matrix; for AITER's, kv_cache and kv_scale), and the page
strides `value_page_words` (value page stride / 4) and `scale_page_stride` (bytes), both int64.
Lane group G (= lane // 16, the MFMA's K block) of a key tile needs, of the key at (page, token),
the 16 value bytes of group G as 4 words from word `key_value_word(...)` and the scale byte of
group G at byte `key_scale_byte(...)`:

    value word  = page * value_page_words  + token * TOKEN_WORDS + G * GROUP_WORDS
    scale byte  = page * scale_page_stride + SCALE_OFFSET + token_scale_offsets(token) + G * SCALE_GROUP_STRIDE

with the per-format constants of `KEY_ADDRESSING` (KVCache's in-page strides of the same format;
TOKEN_WORDS = value_token_stride / 4, GROUP_WORDS = value_group_stride / 4). The format is a
compile-time constant of the kernel, the page strides launch arguments. The functions are plain
arithmetic: the kernel calls them on its FlyDSL int64 values, the tests on torch int64 tensors.

Limit: the values are loaded as 4-byte words, so the value bytes of page 0 must start at a multiple
of 4 bytes and the value page stride must be a multiple of 4 (every layout we know of uses
multiples of 16: 4352, 4608, 4096); `cache_operands` raises InputError otherwise. Scales are
loaded byte by byte: any scale page stride.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..cache_layout import (
    GROUP_BYTES,
    PAGE_SIZE,
    PAGE_VALUE_BYTES,
    VALUE_BYTES,
    KVCache,
    token_scale_offsets,
)
from ..errors import InputError

WORD_BYTES = 4


@dataclass(frozen=True)
class KeyAddressing:
    """The compile-time in-page addressing of one cache format (module docstring)."""

    token_words: int  # value words between tokens t and t + 1 of a page
    group_words: int  # value words between groups g and g + 1 of a token
    scale_offset: int  # first scale byte of a page in the scale operand
    scale_group_stride: int  # scale bytes between groups g and g + 1 of a token
    interleaved_scales: bool  # AITER's token order of scales (cache_layout.token_scale_offsets)


KEY_ADDRESSING = {
    "litetopk": KeyAddressing(
        token_words=VALUE_BYTES // WORD_BYTES,
        group_words=GROUP_BYTES // WORD_BYTES,
        scale_offset=PAGE_VALUE_BYTES,
        scale_group_stride=1,
        interleaved_scales=False,
    ),
    "aiter": KeyAddressing(
        token_words=GROUP_BYTES // WORD_BYTES,
        group_words=PAGE_SIZE * GROUP_BYTES // WORD_BYTES,
        scale_offset=0,
        scale_group_stride=PAGE_SIZE,
        interleaved_scales=True,
    ),
}


def key_value_word(addressing: KeyAddressing, page, token, group, value_page_words):
    """First of the 4 value words of group `group` of key (page, token) in the value operand."""
    return page * value_page_words + token * addressing.token_words + group * addressing.group_words


def key_scale_byte(addressing: KeyAddressing, page, token, group, scale_page_stride):
    """Byte of the scale of group `group` of key (page, token) in the scale operand."""
    return (
        page * scale_page_stride
        + addressing.scale_offset
        + token_scale_offsets(token, addressing.interleaved_scales)
        + group * addressing.scale_group_stride
    )


def _flat_bytes(pages: torch.Tensor) -> torch.Tensor:
    """uint8 [n]: every byte from the first byte of page 0 to the last byte of the last page of a
    [num_pages, page_bytes] matrix whose pages lie stride(0) apart (the caller's memory, in place)."""
    count, page_bytes = pages.shape
    span = (count - 1) * pages.stride(0) + page_bytes if count else 0
    return pages.as_strided((span,), (1,))


def cache_operands(cache: KVCache) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """(value_words int32 [n], scale_bytes uint8 [m], value_page_words, scale_page_stride) of a
    cache in either format, views of the caller's memory (module docstring). Raises InputError when
    the value pages are not 4-byte aligned (the one layout limit of the flydsl kernel)."""
    if cache.values.data_ptr() % WORD_BYTES or cache.value_page_stride % WORD_BYTES:
        raise InputError(
            f"backend='flydsl' loads key values as {WORD_BYTES}-byte words: kv_cache must start at a multiple of "
            f"{WORD_BYTES} bytes (address % {WORD_BYTES} = {cache.values.data_ptr() % WORD_BYTES}) and its page "
            f"stride must be a multiple of {WORD_BYTES} (got {cache.value_page_stride} bytes)"
        )
    value_words = _flat_bytes(cache.values).view(torch.int32)
    return value_words, _flat_bytes(cache.scales), cache.value_page_stride // WORD_BYTES, cache.scale_page_stride


__all__ = ["KEY_ADDRESSING", "KeyAddressing", "cache_operands", "key_scale_byte", "key_value_word"]
