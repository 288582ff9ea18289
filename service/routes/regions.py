"""/v1/regions: register, list, look up and unregister shared-memory regions (service/regions.py)."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Body, Depends, Query, Response

from ..errors import PROBLEM_JSON
from ..schemas import CudaIpcRegistration, Problem, RegionInfo, RegionList, RegionRegistration, RegionId
from ..state import ServiceState, get_state

_PROBLEMS = {status: {"model": Problem, "content": {PROBLEM_JSON: {}}} for status in (404, 409, 413, 422, 429, 503)}

router = APIRouter(prefix="/v1/regions", tags=["regions"], responses=_PROBLEMS)


@router.post("", status_code=201, response_model=RegionInfo, summary="Register a region")
async def register_region(
    registration: Annotated[RegionRegistration, Body()], state: ServiceState = Depends(get_state),
) -> RegionInfo:
    """Map a POSIX shared-memory block or open a CUDA IPC handle; returns its id and generation.

    Registering the same memory again keeps the id and bumps the generation (older generations
    become `stale_region`). The exporter keeps the memory alive until unregistered.
    """
    if isinstance(registration, CudaIpcRegistration):
        region = await asyncio.to_thread(state.table.register_cuda_ipc, registration)
    else:
        region = state.table.register_shm(registration)
    return region.info()


@router.get("", response_model=RegionList, summary="List live regions")
async def list_regions(state: ServiceState = Depends(get_state)) -> RegionList:
    return RegionList(regions=[r.info() for r in state.table.list()])


@router.get("/{region_id}", response_model=RegionInfo, summary="Describe one region")
async def get_region(region_id: RegionId, state: ServiceState = Depends(get_state)) -> RegionInfo:
    return state.table.get(region_id).info()


@router.delete("/{region_id}", status_code=204, summary="Unregister a region")
async def unregister_region(
    region_id: RegionId,
    generation: Annotated[int | None, Query(ge=1, description="only this generation (else stale_region)")] = None,
    state: ServiceState = Depends(get_state),
) -> Response:
    """Retire the region at once (queued requests naming it get `stale_region`) and return once
    no running request uses it: from then on the exporter may free or reuse the memory."""
    await asyncio.to_thread(state.table.unregister, region_id, generation, state.settings.request_timeout_s)
    return Response(status_code=204)
