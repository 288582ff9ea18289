"""/livez, /readyz, /metrics and /v1/info."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Response

from ..errors import PROBLEM_JSON
from ..schemas import Problem, ServiceInfo
from ..state import ServiceState, get_state

router = APIRouter(tags=["health"])


@router.get("/livez", summary="The process is up")
async def livez() -> dict:
    return {"status": "ok"}


@router.get(
    "/readyz",
    summary="The backend has run its warm-up and the queue is open",
    responses={503: {"model": Problem, "content": {PROBLEM_JSON: {}}}},
)
async def readyz(state: ServiceState = Depends(get_state)) -> dict:
    return state.readiness()


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
async def metrics(state: ServiceState = Depends(get_state)) -> Response:
    body, content_type = state.metrics.render()
    return Response(body, media_type=content_type)


@router.get("/v1/info", response_model=ServiceInfo, summary="Device, backend and limits of this service")
async def info(state: ServiceState = Depends(get_state)) -> ServiceInfo:
    return ServiceInfo(**state.info())
