"""The public operator: litetopk_prefill and dense_topk_prefill, eager or through their custom ops.

Layer: public face (graphs.py, adapters.py and aiter.py build on it). It imports the ops (ops.py:
the implementation, registered with torch.library) and re-exports the backend registry's public
names (registry.py: BACKEND_NAMES, backend_instance, get_backend, resolve_backend).

    litetopk_prefill(...)   the fused LiteTopK method (pipeline.run_litetopk)
    dense_topk_prefill(...) the dense baseline (pipeline.run_dense)

An eager call runs the implementation directly (ops.run_prefill); a call that torch.compile traces
goes through the ops (litetopk::prefill, or litetopk::prefill_out when `out=` is given), whose fake
implementations let a compiled model call the operator without a graph break (ops.py says how the
dict, the tuning and the result map onto the ops' schemas). Both give the same bits.

`backend` is one of BACKEND_NAMES. "auto" picks by the inputs' device: a CUDA (NVIDIA) device ->
"triton", a ROCm gfx950 device -> "flydsl", anything else -> "reference". A backend that cannot
run raises BackendUnavailableError; no request is ever served by another backend than the one
asked for. Device, driver and compiler failures leave as DeviceError (raised from the original).
Every call runs on the inputs' device (made current for the call), on the current stream.
"""

from __future__ import annotations

import torch

from .devices import is_cuda, is_gfx950
from .ops import (
    DEFAULT_TUNING,
    dense_prefill,
    dense_prefill_out,
    out_fields,
    prefill,
    prefill_out,
    run_dense_prefill,
    run_prefill,
    tuning_options,
)
from .pipeline import LiteTopKTuning
from .registry import BACKEND_NAMES, backend_instance, get_backend, resolve_backend
from .result import TopKResult


def litetopk_prefill(
    q_fp4,
    q_scale,
    kv_cache,
    block_table,
    weights,
    row_to_batch,
    starts,
    ends,
    *,
    topk: int,
    weight_scale: float = 1.0,
    backend: str = "auto",
    repair: bool = True,
    tuning: LiteTopKTuning | None = None,
    out: dict | None = None,
    max_seq_len: int | None = None,
    kv_scale: torch.Tensor | None = None,
    check: bool = False,
    workspace: torch.Tensor | None = None,
) -> TopKResult:
    """Top-`topk` keys of every query row by the fused LiteTopK method (docs/contract.md §1-§4).

    Row i scores the keys of its window [starts[i], ends[i]) of sequence row_to_batch[i] with
    weight_scale * sum_h w[i, h] * relu(q[i, h] . k[j]) and returns the K best by (score desc,
    position asc), equal bit for bit to `dense_topk_prefill` with the same backend. The call runs
    on the current stream and never waits for the device (no host round trip: capturable in a CUDA
    graph with fixed shapes, docs/operator-embedding.md); under torch.compile it is the custom op
    litetopk::prefill (litetopk::prefill_out with `out`), traced without a graph break (ops.py).

    Parameters
    ----------
    q_fp4 : torch.Tensor
        uint8 [rows, 64, 64]: packed E2M1 query values, two a byte, low nibble first.
    q_scale : torch.Tensor
        uint8 [rows, 64, 4]: UE8M0 query scales, one per 32 values.
    kv_cache : torch.Tensor
        The paged key cache, read in place: uint8 [num_pages, 4352] or any view of 4352-byte pages
        lying stride(0) >= 4352 bytes apart (e.g. [num_pages, 64, 1, 68], vLLM's 4608-byte pages);
        with `kv_scale`, AITER's values uint8 [num_pages, 1, 4, 64, 16] (docs/cache-layouts.md).
    block_table : torch.Tensor
        int32 [batch, max_pages]: logical page p of sequence b is physical page block_table[b, p].
    weights : torch.Tensor
        float32 or bfloat16 [rows, 64]: head weights (softmax and head scales folded in).
    row_to_batch, starts, ends : torch.Tensor
        int32 [rows]: each row's sequence and window [start, end) of compressed positions.
    topk : int
        K, one of SUPPORTED_TOPK (512, 1024); UnsupportedTopKError otherwise.
    weight_scale : float
        A finite factor of every score (default 1.0).
    backend : str
        One of BACKEND_NAMES; "auto" (default) picks by the inputs' device.
    repair : bool
        Rescan capacity events exactly on the device (default True; docs/contract.md §4).
    tuning : LiteTopKTuning, optional
        The method's knobs; None: the production settings.
    out : dict, optional
        Result field name -> caller-owned tensor of the field's dtype and shape (any strides, e.g.
        `buf[a:b, :K]`), written in place and returned in the result; no overlap with the inputs
        or each other.
    max_seq_len : int, optional
        A static bound of every window end (rows beyond it are INVALID_ROW); buffers, grids and the
        calibration stride are sized from it (default max_pages * 64: pass it when the block table
        is much wider than the longest window).
    kv_scale : torch.Tensor, optional
        uint8 [num_pages, 1, 4, 64]: given, `kv_cache` is in AITER's format (the same answers).
    check : bool
        The one synchronizing convenience (default False): repair capacity events left beyond the
        device repair's capacity, then raise RowFaultError for faulty rows. Never under graph capture.
    workspace : torch.Tensor, optional
        uint8, from allocate_workspace / workspace_bytes: holds every intermediate buffer of the call
        (kernels/scratch.py), reused across calls, one call at a time; None: torch's allocator.

    Returns
    -------
    TopKResult
        values float32 [rows, K], raw_indices and physical_indices int32 [rows, K] (-inf / -1
        padded), counts, status (RowStatus bits; a faulty row publishes nothing), repaired and
        candidates int32 [rows]. Row faults are status bits, not exceptions:
        `result.raise_for_status()` raises them. Raises InputError for malformed arguments,
        BackendUnavailableError / DeviceError as the module docstring says.

    Example
    -------
    >>> from litetopk.kernels import litetopk_prefill, random_problem
    >>> p = random_problem(rows=4, keys=2048, topk=512)
    >>> result = litetopk_prefill(*p.args(), topk=512, backend="reference")
    >>> result.raw_indices.shape, result.status.tolist()
    (torch.Size([4, 512]), [0, 0, 0, 0])
    """
    if not torch.compiler.is_compiling():
        return run_prefill(
            q_fp4,
            q_scale,
            kv_cache,
            block_table,
            weights,
            row_to_batch,
            starts,
            ends,
            topk=topk,
            weight_scale=weight_scale,
            backend=backend,
            repair=repair,
            tuning=tuning,
            out=out,
            max_seq_len=max_seq_len,
            kv_scale=kv_scale,
            check=check,
            workspace=workspace,
        )
    options = dict(
        topk=topk,
        weight_scale=weight_scale,
        backend=backend,
        repair=repair,
        max_seq_len=max_seq_len,
        check=check,
        **tuning_options(DEFAULT_TUNING if tuning is None else tuning),
    )
    inputs = (q_fp4, q_scale, kv_cache, block_table, weights, row_to_batch, starts, ends, kv_scale, workspace)
    if out is None:
        return TopKResult(*prefill(*inputs, **options))
    fields = out_fields(out, q_fp4, topk)
    prefill_out(*inputs, *fields.values(), **options)
    return TopKResult(**fields)


def dense_topk_prefill(
    q_fp4,
    q_scale,
    kv_cache,
    block_table,
    weights,
    row_to_batch,
    starts,
    ends,
    *,
    topk: int,
    weight_scale: float = 1.0,
    backend: str = "auto",
    selector: str = "torch",
    out: dict | None = None,
    max_seq_len: int | None = None,
    kv_scale: torch.Tensor | None = None,
    check: bool = False,
    workspace: torch.Tensor | None = None,
) -> TopKResult:
    """The dense baseline: the full float32 [rows, max_end] score matrix, then an exact top-K.

    The same answer as `litetopk_prefill` with the same backend, bit for bit; under torch.compile
    the custom op litetopk::dense_prefill (litetopk::dense_prefill_out with `out`). Its tie check
    reads tied rows on the host (the dense path is the baseline, not the embeddable op).

    Parameters
    ----------
    q_fp4, q_scale, kv_cache, block_table, weights, row_to_batch, starts, ends : torch.Tensor
        As litetopk_prefill.
    topk, weight_scale, backend, out, max_seq_len, kv_scale, check
        As litetopk_prefill.
    selector : str
        What selects the top-K of the score matrix: "torch" (default: torch.topk, ties settled) or
        "flashinfer" (its radix top-k, ties settled), or "radix" (dense_selection.select_topk_radix:
        exact by itself, CUDA only); the answer does not depend on it.
    workspace : torch.Tensor, optional
        Sized with workspace_bytes(..., dense=True): it holds the score matrix.

    Returns
    -------
    TopKResult
        As litetopk_prefill (`repaired` is 0, `candidates` the window's length).

    Example
    -------
    >>> from litetopk.kernels import dense_topk_prefill, litetopk_prefill, random_problem
    >>> p = random_problem(rows=2, keys=1000, topk=512)
    >>> dense = dense_topk_prefill(*p.args(), topk=512, backend="reference")
    >>> lite = litetopk_prefill(*p.args(), topk=512, backend="reference")
    >>> torch.equal(dense.raw_indices, lite.raw_indices)
    True
    """
    if not torch.compiler.is_compiling():
        return run_dense_prefill(
            q_fp4,
            q_scale,
            kv_cache,
            block_table,
            weights,
            row_to_batch,
            starts,
            ends,
            topk=topk,
            weight_scale=weight_scale,
            backend=backend,
            selector=selector,
            out=out,
            max_seq_len=max_seq_len,
            kv_scale=kv_scale,
            check=check,
            workspace=workspace,
        )
    options = dict(
        topk=topk, weight_scale=weight_scale, backend=backend, selector=selector, max_seq_len=max_seq_len, check=check
    )
    inputs = (q_fp4, q_scale, kv_cache, block_table, weights, row_to_batch, starts, ends, kv_scale, workspace)
    if out is None:
        return TopKResult(*dense_prefill(*inputs, **options))
    fields = out_fields(out, q_fp4, topk)
    dense_prefill_out(*inputs, *fields.values(), **options)
    return TopKResult(**fields)


__all__ = [
    "BACKEND_NAMES",
    "backend_instance",
    "dense_topk_prefill",
    "get_backend",
    "is_cuda",
    "is_gfx950",
    "litetopk_prefill",
    "resolve_backend",
]
