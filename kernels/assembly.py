"""Stage 6, assembly: sorted ordering keys -> the published TopKResult, page-mapped, in one Triton
launch (CUDA) or torch ops (elsewhere), the same bits (tested).

Layer: stage, the last (pipeline.run_litetopk and run_dense run `assemble_result`). Reading order: the
kernel, its launcher (assemble_into_triton), the torch twin (assemble_into_torch), then
`assemble_result`, the one line that picks between them (devices.runs_triton_stages).

Math, per row with status s and sorted keys [K] (keys.py's ordering keys, NO_KEY padded):
    live[j]        = key[j] != NO_KEY and s == 0
    value, raw     = keys.split_keys(key)                  (-inf, -1 where not live)
    page           = block_table[row_to_batch, raw // 64]  (int64)
    physical       = page * 64 + raw % 64                  (int64; -1 where not live)
    counts         = number of live keys
A live key whose page is negative or whose slot is beyond int32 cannot be published: the row gets
INVALID_PAGE or SLOT_OVERFLOW and publishes nothing (the row checks already fail such rows; this is
the last guard, on the device: nothing is read back on the host).
`repaired` None: no row was repaired (zeros). `candidates` is a tensor of per-row counts, or the rows'
windows (starts, ends): the dense path scores every key of a window, so its count is ends - starts, computed
by the kernel (no separate launch).
`out` takes caller-owned tensors for any subset of the result fields (TopKResult's names, shapes
and dtypes; any strides, e.g. `buf[start:end, :K]`); the fields written there are returned as those
tensors, the others are allocated.

Tiling (the kernel): one program per row, its K keys at once. The outputs may have any strides
(caller-owned views such as `buf[start:end, :K]`); every address is int64.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import triton
import triton.language as tl

from .cache_layout import PAGE_SIZE
from .devices import runs_triton_stages
from .keys import NO_KEY, NO_KEY_C, _scores_of_keys, split_keys
from .result import RESULT_FIELDS, TopKResult
from .status import RowStatus, set_status_bit

INT32_MAX = 2**31 - 1


@triton.jit
def assemble_result_kernel(
    keys_ptr,
    status_ptr,
    row_to_batch_ptr,
    block_table_ptr,
    max_pages,  # int64 [rows, K]; int32 ...
    values_ptr,
    values_s0,
    values_s1,
    raw_ptr,
    raw_s0,
    raw_s1,  # outputs with their strides
    physical_ptr,
    physical_s0,
    physical_s1,
    counts_ptr,
    counts_s0,
    status_out_ptr,
    status_s0,
    repaired_ptr,
    repaired_out_ptr,
    repaired_s0,
    candidates_ptr,  # int64 [rows], or (WINDOWS) int32 starts [rows]
    ends_ptr,  # WINDOWS: int32 ends [rows] (candidates = ends - starts)
    candidates_out_ptr,
    candidates_s0,  # [rows]
    TOPK: tl.constexpr,
    PAGE: tl.constexpr,
    INVALID_PAGE: tl.constexpr,
    SLOT_OVERFLOW: tl.constexpr,
    REPAIRS: tl.constexpr,  # False: no row was repaired (repaired_ptr unread, 0 stored)
    WINDOWS: tl.constexpr,  # candidates are the windows' lengths (candidates_ptr: starts)
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, TOPK).to(tl.int64)
    keys = tl.load(keys_ptr + row * TOPK + offs)
    status = tl.load(status_ptr + row)
    live = (keys != NO_KEY_C) & (status == 0)
    positions = 4294967295 - (keys & 4294967295)  # int64, < 2^31 for a live key
    batch = tl.load(row_to_batch_ptr + row).to(tl.int64)
    pages = tl.load(block_table_ptr + batch * max_pages + positions // PAGE, mask=live, other=0).to(tl.int64)
    slots = pages * PAGE + positions % PAGE  # int64: never wraps
    status |= tl.where(tl.max((live & (pages < 0)).to(tl.int32), axis=0) > 0, INVALID_PAGE, 0)
    status |= tl.where(tl.max((live & (slots > 2147483647)).to(tl.int32), axis=0) > 0, SLOT_OVERFLOW, 0)
    live = live & (status == 0)
    tl.store(values_ptr + row * values_s0 + offs * values_s1, tl.where(live, _scores_of_keys(keys), float("-inf")))
    tl.store(raw_ptr + row * raw_s0 + offs * raw_s1, tl.where(live, positions, -1).to(tl.int32))
    tl.store(physical_ptr + row * physical_s0 + offs * physical_s1, tl.where(live, slots, -1).to(tl.int32))
    tl.store(counts_ptr + row * counts_s0, tl.sum(live.to(tl.int32), axis=0))
    tl.store(status_out_ptr + row * status_s0, status)
    if REPAIRS:
        tl.store(repaired_out_ptr + row * repaired_s0, tl.load(repaired_ptr + row))
    else:
        tl.store(repaired_out_ptr + row * repaired_s0, 0)
    if WINDOWS:
        tl.store(candidates_out_ptr + row * candidates_s0, tl.load(ends_ptr + row) - tl.load(candidates_ptr + row))
    else:
        tl.store(
            candidates_out_ptr + row * candidates_s0,
            tl.minimum(tl.load(candidates_ptr + row), 2147483647).to(tl.int32),
        )


def assemble_into_triton(
    top_keys: torch.Tensor,
    row_to_batch: torch.Tensor,
    block_table: torch.Tensor,
    status: torch.Tensor,
    repaired: torch.Tensor | None,
    candidates: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
    buffers: dict,
) -> None:
    """assemble_into_torch in one kernel (every result field written into `buffers`,
    whatever their strides)."""
    rows, k = top_keys.shape
    if rows == 0:
        return
    values, raw, physical = buffers["values"], buffers["raw_indices"], buffers["physical_indices"]
    counts, status_out = buffers["counts"], buffers["status"]
    repaired_out, candidates_out = buffers["repaired"], buffers["candidates"]
    windows = isinstance(candidates, tuple)
    # the windows' (starts, ends), or the counts and an unread pointer
    counted, ends = (candidates[0], candidates[1].contiguous()) if windows else (candidates, candidates_out)
    assemble_result_kernel[(rows,)](
        top_keys.contiguous(),
        status.to(torch.int32).contiguous(),
        row_to_batch.contiguous(),
        block_table,
        block_table.shape[1],
        values,
        *values.stride(),
        raw,
        *raw.stride(),
        physical,
        *physical.stride(),
        counts,
        counts.stride(0),
        status_out,
        status_out.stride(0),
        repaired.contiguous() if repaired is not None else repaired_out,
        repaired_out,
        repaired_out.stride(0),
        counted.contiguous(),
        ends,
        candidates_out,
        candidates_out.stride(0),
        TOPK=k,
        PAGE=PAGE_SIZE,
        INVALID_PAGE=int(RowStatus.INVALID_PAGE),
        SLOT_OVERFLOW=int(RowStatus.SLOT_OVERFLOW),
        REPAIRS=repaired is not None,
        WINDOWS=windows,
        num_warps=4,
    )


def assemble_into_torch(
    top_keys: torch.Tensor,
    row_to_batch: torch.Tensor,
    block_table: torch.Tensor,
    status: torch.Tensor,
    repaired: torch.Tensor | None,
    candidates: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
    buffers: dict,
) -> None:
    """The assembly in torch ops: writes every result field into `buffers` (candidates clamped to int32)."""
    live = (top_keys != NO_KEY) & (status == 0)[:, None]
    _, positions = split_keys(top_keys)
    pos = torch.where(live, positions, 0).long()
    pages = block_table[row_to_batch.long()[:, None], pos // PAGE_SIZE].long()
    slots = pages * PAGE_SIZE + pos % PAGE_SIZE
    status = set_status_bit(status, (live & (pages < 0)).any(dim=1), RowStatus.INVALID_PAGE)
    status = set_status_bit(status, (live & (slots > INT32_MAX)).any(dim=1), RowStatus.SLOT_OVERFLOW)
    live &= (status == 0)[:, None]
    values, positions = split_keys(torch.where(live, top_keys, NO_KEY))
    buffers["values"].copy_(values)
    buffers["raw_indices"].copy_(positions)
    buffers["physical_indices"].copy_(torch.where(live, slots, -1))
    buffers["counts"].copy_(live.sum(dim=1))
    buffers["status"].copy_(status)
    if repaired is not None:
        buffers["repaired"].copy_(repaired)
    else:
        buffers["repaired"].zero_()
    if isinstance(candidates, tuple):  # the windows (starts, ends)
        candidates = candidates[1].long() - candidates[0].long()
    buffers["candidates"].copy_(candidates.clamp(max=INT32_MAX))


def result_buffers(rows: int, k: int, device: torch.device, out: Mapping[str, torch.Tensor] | None) -> dict:
    """The tensors a TopKResult of [rows, K] is written into: out's where given, new ones elsewhere
    (from torch's allocator, never the workspace: the result outlives the call)."""
    given = dict(out or {})
    return {
        name: given[name] if name in given else torch.empty(shape_of(rows, k), dtype=dtype, device=device)
        for name, (shape_of, dtype) in RESULT_FIELDS.items()
    }


def assemble_result(
    top_keys: torch.Tensor,
    row_to_batch: torch.Tensor,
    block_table: torch.Tensor,
    status: torch.Tensor,
    repaired: torch.Tensor | None,
    candidates: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
    out: Mapping[str, torch.Tensor] | None = None,
) -> TopKResult:
    """Turn sorted keys int64 [rows, K] into a TopKResult (module docstring), on the keys' device;
    `repaired` and `candidates` as the module docstring says;
    `out` as the module docstring says (checked by the operator). Runs the Triton twin where
    devices.runs_triton_stages says so."""
    rows, k = top_keys.shape
    buffers = result_buffers(rows, k, top_keys.device, out)
    if runs_triton_stages(top_keys.device):
        assemble_into_triton(top_keys, row_to_batch, block_table, status, repaired, candidates, buffers)
    else:
        assemble_into_torch(top_keys, row_to_batch, block_table, status, repaired, candidates, buffers)
    return TopKResult(**buffers)
