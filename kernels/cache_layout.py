"""The paged FP4 key cache as DeepSeek-V4 serving stacks store it (CONTRACT.md §2).

One page holds PAGE_SIZE = 64 compressed tokens in PAGE_BYTES = 4352 bytes:
    bytes [0, 4096)    64 tokens x 64 bytes of packed E2M1 values (token t at t * 64)
    bytes [4096, 4352) 64 tokens x 4 UE8M0 scale bytes (token t at 4096 + t * 4)
A cache is uint8 [num_pages, 4352]. Logical position j of sequence b lives in physical page
block_table[b, j // 64], row j % 64; its physical slot is block_table[b, j // 64] * 64 + j % 64,
computed in int64 (`map_pages` in selection.py turns it into the int32 output).
"""

from __future__ import annotations

import torch

from .errors import InputError

PAGE_SIZE = 64
HEAD_DIM = 128
NUM_HEADS = 64
VALUE_BYTES = HEAD_DIM // 2  # 64 bytes of packed E2M1 per key
SCALE_BYTES = HEAD_DIM // 32  # 4 UE8M0 scale bytes per key
PAGE_VALUE_BYTES = PAGE_SIZE * VALUE_BYTES  # 4096
PAGE_BYTES = PAGE_SIZE * (VALUE_BYTES + SCALE_BYTES)  # 4352


def page_values(kv_cache: torch.Tensor) -> torch.Tensor:
    """View of the packed values of every page: uint8 [num_pages, PAGE_SIZE, VALUE_BYTES]."""
    return kv_cache[:, :PAGE_VALUE_BYTES].view(-1, PAGE_SIZE, VALUE_BYTES)


def page_scales(kv_cache: torch.Tensor) -> torch.Tensor:
    """View of the scale bytes of every page: uint8 [num_pages, PAGE_SIZE, SCALE_BYTES]."""
    return kv_cache[:, PAGE_VALUE_BYTES:].view(-1, PAGE_SIZE, SCALE_BYTES)


def _check_sequences(k_fp4: torch.Tensor, k_scale: torch.Tensor, block_table: torch.Tensor) -> None:
    if k_fp4.dtype != torch.uint8 or k_scale.dtype != torch.uint8:
        raise InputError(f"k_fp4 and k_scale must be uint8, got {k_fp4.dtype} and {k_scale.dtype}")
    if k_fp4.ndim != 3 or k_fp4.shape[-1] != VALUE_BYTES:
        raise InputError(f"k_fp4 must be [batch, length, {VALUE_BYTES}], got {tuple(k_fp4.shape)}")
    if tuple(k_scale.shape) != (*k_fp4.shape[:2], SCALE_BYTES):
        raise InputError(
            f"k_scale must be [batch, length, {SCALE_BYTES}] matching k_fp4, got {tuple(k_scale.shape)}"
        )
    if block_table.ndim != 2 or block_table.shape[0] != k_fp4.shape[0]:
        raise InputError(f"block_table must be [batch, max_pages], got {tuple(block_table.shape)}")
    if k_fp4.shape[1] > block_table.shape[1] * PAGE_SIZE:
        raise InputError(
            f"length {k_fp4.shape[1]} needs {-(-k_fp4.shape[1] // PAGE_SIZE)} pages per sequence, "
            f"block_table has {block_table.shape[1]}"
        )


def _live_pages(block_table: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(batch index, logical page) of every page that holds positions < length."""
    pages_used = -(-length // PAGE_SIZE)
    batch, logical = torch.meshgrid(
        torch.arange(block_table.shape[0]), torch.arange(pages_used), indexing="ij"
    )
    return batch.reshape(-1), logical.reshape(-1)


def pack_kv_cache(
    k_fp4: torch.Tensor, k_scale: torch.Tensor, block_table: torch.Tensor, num_pages: int
) -> torch.Tensor:
    """Lay out per-sequence keys as a paged cache.

    `k_fp4` uint8 [batch, length, 64], `k_scale` uint8 [batch, length, 4]: key j of sequence b.
    `block_table` int [batch, max_pages]: physical page of each logical page (a negative entry
    marks an unused page and must not hold positions < length). Returns uint8 [num_pages, 4352];
    bytes of pages no sequence uses, and of slots past `length`, are zero. Raises InputError for
    bad shapes, pages outside [0, num_pages), or a physical page used twice.
    """
    _check_sequences(k_fp4, k_scale, block_table)
    batch_size, length, _ = k_fp4.shape
    batch, logical = _live_pages(block_table.cpu(), length)
    physical = block_table.cpu().long()[batch, logical]
    if bool(((physical < 0) | (physical >= num_pages)).any()):
        raise InputError(f"block_table maps a used page outside [0, {num_pages})")
    if physical.unique().numel() != physical.numel():
        raise InputError("block_table maps two logical pages to the same physical page")
    padded = -(-length // PAGE_SIZE) * PAGE_SIZE
    values = torch.zeros(batch_size, padded, VALUE_BYTES, dtype=torch.uint8, device=k_fp4.device)
    scales = torch.zeros(batch_size, padded, SCALE_BYTES, dtype=torch.uint8, device=k_fp4.device)
    values[:, :length] = k_fp4
    scales[:, :length] = k_scale
    cache = torch.zeros(num_pages, PAGE_BYTES, dtype=torch.uint8, device=k_fp4.device)
    physical = physical.to(k_fp4.device)
    page_values(cache)[physical] = values.view(batch_size, -1, PAGE_SIZE, VALUE_BYTES)[batch, logical]
    page_scales(cache)[physical] = scales.view(batch_size, -1, PAGE_SIZE, SCALE_BYTES)[batch, logical]
    return cache


def unpack_kv_cache(
    kv_cache: torch.Tensor, block_table: torch.Tensor, length: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of `pack_kv_cache`: (k_fp4 uint8 [batch, length, 64], k_scale uint8 [batch, length, 4])."""
    if kv_cache.dtype != torch.uint8 or kv_cache.ndim != 2 or kv_cache.shape[1] != PAGE_BYTES:
        raise InputError(f"kv_cache must be uint8 [num_pages, {PAGE_BYTES}], got {tuple(kv_cache.shape)}")
    batch, logical = _live_pages(block_table.cpu(), length)
    physical = block_table.cpu().long()[batch, logical]
    if bool(((physical < 0) | (physical >= kv_cache.shape[0])).any()):
        raise InputError(f"block_table maps a used page outside [0, {kv_cache.shape[0]})")
    physical = physical.to(kv_cache.device)
    batch_size = block_table.shape[0]
    values = page_values(kv_cache)[physical].view(batch_size, -1, VALUE_BYTES)[:, :length]
    scales = page_scales(kv_cache)[physical].view(batch_size, -1, SCALE_BYTES)[:, :length]
    return values.contiguous(), scales.contiguous()
