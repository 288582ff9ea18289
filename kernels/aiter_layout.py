"""Converters between our cache format and AITER's (docs/cache-layouts.md; cache_layout.py).

Layer: formats (imports cache_layout and errors only; aiter.py and the tests use it).

AITER's FlyDSL FP4 indexer (ROCm/aiter `aiter/ops/flydsl/pa_mqa_litetopk_fp4.py`, its writers
`indexer_k_fp4_paged_preshuffle` / `quant_q_fp4_preshuffle` in
`op_tests/test_flydsl_pa_mqa_logits_fp4_prefill.py`) stores, per page p, token t, group g:
    kv_cache[p, 0, g, t, b]                       = our value byte t * 64 + g * 16 + b
    kv_scale[p, 0, g, (t % 16) * 4 + t // 16]     = our scale byte 4096 + t * 4 + g
and the query scales of row r, head h as
    q_scale[r, 0, g, h % 16, h // 16]             = our q_scale[r, h, g].
q_fp4 [rows, 64, 64] and the packing of a byte (element 2i low nibble) are the same in both.
Every function here is a pure permutation of bytes: round trips are exact.
"""

from __future__ import annotations

import torch

from .cache_layout import (
    GROUP_BYTES,
    NUM_HEADS,
    PAGE_BYTES,
    PAGE_SIZE,
    PAGE_VALUE_BYTES,
    SCALE_BYTES,
    describe_kv_cache,
    pack_kv_cache,
    unpack_kv_cache,
)
from .errors import InputShapeError

_TOKEN_QUARTERS = PAGE_SIZE // 16  # AITER's scale order: token t = quarter * 16 + lane


def aiter_pages_from_litetopk(kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Our cache (any accepted view) -> AITER's (kv_cache uint8 [pages, 1, 4, 64, 16],
    kv_scale uint8 [pages, 1, 4, 64]), new contiguous tensors."""
    pages = describe_kv_cache(kv_cache).values
    num_pages = pages.shape[0]
    values = pages[:, :PAGE_VALUE_BYTES].reshape(num_pages, PAGE_SIZE, SCALE_BYTES, GROUP_BYTES)
    scales = pages[:, PAGE_VALUE_BYTES:].reshape(num_pages, _TOKEN_QUARTERS, 16, SCALE_BYTES)
    return (
        values.permute(0, 2, 1, 3).contiguous().unsqueeze(1),
        scales.permute(0, 3, 2, 1).reshape(num_pages, 1, SCALE_BYTES, PAGE_SIZE).contiguous(),
    )


def litetopk_pages_from_aiter(kv_cache: torch.Tensor, kv_scale: torch.Tensor) -> torch.Tensor:
    """AITER's cache -> ours, uint8 [pages, 4352] (the inverse of `aiter_pages_from_litetopk`)."""
    cache = describe_kv_cache(kv_cache, kv_scale)
    num_pages = cache.num_pages
    values = cache.values.reshape(num_pages, SCALE_BYTES, PAGE_SIZE, GROUP_BYTES).permute(0, 2, 1, 3)
    scales = cache.scales.reshape(num_pages, SCALE_BYTES, 16, _TOKEN_QUARTERS).permute(0, 3, 2, 1)
    out = torch.empty(num_pages, PAGE_BYTES, dtype=torch.uint8, device=cache.device)
    out[:, :PAGE_VALUE_BYTES] = values.reshape(num_pages, PAGE_VALUE_BYTES)
    out[:, PAGE_VALUE_BYTES:] = scales.reshape(num_pages, -1)
    return out


def pack_kv_cache_aiter(
    k_fp4: torch.Tensor, k_scale: torch.Tensor, block_table: torch.Tensor, num_pages: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """`pack_kv_cache` in AITER's format: (kv_cache [num_pages, 1, 4, 64, 16], kv_scale
    [num_pages, 1, 4, 64]); same arguments, checks and zero bytes."""
    return aiter_pages_from_litetopk(pack_kv_cache(k_fp4, k_scale, block_table, num_pages))


def unpack_kv_cache_aiter(
    kv_cache: torch.Tensor, kv_scale: torch.Tensor, block_table: torch.Tensor, length: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of `pack_kv_cache_aiter`: (k_fp4 uint8 [batch, length, 64], k_scale uint8 [batch, length, 4])."""
    return unpack_kv_cache(kv_cache, block_table, length, kv_scale=kv_scale)


def shuffle_q_scale_aiter(q_scale: torch.Tensor) -> torch.Tensor:
    """Our q_scale uint8 [rows, 64, 4] -> AITER's pre-shuffled uint8 [rows, 1, 4, 16, 4] (new tensor)."""
    if q_scale.ndim != 3 or tuple(q_scale.shape[1:]) != (NUM_HEADS, SCALE_BYTES):
        raise InputShapeError(f"q_scale must be [rows, {NUM_HEADS}, {SCALE_BYTES}], got {list(q_scale.shape)}")
    rows = q_scale.shape[0]
    by_tile = q_scale.reshape(rows, NUM_HEADS // 16, 16, SCALE_BYTES)  # [rows, h // 16, h % 16, g]
    return by_tile.permute(0, 3, 2, 1).contiguous().unsqueeze(1)


def unshuffle_q_scale_aiter(q_scale: torch.Tensor) -> torch.Tensor:
    """AITER's q_scale uint8 [rows, 1, 4, 16, 4] -> ours, uint8 [rows, 64, 4] (new contiguous tensor)."""
    if q_scale.ndim != 5 or tuple(q_scale.shape[1:]) != (1, SCALE_BYTES, 16, NUM_HEADS // 16):
        raise InputShapeError(f"q_scale must be AITER's [rows, 1, 4, 16, 4], got {list(q_scale.shape)}")
    rows = q_scale.shape[0]
    return q_scale[:, 0].permute(0, 3, 2, 1).reshape(rows, NUM_HEADS, SCALE_BYTES).contiguous()
