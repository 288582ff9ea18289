"""Regions: shared memory that a worker process registered once and then names in requests.

A region is a registered block of memory the service can read and write without a copy:
    shm       a POSIX shared-memory block `/dev/shm/<name>` (host memory), mapped whole;
    cuda_ipc  device memory exported by a CUDA IPC handle (64 bytes) on the GPU named by UUID;
              only the GPU this service is pinned to is accepted (`foreign_device` otherwise).
Each region has an id and a generation. Registering the same memory again (same shm name, or the
same handle and offset) keeps the id and bumps the generation; a request naming an older
generation, or an unregistered region, gets `stale_region`; an id never seen gets
`unknown_region`. Every request names region + generation + byte offset + dtype + shape per
tensor, checked here (`out_of_bounds`, `misaligned_offset`) every time.

Lifetime. The exporter keeps the memory alive until `unregister` has returned. The device worker
holds a lease on each region while a request runs; unregistering retires the region at once (queued
requests that name it then fail with `stale_region`) and waits for running leases to end, so after
it returns the service never touches the memory again. A shm mapping survives the block's unlink
(POSIX semantics); it is unmapped when the last tensor viewing it is gone. Regions carry their
owner's pid: when that process has died (checked periodically and on every use) its regions are
retired as if unregistered. A pid means something only in its pid namespace: a registration that
names a namespace (`pid_ns`) other than the service's is refused with `foreign_pid_namespace`
(or, with LITETOPK_FOREIGN_PID_NAMESPACE=untrack, registered with no owner), never tracked
against whichever unrelated process has that number here.
"""

from __future__ import annotations

import base64
import collections
import contextlib
import logging
import math
import mmap
import os
import secrets
import stat
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from litetopk.clients.wire import DTYPES

from .errors import ServiceError
from .schemas import CudaIpcRegistration, RegionInfo, RegionSlice, ShmRegistration
from .settings import normalize_uuid

log = logging.getLogger("litetopk.service")

SHM_DIR = Path("/dev/shm")
RETIRED_MEMORY = 4096  # ids remembered after retirement, so that late requests get stale_region


def device_uuid(device: torch.device) -> str | None:
    """The normalized UUID of a CUDA device (None for the CPU)."""
    if device.type != "cuda":
        return None
    return normalize_uuid(str(torch.cuda.get_device_properties(device).uuid))


def pid_namespace() -> int | None:
    """This process's pid namespace id (st_ino of /proc/self/ns/pid, as the clients send it)."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None  # no procfs: namespaces cannot be compared, pids are taken as they come


def _process_start(pid: int) -> str | None:
    """Field 22 of /proc/<pid>/stat (start time): tells a live owner from a reused pid."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else None


def owner_alive(pid: int | None, start: str | None) -> bool:
    """False when process `pid` is gone, a zombie, or a different process under a reused pid."""
    if pid is None:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, owned by another user
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat_file:
            state = stat_file.read().decode(errors="replace").rsplit(")", 1)[-1].split()
    except OSError:
        return True  # no procfs: the kill probe is all we have
    if state and state[0] in ("Z", "X"):
        return False
    return start is None or (len(state) > 19 and state[19] == start)


def _owner_alive(region: "Region", alive: dict | None) -> bool:
    """owner_alive for `region`, remembered in `alive` (when given) while it says yes."""
    if region.pid is None:
        return True
    key = (region.pid, region.pid_start)
    if alive is not None and key in alive:
        return True
    if not owner_alive(region.pid, region.pid_start):
        return False
    if alive is not None:
        alive[key] = True
    return True


@dataclass(eq=False)
class Region:
    """One registered block; `base` is a uint8 [size] tensor over it on `device`."""

    id: str
    generation: int
    kind: str
    size: int
    device: torch.device
    key: tuple
    pid: int | None
    pid_start: str | None
    name: str | None
    base: torch.Tensor | None
    close: Callable[[], None] = field(default=lambda: None, repr=False)
    leases: int = 0
    live: bool = True
    reason: str = ""

    def info(self) -> RegionInfo:
        return RegionInfo(id=self.id, generation=self.generation, kind=self.kind, size=self.size,
                          pid=self.pid, device=str(self.device), name=self.name)

    def view(self, ref: RegionSlice, what: str) -> torch.Tensor:
        """The tensor `ref` names inside this region (bounds and alignment checked)."""
        nbytes = self.check_bounds(ref, what)
        if self.base is None:
            raise ServiceError("stale_region", f"{what}: region {self.id} was released")
        return self.base[ref.offset:ref.offset + nbytes].view(DTYPES[ref.dtype]).view(ref.shape)

    def check_bounds(self, ref: RegionSlice, what: str) -> int:
        """Raise `misaligned_offset` / `out_of_bounds` for `ref`; its size in bytes otherwise."""
        dtype = DTYPES[ref.dtype]
        nbytes = math.prod(ref.shape) * dtype.itemsize
        if ref.offset % dtype.itemsize:
            raise ServiceError("misaligned_offset", f"{what}: offset {ref.offset} is not a multiple of "
                               f"{dtype.itemsize} ({ref.dtype}); align it")
        if ref.offset + nbytes > self.size:
            raise ServiceError("out_of_bounds", f"{what}: {nbytes} bytes at offset {ref.offset} overrun "
                               f"region {self.id} ({self.size} bytes)")
        return nbytes


class RegionTable:
    """The registered regions of one service (thread-safe: the event loop and the device worker)."""

    def __init__(self, device: torch.device, foreign_pid_namespace: str = "refuse"):
        self.device = device
        self.uuid = device_uuid(device)
        self.pid_ns = pid_namespace()
        self.foreign_pid_namespace = foreign_pid_namespace
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._live: dict[str, Region] = {}
        self._by_key: dict[tuple, str] = {}
        self._retired: collections.OrderedDict[str, tuple[int, str]] = collections.OrderedDict()
        self.on_retire: Callable[[Region], None] = lambda region: None

    # -- registration --------------------------------------------------------------------------

    def register_shm(self, reg: ShmRegistration) -> Region:
        name = reg.name.lstrip("/")
        pid, start = self._check_owner(reg.pid, reg.pid_ns)
        base = _map_shm(name, reg.size)
        return self._add("shm", ("shm", name), reg.size, torch.device("cpu"), pid, start, name, base, lambda: None)

    def register_cuda_ipc(self, reg: CudaIpcRegistration) -> Region:
        """Open a CUDA IPC handle on the pinned device (blocking: call it off the event loop)."""
        if self.device.type != "cuda":
            raise ServiceError("foreign_device", f"this service runs on {self.device} and owns no GPU; "
                               f"GPU {reg.device_uuid} is not served here")
        if normalize_uuid(reg.device_uuid) != self.uuid:
            raise ServiceError("foreign_device", f"the handle is from GPU {reg.device_uuid}; this service owns "
                               f"GPU {self.uuid} ({self.device}); send it to the service pinned to that GPU")
        pid, start = self._check_owner(reg.pid, reg.pid_ns)
        base, close = _open_cuda_ipc(reg, self.device)
        key = ("cuda_ipc", reg.handle_bytes(), reg.offset)
        return self._add("cuda_ipc", key, reg.size, self.device, pid, start, None, base, close)

    def _check_owner(self, pid: int | None, pid_ns: int | None) -> tuple[int | None, str | None]:
        """(pid to track, its start time): refuse a pid of another pid namespace or of no live process."""
        if pid is not None and pid_ns is not None and self.pid_ns is not None and pid_ns != self.pid_ns:
            if self.foreign_pid_namespace == "refuse":
                raise ServiceError(
                    "foreign_pid_namespace", f"owner pid {pid} lives in pid namespace {pid_ns}, this service in "
                    f"{self.pid_ns}: it cannot tell whether that process is alive. Share the pid namespace "
                    "(compose `pid: service:<service>` or `pid: host`) or send pid=null "
                    "(TopKClient(owner_pid=None), LITETOPK_CLIENT_OWNER_PID=none) and unregister explicitly")
            log.warning("owner pid %d is from pid namespace %d (not %d): registered untracked", pid, pid_ns,
                        self.pid_ns)
            return None, None
        start = _process_start(pid) if pid is not None else None
        if pid is not None and not owner_alive(pid, start):
            raise ServiceError("validation_error", f"owner pid {pid} is not a running process "
                               "(send pid=null when the service does not share the owner's pid namespace)")
        return pid, start

    def _add(self, kind, key, size, device, pid, start, name, base, close) -> Region:
        with self._lock:
            old_id = self._by_key.get(key)
            old = self._live.get(old_id) if old_id else None
            region = Region(
                id=old_id or "r" + secrets.token_hex(8), generation=old.generation + 1 if old else 1,
                kind=kind, size=size, device=device, key=key, pid=pid, pid_start=start, name=name,
                base=base, close=close,
            )
            if old is not None:
                self._retire_locked(old, f"superseded by generation {region.generation}")
            self._live[region.id] = region
            self._by_key[key] = region.id
            self._retired.pop(region.id, None)
        return region

    # -- lookup --------------------------------------------------------------------------------

    def list(self) -> list[Region]:
        with self._lock:
            return list(self._live.values())

    def get(self, region_id: str, generation: int | None = None, alive: dict | None = None) -> Region:
        with self._lock:
            return self._find_locked(region_id, generation, alive)

    def _find_locked(self, region_id: str, generation: int | None, alive: dict | None = None) -> Region:
        """The live region (its owner checked alive; `alive`, a dict kept for one request phase,
        remembers owners already found alive so that a request naming 15 regions of one owner
        reads /proc once, not 15 times)."""
        region = self._live.get(region_id)
        if region is not None and not _owner_alive(region, alive):
            self._retire_locked(region, f"its owner process {region.pid} died")
            region = None
        if region is None:
            if region_id in self._retired:
                gen, reason = self._retired[region_id]
                raise ServiceError("stale_region", f"region {region_id} (generation {gen}) is gone: {reason}")
            raise ServiceError("unknown_region", f"no region {region_id!r} was registered here")
        if generation is not None and generation != region.generation:
            raise ServiceError("stale_region", f"region {region_id} is at generation {region.generation}; "
                               f"the request names generation {generation}")
        return region

    def check(self, ref: RegionSlice, what: str, alive: dict | None = None) -> Region:
        """Raise the error `ref` would meet (no lease taken): admission-time checking."""
        region = self.get(ref.region, ref.generation, alive)
        region.check_bounds(ref, what)
        return region

    # -- leases (device worker) ---------------------------------------------------------------

    def acquire(self, ref: RegionSlice, what: str, alive: dict | None = None) -> tuple[Region, torch.Tensor]:
        """Lease the region `ref` names and return (region, tensor); pair with `release`."""
        with self._lock:
            region = self._find_locked(ref.region, ref.generation, alive)
            tensor = region.view(ref, what)
            region.leases += 1
        return region, tensor

    def release(self, region: Region) -> None:
        with self._lock:
            region.leases -= 1
            closing = region.leases == 0 and not region.live
            self._idle.notify_all()
        if closing:
            self._close(region)

    # -- retirement ----------------------------------------------------------------------------

    def unregister(self, region_id: str, generation: int | None = None, timeout: float | None = None) -> Region:
        """Retire a region and wait until no request uses it (blocking: call it off the event loop)."""
        with self._lock:
            region = self._find_locked(region_id, generation)
            self._retire_locked(region, "unregistered")
            if not self._idle.wait_for(lambda: region.leases == 0, timeout):
                raise ServiceError("timeout", f"region {region_id} is still in use after {timeout} s")
        self._close(region)
        return region

    def drop_dead_owners(self) -> list[Region]:
        """Retire every region whose owner process has died; returns them."""
        with self._lock:
            dead = [r for r in self._live.values() if not owner_alive(r.pid, r.pid_start)]
            for region in dead:
                self._retire_locked(region, f"its owner process {region.pid} died")
            idle = [r for r in dead if r.leases == 0]
        for region in idle:
            self._close(region)
        return dead

    def close_all(self) -> None:
        with self._lock:
            regions = list(self._live.values())
            for region in regions:
                self._retire_locked(region, "the service stopped")
        for region in regions:
            if region.leases == 0:
                self._close(region)

    def _retire_locked(self, region: Region, reason: str) -> None:
        if not region.live:
            return
        region.live = False
        region.reason = reason
        self._live.pop(region.id, None)
        if self._by_key.get(region.key) == region.id:
            self._by_key.pop(region.key, None)  # `_add` maps the key to the next generation
        self._retired[region.id] = (region.generation, reason)
        while len(self._retired) > RETIRED_MEMORY:
            self._retired.popitem(last=False)
        log.info("region %s (generation %d) retired: %s", region.id, region.generation, reason)
        self.on_retire(region)

    def _close(self, region: Region) -> None:
        base, region.base = region.base, None
        if base is None:
            return
        del base
        with torch.cuda.device(region.device) if region.device.type == "cuda" else contextlib.nullcontext():
            region.close()


# ------------------------------------------------------------------------------- opening memory


def _map_shm(name: str, size: int) -> torch.Tensor:
    """uint8 [size] over /dev/shm/<name>, mapped shared and writable."""
    path = SHM_DIR / name
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise ServiceError("shm_unavailable", f"cannot open shared memory {name!r}: {exc.strerror}") from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ServiceError("shm_unavailable", f"{name!r} is not a shared-memory block")
        if info.st_size < size:
            raise ServiceError("out_of_bounds", f"shared memory {name!r} holds {info.st_size} bytes; "
                               f"the registration declares {size}")
        mapping = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    # The tensor keeps the mapping alive; it is unmapped when the last view of it is gone.
    return torch.frombuffer(mapping, dtype=torch.uint8)


def _open_cuda_ipc(reg: CudaIpcRegistration, device: torch.device) -> tuple[torch.Tensor, Callable[[], None]]:
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
            device.index, handle, reg.size, reg.offset, base64.b64decode(t.ref_counter_handle),
            t.ref_counter_offset, event, bool(t.event_sync_required and t.event_handle),
        )
    except (RuntimeError, TypeError) as exc:
        raise ServiceError("ipc_unavailable", f"torch could not open the CUDA IPC handle: {exc}") from exc
    base = torch.empty((0,), dtype=torch.uint8, device=device)
    base.set_(storage, 0, (reg.size,), (1,))
    return base, lambda: None  # torch closes the handle when the storage's last reference goes


class _CudaArray:
    """The smallest object torch.as_tensor accepts for a raw device pointer."""

    def __init__(self, ptr: int, size: int):
        self.__cuda_array_interface__ = {"shape": (size,), "typestr": "|u1", "data": (ptr, False),
                                         "version": 3, "strides": None}


def _open_cuda_ipc_runtime(reg, handle: bytes, device: torch.device):
    """cudaIpcOpenMemHandle through cuda.bindings (any exporter, e.g. a C++ engine)."""
    try:
        from cuda.bindings import runtime as cudart
    except ImportError as exc:
        raise ServiceError("ipc_unavailable", "cuda.bindings is not installed here; register through torch "
                           "(litetopk.clients does) or install cuda-bindings") from exc
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


__all__ = ["Region", "RegionTable", "device_uuid", "normalize_uuid", "owner_alive", "pid_namespace"]
