"""The paged FP4 key cache in its two formats (docs/contract.md §2 and §7; docs/cache-layouts.md).

Layer: formats, at the bottom of `litetopk.kernels` (imports errors only).

One page holds PAGE_SIZE = 64 compressed tokens; token t's key is 64 packed E2M1 bytes (group g of
32 elements in bytes [16g, 16g + 16)) and 4 UE8M0 scale bytes (group g). The two formats place them:

    "litetopk" (ours; sglang's CUDA FP4 indexer, DeepGEMM, vLLM): one uint8 tensor, a page is 4352
        bytes, value byte (t, g, b) at t * 64 + g * 16 + b, scale (t, g) at 4096 + t * 4 + g.
        Pages may lie any stride(0) >= 4352 bytes apart ([pages, 4352], [pages, 64, 1, 68], a
        slice of a per-block slab such as vLLM's 4608-byte pages).
    "aiter" (ROCm/aiter's FlyDSL FP4 indexer): two tensors, kv_cache uint8 [pages, 1, 4, 64, 16]
        (group-major: value byte (t, g, b) at g * 1024 + t * 16 + b of a 4096-byte page) and
        kv_scale uint8 [pages, 1, 4, 64] (scale (t, g) at g * 64 + (t % 16) * 4 + t // 16 of a
        256-byte page); here too each tensor's pages may lie any stride(0) apart.

`describe_kv_cache(kv_cache, kv_scale)` validates either and returns a frozen `KVCache` that every
backend reads in place (byte address = base + page * page stride (int64) + in-page offset).
Logical position j of sequence b lives in physical page block_table[b, j // 64], token j % 64;
its physical slot is block_table[b, j // 64] * 64 + j % 64, computed in int64.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .errors import InputDtypeError, InputError, InputShapeError

PAGE_SIZE = 64
HEAD_DIM = 128
NUM_HEADS = 64
VALUE_BYTES = HEAD_DIM // 2  # 64 bytes of packed E2M1 per key
SCALE_BYTES = HEAD_DIM // 32  # 4 UE8M0 scale bytes per key
GROUP_BYTES = VALUE_BYTES // SCALE_BYTES  # 16 packed bytes per 32-element group
PAGE_VALUE_BYTES = PAGE_SIZE * VALUE_BYTES  # 4096
PAGE_BYTES = PAGE_SIZE * (VALUE_BYTES + SCALE_BYTES)  # 4352
CACHE_FORMATS = ("litetopk", "aiter")
AITER_VALUE_SHAPE = (1, SCALE_BYTES, PAGE_SIZE, GROUP_BYTES)  # kv_cache [pages, 1, 4, 64, 16]
AITER_SCALE_SHAPE = (1, SCALE_BYTES, PAGE_SIZE)  # kv_scale [pages, 1, 4, 64]


@dataclass(frozen=True)
class KVCache:
    """A validated paged cache in one of CACHE_FORMATS, read in place.

    `values` / `scales`: uint8 [num_pages, value_page_bytes] / [num_pages, scale_page_bytes] views
    of the caller's memory (the same storage; for "litetopk" both are the one page matrix and the
    scales start at `scale_offset` = 4096 of each page). In-page byte offsets of token t:
        value byte (t, g, b) = t * value_token_stride + g * value_group_stride + b   (b < 16)
        scale (t, g)         = scale_offset + token_scale_offset(t) + g * scale_group_stride
    with token_scale_offset(t) = t * 4 ("litetopk") or (t % 16) * 4 + t // 16 ("aiter").
    Page strides are in bytes; address arithmetic with them is 64-bit.
    """

    format: str
    values: torch.Tensor
    scales: torch.Tensor
    num_pages: int
    value_page_stride: int
    scale_page_stride: int
    value_token_stride: int
    value_group_stride: int
    scale_offset: int
    scale_group_stride: int

    @property
    def interleaved_scales(self) -> bool:
        """True where a page's scale bytes are AITER's interleaved token order."""
        return self.format == "aiter"

    @property
    def device(self) -> torch.device:
        return self.values.device

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """The caller tensors this cache reads (one for "litetopk", two for "aiter")."""
        return (self.values,) if self.format == "litetopk" else (self.values, self.scales)


def _page_matrix(tensor, name: str, page_shape: tuple[int, ...], wanted: str) -> torch.Tensor:
    """uint8 [pages, prod(page_shape)] view of `tensor` whose pages are contiguous and lie
    stride(0) >= page bytes apart; raises InputError saying what to change."""
    if not isinstance(tensor, torch.Tensor):
        raise InputError(f"{name} must be a uint8 tensor, got {type(tensor).__name__}")
    if tensor.dtype != torch.uint8:
        raise InputDtypeError(f"{name} must be a uint8 tensor, got {str(tensor.dtype).removeprefix('torch.')}")
    page_bytes = math.prod(page_shape)
    if (
        tensor.ndim < 2
        or math.prod(tensor.shape[1:]) != page_bytes
        or (len(page_shape) > 1 and tuple(tensor.shape[1:]) != page_shape)
    ):
        raise InputShapeError(f"{name} must be {wanted}, got {list(tensor.shape)}")
    inner = tensor[0] if tensor.shape[0] else tensor.new_empty(tensor.shape[1:])
    if not inner.is_contiguous():
        raise InputError(
            f"the bytes of one page of {name} must be contiguous (strides {list(tensor.stride())}); "
            "pages themselves may lie any stride(0) apart"
        )
    stride = tensor.stride(0) if tensor.shape[0] > 1 else page_bytes
    if stride < page_bytes:
        raise InputError(f"{name} pages overlap: stride(0) = {stride} bytes < {page_bytes} bytes a page")
    return tensor.as_strided((tensor.shape[0], page_bytes), (stride, 1))


def describe_kv_cache(kv_cache, kv_scale=None) -> KVCache:
    """Validate a cache given in either format and describe it (module docstring).

    `kv_scale is None`: our format, `kv_cache` uint8 [num_pages, 4352] or any view of 4352-byte
    pages (e.g. [num_pages, 64, 1, 68]) whose pages lie stride(0) >= 4352 bytes apart.
    Otherwise AITER's: `kv_cache` uint8 [num_pages, 1, 4, 64, 16], `kv_scale` uint8
    [num_pages, 1, 4, 64] on the same device. Raises InputError (dtype/shape subclasses) for
    anything else; reads no bytes and copies nothing.
    """
    if kv_scale is None:
        pages = _page_matrix(
            kv_cache, "kv_cache", (PAGE_BYTES,), f"[num_pages, {PAGE_BYTES}] (or a view such as [num_pages, 64, 1, 68])"
        )
        return KVCache(
            format="litetopk",
            values=pages,
            scales=pages,
            num_pages=pages.shape[0],
            value_page_stride=pages.stride(0),
            scale_page_stride=pages.stride(0),
            value_token_stride=VALUE_BYTES,
            value_group_stride=GROUP_BYTES,
            scale_offset=PAGE_VALUE_BYTES,
            scale_group_stride=1,
        )
    values = _page_matrix(
        kv_cache, "kv_cache", AITER_VALUE_SHAPE, "[num_pages, 1, 4, 64, 16] (AITER's layout, given with kv_scale)"
    )
    scales = _page_matrix(kv_scale, "kv_scale", AITER_SCALE_SHAPE, "[num_pages, 1, 4, 64] (AITER's layout)")
    if scales.shape[0] != values.shape[0]:
        raise InputShapeError(
            f"kv_scale must have one page per kv_cache page: {values.shape[0]} pages, got {scales.shape[0]}"
        )
    if scales.device != values.device:
        raise InputError(f"kv_cache and kv_scale must be on one device; got {values.device} and {scales.device}")
    return KVCache(
        format="aiter",
        values=values,
        scales=scales,
        num_pages=values.shape[0],
        value_page_stride=values.stride(0),
        scale_page_stride=scales.stride(0),
        value_token_stride=GROUP_BYTES,
        value_group_stride=PAGE_SIZE * GROUP_BYTES,
        scale_offset=0,
        scale_group_stride=PAGE_SIZE,
    )


def token_scale_offsets(tokens: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """In-page offset of group 0's scale byte of each token (module docstring), same dtype."""
    return (tokens % 16) * SCALE_BYTES + tokens // 16 if interleaved else tokens * SCALE_BYTES


def gather_keys(cache: KVCache, pages: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(values uint8 [n, 64], scales uint8 [n, 4]) of the keys at (pages[i], tokens[i]), read from
    either format; `pages` must lie in [0, num_pages)."""
    pages = pages.long().reshape(-1, 1)
    tokens = tokens.long().reshape(-1, 1)
    byte = torch.arange(VALUE_BYTES, device=pages.device)
    value_at = tokens * cache.value_token_stride + (byte // GROUP_BYTES) * cache.value_group_stride + byte % GROUP_BYTES
    group = torch.arange(SCALE_BYTES, device=pages.device)
    scale_at = (
        cache.scale_offset + token_scale_offsets(tokens, cache.interleaved_scales) + group * cache.scale_group_stride
    )
    return cache.values[pages, value_at], cache.scales[pages, scale_at]


def page_values(kv_cache: torch.Tensor) -> torch.Tensor:
    """View of the packed values of every page of our format: uint8 [num_pages, PAGE_SIZE, VALUE_BYTES]."""
    return kv_cache[:, :PAGE_VALUE_BYTES].unflatten(1, (PAGE_SIZE, VALUE_BYTES))


def page_scales(kv_cache: torch.Tensor) -> torch.Tensor:
    """View of the scale bytes of every page of our format: uint8 [num_pages, PAGE_SIZE, SCALE_BYTES]."""
    return kv_cache[:, PAGE_VALUE_BYTES:PAGE_BYTES].unflatten(1, (PAGE_SIZE, SCALE_BYTES))


def _check_sequences(k_fp4: torch.Tensor, k_scale: torch.Tensor, block_table: torch.Tensor) -> None:
    if k_fp4.dtype != torch.uint8 or k_scale.dtype != torch.uint8:
        raise InputError(f"k_fp4 and k_scale must be uint8, got {k_fp4.dtype} and {k_scale.dtype}")
    if k_fp4.ndim != 3 or k_fp4.shape[-1] != VALUE_BYTES:
        raise InputError(f"k_fp4 must be [batch, length, {VALUE_BYTES}], got {tuple(k_fp4.shape)}")
    if tuple(k_scale.shape) != (*k_fp4.shape[:2], SCALE_BYTES):
        raise InputError(f"k_scale must be [batch, length, {SCALE_BYTES}] matching k_fp4, got {tuple(k_scale.shape)}")
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
    batch, logical = torch.meshgrid(torch.arange(block_table.shape[0]), torch.arange(pages_used), indexing="ij")
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
    kv_cache: torch.Tensor, block_table: torch.Tensor, length: int, kv_scale: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of `pack_kv_cache` (and, with `kv_scale`, of `pack_kv_cache_aiter`): (k_fp4 uint8
    [batch, length, 64], k_scale uint8 [batch, length, 4]) read from a cache in either format and
    any page stride (`describe_kv_cache`)."""
    cache = describe_kv_cache(kv_cache, kv_scale)
    batch, logical = _live_pages(block_table.cpu(), length)
    physical = block_table.cpu().long()[batch, logical]
    if bool(((physical < 0) | (physical >= cache.num_pages)).any()):
        raise InputError(f"block_table maps a used page outside [0, {cache.num_pages})")
    batch_size = block_table.shape[0]
    pages = physical.to(cache.device).repeat_interleave(PAGE_SIZE)
    tokens = torch.arange(PAGE_SIZE, device=cache.device).repeat(physical.numel())
    values, scales = gather_keys(cache, pages, tokens)
    return (
        values.view(batch_size, -1, VALUE_BYTES)[:, :length].contiguous(),
        scales.view(batch_size, -1, SCALE_BYTES)[:, :length].contiguous(),
    )
