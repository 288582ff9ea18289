"""The one validation layer in front of every backend (CONTRACT.md §1-§3).

`validate_prefill` checks what would make a call meaningless (dtypes, shapes, contiguity, one
device, K, weight_scale) and raises InputError saying what to change. Faults that belong to single
rows do not fail the whole call here: they become status bits of those rows and the rows' windows
are emptied, so backends (which assume valid input) never read through them:
    INVALID_ROW   batch index outside [0, batch), or a window not inside [0, max_pages * 64)
    INVALID_PAGE  a page that overlaps the row's window is negative or >= num_pages
                  (a bad page id outside every window is ignored)
    NONFINITE     a NaN/inf weight (NaN/inf scores are found by the backends while scoring)
Physical slots are computed in int64; a live slot that does not fit int32 raises SlotOverflowError.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import torch

from .cache_layout import NUM_HEADS, PAGE_SIZE, SCALE_BYTES, VALUE_BYTES, KVCache, describe_kv_cache
from .devices import is_cuda
from .errors import InputDtypeError, InputError, InputShapeError, SlotOverflowError, UnsupportedTopKError
from .status import RowStatus

SUPPORTED_TOPK = (512, 1024)
INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class PrefillProblem:
    """Validated inputs of one prefill call; every tensor is on `device` and contiguous except the
    cache, whose pages may lie any stride apart (`cache_layout.describe_kv_cache`).

    `starts`/`ends` are the effective windows: rows with a status bit have an empty window.
    `weights` is float32 (bfloat16 input is widened exactly).
    """

    q_fp4: torch.Tensor  # uint8 [rows, 64, 64]
    q_scale: torch.Tensor  # uint8 [rows, 64, 4]
    cache: KVCache  # the paged keys in either format, read in place (cache_layout.py)
    block_table: torch.Tensor  # int32 [batch, max_pages]
    weights: torch.Tensor  # float32 [rows, 64]
    row_to_batch: torch.Tensor  # int32 [rows]
    starts: torch.Tensor  # int32 [rows]
    ends: torch.Tensor  # int32 [rows]
    row_status: torch.Tensor  # int32 [rows], bits found by validation
    topk: int
    weight_scale: float
    max_end: int  # largest effective window end (0 when every window is empty)
    host_rows: np.ndarray  # int32 [3, rows]: row_to_batch, starts, ends on the host (backends' schedules)

    @property
    def num_rows(self) -> int:
        return self.q_fp4.shape[0]

    @property
    def device(self) -> torch.device:
        return self.q_fp4.device

    @property
    def empty_rows(self) -> int:
        """Rows whose effective window is empty (from the host copy: no device work)."""
        return int((self.host_rows[2] <= self.host_rows[1]).sum())

    @property
    def window_lengths(self) -> torch.Tensor:
        """int64 [rows]: keys in each row's effective window."""
        return (self.ends - self.starts).long()

    def subset(self, rows: torch.Tensor) -> "PrefillProblem":
        """The same problem restricted to `rows` (int64 indices), in that order."""
        ends = self.ends[rows]
        return replace(
            self,
            q_fp4=self.q_fp4[rows],
            q_scale=self.q_scale[rows],
            weights=self.weights[rows],
            row_to_batch=self.row_to_batch[rows],
            starts=self.starts[rows],
            ends=ends,
            row_status=self.row_status[rows],
            **_window_summary(self.row_to_batch[rows], self.starts[rows], ends),
        )


def _window_summary(row_to_batch: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor) -> dict:
    """max_end and host_rows of effective windows: one copy of the row metadata to the host (the
    one host sync of validation)."""
    return _summary_of(torch.stack([row_to_batch, starts, ends]).to(torch.int32))


def _summary_of(effective: torch.Tensor) -> dict:
    host_rows = effective.cpu().numpy()
    return dict(max_end=int(host_rows[2].max()) if host_rows.shape[1] else 0, host_rows=host_rows)


def row_checks_run_as_kernel(device: torch.device) -> bool:
    """True where the per-row checks run as one Triton kernel (kernels/triton/row_checks.py, equal to
    the torch code here): NVIDIA CUDA devices. Elsewhere (CPU, ROCm) the torch code runs."""
    return is_cuda(device)


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


def check_slots_fit_int32(max_page_id: int) -> None:
    """Raise SlotOverflowError when the last slot of page `max_page_id` does not fit int32."""
    last_slot = int(max_page_id) * PAGE_SIZE + (PAGE_SIZE - 1)  # Python int: 64-bit and beyond
    if last_slot > INT32_MAX:
        raise SlotOverflowError(
            f"physical page {max_page_id} has slots up to {last_slot}, beyond int32 ({INT32_MAX}); "
            f"split the cache so that page ids stay below {(INT32_MAX + 1) // PAGE_SIZE}"
        )


def _row_status(
    block_table: torch.Tensor, num_pages: int, weights: torch.Tensor,
    row_to_batch: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor,
) -> torch.Tensor:
    batch, max_pages = block_table.shape
    b = row_to_batch.long()
    s = starts.long()
    e = ends.long()
    bad_row = (b < 0) | (b >= batch) | (s < 0) | (s > e) | (e > max_pages * PAGE_SIZE)
    status = torch.where(bad_row, int(RowStatus.INVALID_ROW), 0).to(torch.int32)
    # Pages a row reads: [first, last) with first = s // 64, last = ceil(e / 64); empty when s == e.
    bad_page = ((block_table < 0) | (block_table >= num_pages)).to(torch.int32)
    bad_prefix = torch.nn.functional.pad(bad_page.cumsum(dim=1), (1, 0))  # [batch, max_pages + 1]
    safe_b = torch.where(bad_row, 0, b)
    first = torch.where(bad_row, 0, s // PAGE_SIZE)
    last = torch.where(bad_row, 0, (e + PAGE_SIZE - 1) // PAGE_SIZE).clamp_min(first)
    bad_in_window = bad_prefix[safe_b, last] - bad_prefix[safe_b, first] > 0 if batch else bad_row
    status |= torch.where(bad_in_window & ~bad_row, int(RowStatus.INVALID_PAGE), 0).to(torch.int32)
    status |= torch.where(~torch.isfinite(weights).all(dim=1), int(RowStatus.NONFINITE), 0).to(torch.int32)
    return status


def _max_live_page(block_table: torch.Tensor, row_to_batch, starts, ends, status) -> int:
    """Largest page id that some answerable row reads (0 when none)."""
    live = status == 0
    if not bool(live.any()):
        return 0
    batch, max_pages = block_table.shape
    logical = torch.arange(max_pages, device=block_table.device)
    b = row_to_batch.long()[live]
    first = (starts.long()[live] // PAGE_SIZE)[:, None]
    last = ((ends.long()[live] + PAGE_SIZE - 1) // PAGE_SIZE)[:, None]
    read = (logical[None, :] >= first) & (logical[None, :] < last)
    pages = torch.where(read, block_table[b].long(), 0)
    return int(pages.max())


def validate_prefill(
    q_fp4, q_scale, kv_cache, block_table, weights, row_to_batch, starts, ends, *, topk, weight_scale=1.0,
    kv_scale=None,
) -> PrefillProblem:
    """Check every argument of `litetopk_prefill` / `dense_topk_prefill` and build a PrefillProblem.

    Raises InputError (or UnsupportedTopKError / SlotOverflowError) for anything that makes the
    call meaningless; row-level faults become bits of `row_status` instead (module docstring).
    `kv_scale` given: the cache is in AITER's format (`describe_kv_cache`).
    """
    check_topk(topk)
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
        "q_fp4": q_fp4, "q_scale": q_scale, "kv_cache": cache.values, "block_table": block_table,
        "weights": weights, "row_to_batch": row_to_batch, "starts": starts, "ends": ends,
    }
    devices = {name: t.device for name, t in tensors.items()}
    if len(set(devices.values())) != 1:
        listing = ", ".join(f"{n} on {d}" for n, d in devices.items())
        raise InputError(f"all tensors must be on one device; got {listing}")
    weights = weights.float().contiguous()
    num_pages = cache.num_pages
    if row_checks_run_as_kernel(weights.device):
        from .triton.row_checks import row_checks_triton

        status, effective = row_checks_triton(block_table, num_pages, weights, row_to_batch, starts, ends)
    else:
        status = _row_status(block_table, num_pages, weights, row_to_batch, starts, ends)
        ok = status == 0
        effective = torch.stack([torch.where(ok, t, 0) for t in (row_to_batch, starts, ends)]).to(torch.int32)
    if num_pages * PAGE_SIZE - 1 > INT32_MAX:
        check_slots_fit_int32(_max_live_page(block_table, row_to_batch, starts, ends, status))
    eff_rtb, eff_starts, eff_ends = effective.unbind(0)
    return PrefillProblem(
        q_fp4=q_fp4, q_scale=q_scale, cache=cache, block_table=block_table, weights=weights,
        row_to_batch=eff_rtb, starts=eff_starts, ends=eff_ends,
        row_status=status, topk=topk, weight_scale=float(weight_scale), **_summary_of(effective),
    )
