"""Client-side regions: exporting tensors to the service without copying them through HTTP.

    CPU tensor   copied once into a new POSIX shared-memory block that this client owns; the
                 Region keeps the block alive and `region.tensor` is the tensor's new home
                 (write into it, e.g. to update a cache in place, and the service sees it).
    CUDA tensor  exported by CUDA IPC handle (torch's `_share_cuda_`, no copy); the Region keeps
                 a reference to the tensor so its memory stays allocated until `unregister`.

A `RegionSlice` names `shape` elements of `dtype` at a byte `offset` of a region. A tensor that
lies inside a registered region (e.g. a slice of `region.tensor`) is found by address and sent
as a slice of it, so slices of registered regions travel as references too.
"""

from __future__ import annotations

import base64
import math
import mmap
import os
import secrets
from dataclasses import dataclass, field
from multiprocessing import resource_tracker
from pathlib import Path

import torch

from .wire import dtype_name

SHM_DIR = Path("/dev/shm")


@dataclass(eq=False)
class Region:
    """A region registered with the service: id, generation, and the memory it names.

    `base` is uint8 [size] over the whole region; `tensor` is what was registered (its dtype and
    shape) inside it. Keep the Region (and for CUDA, do not free or reuse the memory) until
    `client.unregister(region)` has returned.
    """

    id: str
    generation: int
    kind: str
    size: int
    base: torch.Tensor
    tensor: torch.Tensor
    keepalive: object = field(default=None, repr=False)
    registered: bool = True

    @property
    def device(self) -> torch.device:
        return self.base.device

    def slice(self, offset: int = 0, dtype: torch.dtype | None = None, shape=None) -> "RegionSlice":
        """`shape` elements of `dtype` at byte `offset` (default: the registered tensor)."""
        if dtype is None and shape is None and offset == 0:
            return RegionSlice(self, self.offset_of(self.tensor), self.tensor.dtype, tuple(self.tensor.shape))
        dtype = dtype or torch.uint8
        shape = tuple(shape) if shape is not None else ((self.size - offset) // dtype.itemsize,)
        return RegionSlice(self, offset, dtype, shape)

    def offset_of(self, tensor: torch.Tensor) -> int:
        return tensor.data_ptr() - self.base.data_ptr()

    def contains(self, tensor: torch.Tensor) -> bool:
        if tensor.device != self.device or not tensor.is_contiguous():
            return False
        start = self.offset_of(tensor)
        return 0 <= start and start + tensor.numel() * tensor.element_size() <= self.size


@dataclass(frozen=True, eq=False)
class RegionSlice:
    """`shape` elements of `dtype`, C-contiguous, at byte `offset` of `region`."""

    region: Region
    offset: int
    dtype: torch.dtype
    shape: tuple[int, ...]

    def to_wire(self) -> dict:
        return {"region": self.region.id, "generation": self.region.generation, "offset": self.offset,
                "dtype": dtype_name(self.dtype), "shape": list(self.shape)}

    def tensor(self) -> torch.Tensor:
        """The local tensor this slice names (a view of the region's memory)."""
        nbytes = math.prod(self.shape) * self.dtype.itemsize
        return self.region.base[self.offset:self.offset + nbytes].view(self.dtype).view(self.shape)


# ---------------------------------------------------------------------------------- exporting


@dataclass
class Export:
    """What `register` sends, and what the Region must keep once the service said yes."""

    registration: dict
    base: torch.Tensor
    tensor: torch.Tensor
    keepalive: object


class ShmBlock:
    """A POSIX shared-memory block /dev/shm/<name> created by this process, mapped once.

    The block is registered with multiprocessing's resource tracker, which unlinks it if this
    process dies without unlinking it (a killed worker leaves no block behind). The mapping is
    closed by the last tensor viewing it, never explicitly (tensors may outlive the Region).
    """

    def __init__(self, size: int):
        self.name = "litetopk_" + secrets.token_hex(10)
        fd = os.open(SHM_DIR / self.name, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(fd, size)
            self.mapping = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        resource_tracker.register("/" + self.name, "shared_memory")
        self.linked = True

    def unlink(self) -> None:
        if self.linked:
            self.linked = False
            os.unlink(SHM_DIR / self.name)
            resource_tracker.unregister("/" + self.name, "shared_memory")


def export_cpu(tensor: torch.Tensor, *, min_size: int = 0) -> Export:
    """Copy `tensor` into a new shared-memory block (owned by this process) and describe it."""
    nbytes = tensor.numel() * tensor.element_size()
    size = max(nbytes, min_size, 1)
    block = ShmBlock(size)
    base = torch.frombuffer(block.mapping, dtype=torch.uint8)
    home = base[:nbytes].view(tensor.dtype).view(tensor.shape)
    home.copy_(tensor)
    registration = {"kind": "shm", "name": block.name, "size": size, "pid": os.getpid()}
    return Export(registration, base, home, block)


def export_cuda(tensor: torch.Tensor) -> Export:
    """Describe the CUDA allocation holding `tensor` by IPC handle (torch's protocol, no pickle)."""
    if not tensor.is_contiguous():
        raise ValueError("register a contiguous CUDA tensor (call .contiguous() first)")
    storage = tensor.untyped_storage()
    (_, handle, size, offset, counter, counter_offset, event, event_sync) = storage._share_cuda_()
    uuid = str(torch.cuda.get_device_properties(tensor.device).uuid)
    b64 = lambda raw: base64.b64encode(raw).decode() if raw is not None else None  # noqa: E731
    registration = {
        "kind": "cuda_ipc", "handle": b64(handle), "device_uuid": uuid, "size": int(size), "offset": int(offset),
        "pid": os.getpid(),
        "torch": {"ref_counter_handle": b64(counter), "ref_counter_offset": int(counter_offset),
                  "event_handle": b64(event), "event_sync_required": bool(event_sync)},
    }
    base = torch.empty((0,), dtype=torch.uint8, device=tensor.device)
    base.set_(storage, 0, (storage.nbytes(),), (1,))
    return Export(registration, base, tensor, tensor)


def export(tensor: torch.Tensor, *, min_size: int = 0) -> Export:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"register() takes a torch.Tensor, got {type(tensor).__name__}")
    if tensor.device.type == "cuda":
        return export_cuda(tensor)
    if tensor.device.type != "cpu":
        raise ValueError(f"tensors on {tensor.device} cannot be shared with the service")
    return export_cpu(tensor, min_size=min_size)


def release_export(region: Region) -> None:
    """Let go of the local side of a region after the service unregistered it."""
    keep, region.keepalive = region.keepalive, None
    region.registered = False
    if isinstance(keep, ShmBlock):
        keep.unlink()  # the mapping itself lives on while tensors view it (region.tensor, slices)


__all__ = ["Export", "Region", "ShmBlock", "RegionSlice", "export", "export_cpu", "export_cuda", "release_export"]
