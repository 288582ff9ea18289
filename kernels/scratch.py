"""Scratch: where a call's intermediate tensors come from, the caller's workspace or the device allocator.

Layer: utilities, the bottom of `litetopk.kernels` (imports errors only). Every stage and backend
takes its explicit buffers from `problem.scratch` (a Scratch) instead of calling torch.empty:

    scratch.empty(shape, dtype)        uninitialised
    scratch.zeros(shape, dtype)        zero-filled (one memset launch)
    scratch.full(shape, value, dtype)  filled with `value`

Without a workspace, Scratch allocates from torch's caching allocator. With one (a caller-owned
uint8 device tensor, workspace.allocate_workspace), the buffers are carved from it in call order,
each aligned to ALIGNMENT bytes, so a call allocates nothing and the same call replays on the same
addresses (CUDA graphs). A workspace that is too small raises InputError saying how many bytes the
call needs; `Scratch.used` counts the bytes carved, which is how workspace.py sizes a workspace.

What the workspace holds: the explicit buffers of the stages (row checks' outputs, decoded operands,
the schedule, the calibration sample, the candidate buffers and scan state, the repair's rescan).
Not in it: implicit temporaries of torch ops (the torch stages' intermediate results), the
per-block temporaries of the reference backend's loops, the dense path's answer for a window bound
of 0 (no score column: it would make the size shrink as the bound grows), and the result fields not
given in `out=` (they are returned, so they outlive the call). Those come from torch's allocator
(under a CUDA graph, the graph's pool).
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Iterator

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
            raise InputError(
                f"the workspace holds {self.workspace.numel()} bytes; this call needs at least "
                f"{self.used} (size it with workspace_bytes(...) for the call's rows, sequences, "
                "window bound and K)"
            )
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
                self.workspace.untyped_storage(), offset, shape, _contiguous_strides(shape)
            )
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


__all__ = ["ALIGNMENT", "STORAGE_ALIGNMENT", "Scratch"]
