"""One router per resource: regions, topk, health (liveness, readiness, metrics, info)."""

from .health import router as health_router
from .regions import router as regions_router
from .topk import router as topk_router

__all__ = ["health_router", "regions_router", "topk_router"]
