"""/livez, /readyz, /metrics and /v1/info."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Response

from litetopk.kernels import SUPPORTED_TOPK

from ..errors import PROBLEM_JSON, ServiceError
from ..schemas import Problem, ServiceInfo
from ..state import ServiceState, get_state

router = APIRouter(tags=["health"])


@router.get("/livez", summary="The process is up")
async def livez() -> dict:
    return {"status": "ok"}


@router.get("/readyz", summary="The backend has run its warm-up and the queue is open",
            responses={503: {"model": Problem, "content": {PROBLEM_JSON: {}}}})
async def readyz(state: ServiceState = Depends(get_state)) -> dict:
    retry = {"Retry-After": str(state.settings.retry_after_s)}
    if state.draining:
        raise ServiceError("shutting_down", "the service is draining its queue", headers=retry)
    if not state.ready.is_set():
        why = f"the warm-up failed: {state.warmup_error}" if state.warmup_error else "the warm-up has not finished"
        raise ServiceError("not_ready", why, headers=retry)
    return {"status": "ready", "device": str(state.device), "backend": state.backend}


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
async def metrics(state: ServiceState = Depends(get_state)) -> Response:
    body, content_type = state.metrics.render()
    return Response(body, media_type=content_type)


@router.get("/v1/info", response_model=ServiceInfo, summary="Device, backend and limits of this service")
async def info(state: ServiceState = Depends(get_state)) -> ServiceInfo:
    from litetopk import service

    s = state.settings
    return ServiceInfo(device=str(state.device), device_uuid=state.table.uuid, backend=state.backend,
                       supported_topk=list(SUPPORTED_TOPK), queue_size=s.queue_size,
                       max_request_bytes=s.max_request_bytes, request_timeout_s=s.request_timeout_s,
                       fd_socket=state.fd_socket, max_rows=s.row_limit(state.device), max_keys=s.max_keys,
                       max_batch=s.max_batch, version=service.__version__)
