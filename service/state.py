"""What the routes share for the life of the app (built by app.py's lifespan)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

import torch
from fastapi import Request

from litetopk.kernels import LiteTopKTuning

from .executor import DeviceExecutor
from .fdpass import FdTickets
from .metrics import ServiceMetrics
from .regions import RegionTable
from .settings import ServiceSettings


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


async def get_state(request: Request) -> ServiceState:
    """FastAPI dependency: the app's ServiceState (async: FastAPI runs a plain `def` dependency in
    its thread pool, a thread hop of ~1-3 ms per request on a busy host)."""
    return request.app.state.service


__all__ = ["ServiceState", "get_state"]
