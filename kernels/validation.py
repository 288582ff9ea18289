"""The one validation layer in front of every backend (docs/contract.md §1-§3).

Layer: stage, the first (the operator and graphs.py call it; it launches the row checks). Host
checks (check_prefill, check_topk, check_out, check_workspace) read shapes, dtypes, strides, devices
and addresses only; validate_prefill adds the row checks' launch and builds the PrefillProblem
(problem.py) every later stage and backend takes.

`validate_prefill` checks what would make a call meaningless (dtypes, shapes, contiguity, one
device, K, weight_scale) and raises InputError saying what to change. Faults that belong to single
rows do not fail the whole call here: they become status bits of those rows and the rows' windows
are emptied, so backends (which assume valid input) never read through them:
    INVALID_ROW   batch index outside [0, batch), or a window not inside [0, max_end) where
                  max_end = min(max_seq_len, max_pages * 64) (max_seq_len: the caller's bound)
    INVALID_PAGE  a page that overlaps the row's window is negative or >= num_pages
                  (a bad page id outside every window is ignored)
    NONFINITE     a NaN/inf weight (NaN/inf scores are found by the backends while scoring)
    SLOT_OVERFLOW a page of the row's window has slots beyond int32 (page id >= 2^25); slots are
                  computed in int64 and never wrap
Nothing here reads a tensor's contents on the host: the checks run on the inputs' device (one
Triton kernel on CUDA, row_checks.py) and every size the backends allocate comes from shapes and
from `max_end`, a static bound of every window end (no host round trip, CUDA-graph capturable).
"""

from __future__ import annotations

import math

import torch

from .cache_layout import NUM_HEADS, PAGE_SIZE, SCALE_BYTES, VALUE_BYTES, KVCache, describe_kv_cache
from .errors import InputDtypeError, InputError, InputShapeError, UnsupportedTopKError
from .problem import PrefillProblem
from .result import RESULT_FIELDS
from .row_checks import row_checks
from .scratch import ALIGNMENT, STORAGE_ALIGNMENT, Scratch

SUPPORTED_TOPK = (512, 1024)


def _require(tensor: torch.Tensor, name: str, dtypes: tuple[torch.dtype, ...], shape: tuple) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise InputError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype not in dtypes:
        wanted = " or ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise InputDtypeError(f"{name} must be {wanted}, got {str(tensor.dtype).removeprefix('torch.')}")
    if tensor.ndim != len(shape) or any(want is not None and got != want for got, want in zip(tensor.shape, shape)):
        wanted = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
        raise InputShapeError(f"{name} must have shape {wanted}, got {list(tensor.shape)}")
    if not tensor.is_contiguous():
        raise InputError(f"{name} must be contiguous (call .contiguous() first)")


def check_topk(topk: int) -> int:
    """Return `topk` if it is supported, else raise UnsupportedTopKError naming the supported set."""
    if isinstance(topk, bool) or not isinstance(topk, int) or topk not in SUPPORTED_TOPK:
        raise UnsupportedTopKError(f"topk={topk!r} is not supported; supported: {SUPPORTED_TOPK}")
    return topk


def check_prefill(
    q_fp4,
    q_scale,
    kv_cache,
    block_table,
    weights,
    row_to_batch,
    starts,
    ends,
    *,
    topk,
    weight_scale=1.0,
    max_seq_len: int | None = None,
    kv_scale=None,
    out=None,
    workspace: torch.Tensor | None = None,
) -> tuple[KVCache, int]:
    """The host half of `validate_prefill`: every check that reads shapes, dtypes, strides, devices
    and addresses only (never a tensor's contents, launches nothing). Returns (the cache described,
    max_end: the static bound of every window end). Raises as `validate_prefill` says."""
    check_topk(topk)
    if max_seq_len is not None and (
        isinstance(max_seq_len, bool) or not isinstance(max_seq_len, int) or max_seq_len < 0
    ):
        raise InputError(f"max_seq_len must be a non-negative int or None, got {max_seq_len!r}")
    if not isinstance(weight_scale, (int, float)) or isinstance(weight_scale, bool) or not math.isfinite(weight_scale):
        raise InputError(f"weight_scale must be a finite number, got {weight_scale!r}")
    cache = describe_kv_cache(kv_cache, kv_scale)
    _require(q_fp4, "q_fp4", (torch.uint8,), (None, NUM_HEADS, VALUE_BYTES))
    rows = q_fp4.shape[0]
    _require(q_scale, "q_scale", (torch.uint8,), (rows, NUM_HEADS, SCALE_BYTES))
    _require(weights, "weights", (torch.float32, torch.bfloat16), (rows, NUM_HEADS))
    _require(block_table, "block_table", (torch.int32,), (None, None))
    for name, tensor in (("row_to_batch", row_to_batch), ("starts", starts), ("ends", ends)):
        _require(tensor, name, (torch.int32,), (rows,))
    tensors = {
        "q_fp4": q_fp4,
        "q_scale": q_scale,
        "kv_cache": cache.values,
        "block_table": block_table,
        "weights": weights,
        "row_to_batch": row_to_batch,
        "starts": starts,
        "ends": ends,
    }
    devices = {name: t.device for name, t in tensors.items()}
    if len(set(devices.values())) != 1:
        listing = ", ".join(f"{n} on {d}" for n, d in devices.items())
        raise InputError(f"all tensors must be on one device; got {listing}")
    inputs = {**tensors, "kv_cache": kv_cache, "kv_scale": kv_scale}
    check_out(out, rows, topk, q_fp4.device, inputs)
    check_workspace(workspace, q_fp4.device, inputs, out)
    table_end = block_table.shape[1] * PAGE_SIZE
    return cache, table_end if max_seq_len is None else min(max_seq_len, table_end)


def validate_prefill(
    q_fp4,
    q_scale,
    kv_cache,
    block_table,
    weights,
    row_to_batch,
    starts,
    ends,
    *,
    topk,
    weight_scale=1.0,
    max_seq_len: int | None = None,
    kv_scale=None,
    out=None,
    workspace: torch.Tensor | None = None,
) -> PrefillProblem:
    """Check every argument of `litetopk_prefill` / `dense_topk_prefill` and build a PrefillProblem.

    Raises InputError (or UnsupportedTopKError) for anything that makes the call meaningless, from
    shapes, dtypes and devices alone (`check_prefill`); row-level faults become bits of `row_status`
    instead (module docstring), computed on the device. `max_seq_len` (optional) bounds every window
    end; buffers and grids are sized from it (default: the block table's max_pages * 64). `kv_scale`
    given: the cache is in AITER's format (`describe_kv_cache`). `out` (check_out) and `workspace`
    (check_workspace) are checked before anything runs; the problem's Scratch carves the workspace
    from the row checks on.
    """
    cache, max_end = check_prefill(
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
        max_seq_len=max_seq_len,
        kv_scale=kv_scale,
        out=out,
        workspace=workspace,
    )
    scratch = Scratch(q_fp4.device, workspace)
    weights = weights.float().contiguous()
    checked = row_checks(block_table, cache.num_pages, weights, row_to_batch, starts, ends, max_end, scratch=scratch)
    eff_rtb, eff_starts, eff_ends = checked.effective.unbind(0)
    return PrefillProblem(
        q_fp4=q_fp4,
        q_scale=q_scale,
        cache=cache,
        block_table=block_table,
        weights=weights,
        row_to_batch=eff_rtb,
        starts=eff_starts,
        ends=eff_ends,
        row_status=checked.status,
        sequence_ends=checked.sequence_ends,
        zeroed=checked.zeroed,
        topk=topk,
        weight_scale=float(weight_scale),
        max_end=max_end,
        scratch=scratch,
    )


def _byte_span(tensor: torch.Tensor) -> tuple[int, int]:
    """[first, last) bytes of memory a strided tensor can touch."""
    start = tensor.data_ptr()
    if tensor.is_contiguous():  # (most inputs: no walk over the strides; a call checks ~19 spans)
        return start, start + tensor.numel() * tensor.element_size()
    if tensor.numel() == 0:
        return start, start
    extent = sum((size - 1) * abs(stride) for size, stride in zip(tensor.shape, tensor.stride())) + 1
    return start, start + extent * tensor.element_size()


def check_out(out, rows: int, k: int, device: torch.device, inputs: dict[str, torch.Tensor | None]) -> None:
    """Check caller-owned result buffers: a mapping from TopKResult field names (RESULT_FIELDS) to tensors
    of that field's shape ([rows, k] or [rows]) and dtype on `device` (any strides, e.g. `buf[a:b, :K]`),
    no two of them and none of them and an input overlapping in memory. Raises InputError naming the field."""
    if out is None:
        return
    if not isinstance(out, dict):
        raise InputError(f"out must be a dict of result fields to tensors, got {type(out).__name__}")
    for name, tensor in out.items():
        if name not in RESULT_FIELDS:
            raise InputError(f"out[{name!r}] is not a result field; fields: {tuple(RESULT_FIELDS)}")
        shape_of, dtype = RESULT_FIELDS[name]
        _require_strided(tensor, f"out[{name!r}]", dtype, shape_of(rows, k))
        if tensor.device != device:
            raise InputError(f"out[{name!r}] is on {tensor.device}; the inputs are on {device}")
        if not _no_self_overlap(tensor):
            raise InputError(f"out[{name!r}] has elements that share memory (a stride of 0 or overlapping rows)")
    _check_disjoint({f"out[{n!r}]": t for n, t in out.items()}, inputs)


def check_workspace(workspace, device: torch.device, inputs: dict[str, torch.Tensor | None], out) -> None:
    """Check a caller-owned workspace (workspace.allocate_workspace, carved by scratch.Scratch): a 1-D
    contiguous uint8 tensor on `device` whose data pointer is a multiple of ALIGNMENT, overlapping
    no input and no `out` tensor. Its size is checked as the call carves it (Scratch: InputError
    naming the bytes needed)."""
    if workspace is None:
        return
    if not isinstance(workspace, torch.Tensor):
        raise InputError(f"workspace must be a torch.Tensor (allocate_workspace(...)), got {type(workspace).__name__}")
    if workspace.dtype != torch.uint8 or workspace.ndim != 1 or not workspace.is_contiguous():
        raise InputError(
            f"workspace must be a 1-D contiguous uint8 tensor (allocate_workspace(...)), got "
            f"{str(workspace.dtype).removeprefix('torch.')} of shape {list(workspace.shape)} "
            f"and strides {list(workspace.stride())}"
        )
    if workspace.device != device:
        raise InputError(f"workspace is on {workspace.device}; the inputs are on {device}")
    if workspace.data_ptr() % ALIGNMENT:
        raise InputError(
            f"workspace must start on a {ALIGNMENT}-byte boundary (data_ptr % {ALIGNMENT} = "
            f"{workspace.data_ptr() % ALIGNMENT}); allocate_workspace(...) returns one that does"
        )
    if workspace.untyped_storage().data_ptr() % STORAGE_ALIGNMENT:
        # (Scratch places its buffers by element offsets from the storage's start, up to 8 bytes an element)
        raise InputError(
            f"the workspace's storage must start on a {STORAGE_ALIGNMENT}-byte boundary (any tensor "
            "torch allocates does); allocate_workspace(...) returns one that does"
        )
    outs = {f"out[{n!r}]": t for n, t in (out or {}).items()}
    _check_disjoint({"workspace": workspace}, {**inputs, **outs})


def _check_disjoint(written: dict[str, torch.Tensor], others: dict[str, torch.Tensor | None]) -> None:
    """InputError when a tensor of `written` overlaps another of `written` or one of `others` in memory."""
    spans = [(n, _byte_span(t)) for n, t in written.items()]
    spans += [(n, _byte_span(t)) for n, t in others.items() if isinstance(t, torch.Tensor)]
    for i, (name_a, (lo_a, hi_a)) in enumerate(spans[: len(written)]):
        for name_b, (lo_b, hi_b) in spans[i + 1 :]:
            if lo_a < hi_b and lo_b < hi_a:
                raise InputError(
                    f"{name_a} overlaps {name_b} in memory; outputs and the workspace must not alias "
                    "inputs or each other"
                )


def _no_self_overlap(tensor: torch.Tensor) -> bool:
    dims = sorted((abs(st), size) for size, st in zip(tensor.shape, tensor.stride()) if size > 1)
    reach = 1
    for stride, size in dims:
        if stride < reach:
            return False
        reach = stride * size
    return True


def _require_strided(tensor, name: str, dtype: torch.dtype, shape: tuple) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise InputError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype != dtype:
        raise InputDtypeError(
            f"{name} must be {str(dtype).removeprefix('torch.')}, got {str(tensor.dtype).removeprefix('torch.')}"
        )
    if tuple(tensor.shape) != tuple(shape):
        raise InputShapeError(f"{name} must have shape {list(shape)}, got {list(tensor.shape)}")
