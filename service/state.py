"""What the routes share for the life of the app (built by app.py's lifespan)."""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path

import torch
from fastapi import Request

from litetopk.kernels import SUPPORTED_TOPK, LiteTopKTuning

from .errors import ServiceError
from .executor import DeviceExecutor
from .fdpass import FdTickets
from .metrics import ServiceMetrics
from .regions import RegionTable
from .settings import ServiceSettings
from .topk import UidAdmissions

log = logging.getLogger("litetopk.service")


@dataclass(eq=False)
class ServiceState:
    settings: ServiceSettings
    device: torch.device
    backend: str  # the resolved backend name ("reference", "triton", ...)
    tuning: LiteTopKTuning  # every operator call's (settings.tuning)
    table: RegionTable
    executor: DeviceExecutor
    metrics: ServiceMetrics
    tickets: FdTickets = field(default_factory=FdTickets)  # fds handed over the fd socket, unclaimed
    fd_socket: str | None = None  # the fd socket's path (None: host memory cannot be registered)
    token: str | None = None  # the TCP bearer token (None: TCP refuses region operations)
    token_path: Path | None = None
    ready: threading.Event = field(default_factory=threading.Event)
    warmup_error: str | None = None
    draining: bool = False
    ipc_socket: str | None = None  # the IPC channel's socket (None: not served)
    http_url: str | None = None  # where TCP listens (None: not at all, or not known in-process)
    http_admissions: UidAdmissions = field(default_factory=UidAdmissions)  # HTTP's kept admissions (the event loop's)

    def info(self) -> dict:
        """/v1/info's document (the IPC hello's `info`): device, backend, limits, where to connect."""
        from . import __version__

        s = self.settings
        return dict(
            device=str(self.device),
            device_uuid=self.table.uuid,
            backend=self.backend,
            supported_topk=list(SUPPORTED_TOPK),
            queue_size=s.queue_size,
            max_request_bytes=s.max_request_bytes,
            request_timeout_s=s.request_timeout_s,
            http_url=self.http_url,
            fd_socket=self.fd_socket,
            ipc_socket=self.ipc_socket,
            token_file=str(self.token_path) if self.token_path else None,
            max_rows=s.row_limit(self.device),
            max_keys=s.max_keys,
            max_batch=s.max_batch,
            max_regions_per_principal=s.max_regions_per_principal,
            max_region_bytes_per_principal=s.max_region_bytes_per_principal,
            graphs=s.graphs,
            ipc_max_connections=s.ipc_max_connections,
            ipc_max_connections_per_uid=s.ipc_max_connections_per_uid,
            ipc_max_in_flight=s.ipc_max_in_flight,
            version=__version__,
        )

    def begin_shutdown(self) -> None:
        """SIGTERM/SIGINT (on the event loop): refuse new work (`shutting_down`), let queued and
        running work go on for the grace period, then answer what is still queued `shutting_down`."""
        if self.draining:
            return
        self.draining = True
        self.executor.stop_admissions()
        asyncio.get_running_loop().call_later(self.settings.shutdown_timeout_s, self._fail_queued)

    def _fail_queued(self) -> None:
        retry = {"Retry-After": str(self.settings.retry_after_s)}
        error = ServiceError(
            "shutting_down",
            f"the service is shutting down: the grace period of "
            f"{self.settings.shutdown_timeout_s:g} s ended before this request reached the device; "
            "retry on its successor",
            headers=retry,
            retry_after=self.settings.retry_after_s,
        )
        failed = self.executor.fail_queued(error)
        if failed:
            log.warning("shutdown: %d queued requests answered shutting_down (grace period over)", failed)

    def readiness(self) -> dict:
        """/readyz's document, or the ServiceError `shutting_down` / `not_ready`."""
        retry = {"Retry-After": str(self.settings.retry_after_s)}
        if self.draining:
            raise ServiceError("shutting_down", "the service is draining its queue", headers=retry)
        if not self.ready.is_set():
            why = f"the warm-up failed: {self.warmup_error}" if self.warmup_error else "the warm-up has not finished"
            raise ServiceError("not_ready", why, headers=retry)
        return {"status": "ready", "device": str(self.device), "backend": self.backend}


async def get_state(request: Request) -> ServiceState:
    """FastAPI dependency: the app's ServiceState (async: FastAPI runs a plain `def` dependency in
    its thread pool, a thread hop of ~1-3 ms per request on a busy host)."""
    return request.app.state.service


__all__ = ["ServiceState", "get_state"]
