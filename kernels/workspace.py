"""Where a call's intermediate tensors come from: the caller's workspace, or the device allocator.

Every stage takes its explicit buffers from `problem.scratch` (a Scratch) instead of calling torch.empty:

    scratch.empty(shape, dtype)        uninitialised
    scratch.zeros(shape, dtype)        zero-filled (one memset launch)
    scratch.full(shape, value, dtype)  filled with `value`

Without a workspace, Scratch allocates from torch's caching allocator as before. With one (a caller-owned
uint8 device tensor, `allocate_workspace`), the buffers are carved from it in call order, each aligned
to ALIGNMENT bytes, so a call allocates nothing and the same call replays on the same addresses (CUDA
graphs). A workspace that is too small raises InputError saying how many bytes the call needs.

What the workspace holds: the explicit buffers of the stages (row checks' outputs, decoded operands,
the schedule, the calibration sample, the candidate buffers and scan state, the repair's rescan).
Not in it: implicit temporaries of torch ops (the torch stages' intermediate results), the
per-block temporaries of the reference backend's loops, the dense path's answer for a window bound
of 0 (no score column: it would make the size shrink as the bound grows), and the result fields not
given in `out=` (they are returned, so they outlive the call). Those come from torch's allocator
(under a CUDA graph, the graph's pool).

Sizing (`workspace_bytes`) is measured, not restated: the operator itself runs at the bounds (rows with
empty windows: the buffers' shapes come from shapes and bounds only, never from the data) and
Scratch counts the bytes carved (`Scratch.used`). Every buffer grows with rows, sequences and the
window bound, except where the calibration changes its sample shape (`calibration.shape_changes`):
the run is repeated at each such bound below `max_seq_len` and the largest count is the answer. A
self-calibrating scan (LiteTopKTuning(calibration="scan")) has no calibration sample and a candidate
buffer of tuning.capacity(K) keys at every bound: one run, at the bounds.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Iterator, Sequence

import torch

from .errors import InputError

ALIGNMENT = 256  # bytes: every carved buffer starts on this boundary (TMA and vector loads need >= 16)
STORAGE_ALIGNMENT = 16  # bytes: where a workspace's storage starts (its views count elements from there)
MAX_VIEWS = 4096  # carved views a workspace keeps for the next calls (a few dozen calls' shapes)
_VIEWS = "_litetopk_views"  # the attribute of a workspace tensor that keeps them
_WHERE = "at"  # their entry for the (data pointer, bytes) they were carved from


class Scratch:
    """A call's source of intermediate buffers (module docstring). Not thread-safe: one per call."""

    def __init__(self, device: torch.device, workspace: torch.Tensor | None = None):
        self.device = torch.device(device)
        self.workspace = workspace
        self.used = 0  # bytes carved so far (rounded up to ALIGNMENT); also counted without a workspace
        self._uncounted = False
        # The views carved from this workspace, kept on the tensor across calls (every call of a shape
        # carves the same ones: a lookup instead of a view op a buffer), one set for calls inside
        # torch.inference_mode and one for calls outside it (an inference tensor cannot be written outside
        # it). Dropped at a call's start when they have grown past MAX_VIEWS, or when the tensor no longer
        # lies where they were carved (set_, resize_).
        self._views: dict | None = None
        if workspace is not None:
            kept = workspace.__dict__.setdefault(_VIEWS, {})
            self._views = kept.setdefault(torch.is_inference_mode_enabled(), {})
            where = (workspace.data_ptr(), workspace.numel())
            if self._views.get(_WHERE) != where or len(self._views) > MAX_VIEWS:
                self._views.clear()
                self._views[_WHERE] = where

    def empty(self, shape, dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised contiguous tensor of `shape` and `dtype` on the call's device."""
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        if self._uncounted:
            return torch.empty(shape, dtype=dtype, device=self.device)
        count = math.prod(shape)
        start = self.used
        self.used += -(-(count * dtype.itemsize) // ALIGNMENT) * ALIGNMENT
        if self.workspace is None:
            return torch.empty(shape, dtype=dtype, device=self.device)
        if self.used > self.workspace.numel():
            raise InputError(f"the workspace holds {self.workspace.numel()} bytes; this call needs at least "
                             f"{self.used} (size it with workspace_bytes(...) for the call's rows, sequences, "
                             "window bound and K)")
        # A call carves ~100 buffers and the host time of an eager call counts them: each is looked up
        # (the same call shape carved it before) or made once. A kept view is a tensor on the
        # workspace's storage, not a view of the tensor (which would hold the tensor through `_base`:
        # a reference cycle that keeps a dropped workspace's memory until Python's garbage collector
        # runs). Buffers start on ALIGNMENT bytes, so the element offset is exact.
        if count == 0:  # (no bytes: every empty buffer of a call would share one kept tensor)
            return torch.empty(shape, dtype=dtype, device=self.device)
        key = (start, shape, dtype)
        view = self._views.get(key)
        if view is None:
            offset = (self.workspace.storage_offset() + start) // dtype.itemsize
            view = self._views[key] = torch.empty(0, dtype=dtype, device=self.device).set_(
                self.workspace.untyped_storage(), offset, shape, _contiguous_strides(shape))
        return view

    def zeros(self, shape, dtype: torch.dtype) -> torch.Tensor:
        """A zero-filled tensor (module docstring)."""
        return self.empty(shape, dtype).zero_()

    def full(self, shape, value, dtype: torch.dtype) -> torch.Tensor:
        """A tensor filled with `value` (module docstring)."""
        return self.empty(shape, dtype).fill_(value)

    @contextlib.contextmanager
    def from_allocator(self) -> Iterator[None]:
        """Inside, buffers come from torch's allocator and are not counted: for the synchronizing
        `check=True` completion of the repair (a data-dependent number of rescans, never under
        capture), which a workspace sized from bounds cannot hold."""
        self._uncounted, before = True, self._uncounted
        try:
            yield
        finally:
            self._uncounted = before


@functools.lru_cache(maxsize=1024)
def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def workspace_bytes(max_rows: int, max_seq_len: int, topk: int | Sequence[int], *, device, backend: str = "auto",
                    tuning=None, dense: bool = False, max_batch: int = 1) -> int:
    """Bytes of a workspace that serves every `litetopk_prefill` call (`dense_topk_prefill` with
    dense=True) on `device` with the backend `backend` resolves to there, `tuning` (LiteTopKTuning,
    default production) and: rows <= max_rows, block-table rows (sequences) <= max_batch, window
    bound max_end = min(max_seq_len argument, block_table.shape[1] * 64) <= max_seq_len, K `topk` (or
    any K of a sequence of them). Exact: the largest call within the bounds carves exactly this many
    bytes; that is the call at the bounds, or one at a bound below max_seq_len where the calibration
    sample changes shape (module docstring: measured by running the operator on `device`, a few
    launches with empty windows; call it once, outside graph capture). Raises InputError for a bound
    out of range."""
    from .calibration import shape_changes
    from .operator import new_backend, on_device
    from .pipeline import LiteTopKTuning
    from .validation import check_topk

    ks = (topk,) if isinstance(topk, int) else tuple(topk)
    for k in ks:
        check_topk(k)
    for name, value, least in (("max_rows", max_rows, 0), ("max_seq_len", max_seq_len, 0), ("max_batch", max_batch, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise InputError(f"{name} must be an int >= {least}, got {value!r}")
    device = torch.device(device)
    tuning = tuning or LiteTopKTuning()
    chosen = new_backend(backend, device)  # its own instance: the dry runs' operands are not kept around
    at_the_bound = dense or tuning.calibration == "scan"  # no calibration sample (module docstring)
    bounds = [(k, max_seq_len) for k in ks] if at_the_bound else \
        [(k, end) for k in ks for end in shape_changes(max_seq_len, tuning.sample_size, k)]
    with on_device(device, chosen):
        return max(_bytes_at(chosen, max_rows, max_batch, max_seq_len, end, k, device, tuning, dense)
                   for k, end in bounds)


def allocate_workspace(max_rows: int, max_seq_len: int, topk: int | Sequence[int], *, device, backend: str = "auto",
                       tuning=None, dense: bool = False, max_batch: int = 1) -> torch.Tensor:
    """A uint8 [workspace_bytes(...)] tensor on `device` (same arguments), its start aligned to
    ALIGNMENT bytes: pass it as `workspace=` to every call within those bounds, one call at a time."""
    nbytes = workspace_bytes(max_rows, max_seq_len, topk, device=device, backend=backend, tuning=tuning, dense=dense,
                             max_batch=max_batch)
    raw = torch.empty(nbytes + ALIGNMENT, dtype=torch.uint8, device=device)
    start = -raw.data_ptr() % ALIGNMENT  # CPU tensors start on 64 bytes, CUDA ones on 512
    return raw[start:start + nbytes]


def _bytes_at(backend, rows: int, batch: int, table_end: int, max_end: int, k: int, device: torch.device, tuning,
              dense: bool) -> int:
    """Scratch.used of one call of `rows` empty rows over `batch` sequences, window bound `max_end`."""
    from .cache_layout import PAGE_BYTES, PAGE_SIZE
    from .pipeline import run_dense, run_litetopk
    from .validation import validate_prefill

    def zeros(*shape, dtype=torch.int32):
        return torch.zeros(shape, dtype=dtype, device=device)

    problem = validate_prefill(
        zeros(rows, 64, 64, dtype=torch.uint8), torch.full((rows, 64, 4), 127, dtype=torch.uint8, device=device),
        zeros(1, PAGE_BYTES, dtype=torch.uint8), zeros(batch, max(1, -(-table_end // PAGE_SIZE))),
        zeros(rows, 64, dtype=torch.float32), zeros(rows), zeros(rows), zeros(rows), topk=k, max_seq_len=max_end)
    if dense:
        run_dense(problem, backend, selector="torch")
    else:
        run_litetopk(problem, backend, repair=True, tuning=tuning)
    return problem.scratch.used


__all__ = ["ALIGNMENT", "Scratch", "allocate_workspace", "workspace_bytes"]
