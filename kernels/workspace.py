"""Where a call's intermediate tensors come from: the caller's workspace, or the device allocator.

Every stage takes its buffers from `problem.scratch` (a Scratch) instead of calling torch.empty:

    scratch.empty(shape, dtype)        uninitialised
    scratch.zeros(shape, dtype)        zero-filled (one memset launch)
    scratch.full(shape, value, dtype)  filled with `value`

Without a workspace, Scratch allocates from torch's caching allocator as before. With one (a caller-owned
uint8 device tensor, `allocate_workspace`), the buffers are carved from it in call order, each aligned
to ALIGNMENT bytes, so a call allocates nothing and the same call replays on the same addresses (CUDA
graphs). A workspace that is too small raises InputError saying how many bytes the call needs.
"""

from __future__ import annotations

import math

import torch

from .errors import InputError

ALIGNMENT = 256  # bytes: every carved buffer starts on this boundary (TMA and vector loads need >= 16)


class Scratch:
    """A call's source of intermediate buffers (module docstring). Not thread-safe: one per call."""

    def __init__(self, device: torch.device, workspace: torch.Tensor | None = None):
        self.device = torch.device(device)
        self.workspace = workspace
        self.used = 0  # bytes carved so far (rounded up to ALIGNMENT); also counted without a workspace

    def empty(self, shape, dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised contiguous tensor of `shape` and `dtype` on the call's device."""
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        start = self.used
        self.used += -(-nbytes // ALIGNMENT) * ALIGNMENT
        if self.workspace is None:
            return torch.empty(shape, dtype=dtype, device=self.device)
        if self.used > self.workspace.numel():
            raise InputError(f"the workspace holds {self.workspace.numel()} bytes; this call needs at least "
                             f"{self.used} (size it with workspace_bytes(...))")
        return self.workspace[start:start + nbytes].view(dtype).view(shape)

    def zeros(self, shape, dtype: torch.dtype) -> torch.Tensor:
        """A zero-filled tensor (module docstring)."""
        return self.empty(shape, dtype).zero_()

    def full(self, shape, value, dtype: torch.dtype) -> torch.Tensor:
        """A tensor filled with `value` (module docstring)."""
        return self.empty(shape, dtype).fill_(value)


__all__ = ["ALIGNMENT", "Scratch"]
