"""Client-side regions: exporting tensors to the service without copying them through HTTP.

    CPU tensor   copied once into a new POSIX shared-memory block that this client owns; the
                 Region keeps the block alive and `region.tensor` is the tensor's new home
                 (write into it, e.g. to update a cache in place, and the service sees it).
    CUDA tensor  exported by CUDA IPC handle (torch's `_share_cuda_`, no copy); the Region keeps
                 a reference to the tensor so its memory stays allocated until `unregister`.

A `RegionSlice` names `shape` elements of `dtype` at a byte `offset` of a region. A tensor that
lies inside a registered region (e.g. a slice of `region.tensor`) is found by address and sent
as a slice of it, so slices of registered regions travel as references too.

Every registration names its owner (`owner_fields`): `pid`, the process whose death retires the
region in the service, and `pid_ns`, the pid namespace that pid lives in (the inode of
/proc/self/ns/pid), so that a service in another pid namespace refuses the pid instead of
tracking whichever unrelated process has that number there. `pid: null` opts out of tracking.
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
OWNER_PID_ENV = "LITETOPK_CLIENT_OWNER_PID"  # 'none' (send pid: null) or a pid; unset: this process
SHM_MODE_ENV = "LITETOPK_CLIENT_SHM_MODE"  # octal permissions of new shared-memory blocks (default 0600)
DEFAULT_SHM_MODE = 0o600


def pid_namespace() -> int | None:
    """This process's pid namespace id (st_ino of /proc/self/ns/pid); None where it cannot be read."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None


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


def resolve_shm_mode(shm_mode: int | None) -> int:
    """None -> $LITETOPK_CLIENT_SHM_MODE (octal) when set, else 0600; the owner keeps read and write."""
    if shm_mode is None:
        text = os.environ.get(SHM_MODE_ENV, "").strip()
        try:
            shm_mode = int(text.lower().removeprefix("0o"), 8) if text else DEFAULT_SHM_MODE
        except ValueError:
            raise ValueError(f"{SHM_MODE_ENV}={text!r} is not an octal mode such as 0600 or 0660") from None
    if isinstance(shm_mode, bool) or not isinstance(shm_mode, int) or not 0 <= shm_mode <= 0o777 \
            or shm_mode & 0o600 != 0o600:
        raise ValueError(f"shm_mode={shm_mode!r}: give permission bits with owner read and write (0o600, 0o660)")
    return shm_mode


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

    `mode` is its permission bits (0600: this uid only; 0660: also the group, which is this
    process's primary group, for a service running under another uid in that group).

    The block is registered with multiprocessing's resource tracker, which unlinks it if this
    process dies without unlinking it (a killed worker leaves no block behind). The mapping is
    closed by the last tensor viewing it, never explicitly (tensors may outlive the Region).
    """

    def __init__(self, size: int, mode: int = DEFAULT_SHM_MODE):
        self.name = "litetopk_" + secrets.token_hex(10)
        fd = os.open(SHM_DIR / self.name, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            if mode != 0o600:
                os.fchmod(fd, mode)  # exactly `mode`, whatever the umask
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


def export_cpu(tensor: torch.Tensor, *, min_size: int = 0, shm_mode: int = DEFAULT_SHM_MODE) -> Export:
    """Copy `tensor` into a new shared-memory block (owned by this process) and describe it."""
    nbytes = tensor.numel() * tensor.element_size()
    size = max(nbytes, min_size, 1)
    block = ShmBlock(size, shm_mode)
    base = torch.frombuffer(block.mapping, dtype=torch.uint8)
    home = base[:nbytes].view(tensor.dtype).view(tensor.shape)
    home.copy_(tensor)
    registration = {"kind": "shm", "name": block.name, "size": size}
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
        "torch": {"ref_counter_handle": b64(counter), "ref_counter_offset": int(counter_offset),
                  "event_handle": b64(event), "event_sync_required": bool(event_sync)},
    }
    base = torch.empty((0,), dtype=torch.uint8, device=tensor.device)
    base.set_(storage, 0, (storage.nbytes(),), (1,))
    return Export(registration, base, tensor, tensor)


def export(tensor: torch.Tensor, *, min_size: int = 0, shm_mode: int = DEFAULT_SHM_MODE) -> Export:
    """The registration of `tensor` without its owner fields (`owner_fields` adds them)."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"register() takes a torch.Tensor, got {type(tensor).__name__}")
    if tensor.device.type == "cuda":
        return export_cuda(tensor)
    if tensor.device.type != "cpu":
        raise ValueError(f"tensors on {tensor.device} cannot be shared with the service")
    return export_cpu(tensor, min_size=min_size, shm_mode=shm_mode)


def release_export(region: Region) -> None:
    """Let go of the local side of a region after the service unregistered it."""
    keep, region.keepalive = region.keepalive, None
    region.registered = False
    if isinstance(keep, ShmBlock):
        keep.unlink()  # the mapping itself lives on while tensors view it (region.tensor, slices)


__all__ = ["Export", "Region", "ShmBlock", "RegionSlice", "export", "export_cpu", "export_cuda", "owner_fields",
           "pid_namespace", "release_export", "resolve_owner_pid", "resolve_shm_mode"]
