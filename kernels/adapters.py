"""Adapters from sglang's and vLLM's DeepSeek-V4 FP4 indexer calls to `litetopk_prefill`, zero copy.

Layer: public face (imports the operator and the formats).

Each adapter takes the tensors the engine hands its own indexer logits + top-k at that call site
(decode, MTP verify and prefill), reinterprets them as the operator's arguments by views, builds the
per-row metadata (row_to_batch, starts, ends) on the device from shapes alone (no host sync, no
data-dependent shape: the call can be captured in a CUDA graph), and writes the answer through
`out=` into the engine's own int32 index buffer. The queries, scales, weights, cache and tables are
never copied.

    engine                 call site (pinned below)                adapter
    sglang, any mode       DeepseekV4 backend `forward_c4_indexer`   topk_sglang_c4_indexer
    sglang, own windows    (per-token [start, end) windows)         topk_sglang_fp4_indexer
    vLLM, decode / MTP     `sparse_attn_indexer`, `if has_decode:`  topk_vllm_indexer_decode
    vLLM, prefill chunk    `sparse_attn_indexer`, `for chunk in`    topk_vllm_indexer_prefill_chunk
    vLLM, own windows      (row_to_request, starts, ends)           topk_vllm_indexer

Matched line by line against the public sources in the search tool's store. The store keeps
versions file by file, so each file below is pinned at its own commit (not one tree); a newer
engine may have moved a tensor.

sglang (sgl-project/sglang):
  S1 python/sglang/srt/layers/attention/dsv4/indexer.py @ 00509fc37435a43a8b44aa0d942c980298a2d20c
     (C4IndexerBackendMixin.forward_c4_indexer, C4Indexer.compute_q, topk_transform_512_*)
  S2 python/sglang/srt/layers/attention/dsv4/metadata.py @ 0094505da74125a31ceb354f37ae7a1b6a97d3f5
     (PagedIndexerMetadata: page_size 256, c4_page_size 64, max_c4_seq_len; the terms comment)
  S3 python/sglang/srt/layers/attention/deepseek_v4_backend.py @ 00021f78220abd9502d41286e9836258132b3c6d
     (init_forward_metadata_indexer, make_forward_metadata_from_raw_decode / _raw_verify,
      expand_extend_with_same_length; make_core_attn_metadata read in other stored versions of
      this file, found by content, not at this commit)
  S4 python/sglang/kernels/ops/attention/dsv4/elementwise.py @ 05d82b60d243d684c578bffbd15fe2ec437a345c
     (fused_q_indexer_rope_hadamard_fp4_quant: the FP4 query's dtypes and shapes)
  S5 python/sglang/kernels/ops/attention/dsv4/fp4_litetopk_hip.py @ 0bbd7a312e481cd820d7afd4726ae30a1693579a
     (sglang's own LiteTopK call on ROCm, through AITER: prefill only; see kernels/aiter.py)
vLLM (vllm-project/vllm):
  V1 vllm/model_executor/layers/sparse_attn_indexer.py @ 006475fe481a855ea61dd7aafc3722458fcbbeea
     (sparse_attn_indexer: the prefill chunks and the decode branch; kv_cache_as_quant_view)
  V2 vllm/v1/attention/backends/mla/indexer.py @ 0023368d052caf392d159ab32d380a807a89be99
     (DeepSeekV32IndexerDecodeMetadata, _prepare_decode_tensors, build_prefill_chunk_metadata)
  V3 vllm/v1/attention/ops/deepseek_v4_ops/fused_indexer_q.py @ 0f70fc66c98d693f6929a4c2624e4a76f7a980e2
     (fused_indexer_q_rope_quant(use_fp4=True): the FP4 query's dtypes and shapes)
  V4 vllm/v1/attention/ops/deepseek_v4_ops/fused_compress_quant_cache.py @ 0de10a276eced6036e9752a223cba53c996d31cd
     (the MXFP4 indexer cache block: values [0, 64*64), scales [64*64, +64*4), low nibble first)
  V5 vllm/model_executor/layers/deepseek_v4_attention.py @ 0a291a2e1074b13971361df76245548a4ea4a77d
     (DeepseekV4Indexer: 132-byte FP8-sized pages of which FP4 uses the first 68 per token;
      _forward_decode: topk_indices_buffer rows are request-relative C4 positions, -1 padded)

Tensor mapping, sglang (`topk_sglang_c4_indexer`; S1 forward_c4_indexer unless said):
  q_fp4    <- q_indexer[0]: int8 [T, 64, 64] (S4), viewed as uint8.
  q_scale  <- q_indexer[1]: int32 [T, 64] (S4; older versions [T, 1, 64]), its bytes viewed as
              uint8 [T, 64, 4] (little endian: byte g is group g's UE8M0 scale).
  kv_cache <- token_to_kv_pool.get_index_k_with_scale_buffer(layer): uint8 [pages, 4352] (S1 views
              it as [pages, 64, 1, 68]); passed as is.
  block_table <- indexer_metadata.page_table: int32 [T, max_pages], ONE ROW PER QUERY TOKEN (S3
              make_core_attn_metadata: req_to_token[req_pool_indices_repeated, ::256] // 256; a
              256-token page holds 64 C4 keys, so the same page id addresses the C4 cache; S1
              pads missing rows with 0).
  weights  <- weights float32 [T, 64, 1] (S4, softmax and head scales folded in), viewed [T, 64].
  row_to_batch <- arange(T): page-table row t serves query row t (with next_n > 1 at MTP verify:
              t - t % next_n, the request's first token, whose row its other tokens repeat).
  starts   <- 0.
  ends     <- indexer_metadata.c4_seq_lens int32 [T] (or [T, 1]; S3 names the field
              compressed_seq_lens): c4_topk_lengths_raw = seq_lens_casual // 4 per token, not
              clamped (S3 init_forward_metadata_indexer; S2's comment still says "bounded by at
              least 1"); seq_lens_casual is seq_lens at decode (one token per request) and
              L + j - next_n + 1 for j < next_n at MTP verify (S3); S1 pads missing rows with 1.
  max_seq_len <- indexer_metadata.max_c4_seq_len (optional; S2: page_table.shape[1] * 64 while
              capturing).
  out physical_indices <- core_metadata.c4_sparse_page_indices int32 [T, K] (slot = page * 64 +
              j % 64, -1 padded: S1 topk_transform_512_*); out raw_indices <- c4_sparse_raw_indices
              (optional).
  Decode, MTP verify and extend hand the indexer the same tensors; only T and the lengths differ
  (the FP4 indexer always takes the paged path: S1 _can_use_nonpaged_indexer refuses it).

Tensor mapping, vLLM decode (`topk_vllm_indexer_decode`; V1 `if has_decode:` unless said):
  q_fp4    <- padded_q_quant_decode_tokens: uint8 [B, next_n, 64, 64] (V3 index_q_packed
              [T, 64, 64] reshaped), or the flat [B * next_n, 64, 64].
  q_scale  <- padded_q_scale: int32 [B, next_n, 64] (V3: 4 UE8M0 bytes per head as one int32),
              or [B * next_n, 64]; its bytes viewed as uint8 [B * next_n, 64, 4].
  kv_cache <- kv_cache: the layer's 3-D uint8 [blocks, 64, 132] allocation (V5: FP8-sized; FP4
              uses the first 64 * 68 bytes of a block, V4), viewed like kv_cache_as_quant_view:
              [blocks, 64, 1, 68] with the block stride kept; the 4-D view itself is taken too.
  block_table <- decode_metadata.block_table int32 [>= B, max_blocks] (V2: per request on the
              native path; on the flattened path one row per token, with next_n = 1).
  weights  <- weights[:num_padded_tokens] float32 [B * next_n, 64] (V3: softmax and head scales
              folded in).
  row_to_batch <- arange(B * next_n) // next_n: row b * next_n + j belongs to request b.
  starts   <- 0.
  ends     <- decode_metadata.seq_lens[:B] int32 [B, next_n] (native MTP: max(L_b - next_n + j + 1,
              0) // 4, V2 _prepare_decode_tensors: the clamp keeps padding requests at 0), [B, 1]
              (next_n = 1, or the flattened path), or [B].
  max_seq_len <- max_model_len (the indexer's, already compressed: V5), optional.
  out raw_indices <- topk_indices_buffer[:B * next_n, :K] (request-relative C4 positions, -1
              padded; V5 compute_global_topk_indices_and_lens maps them through the block table).
  vLLM's `requires_padding` calls (uneven decode lengths) pack q with pack_seq_triton first and
  unpack the indices after (V1); the adapter takes the packed tensors, as DeepGEMM does.

Tensor mapping, vLLM prefill (`topk_vllm_indexer_prefill_chunk`; V1 `for chunk in ...chunks`):
  q_fp4 / q_scale / weights <- q_quant / q_scale / weights [chunk.token_start:chunk.token_end]
              (shapes as at decode, flat).
  kv_cache <- kv_cache (read in place: the chunk's gather into k_quant is not needed).
  block_table <- chunk.block_table int32 [chunk requests, max_blocks].
  row_to_batch <- the request of each row: the r with cu_seq_lens[r] == cu_seqlen_ks[t] (a
              searchsorted on the device; V2 BuildPrefillChunkMetadataKernel writes ks = the
              request's start in the gathered keys, ke = ks + (start_pos + 1 + i) // 4).
  starts / ends <- 0 / chunk.cu_seqlen_ke - chunk.cu_seqlen_ks.
  out raw_indices <- topk_indices_buffer[chunk.token_start:chunk.token_end, :K] (request-relative
              C4 positions: V5's prefill gathers each request's C4 keys from position 0 and combines
              them with these indices; top_k_per_row_prefill's own code was not read).
  Not mapped: decode context parallelism (V1 _merge_dcp_topk_global, V2 local seq_lens): each
  rank's local windows and the cross-rank merge stay the engine's.

Where we differ from the engines' own top-k (the same keys, up to exact ties at the K-th place):
- a row whose window holds <= K keys returns its keys ordered by score; sglang returns them in
  position order (S1 `needs_sequential`), vLLM and DeepGEMM's top-k leave the order unspecified;
- exact ties at the K-th place go to the lower position (sglang's and vLLM's radix top-k do not
  fix it);
- a faulted row (bad page, window past max_seq_len, NaN/inf) publishes -1 everywhere and carries a
  RowStatus bit in the returned TopKResult; the engines have no status and would publish garbage.
"""

from __future__ import annotations

import torch

from .cache_layout import NUM_HEADS, PAGE_SIZE, SCALE_BYTES, VALUE_BYTES
from .errors import InputDtypeError, InputError, InputShapeError
from .operator import litetopk_prefill
from .result import TopKResult

#: dtypes an engine may hold the packed E2M1 queries in (viewed as uint8, never converted).
QUERY_DTYPES = tuple(
    dtype for dtype in (torch.uint8, torch.int8, getattr(torch, "float4_e2m1fn_x2", None)) if dtype is not None
)
#: bytes of one token in vLLM's FP4 indexer cache block: 64 packed values + 4 scales (V1, V4).
VLLM_FP4_TOKEN_BYTES = VALUE_BYTES + SCALE_BYTES


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _require_tensor(tensor, name: str) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise InputError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    return tensor


def _contiguous_view(tensor: torch.Tensor, name: str) -> torch.Tensor:
    if not tensor.is_contiguous():
        raise InputError(f"{name} must be contiguous (the adapter views it, it never copies)")
    return tensor


def query_bytes(q_fp4) -> torch.Tensor:
    """An engine's packed E2M1 queries, uint8 / int8 (sglang) / float4_e2m1fn_x2 [..., 64, 64]
    (vLLM decode: [B, next_n, 64, 64]), as uint8 [rows, 64, 64]: a view of the same bytes."""
    q_fp4 = _require_tensor(q_fp4, "q_fp4")
    if q_fp4.dtype not in QUERY_DTYPES:
        wanted = [_dtype_name(d) for d in QUERY_DTYPES]
        raise InputDtypeError(f"q_fp4 must be one of {wanted}, got {_dtype_name(q_fp4.dtype)}")
    if q_fp4.ndim < 3 or tuple(q_fp4.shape[-2:]) != (NUM_HEADS, VALUE_BYTES):
        raise InputShapeError(f"q_fp4 must be [..., {NUM_HEADS}, {VALUE_BYTES}], got {list(q_fp4.shape)}")
    return _contiguous_view(q_fp4, "q_fp4").view(torch.uint8).reshape(-1, NUM_HEADS, VALUE_BYTES)


def query_scale_bytes(q_scale, name: str = "q_scale") -> torch.Tensor:
    """An engine's UE8M0 query scales as our uint8 [rows, 64, 4], a view of the same bytes: int32
    [..., 64] (sglang [T, 64] or [T, 1, 64], vLLM [T, 64] or [B, next_n, 64]: byte g of a head's
    int32 is group g) or uint8 [..., 64, 4] (ours). Raises InputError for anything else."""
    q_scale = _require_tensor(q_scale, name)
    if q_scale.dtype == torch.int32 and q_scale.ndim >= 2 and q_scale.shape[-1] == NUM_HEADS:
        return _contiguous_view(q_scale, name).view(torch.uint8).reshape(-1, NUM_HEADS, SCALE_BYTES)
    if q_scale.dtype == torch.uint8 and q_scale.ndim >= 3 and tuple(q_scale.shape[-2:]) == (NUM_HEADS, SCALE_BYTES):
        return _contiguous_view(q_scale, name).reshape(-1, NUM_HEADS, SCALE_BYTES)
    raise InputShapeError(
        f"{name} must be int32 [..., {NUM_HEADS}] (the engines' packed scales) or uint8 "
        f"[..., {NUM_HEADS}, {SCALE_BYTES}], got {_dtype_name(q_scale.dtype)} {list(q_scale.shape)}"
    )


def sglang_q_scale_bytes(q_scale: torch.Tensor) -> torch.Tensor:
    """sglang's int32 query scales, [T, 64] (S4) or [T, 1, 64], as our uint8 [T, 64, 4] (a view)."""
    q_scale = _require_tensor(q_scale, "sglang q_scale")
    if (
        q_scale.dtype != torch.int32
        or q_scale.ndim not in (2, 3)
        or q_scale.shape[-1] != NUM_HEADS
        or (q_scale.ndim == 3 and q_scale.shape[1] != 1)
    ):
        raise InputShapeError(
            f"sglang q_scale must be int32 [T, {NUM_HEADS}] or [T, 1, {NUM_HEADS}], "
            f"got {_dtype_name(q_scale.dtype)} {list(q_scale.shape)}"
        )
    return query_scale_bytes(q_scale, "sglang q_scale")


def head_weights(weights, rows: int) -> torch.Tensor:
    """Head weights float32 / bfloat16 [rows, 64] or sglang's [rows, 64, 1], as [rows, 64] (a view)."""
    weights = _require_tensor(weights, "weights")
    if weights.ndim == 3 and weights.shape[-1] == 1:
        weights = weights.squeeze(-1)
    if weights.ndim != 2 or tuple(weights.shape) != (rows, NUM_HEADS):
        raise InputShapeError(
            f"weights must be [{rows}, {NUM_HEADS}] or [{rows}, {NUM_HEADS}, 1], got {list(weights.shape)}"
        )
    return weights


def _lengths(lengths, rows: int | None, name: str) -> torch.Tensor:
    """int32 per-row window ends of any shape ([T], [T, 1], [B, next_n]) flattened to [rows] (a view)."""
    lengths = _require_tensor(lengths, name)
    if lengths.dtype != torch.int32:
        raise InputDtypeError(f"{name} must be int32, got {_dtype_name(lengths.dtype)}")
    flat = _contiguous_view(lengths, name).reshape(-1)
    if rows is not None and flat.shape[0] != rows:
        raise InputShapeError(f"{name} must hold one length per query row ({rows}), got {list(lengths.shape)}")
    return flat


def index_buffer(buffer, rows: int, topk: int, name: str) -> torch.Tensor:
    """The [rows, K] corner of an engine's int32 index buffer (vLLM's topk_indices_buffer is
    [max_num_batched_tokens, K]; sglang's page-index buffers may be padded to a multiple of 64)."""
    if (
        not isinstance(buffer, torch.Tensor)
        or buffer.dtype != torch.int32
        or buffer.ndim != 2
        or buffer.shape[0] < rows
        or buffer.shape[1] < topk
    ):
        got = (
            f"{_dtype_name(buffer.dtype)} {list(buffer.shape)}"
            if isinstance(buffer, torch.Tensor)
            else type(buffer).__name__
        )
        raise InputShapeError(f"{name} must be int32 [>= {rows}, >= {topk}] (written at [:{rows}, :{topk}]), got {got}")
    return buffer[:rows, :topk]


def vllm_kv_cache_pages(kv_cache) -> torch.Tensor:
    """vLLM's FP4 indexer cache as pages the operator reads in place (V1 kv_cache_as_quant_view).

    The layer's allocation is uint8 [blocks, 64, W] with W >= 68 (V5: W = 132, FP8-sized) and any
    block stride; a block's first 64 * 68 bytes are our page (V4). It is returned as the view
    DeepGEMM gets, [blocks, 64, 1, 68] with the block stride kept. Any other view is returned as
    given (the operator accepts [blocks, 4352] and [blocks, 64, 1, 68] at any block stride)."""
    kv_cache = _require_tensor(kv_cache, "kv_cache")
    if kv_cache.ndim != 3:
        return kv_cache
    blocks, block_size, width = kv_cache.shape
    if kv_cache.dtype != torch.uint8 or block_size != PAGE_SIZE or width < VLLM_FP4_TOKEN_BYTES:
        raise InputShapeError(
            f"vLLM kv_cache must be uint8 [blocks, {PAGE_SIZE}, >= {VLLM_FP4_TOKEN_BYTES}], "
            f"got {_dtype_name(kv_cache.dtype)} {list(kv_cache.shape)}"
        )
    if kv_cache.stride(2) != 1 or kv_cache.stride(1) != width:
        raise InputError(
            f"the bytes of one vLLM kv_cache block must be contiguous, got strides {list(kv_cache.stride())}"
        )
    block_stride = kv_cache.stride(0) if blocks > 1 else PAGE_SIZE * width
    return kv_cache.as_strided(
        (blocks, PAGE_SIZE, 1, VLLM_FP4_TOKEN_BYTES), (block_stride, VLLM_FP4_TOKEN_BYTES, VLLM_FP4_TOKEN_BYTES, 1)
    )


def _zeros(rows: int, device: torch.device) -> torch.Tensor:
    return torch.zeros(rows, dtype=torch.int32, device=device)


def topk_sglang_c4_indexer(
    q_fp4: torch.Tensor,
    q_sf: torch.Tensor,
    kv_cache: torch.Tensor,
    page_table: torch.Tensor,
    weights: torch.Tensor,
    c4_seq_lens: torch.Tensor,
    c4_sparse_page_indices: torch.Tensor,
    *,
    topk: int,
    c4_sparse_raw_indices: torch.Tensor | None = None,
    max_seq_len: int | None = None,
    weight_scale: float = 1.0,
    next_n: int = 1,
    backend: str = "auto",
    workspace: torch.Tensor | None = None,
) -> TopKResult:
    """sglang's DeepSeek-V4 C4 indexer call (`forward_c4_indexer`, module docstring): decode, MTP
    verify and extend alike. Query row t sees C4 positions [0, c4_seq_lens[t]) through its own
    page-table row page_table[t].

    `next_n` > 1 (MTP verify, T = B * next_n) tells the operator that rows b * next_n + j are one
    request's: they read page_table[b * next_n] (sglang repeats a request's page-table row for each
    of its tokens, S3 expand_extend_with_same_length), so the operator sees next_n rows per sequence
    and can share key tiles among them. The answer is the same; it is the caller's promise that the
    next_n rows of each request are equal (not checked: that would read the table on the host).

    Parameters
    ----------
    q_fp4 : torch.Tensor
        int8 / uint8 [T, 64, 64]: packed E2M1 queries (q_indexer[0]).
    q_sf : torch.Tensor
        int32 [T, 64] (or [T, 1, 64]): four UE8M0 scale bytes a head (q_indexer[1]).
    kv_cache : torch.Tensor
        The indexer buffer, uint8 [pages, 4352] (or its [pages, 64, 1, 68] view), read in place.
    page_table : torch.Tensor
        int32 [T, max_pages]: one row per query token (indexer_metadata.page_table).
    weights : torch.Tensor
        float32 [T, 64, 1] (or [T, 64]): head weights.
    c4_seq_lens : torch.Tensor
        int32 [T] (or [T, 1]): each row's window end (indexer_metadata.c4_seq_lens).
    c4_sparse_page_indices : torch.Tensor
        int32 [>= T, >= K], written at [:T, :K] with physical slots (-1 padded).
    topk : int
        K, in SUPPORTED_TOPK.
    c4_sparse_raw_indices : torch.Tensor, optional
        Like c4_sparse_page_indices, written with C4 positions.
    max_seq_len : int, optional
        The static window bound (indexer_metadata.max_c4_seq_len).
    weight_scale, backend, workspace
        As litetopk_prefill.
    next_n : int
        Query rows a request (default 1: every row its own), as above.

    Returns
    -------
    TopKResult
        litetopk_prefill's result (its status bits say which rows published nothing); its
        physical_indices (raw_indices) are the written corners of the buffers. Raises InputError
        for tensors that do not match.

    Example
    -------
    >>> from litetopk.kernels import random_problem
    >>> p = random_problem(rows=4, keys=[1500, 900], topk=512)
    >>> page_table = p.block_table[p.row_to_batch.long()]  # one page-table row per query token
    >>> q_sf = p.q_scale.view(torch.int32).squeeze(-1)     # int32 [T, 64]
    >>> page_indices = torch.full((8, 512), -1, dtype=torch.int32)  # the engine's buffer, more rows than T
    >>> result = topk_sglang_c4_indexer(p.q_fp4.view(torch.int8), q_sf, p.kv_cache, page_table,
    ...                                 p.weights[..., None], p.ends, page_indices, topk=512)
    >>> torch.equal(page_indices[:4], result.physical_indices), result.status.tolist()
    (True, [0, 0, 0, 0])
    """
    q = query_bytes(q_fp4)
    rows = q.shape[0]
    ends = _lengths(c4_seq_lens, rows, "c4_seq_lens")
    if isinstance(next_n, bool) or not isinstance(next_n, int) or next_n < 1 or rows % next_n:
        raise InputError(f"next_n must be a positive int dividing the {rows} query rows, got {next_n!r}")
    return _sglang_call(
        q,
        q_sf,
        kv_cache,
        page_table,
        weights,
        _zeros(rows, q.device),
        ends,
        (c4_sparse_page_indices, "c4_sparse_page_indices"),
        (c4_sparse_raw_indices, "c4_sparse_raw_indices"),
        topk=topk,
        max_seq_len=max_seq_len,
        weight_scale=weight_scale,
        backend=backend,
        workspace=workspace,
        next_n=next_n,
    )


def topk_sglang_fp4_indexer(
    q_fp4: torch.Tensor,
    q_scale: torch.Tensor,
    kv_cache: torch.Tensor,
    page_table: torch.Tensor,
    weights: torch.Tensor,
    starts: torch.Tensor,
    ends: torch.Tensor,
    out_physical: torch.Tensor,
    *,
    topk: int,
    out_raw: torch.Tensor | None = None,
    max_seq_len: int | None = None,
    weight_scale: float = 1.0,
    backend: str = "auto",
    workspace: torch.Tensor | None = None,
) -> TopKResult:
    """sglang's FP4 indexer tensors with explicit per-token windows: query row t reads window
    [starts[t], ends[t]) through page_table[t].

    Parameters
    ----------
    q_fp4, q_scale, kv_cache, weights
        As topk_sglang_c4_indexer (q_scale: its q_sf).
    page_table : torch.Tensor
        int32 [T, max_pages]: one row per query token.
    starts, ends : torch.Tensor
        int32 [T]: each row's window [start, end).
    out_physical : torch.Tensor
        int32 [>= T, >= K], written at [:T, :K] with physical slots (-1 padded).
    topk : int
        K, in SUPPORTED_TOPK.
    out_raw : torch.Tensor, optional
        Like out_physical, written with C4 positions.
    max_seq_len, weight_scale, backend, workspace
        As topk_sglang_c4_indexer.

    Returns
    -------
    TopKResult
        litetopk_prefill's result. Raises InputError for tensors that do not match.

    Example
    -------
    >>> from litetopk.kernels import random_problem
    >>> p = random_problem(rows=4, keys=[1500, 900], topk=512, causal=False)
    >>> page_table = p.block_table[p.row_to_batch.long()]
    >>> out_physical = torch.empty((4, 512), dtype=torch.int32)
    >>> result = topk_sglang_fp4_indexer(p.q_fp4, p.q_scale.view(torch.int32).squeeze(-1), p.kv_cache,
    ...                                  page_table, p.weights, p.starts, p.ends, out_physical, topk=512)
    >>> bool((result.counts == torch.clamp(p.ends - p.starts, max=512)).all())
    True
    """
    q = query_bytes(q_fp4)
    return _sglang_call(
        q,
        q_scale,
        kv_cache,
        page_table,
        weights,
        starts,
        ends,
        (out_physical, "out_physical"),
        (out_raw, "out_raw"),
        topk=topk,
        max_seq_len=max_seq_len,
        weight_scale=weight_scale,
        backend=backend,
        workspace=workspace,
        next_n=1,
    )


def _sglang_call(
    q,
    q_sf,
    kv_cache,
    page_table,
    weights,
    starts,
    ends,
    out_physical,
    out_raw,
    *,
    topk,
    max_seq_len,
    weight_scale,
    backend,
    workspace,
    next_n,
) -> TopKResult:
    """The shared sglang call: `out_physical` / `out_raw` are (buffer or None, its name for errors);
    row t reads page-table row t - t % next_n (passed as one row a request where next_n > 1)."""
    rows = q.shape[0]
    page_table = _require_tensor(page_table, "page_table")
    if page_table.ndim != 2 or page_table.shape[0] != rows:
        raise InputShapeError(
            f"page_table must be int32 [{rows}, max_pages] (one row per query token), got {list(page_table.shape)}"
        )
    out = {"physical_indices": index_buffer(out_physical[0], rows, topk, out_physical[1])}
    if out_raw[0] is not None:
        out["raw_indices"] = index_buffer(out_raw[0], rows, topk, out_raw[1])
    row_to_batch = torch.arange(rows, dtype=torch.int32, device=q.device)  # page_table row t serves row t
    if next_n > 1:
        # A request's rows read its first token's row: the operator gets one block-table row a request (a
        # small device copy of those rows: no host sync), so it sees next_n rows a sequence and its decode
        # schedule lets the request's rows share each key tile (Triton backend, paged mode).
        page_table = page_table[::next_n].contiguous()
        row_to_batch = row_to_batch // next_n
    return litetopk_prefill(
        q,
        sglang_q_scale_bytes(q_sf),
        kv_cache,
        page_table,
        head_weights(weights, rows),
        row_to_batch,
        starts,
        ends,
        topk=topk,
        weight_scale=weight_scale,
        backend=backend,
        out=out,
        max_seq_len=max_seq_len,
        workspace=workspace,
    )


def topk_vllm_indexer_decode(
    q_fp4: torch.Tensor,
    q_scale: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    weights: torch.Tensor,
    seq_lens: torch.Tensor,
    topk_indices_buffer: torch.Tensor,
    *,
    topk: int,
    max_seq_len: int | None = None,
    weight_scale: float = 1.0,
    backend: str = "auto",
    workspace: torch.Tensor | None = None,
) -> TopKResult:
    """vLLM's DeepSeek-V4 indexer decode call (`sparse_attn_indexer`, module docstring): B requests,
    next_n query rows each; row b * next_n + j reads C4 positions [0, seq_lens[b, j]) of request b
    through block_table[b].

    Parameters
    ----------
    q_fp4 : torch.Tensor
        uint8 [B, next_n, 64, 64] (or [B * next_n, 64, 64]): packed E2M1 queries.
    q_scale : torch.Tensor
        int32 [B, next_n, 64] (or [B * next_n, 64]): four UE8M0 scale bytes a head.
    kv_cache : torch.Tensor
        The layer's uint8 [blocks, 64, >= 68] (or the [blocks, 64, 1, 68] DeepGEMM view), any block
        stride, read in place.
    block_table : torch.Tensor
        int32 [>= B, max_blocks]: row b serves request b.
    weights : torch.Tensor
        float32 [B * next_n, 64]: head weights.
    seq_lens : torch.Tensor
        int32 [B, next_n], [B, 1] or [B]: each row's window end.
    topk_indices_buffer : torch.Tensor
        int32 [>= B * next_n, >= K], written at [:B * next_n, :K] with request-relative C4
        positions (-1 padded).
    topk : int
        K, in SUPPORTED_TOPK.
    max_seq_len : int, optional
        The static window bound (the indexer's max_model_len).
    weight_scale, backend, workspace
        As litetopk_prefill.

    Returns
    -------
    TopKResult
        litetopk_prefill's result; raw_indices is the written corner of the buffer. Raises
        InputError for tensors that do not match.

    Example
    -------
    >>> from litetopk.kernels import random_problem
    >>> p = random_problem(rows=2, keys=[1500, 900], topk=512)  # two requests, one token each
    >>> kv_cache = torch.zeros((p.kv_cache.shape[0], 64, 132), dtype=torch.uint8)  # vLLM's FP8-sized blocks
    >>> kv_cache.view(kv_cache.shape[0], -1)[:, :4352] = p.kv_cache                # FP4 uses each block's start
    >>> buffer = torch.full((16, 512), -1, dtype=torch.int32)  # topk_indices_buffer
    >>> result = topk_vllm_indexer_decode(p.q_fp4, p.q_scale.view(torch.int32).squeeze(-1), kv_cache,
    ...                                   p.block_table, p.weights, p.ends, buffer, topk=512)
    >>> torch.equal(buffer[:2], result.raw_indices), result.counts.tolist()
    (True, [512, 512])
    """
    block_table = _require_tensor(block_table, "block_table")
    seq_lens = _require_tensor(seq_lens, "seq_lens")
    if seq_lens.ndim not in (1, 2) or block_table.ndim != 2 or block_table.shape[0] < seq_lens.shape[0]:
        raise InputShapeError(
            f"seq_lens must be [B] or [B, next_n] and block_table [>= B, max_blocks], got "
            f"seq_lens {list(seq_lens.shape)}, block_table {list(block_table.shape)}"
        )
    requests = seq_lens.shape[0]
    next_n = seq_lens.shape[1] if seq_lens.ndim == 2 else 1
    rows = requests * next_n
    ends = _lengths(seq_lens, rows, "seq_lens")
    q = query_bytes(q_fp4)
    if q.shape[0] != rows:
        raise InputShapeError(f"q_fp4 must hold B * next_n = {rows} query rows, got {list(q_fp4.shape)}")
    row_to_request = torch.arange(rows, dtype=torch.int32, device=q.device) // next_n  # row b * next_n + j -> b
    return litetopk_prefill(
        q,
        query_scale_bytes(q_scale),
        vllm_kv_cache_pages(kv_cache),
        block_table,
        head_weights(weights, rows),
        row_to_request,
        _zeros(rows, q.device),
        ends,
        topk=topk,
        weight_scale=weight_scale,
        backend=backend,
        out={"raw_indices": index_buffer(topk_indices_buffer, rows, topk, "topk_indices_buffer")},
        max_seq_len=max_seq_len,
        workspace=workspace,
    )


def vllm_prefill_rows(
    cu_seqlen_ks: torch.Tensor, cu_seqlen_ke: torch.Tensor, cu_seq_lens: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(row_to_request, starts, ends) int32 [rows] of a vLLM prefill chunk, on the device: row t's
    request is the r with cu_seq_lens[r] == cu_seqlen_ks[t] (the last such r: requests with no C4
    key come before it and own no row with a key), its window [0, ke - ks). Rows of a request with
    no key get request 0 or the last, and an empty window.

    Example
    -------
    >>> ks, ke = torch.tensor([0, 0, 100], dtype=torch.int32), torch.tensor([3, 5, 140], dtype=torch.int32)
    >>> [t.tolist() for t in vllm_prefill_rows(ks, ke, torch.tensor([0, 100, 180], dtype=torch.int32))]
    [[0, 0, 1], [0, 0, 0], [3, 5, 40]]
    """
    ks = _lengths(cu_seqlen_ks, None, "cu_seqlen_ks")
    ke = _lengths(cu_seqlen_ke, ks.shape[0], "cu_seqlen_ke")
    cu = _lengths(cu_seq_lens, None, "cu_seq_lens")
    if cu.shape[0] < 2:
        raise InputShapeError(f"cu_seq_lens must be [requests + 1] with requests >= 1, got {list(cu_seq_lens.shape)}")
    requests = cu.shape[0] - 1
    row_to_request = torch.searchsorted(cu[1:], ks, right=True).clamp_(max=requests - 1).to(torch.int32)
    return row_to_request, _zeros(ks.shape[0], ks.device), ke - ks


def topk_vllm_indexer_prefill_chunk(
    q_fp4: torch.Tensor,
    q_scale: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    weights: torch.Tensor,
    cu_seqlen_ks: torch.Tensor,
    cu_seqlen_ke: torch.Tensor,
    cu_seq_lens: torch.Tensor,
    topk_indices_buffer: torch.Tensor,
    *,
    topk: int,
    max_seq_len: int | None = None,
    weight_scale: float = 1.0,
    backend: str = "auto",
    workspace: torch.Tensor | None = None,
) -> TopKResult:
    """vLLM's DeepSeek-V4 indexer prefill call for one chunk (`sparse_attn_indexer`, module
    docstring): the chunk's query rows, its requests' block tables, the cache read in place (no
    gather); rows and windows from the chunk's cumulative lengths (vllm_prefill_rows).

    Parameters
    ----------
    q_fp4, q_scale, weights
        The chunk's rows, as topk_vllm_indexer_decode takes them (sliced [token_start:token_end]).
    kv_cache : torch.Tensor
        As topk_vllm_indexer_decode.
    block_table : torch.Tensor
        int32 [requests, max_blocks]: the chunk's requests.
    cu_seqlen_ks, cu_seqlen_ke : torch.Tensor
        int32 [rows]: each row's first and end C4 key in the chunk's gathered keys.
    cu_seq_lens : torch.Tensor
        int32 [requests + 1]: where each request's C4 keys start in the gathered keys.
    topk_indices_buffer : torch.Tensor
        int32 [>= rows, >= K], written at [:rows, :K] with request-relative C4 positions (pass
        topk_indices_buffer[token_start:token_end]).
    topk, max_seq_len, weight_scale, backend, workspace
        As topk_vllm_indexer_decode.

    Returns
    -------
    TopKResult
        litetopk_prefill's result. Raises InputError for tensors that do not match.

    Example
    -------
    >>> from litetopk.kernels import random_problem
    >>> p = random_problem(rows=4, keys=[1500, 900], topk=512)  # a chunk of two requests, two rows each
    >>> cu_seq_lens = torch.tensor([0, 1500, 2400], dtype=torch.int32)
    >>> ks = cu_seq_lens[p.row_to_batch.long()]
    >>> buffer = torch.full((4, 512), -1, dtype=torch.int32)
    >>> result = topk_vllm_indexer_prefill_chunk(p.q_fp4, p.q_scale, p.kv_cache, p.block_table, p.weights,
    ...                                          ks, ks + p.ends, cu_seq_lens, buffer, topk=512)
    >>> torch.equal(buffer, result.raw_indices), result.status.tolist()
    (True, [0, 0, 0, 0])
    """
    row_to_request, starts, ends = vllm_prefill_rows(cu_seqlen_ks, cu_seqlen_ke, cu_seq_lens)
    return topk_vllm_indexer(
        q_fp4,
        q_scale,
        kv_cache,
        block_table,
        weights,
        row_to_request,
        starts,
        ends,
        topk_indices_buffer,
        topk=topk,
        max_seq_len=max_seq_len,
        weight_scale=weight_scale,
        backend=backend,
        workspace=workspace,
    )


def topk_vllm_indexer(
    q_fp4: torch.Tensor,
    q_scale: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    weights: torch.Tensor,
    row_to_request: torch.Tensor,
    starts: torch.Tensor,
    ends: torch.Tensor,
    topk_indices_buffer: torch.Tensor,
    *,
    topk: int,
    max_seq_len: int | None = None,
    weight_scale: float = 1.0,
    backend: str = "auto",
    workspace: torch.Tensor | None = None,
) -> TopKResult:
    """vLLM's DeepSeek-V4 indexer tensors with explicit windows: query row t of request
    row_to_request[t] sees [starts[t], ends[t]) through block_table[row_to_request[t]].

    Parameters
    ----------
    q_fp4, q_scale, kv_cache, weights
        As topk_vllm_indexer_decode (q_scale also our uint8 [T, 64, 4]; kv_cache also any view of
        4352-byte pages, e.g. vLLM's slab pages).
    block_table : torch.Tensor
        int32 [requests, max_blocks].
    row_to_request, starts, ends : torch.Tensor
        int32 [T]: each row's request and window [start, end).
    topk_indices_buffer : torch.Tensor
        int32 [>= T, >= K] (strided views allowed), written at [:T, :K] with request-relative C4
        positions (-1 padded).
    topk, max_seq_len, weight_scale, backend, workspace
        As topk_vllm_indexer_decode.

    Returns
    -------
    TopKResult
        litetopk_prefill's result. Raises InputError for tensors that do not match.

    Example
    -------
    >>> from litetopk.kernels import random_problem
    >>> p = random_problem(rows=4, keys=[1500, 900], topk=512, causal=False)
    >>> buffer = torch.full((4, 512), -1, dtype=torch.int32)
    >>> result = topk_vllm_indexer(*p.args(), buffer, topk=512)
    >>> torch.equal(buffer, result.raw_indices)
    True
    """
    q = query_bytes(q_fp4)
    rows = q.shape[0]
    return litetopk_prefill(
        q,
        query_scale_bytes(q_scale),
        vllm_kv_cache_pages(kv_cache),
        block_table,
        head_weights(weights, rows),
        row_to_request,
        starts,
        ends,
        topk=topk,
        weight_scale=weight_scale,
        backend=backend,
        out={"raw_indices": index_buffer(topk_indices_buffer, rows, topk, "topk_indices_buffer")},
        max_seq_len=max_seq_len,
        workspace=workspace,
    )


__all__ = [
    "QUERY_DTYPES",
    "VLLM_FP4_TOKEN_BYTES",
    "head_weights",
    "index_buffer",
    "query_bytes",
    "query_scale_bytes",
    "sglang_q_scale_bytes",
    "topk_sglang_c4_indexer",
    "topk_sglang_fp4_indexer",
    "topk_vllm_indexer",
    "topk_vllm_indexer_decode",
    "topk_vllm_indexer_prefill_chunk",
    "vllm_kv_cache_pages",
    "vllm_prefill_rows",
]
