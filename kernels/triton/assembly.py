"""The assembly stage in one kernel: the Triton twin of kernels/assembly.py (CUDA devices and the
interpreter; the same bits, tested).

Math: kernels/assembly.py. Tiling: one program per row, its K keys at once. The outputs may have
any strides (caller-owned views such as `buf[start:end, :K]`); every address is int64.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..cache_layout import PAGE_SIZE
from ..status import RowStatus
from .keys import NO_KEY_C, _scores_of_keys


@triton.jit
def assemble_result_kernel(
    keys_ptr, status_ptr, row_to_batch_ptr, block_table_ptr, max_pages,   # int64 [rows, K]; int32 ...
    values_ptr, values_s0, values_s1, raw_ptr, raw_s0, raw_s1,            # outputs with their strides
    physical_ptr, physical_s0, physical_s1, counts_ptr, counts_s0, status_out_ptr, status_s0,
    repaired_ptr, repaired_out_ptr, repaired_s0, candidates_ptr, candidates_out_ptr, candidates_s0,  # [rows]
    TOPK: tl.constexpr, PAGE: tl.constexpr, INVALID_PAGE: tl.constexpr, SLOT_OVERFLOW: tl.constexpr,
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
    tl.store(repaired_out_ptr + row * repaired_s0, tl.load(repaired_ptr + row))
    tl.store(candidates_out_ptr + row * candidates_s0, tl.minimum(tl.load(candidates_ptr + row), 2147483647).to(tl.int32))


def assemble_into_triton(top_keys: torch.Tensor, row_to_batch: torch.Tensor, block_table: torch.Tensor,
                         status: torch.Tensor, repaired: torch.Tensor, candidates: torch.Tensor, buffers: dict) -> None:
    """kernels.assembly.assemble_into_torch in one kernel (every result field written into `buffers`,
    whatever their strides)."""
    rows, k = top_keys.shape
    if rows == 0:
        return
    values, raw, physical = buffers["values"], buffers["raw_indices"], buffers["physical_indices"]
    counts, status_out = buffers["counts"], buffers["status"]
    repaired_out, candidates_out = buffers["repaired"], buffers["candidates"]
    assemble_result_kernel[(rows,)](
        top_keys.contiguous(), status.to(torch.int32).contiguous(), row_to_batch.contiguous(), block_table,
        block_table.shape[1], values, *values.stride(), raw, *raw.stride(), physical, *physical.stride(),
        counts, counts.stride(0), status_out, status_out.stride(0),
        repaired.contiguous(), repaired_out, repaired_out.stride(0), candidates.contiguous(), candidates_out,
        candidates_out.stride(0), TOPK=k, PAGE=PAGE_SIZE, INVALID_PAGE=int(RowStatus.INVALID_PAGE), SLOT_OVERFLOW=int(RowStatus.SLOT_OVERFLOW),
        num_warps=4)
