"""Opening the memory of a region: sealed memfds (host) and CUDA IPC handles (device).

    memfd     an fd handed over the fd socket (service/fdpass.py): it must be a memfd sealed
              against shrinking (F_SEAL_SHRINK, read with F_GET_SEALS), at least `size` bytes
              long, and writable for a read-write region. It is mapped here (PROT_READ only for a
              read-only region) and the fd closed: a live region holds no fd (the mapping is
              made with mmap(2) itself; Python's mmap object would keep a dup of the fd). The
              mapping keeps the memory, so no later act of the owner (truncate: refused by the
              seal, unmap, exit) can fault the service.
    cuda_ipc  device memory exported by a CUDA IPC handle (64 bytes) on the pinned GPU.

No memory is opened by name: the service maps only fds its callers sent (memory they could open
themselves) and handles they exported.
"""

from __future__ import annotations

import base64
import ctypes
import errno
import fcntl
import logging
import mmap
import os
import stat
from typing import Callable

import torch

from .errors import ServiceError
from .schemas import CudaIpcRegistration
from .wire import SEALS_REQUIRED

log = logging.getLogger("litetopk.service")


def map_memfd(fd: int, size: int, writable: bool) -> tuple[torch.Tensor, tuple]:
    """(uint8 [size] over the memfd `fd`, its (st_dev, st_ino)); always closes `fd`."""
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ServiceError("unsealed_memory", "the fd handed over is not a memfd (not a regular file)")
        try:
            seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        except OSError as exc:
            raise ServiceError(
                "unsealed_memory",
                "the fd handed over is not a memfd that supports seals "
                "(create it with memfd_create(..., MFD_ALLOW_SEALING))",
            ) from exc
        if seals & SEALS_REQUIRED != SEALS_REQUIRED:
            raise ServiceError(
                "unsealed_memory",
                "the memfd is not sealed against shrinking: add F_SEAL_SHRINK "
                "(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK)) before handing it over",
            )
        if info.st_size < size:
            raise ServiceError(
                "out_of_bounds", f"the memfd holds {info.st_size} bytes; the registration declares {size}"
            )
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        try:
            mapping = _map_shared(fd, size, prot)
        except OSError as exc:
            why = (
                "the fd is not open for writing (or the memfd is write-sealed)"
                if exc.errno in (errno.EACCES, errno.EPERM) and writable
                else exc.strerror
            )
            raise ServiceError(
                "shm_unavailable",
                f"cannot map the memfd {'read-write' if writable else 'read-only'}: "
                f"{why}; register it read_only or send a writable fd",
            ) from exc
    finally:
        os.close(fd)
    base = torch.frombuffer(mapping, dtype=torch.uint8)
    # The tensor keeps the mapping alive; it is unmapped when the last view of it is gone.
    return base, (info.st_dev, info.st_ino)


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
_libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
_MAP_FAILED = ctypes.c_void_p(-1).value


def _map_shared(fd: int, size: int, prot: int):
    """`size` bytes of `fd` mapped MAP_SHARED, as a buffer that holds no fd (Python's mmap.mmap keeps a
    dup of the fd for as long as it lives: one fd per region) and unmaps itself when the last object
    viewing it is gone."""
    address = _libc.mmap(None, size, prot, mmap.MAP_SHARED, fd, 0)
    if address in (None, _MAP_FAILED):
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    mapping_type = type("Mapping", (ctypes.c_ubyte * size,), {"__del__": lambda self: _libc.munmap(address, size)})
    return mapping_type.from_address(address)


def open_cuda_ipc(reg: CudaIpcRegistration, device: torch.device) -> tuple[torch.Tensor, Callable[[], None]]:
    """uint8 [reg.size] over the exported allocation, opened on `device` (untested without a GPU)."""
    handle = reg.handle_bytes()
    with torch.cuda.device(device):
        if reg.torch is not None:
            return _open_cuda_ipc_torch(reg, handle, device)
        return _open_cuda_ipc_runtime(reg, handle, device)


def _open_cuda_ipc_torch(reg, handle: bytes, device: torch.device):
    """torch.multiprocessing's own path: reference counted, waits on the exporter's event."""
    t = reg.torch
    # torch's parser wants 64 bytes of event handle even when no event is to be waited on.
    event = base64.b64decode(t.event_handle) if t.event_handle else bytes(64)
    try:
        torch.cuda._lazy_init()
        storage = torch.UntypedStorage._new_shared_cuda(
            device.index,
            handle,
            reg.size,
            reg.offset,
            base64.b64decode(t.ref_counter_handle),
            t.ref_counter_offset,
            event,
            bool(t.event_sync_required and t.event_handle),
        )
    except (RuntimeError, TypeError) as exc:
        raise ServiceError("ipc_unavailable", f"torch could not open the CUDA IPC handle: {exc}") from exc
    base = torch.empty((0,), dtype=torch.uint8, device=device)
    base.set_(storage, 0, (reg.size,), (1,))
    return base, lambda: None  # torch closes the handle when the storage's last reference goes


class _CudaArray:
    """The smallest object torch.as_tensor accepts for a raw device pointer."""

    def __init__(self, ptr: int, size: int):
        self.__cuda_array_interface__ = {
            "shape": (size,),
            "typestr": "|u1",
            "data": (ptr, False),
            "version": 3,
            "strides": None,
        }


def _open_cuda_ipc_runtime(reg, handle: bytes, device: torch.device):
    """cudaIpcOpenMemHandle through cuda.bindings (any exporter, e.g. a C++ engine)."""
    try:
        from cuda.bindings import runtime as cudart
    except ImportError as exc:
        raise ServiceError(
            "ipc_unavailable",
            "cuda.bindings is not installed here; register through torch "
            "(litetopk.clients does) or install cuda-bindings",
        ) from exc
    mem_handle = cudart.cudaIpcMemHandle_t()
    mem_handle.reserved = handle
    err, ptr = cudart.cudaIpcOpenMemHandle(mem_handle, cudart.cudaIpcMemLazyEnablePeerAccess)
    if err != cudart.cudaError_t.cudaSuccess:
        raise ServiceError("ipc_unavailable", f"cudaIpcOpenMemHandle failed: {err}")
    base = torch.as_tensor(_CudaArray(int(ptr) + reg.offset, reg.size), device=device)

    def close() -> None:
        (status,) = cudart.cudaIpcCloseMemHandle(ptr)
        if status != cudart.cudaError_t.cudaSuccess:
            log.warning("cudaIpcCloseMemHandle failed: %s", status)

    return base, close


__all__ = ["map_memfd", "open_cuda_ipc"]
