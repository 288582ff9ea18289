"""What the routes share for the life of the app (built by app.py's lifespan)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import torch
from fastapi import Request

from .executor import DeviceExecutor
from .metrics import ServiceMetrics
from .regions import RegionTable
from .settings import ServiceSettings


@dataclass(eq=False)
class ServiceState:
    settings: ServiceSettings
    device: torch.device
    backend: str  # the resolved backend name ("reference", "triton", ...)
    table: RegionTable
    executor: DeviceExecutor
    metrics: ServiceMetrics
    ready: threading.Event = field(default_factory=threading.Event)
    warmup_error: str | None = None
    draining: bool = False


async def get_state(request: Request) -> ServiceState:
    """FastAPI dependency: the app's ServiceState (async: FastAPI runs a plain `def` dependency in
    its thread pool, a thread hop of ~1-3 ms per request on a busy host)."""
    return request.app.state.service


__all__ = ["ServiceState", "get_state"]
