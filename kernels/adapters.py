"""Adapters from serving engines' DeepSeek-V4 FP4 indexer tensors to `litetopk_prefill`, zero copy.

Layer: public face (imports the operator and the formats).

Each adapter reinterprets the engine's tensors as the operator's arguments by views only (the
cache, queries, scales and weights are never copied) and writes the answer into the engine's
own int32 index buffer.

Matched (tensor shapes and dtypes as issue 14 item 5 states them; NOT yet checked line by line
against a pinned sglang / vLLM commit, see docs/cache-layouts.md):
- sglang, DeepSeek-V4 FP4 indexer (CUDA): q values uint8 [T, 64, 64]; q scales int32 [T, 1, 64]
  whose bytes are our [T, 64, 4]; weights float32 [T, 64, 1] with the softmax scale folded in; a
  page table with one row per query token; the cache in our format; physical indices written
  into the caller's int32 [T, K] buffer.
- vLLM, DeepSeek-V4 indexer: the cache in our format as a slice of per-block slabs (pages
  stride(0) >= 4352 bytes apart, e.g. 4608); a block table per request; raw request-relative
  indices written into `topk_indices_buffer` (any int32 [T, K] view, e.g. buf[:T, :K]).
"""

from __future__ import annotations

import torch

from .cache_layout import NUM_HEADS, SCALE_BYTES
from .errors import InputError, InputShapeError
from .operator import litetopk_prefill
from .result import TopKResult


def _check_index_buffer(buffer: torch.Tensor, rows: int, topk: int, name: str) -> None:
    if not isinstance(buffer, torch.Tensor) or buffer.dtype != torch.int32 or tuple(buffer.shape) != (rows, topk):
        got = list(buffer.shape) if isinstance(buffer, torch.Tensor) else type(buffer).__name__
        raise InputShapeError(f"{name} must be int32 [{rows}, {topk}], got {got}")


def sglang_q_scale_bytes(q_scale: torch.Tensor) -> torch.Tensor:
    """sglang's int32 [T, 1, 64] query scales as our uint8 [T, 64, 4] (a view of the same bytes)."""
    if q_scale.dtype != torch.int32 or q_scale.ndim != 3 or tuple(q_scale.shape[1:]) != (1, NUM_HEADS):
        raise InputShapeError(f"sglang q_scale must be int32 [T, 1, {NUM_HEADS}], "
                              f"got {q_scale.dtype} {list(q_scale.shape)}")
    if not q_scale.is_contiguous():
        raise InputError("sglang q_scale must be contiguous")
    return q_scale.view(torch.uint8).view(q_scale.shape[0], NUM_HEADS, SCALE_BYTES)


def topk_sglang_fp4_indexer(
    q_fp4: torch.Tensor, q_scale: torch.Tensor, kv_cache: torch.Tensor, page_table: torch.Tensor,
    weights: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor, out_physical: torch.Tensor, *,
    topk: int, backend: str = "auto",
) -> TopKResult:
    """sglang's DeepSeek-V4 FP4 indexer call (module docstring): query row t reads window
    [starts[t], ends[t]) through page_table[t] (int32 [T, max_pages], one row per query token);
    writes the physical slots into `out_physical` (int32 [T, K]) and returns the TopKResult.
    weights float32 [T, 64, 1]. Raises InputError for tensors that do not match."""
    rows = q_fp4.shape[0]
    if weights.ndim != 3 or tuple(weights.shape[1:]) != (NUM_HEADS, 1):
        raise InputShapeError(f"sglang weights must be [T, {NUM_HEADS}, 1], got {list(weights.shape)}")
    _check_index_buffer(out_physical, rows, topk, "out_physical")
    row_to_batch = torch.arange(rows, dtype=torch.int32, device=q_fp4.device)  # page_table row t serves row t
    result = litetopk_prefill(
        q_fp4, sglang_q_scale_bytes(q_scale), kv_cache, page_table, weights.view(rows, NUM_HEADS),
        row_to_batch, starts, ends, topk=topk, backend=backend, out={"physical_indices": out_physical},
    )
    return result


def topk_vllm_indexer(
    q_fp4: torch.Tensor, q_scale: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
    weights: torch.Tensor, row_to_request: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor,
    topk_indices_buffer: torch.Tensor, *, topk: int, backend: str = "auto",
) -> TopKResult:
    """vLLM's DeepSeek-V4 indexer call (module docstring): `kv_cache` any uint8 view of 4352-byte
    pages (vLLM's 4608-byte slab pages included), `block_table` int32 [requests, max_pages],
    query row t of request row_to_request[t] sees [starts[t], ends[t]); writes the raw
    request-relative indices (-1 padded) into `topk_indices_buffer` (int32 [T, K], strided views
    allowed) and returns the TopKResult."""
    _check_index_buffer(topk_indices_buffer, q_fp4.shape[0], topk, "topk_indices_buffer")
    result = litetopk_prefill(
        q_fp4, q_scale, kv_cache, block_table, weights, row_to_request, starts, ends, topk=topk, backend=backend,
        out={"raw_indices": topk_indices_buffer},
    )
    return result


__all__ = ["sglang_q_scale_bytes", "topk_sglang_fp4_indexer", "topk_vllm_indexer"]
