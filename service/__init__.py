"""litetopk.service: one process, one pinned device, shared-memory regions, HTTP on TCP and a Unix socket.

Pipeline, one module a stage: settings (one pydantic-settings class) -> regions (shared memory and
CUDA IPC, id + generation, leases) -> executor (the single device worker, bounded queue) ->
routes (regions, topk, health) -> errors (problem+json codes, one place) -> app (factory with
lifespan) -> __main__ (uvicorn, one worker, TCP + Unix socket). Run `python -m litetopk.service`.
"""

__version__ = "0.1.0"

from .app import create_app  # noqa: E402
from .errors import CODES, ServiceError  # noqa: E402
from .settings import ServiceSettings  # noqa: E402

__all__ = ["CODES", "ServiceError", "ServiceSettings", "__version__", "create_app"]
