"""Stage 6, assembly: sorted ordering keys -> the published TopKResult, page-mapped (torch; Triton twin
in kernels/triton/assembly.py, the same bits).

Math, per row with status s and sorted keys [K] (selection.py's ordering keys, NO_KEY padded):
    live[j]        = key[j] != NO_KEY and s == 0
    value, raw     = selection.split_keys(key)            (-inf, -1 where not live)
    page           = block_table[row_to_batch, raw // 64]  (int64)
    physical       = page * 64 + raw % 64                  (int64; -1 where not live)
    counts         = number of live keys
A live key whose page is negative or whose slot is beyond int32 cannot be published: the row gets
INVALID_PAGE or SLOT_OVERFLOW and publishes nothing (the row checks already fail such rows; this is
the last guard, on the device: nothing is read back on the host).
`out` takes caller-owned tensors for any subset of the result fields (TopKResult's names, shapes
and dtypes; any strides, e.g. `buf[start:end, :K]`); the fields written there are returned as those
tensors, the others are allocated.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from .cache_layout import PAGE_SIZE
from .devices import runs_triton_stages
from .result import RESULT_FIELDS, TopKResult
from .selection import NO_KEY, split_keys
from .status import RowStatus, set_status_bit

INT32_MAX = 2**31 - 1


def result_buffers(rows: int, k: int, device: torch.device, out: Mapping[str, torch.Tensor] | None) -> dict:
    """The tensors a TopKResult of [rows, K] is written into: out's where given, new ones elsewhere
    (from torch's allocator, never the workspace: the result outlives the call)."""
    given = dict(out or {})
    return {name: given[name] if name in given else torch.empty(shape_of(rows, k), dtype=dtype, device=device)
            for name, (shape_of, dtype) in RESULT_FIELDS.items()}


def assemble_result(top_keys: torch.Tensor, row_to_batch: torch.Tensor, block_table: torch.Tensor,
                    status: torch.Tensor, repaired: torch.Tensor, candidates: torch.Tensor,
                    out: Mapping[str, torch.Tensor] | None = None) -> TopKResult:
    """Turn sorted keys int64 [rows, K] into a TopKResult (module docstring), on the keys' device;
    `out` as the module docstring says (checked by the operator). Runs the Triton twin where
    devices.runs_triton_stages says so."""
    rows, k = top_keys.shape
    buffers = result_buffers(rows, k, top_keys.device, out)
    if runs_triton_stages(top_keys.device):
        from .triton.assembly import assemble_into_triton

        assemble_into_triton(top_keys, row_to_batch, block_table, status, repaired, candidates, buffers)
    else:
        assemble_into_torch(top_keys, row_to_batch, block_table, status, repaired, candidates, buffers)
    return TopKResult(**buffers)


def assemble_into_torch(top_keys: torch.Tensor, row_to_batch: torch.Tensor, block_table: torch.Tensor,
                        status: torch.Tensor, repaired: torch.Tensor, candidates: torch.Tensor, buffers: dict) -> None:
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
    buffers["repaired"].copy_(repaired)
    buffers["candidates"].copy_(candidates.clamp(max=INT32_MAX))
