"""Client-side regions: exporting tensors to the service without copying them through HTTP.

    CPU tensor   copied once into a new sealed memfd (litetopk.clients.memfd: anonymous memory
                 that cannot shrink) that this client maps; its fd is handed to the service over
                 the fd socket and the Region keeps the mapping: `region.tensor` is the tensor's
                 new home (write into it, e.g. to update a cache in place, and the service sees
                 it). Nothing is left in any file system; the memory is freed when this process
                 and the service have both let go of it.
    CUDA tensor  exported by CUDA IPC handle (torch's `_share_cuda_`, no copy); the Region keeps
                 a reference to the tensor so its memory stays allocated until `unregister`.

Each region is registered `read_write` (default: results may be written into it with `out=`) or
`read_only` (the service maps it read-only and refuses it as an output); a cache is read_only.

A `RegionSlice` names `shape` elements of `dtype` at a byte `offset` of a region. A tensor that
lies inside a registered region (e.g. a slice of `region.tensor`) is found by address and sent
as a slice of it, so slices of registered regions travel as references too.

Every registration names its owner (`owner_fields`): `pid`, the process whose death retires the
region in the service, and `pid_ns`, the pid namespace that pid lives in (litetopk.clients.owners).
`pid: null` opts out of tracking.
"""

from __future__ import annotations

import base64
import functools
import math
import os
from dataclasses import dataclass, field

import torch

from litetopk.service.wire import dtype_name

from .memfd import SealedMemory
from .owners import pid_namespace

OWNER_PID_ENV = "LITETOPK_CLIENT_OWNER_PID"  # 'none' (send pid: null) or a pid; unset: this process
ACCESS_MODES = ("read_only", "read_write")


def resolve_owner_pid(owner_pid: int | str | None) -> int | str | None:
    """'auto' -> $LITETOPK_CLIENT_OWNER_PID when set, else 'current' (this process, read at each
    registration); None -> None (pid: null); a positive int -> itself."""
    if owner_pid == "auto":
        text = os.environ.get(OWNER_PID_ENV, "").strip().lower()
        if not text:
            return "current"
        if text in ("none", "null"):
            return None
        if not text.isdigit() or int(text) < 1:
            raise ValueError(f"{OWNER_PID_ENV}={text!r}: give 'none' or a process id")
        return int(text)
    if owner_pid is None or owner_pid == "current":
        return owner_pid
    if isinstance(owner_pid, bool) or not isinstance(owner_pid, int) or owner_pid < 1:
        raise ValueError(f"owner_pid={owner_pid!r}: give 'auto', None or a process id")
    return owner_pid


def owner_fields(owner_pid: int | str | None) -> dict:
    """The registration's `pid` and `pid_ns` for a resolved owner ('current', None or a pid)."""
    pid = os.getpid() if owner_pid == "current" else owner_pid
    if pid is None:
        return {"pid": None}
    return {"pid": pid, "pid_ns": pid_namespace()}


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
    _wire: dict | None = field(default=None, repr=False)

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

    def wire(self) -> dict:
        """The wire form of `slice()` (the registered tensor), computed once."""
        if self._wire is None:
            self._wire = self.slice().to_wire()
        return self._wire

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
        """The slice on the wire (worked out once: a slice names the same memory all its life)."""
        return self._wire

    @functools.cached_property
    def _wire(self) -> dict:
        return {
            "region": self.region.id,
            "generation": self.region.generation,
            "offset": self.offset,
            "dtype": dtype_name(self.dtype),
            "shape": list(self.shape),
        }

    def tensor(self) -> torch.Tensor:
        """The local tensor this slice names (a view of the region's memory)."""
        nbytes = math.prod(self.shape) * self.dtype.itemsize
        return self.region.base[self.offset : self.offset + nbytes].view(self.dtype).view(self.shape)


# ---------------------------------------------------------------------------------- exporting


@dataclass
class Export:
    """What `register` sends, and what the Region must keep once the service said yes."""

    registration: dict
    base: torch.Tensor
    tensor: torch.Tensor
    keepalive: object


def export_cpu(tensor: torch.Tensor, *, min_size: int = 0) -> Export:
    """Copy `tensor` into a new sealed memfd (owned by this process) and describe it; the
    registration still lacks its `ticket` (the fd is handed over by the client)."""
    nbytes = tensor.numel() * tensor.element_size()
    size = max(nbytes, min_size, 1)
    memory = SealedMemory(size)
    base = torch.frombuffer(memory.mapping, dtype=torch.uint8)
    home = base[:nbytes].view(tensor.dtype).view(tensor.shape)
    home.copy_(tensor)
    return Export({"kind": "memfd", "size": size}, base, home, memory)


def export_cuda(tensor: torch.Tensor) -> Export:
    """Describe the CUDA allocation holding `tensor` by IPC handle (torch's protocol, no pickle)."""
    if not tensor.is_contiguous():
        raise ValueError("register a contiguous CUDA tensor (call .contiguous() first)")
    storage = tensor.untyped_storage()
    (_, handle, size, offset, counter, counter_offset, event, event_sync) = storage._share_cuda_()
    uuid = str(torch.cuda.get_device_properties(tensor.device).uuid)
    b64 = lambda raw: base64.b64encode(raw).decode() if raw is not None else None  # noqa: E731
    registration = {
        "kind": "cuda_ipc",
        "handle": b64(handle),
        "device_uuid": uuid,
        "size": int(size),
        "offset": int(offset),
        "torch": {
            "ref_counter_handle": b64(counter),
            "ref_counter_offset": int(counter_offset),
            "event_handle": b64(event),
            "event_sync_required": bool(event_sync),
        },
    }
    base = torch.empty((0,), dtype=torch.uint8, device=tensor.device)
    base.set_(storage, 0, (storage.nbytes(),), (1,))
    return Export(registration, base, tensor, tensor)


def export(tensor: torch.Tensor, *, min_size: int = 0, access: str = "read_write") -> Export:
    """The registration of `tensor` without its owner fields (`owner_fields` adds them)."""
    if access not in ACCESS_MODES:
        raise ValueError(f"access={access!r}: give one of {ACCESS_MODES}")
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"register() takes a torch.Tensor, got {type(tensor).__name__}")
    if tensor.device.type == "cuda":
        exported = export_cuda(tensor)
    elif tensor.device.type == "cpu":
        exported = export_cpu(tensor, min_size=min_size)
    else:
        raise ValueError(f"tensors on {tensor.device} cannot be shared with the service")
    exported.registration["access"] = access
    return exported


def release_export(region: Region) -> None:
    """Let go of the local side of a region after the service unregistered it."""
    keep, region.keepalive = region.keepalive, None
    region.registered = False
    if isinstance(keep, SealedMemory):
        keep.close_fd()  # the mapping itself lives on while tensors view it (region.tensor, slices)


__all__ = [
    "ACCESS_MODES",
    "Export",
    "Region",
    "RegionSlice",
    "export",
    "export_cpu",
    "export_cuda",
    "owner_fields",
    "release_export",
    "resolve_owner_pid",
]
