"""Regions: memory a caller registered once and then names in requests (the table and its leases).

A region is a registered block of memory the service can read (and, read-write, write) without a
copy:
    memfd     host memory: a sealed memfd handed over the fd socket (service/memory.py);
    cuda_ipc  device memory exported by a CUDA IPC handle on the GPU this service is pinned to.
Each region belongs to the principal (uid, service/principals.py) that registered it: only that
principal can list, use, re-register, write into or delete it; to anyone else its id does not
exist (`unknown_region`). Each region is `read_only` or `read_write`: a request's `out` may name
read-write regions only, and never a region one of its inputs reads.

Ids and generations. Registering the same memory again (the same memfd, or the same handle and
offset, by the same principal) keeps the id and bumps the generation; a request naming an older
generation, or an unregistered region, gets `stale_region`; an id never seen gets
`unknown_region`. Every request names region + generation + byte offset + dtype + shape per
tensor, checked here (`out_of_bounds`, `misaligned_offset`) every time.

Lifetime. The device worker holds a lease on each region while a request runs; unregistering
retires the region at once (queued requests naming it then fail with `stale_region`) and waits for
running leases to end, so after it returns the service never touches the memory again. Regions
carry their owner's pid (service/owners.py): when that process has died (checked periodically and
on every use) its regions are retired as if unregistered. Each retirement has a `RetireReason`.
However it was retired, a region is closed once no lease holds it (at once when none does): its
mapping (or CUDA IPC handle) let go of, with every view kept of it, the kept bindings of requests
(service/topk.py `Admitted.bound`) included.
"""

from __future__ import annotations

import collections
import contextlib
import enum
import logging
import math
import os
import secrets
import threading
import weakref
from dataclasses import dataclass, field
from typing import Callable

import torch

from litetopk.clients.owners import owner_alive, pid_namespace

from .errors import ServiceError
from .memory import map_memfd, open_cuda_ipc
from .owners import OwnerWatch, check_owner
from .schemas import CudaIpcRegistration, MemfdRegistration, RegionInfo, RegionSlice
from .settings import normalize_uuid
from .wire import DTYPES

log = logging.getLogger("litetopk.service")

VIEWS_KEPT = 64  # views one region keeps for the slices requests name again
RETIRED_MEMORY = 4096  # ids remembered after retirement, so that late requests get stale_region
REGION_KINDS = ("memfd", "cuda_ipc")


class RetireReason(str, enum.Enum):
    """Why a region stopped being live (the `reason` label of litetopk_regions_retired_total)."""

    UNREGISTERED = "unregistered"
    SUPERSEDED = "superseded"
    OWNER_DIED = "owner_died"
    SERVICE_STOPPED = "service_stopped"


def device_uuid(device: torch.device) -> str | None:
    """The normalized UUID of a CUDA device (None for the CPU)."""
    if device.type != "cuda":
        return None
    return normalize_uuid(str(torch.cuda.get_device_properties(device).uuid))


OWNERS = OwnerWatch()  # the owner processes of every table's regions, by pidfd


def _owner_alive(region: "Region", alive: dict | None) -> bool:
    """Whether `region`'s owner lives, remembered in `alive` (when given) while it says yes."""
    if region.pid is None:
        return True
    key = (region.pid, region.pid_start)
    if alive is not None and key in alive:
        return True
    if not OWNERS.alive(region.pid, region.pid_start):
        return False
    if alive is not None:
        alive[key] = True
    return True


def view_key(ref: RegionSlice) -> tuple:
    """What a region's kept views are found by: (offset, dtype, shape) of the slice."""
    return (ref.offset, ref.dtype, tuple(ref.shape))


@dataclass(eq=False, slots=True)
class Region:
    """One registered block; `base` is a uint8 [size] tensor over it on `device`."""

    id: str
    generation: int
    kind: str
    size: int
    device: torch.device
    key: tuple
    owner: int  # the principal's uid
    access: str  # "read_only" | "read_write"
    pid: int | None
    pid_start: str | None
    base: torch.Tensor | None
    close: Callable[[], None] = field(default=lambda: None, repr=False)
    leases: int = 0
    views: dict = field(default_factory=dict, repr=False)  # view_key -> tensor (view), ("int32s", key) -> memoryview
    # the kept admissions whose binding views this region (service/topk.py Admitted.bound): unbound
    # when the region closes
    bindings: weakref.WeakSet = field(default_factory=weakref.WeakSet, repr=False)
    live: bool = True
    reason: RetireReason | None = None
    detail: str = ""

    def info(self) -> RegionInfo:
        return RegionInfo(
            id=self.id,
            generation=self.generation,
            kind=self.kind,
            size=self.size,
            access=self.access,
            pid=self.pid,
            device=str(self.device),
        )

    def view(self, ref: RegionSlice, what: str, key: tuple | None = None) -> torch.Tensor:
        """The tensor `ref` names inside this region (bounds and alignment checked); the views of the
        slices requests name again and again are kept (VIEWS_KEPT a region, by `view_key(ref)`), not
        rebuilt, and dropped when the region closes."""
        if key is None:
            key = view_key(ref)
        tensor = self.views.get(key)
        if tensor is not None:
            return tensor
        nbytes = self.check_bounds(ref, what)
        if self.base is None:
            raise ServiceError("stale_region", f"{what}: region {self.id} was released")
        tensor = self.base[ref.offset : ref.offset + nbytes].view(DTYPES[ref.dtype]).view(ref.shape)
        if len(self.views) >= VIEWS_KEPT:
            self.views.clear()
        self.views[key] = tensor
        return tensor

    def int32s(self, ref: RegionSlice, what: str, key: tuple | None = None) -> memoryview:
        """The int32 values `ref` names in this host region, as a memoryview of its memory (kept beside
        the views, and dropped with them)."""
        if key is None:
            key = view_key(ref)
        values = self.views.get(("int32s", key))
        if values is None:
            values = memoryview(self.view(ref, what, key).numpy())
            self.views[("int32s", key)] = values
        return values

    def check_bounds(self, ref: RegionSlice, what: str) -> int:
        """Raise `misaligned_offset` / `out_of_bounds` for `ref`; its size in bytes otherwise."""
        dtype = DTYPES[ref.dtype]
        nbytes = math.prod(ref.shape) * dtype.itemsize
        if ref.offset % dtype.itemsize:
            raise ServiceError(
                "misaligned_offset",
                f"{what}: offset {ref.offset} is not a multiple of {dtype.itemsize} ({ref.dtype}); align it",
            )
        if ref.offset + nbytes > self.size:
            raise ServiceError(
                "out_of_bounds",
                f"{what}: {nbytes} bytes at offset {ref.offset} overrun region {self.id} ({self.size} bytes)",
            )
        return nbytes


class RegionTable:
    """The registered regions of one service (thread-safe: the event loop and the device worker)."""

    def __init__(
        self,
        device: torch.device,
        foreign_pid_namespace: str = "refuse",
        *,
        max_regions: int = 2**31,
        max_bytes: int = 2**62,
    ):
        self.device = device
        self.max_regions, self.max_bytes = max_regions, max_bytes  # per principal
        self.uuid = device_uuid(device)
        self.pid_ns = pid_namespace()
        self.foreign_pid_namespace = foreign_pid_namespace
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._live: dict[str, Region] = {}
        self._by_key: dict[tuple, str] = {}
        self._retired: collections.OrderedDict[str, tuple[int, int, str]] = collections.OrderedDict()
        self._idle_retired: list[Region] = []  # retired without leases, to close once the lock is released
        self.retirements = 0  # regions retired so far (a region's `live` only ever turns False with it)
        self.on_retire: Callable[[Region], None] = lambda region: None

    # -- registration --------------------------------------------------------------------------

    def register_memfd(self, reg: MemfdRegistration, fd: int, owner: int) -> Region:
        """Map the memfd `fd` (consumed) for principal `owner` (service/memory.py checks its seals)."""
        try:
            with self._lock:
                self._check_quota_locked(owner, reg.size, None)
            pid, start = check_owner(reg.pid, reg.pid_ns, self.pid_ns, self.foreign_pid_namespace)
        except BaseException:
            os.close(fd)
            raise
        base, inode = map_memfd(fd, reg.size, reg.access == "read_write")
        return self._add(
            "memfd", ("memfd", owner, *inode), reg, torch.device("cpu"), owner, pid, start, base, lambda: None
        )

    def register_cuda_ipc(self, reg: CudaIpcRegistration, owner: int) -> Region:
        """Open a CUDA IPC handle on the pinned device (blocking: call it off the event loop)."""
        if self.device.type != "cuda":
            raise ServiceError(
                "foreign_device",
                f"this service runs on {self.device} and owns no GPU; GPU {reg.device_uuid} is not served here",
            )
        if normalize_uuid(reg.device_uuid) != self.uuid:
            raise ServiceError(
                "foreign_device",
                f"the handle is from GPU {reg.device_uuid}; this service owns "
                f"GPU {self.uuid} ({self.device}); send it to the service pinned to that GPU",
            )
        key = ("cuda_ipc", owner, reg.handle_bytes(), reg.offset)
        with self._lock:
            self._check_quota_locked(owner, reg.size, key)
        pid, start = check_owner(reg.pid, reg.pid_ns, self.pid_ns, self.foreign_pid_namespace)
        base, close = open_cuda_ipc(reg, self.device)
        return self._add("cuda_ipc", key, reg, self.device, owner, pid, start, base, close)

    def _check_quota_locked(self, owner: int, size: int, key: tuple | None) -> None:
        """`region_quota_exceeded` when `owner` would hold more than max_regions regions or max_bytes
        bytes with a new region of `size` bytes (one that supersedes the region of `key` replaces it)."""
        regions = [r for r in self._live.values() if r.owner == owner and r.key != key]
        held = sum(r.size for r in regions)
        if len(regions) + 1 > self.max_regions:
            raise ServiceError(
                "region_quota_exceeded",
                f"this principal holds {len(regions)} regions, the most it "
                f"may (LITETOPK_MAX_REGIONS_PER_PRINCIPAL); unregister some first",
            )
        if held + size > self.max_bytes:
            raise ServiceError(
                "region_quota_exceeded",
                f"this principal holds {held} bytes of regions; {size} more "
                f"would pass {self.max_bytes} (LITETOPK_MAX_REGION_BYTES_PER_PRINCIPAL); unregister "
                "some first",
            )

    def _add(self, kind, key, reg, device, owner, pid, start, base, close) -> Region:
        with self._lock:
            try:
                self._check_quota_locked(owner, reg.size, key)
            except ServiceError:
                del base
                close()
                raise
            old_id = self._by_key.get(key)
            old = self._live.get(old_id) if old_id else None
            region = Region(
                id=old_id or "r" + secrets.token_hex(8),
                generation=old.generation + 1 if old else 1,
                kind=kind,
                size=reg.size,
                device=device,
                key=key,
                owner=owner,
                access=reg.access,
                pid=pid,
                pid_start=start,
                base=base,
                close=close,
            )
            if old is not None:
                self._retire_locked(old, RetireReason.SUPERSEDED, f"superseded by generation {region.generation}")
            self._live[region.id] = region
            self._by_key[key] = region.id
            OWNERS.watch(pid, start)
            self._retired.pop(region.id, None)
        self._close_idle()
        return region

    # -- lookup (every lookup names the caller's principal) -------------------------------------

    def list(self, owner: int | None = None) -> list[Region]:
        """The live regions of principal `owner` (every principal's with None: metrics only)."""
        with self._lock:
            return [r for r in self._live.values() if owner is None or r.owner == owner]

    def get(self, region_id: str, owner: int, generation: int | None = None, alive: dict | None = None) -> Region:
        try:
            with self._lock:
                return self._find_locked(region_id, owner, generation, alive)
        finally:
            self._close_idle()

    def _find_locked(self, region_id: str, owner: int, generation: int | None, alive: dict | None = None) -> Region:
        """The live region of `owner` (its owner process checked alive; `alive`, a dict kept for one
        request phase, remembers owners already found alive so that a request naming 15 regions of
        one owner reads /proc once, not 15 times). Another principal's region is `unknown_region`."""
        region = self._live.get(region_id)
        if region is not None and region.owner != owner:
            region = None
        if region is not None and not _owner_alive(region, alive):
            self._retire_locked(region, RetireReason.OWNER_DIED, f"its owner process {region.pid} died")
            region = None
        if region is None:
            gen, retired_owner, detail = self._retired.get(region_id, (0, None, ""))
            if retired_owner == owner:
                raise ServiceError("stale_region", f"region {region_id} (generation {gen}) is gone: {detail}")
            raise ServiceError("unknown_region", f"no region {region_id!r} was registered here by this principal")
        if generation is not None and generation != region.generation:
            raise ServiceError(
                "stale_region",
                f"region {region_id} is at generation {region.generation}; the request names generation {generation}",
            )
        return region

    def find_all(self, keys, owner: int, alive: dict | None = None) -> dict[tuple, Region]:
        """{(id, generation): region} of `owner` for every key, under one lock (each key looked up once,
        in order: the first that fails raises as `get` does)."""
        found: dict[tuple, Region] = {}
        try:
            with self._lock:
                for key in keys:
                    if key not in found:
                        found[key] = self._find_locked(key[0], owner, key[1], alive)
        finally:
            self._close_idle()
        return found

    def check(self, ref: RegionSlice, what: str, owner: int, alive: dict | None = None) -> Region:
        """Raise the error `ref` would meet (no lease taken): admission-time checking."""
        region = self.get(ref.region, owner, ref.generation, alive)
        region.check_bounds(ref, what)
        return region

    # -- leases (device worker) ---------------------------------------------------------------

    def acquire(
        self, ref: RegionSlice, what: str, owner: int, alive: dict | None = None
    ) -> tuple[Region, torch.Tensor]:
        """Lease the region `ref` names and return (region, tensor); pair with `release`."""
        try:
            with self._lock:
                region = self._find_locked(ref.region, owner, ref.generation, alive)
                tensor = region.view(ref, what)
                region.leases += 1
        finally:
            self._close_idle()
        return region, tensor

    def lease(self, regions: list[Region], owners: list[Region], checked: int = -1) -> int:
        """Lease the distinct `regions` a request was admitted with (found by `get` / `find_all` for its
        principal), under one lock: all or none. `owners` holds one of them for each owner process
        (each is asked once). A region retired since (unregistered, superseded) or whose owner has died
        is `stale_region`, as a lookup by id would answer. Returns `retirements` as the lease found it:
        passed back as `checked` by the next lease of the same regions, it spares looking at each region
        when none has been retired since. Pair with `release_all`."""
        try:
            with self._lock:
                for region in owners:
                    if region.live and not OWNERS.alive(region.pid, region.pid_start):
                        self._retire_locked(region, RetireReason.OWNER_DIED, f"its owner process {region.pid} died")
                if checked != self.retirements:
                    for region in regions:
                        if not region.live:
                            raise ServiceError(
                                "stale_region",
                                f"region {region.id} (generation {region.generation}) is gone: {region.detail}",
                            )
                for region in regions:
                    region.leases += 1
                return self.retirements
        finally:
            if self._idle_retired:
                self._close_idle()

    def release_all(self, regions: list[Region]) -> None:
        """End the leases `lease` took (one lock; retired regions whose last lease this was are closed)."""
        idle = []
        with self._lock:
            for region in regions:
                region.leases -= 1
                if region.leases == 0 and not region.live:
                    idle.append(region)
            if idle:
                self._idle.notify_all()  # unregister waits for the leases of retired regions only
        for region in idle:
            self._close(region)

    def release(self, region: Region) -> None:
        with self._lock:
            region.leases -= 1
            closing = region.leases == 0 and not region.live
            self._idle.notify_all()
        if closing:
            self._close(region)

    # -- retirement ----------------------------------------------------------------------------

    def unregister(
        self, region_id: str, owner: int, generation: int | None = None, timeout: float | None = None
    ) -> Region:
        """Retire a region and wait until no request uses it (blocking: call it off the event loop)."""
        try:
            with self._lock:
                region = self._find_locked(region_id, owner, generation)
                self._retire_locked(region, RetireReason.UNREGISTERED, "unregistered")
                if not self._idle.wait_for(lambda: region.leases == 0, timeout):
                    raise ServiceError("timeout", f"region {region_id} is still in use after {timeout} s")
        finally:
            self._close_idle()  # a region found dead on the way
        self._close(region)
        return region

    def drop_dead_owners(self) -> list[Region]:
        """Retire every region whose owner process has died; returns them."""
        with self._lock:
            dead = [r for r in self._live.values() if not OWNERS.alive(r.pid, r.pid_start)]
            for region in dead:
                self._retire_locked(region, RetireReason.OWNER_DIED, f"its owner process {region.pid} died")
        self._close_idle()
        return dead

    def close_all(self) -> None:
        with self._lock:
            for region in list(self._live.values()):
                self._retire_locked(region, RetireReason.SERVICE_STOPPED, "the service stopped")
        self._close_idle()

    def _retire_locked(self, region: Region, reason: RetireReason, detail: str) -> None:
        """Retire a live region (no lease can be taken on it from now on). One without leases is closed
        once the lock is released (`_close_idle`), unless it is being unregistered (`unregister` closes
        it); one with leases, when its last lease ends (`release_all`)."""
        if not region.live:
            return
        if region.leases == 0 and reason is not RetireReason.UNREGISTERED:
            self._idle_retired.append(region)
        region.live, region.reason, region.detail = False, reason, detail
        self.retirements += 1
        OWNERS.unwatch(region.pid, region.pid_start)
        self._live.pop(region.id, None)
        if self._by_key.get(region.key) == region.id:
            self._by_key.pop(region.key, None)  # `_add` maps the key to the next generation
        self._retired[region.id] = (region.generation, region.owner, detail)
        while len(self._retired) > RETIRED_MEMORY:
            self._retired.popitem(last=False)
        log.info("region %s (generation %d) retired: %s", region.id, region.generation, detail)
        self.on_retire(region)

    def _close_idle(self) -> None:
        """Close the regions retired without leases under the lock just released (closing a CUDA
        handle may block: never under the lock)."""
        if not self._idle_retired:
            return
        with self._lock:
            idle, self._idle_retired = self._idle_retired, []
        for region in idle:
            self._close(region)

    def _close(self, region: Region) -> None:
        """Let go of a retired region's memory, once (the first caller closes it): its kept views and
        the kept bindings over it (service/topk.py Admitted.bound) first, which hold the memory too."""
        with self._lock:
            base, region.base = region.base, None
            bindings, region.bindings = list(region.bindings), weakref.WeakSet()
            region.views = {}
        for admitted in bindings:
            admitted.unbind()
        if base is None:
            return
        del base
        with torch.cuda.device(region.device) if region.device.type == "cuda" else contextlib.nullcontext():
            region.close()


__all__ = [
    "REGION_KINDS",
    "Region",
    "RegionTable",
    "RetireReason",
    "device_uuid",
    "normalize_uuid",
    "owner_alive",
    "pid_namespace",
    "view_key",
]
