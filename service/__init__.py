"""litetopk.service: one process, one pinned device, shared-memory regions, HTTP on TCP and a Unix socket.

Pipeline, one module a stage: settings (one pydantic-settings class) -> regions (shared memory and
CUDA IPC, id + generation, leases) -> executor (the single device worker, bounded queue) ->
routes (regions, topk, health) -> errors (problem+json codes, one place) -> app (factory with
lifespan) -> __main__ (uvicorn, one worker, TCP + Unix socket). Run `python -m litetopk.service`.

The app and the error codes are imported on first use (PEP 562), so that the probe
`python -m litetopk.service --check livez` starts without loading torch and the kernels.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

from .settings import ServiceSettings  # noqa: E402  (torch-free)

_LAZY = {"create_app": ".app", "CODES": ".errors", "ServiceError": ".errors"}


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["CODES", "ServiceError", "ServiceSettings", "__version__", "create_app"]
