"""/v1/regions: register, list, look up and unregister the caller's regions (service/regions.py).

Every route acts for the caller's principal (service/principals.py): a caller sees and touches
only its own regions; another principal's region id answers `unknown_region`.
"""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Body, Depends, Query, Response

from ..errors import PROBLEM_JSON
from ..principals import Principal, get_principal
from ..schemas import CudaIpcRegistration, Problem, RegionId, RegionInfo, RegionList, RegionRegistration
from ..state import ServiceState, get_state

_PROBLEMS = {
    status: {"model": Problem, "content": {PROBLEM_JSON: {}}}
    for status in (400, 401, 404, 409, 413, 422, 429, 500, 503)
}

router = APIRouter(prefix="/v1/regions", tags=["regions"], responses=_PROBLEMS)


@router.post("", status_code=201, response_model=RegionInfo, summary="Register a region")
async def register_region(
    registration: Annotated[RegionRegistration, Body()],
    state: ServiceState = Depends(get_state),
    principal: Principal = Depends(get_principal),
) -> RegionInfo:
    """Map a sealed memfd (named by the ticket the fd socket gave for it) or open a CUDA IPC
    handle; returns its id and generation.

    Registering the same memory again keeps the id and bumps the generation (older generations
    become `stale_region`). CUDA IPC: the exporter keeps the memory alive until unregistered.
    """
    if isinstance(registration, CudaIpcRegistration):
        region = await asyncio.to_thread(state.table.register_cuda_ipc, registration, principal.uid)
    else:
        fd = state.tickets.take(registration.ticket, principal.uid)
        region = await asyncio.to_thread(state.table.register_memfd, registration, fd, principal.uid)
    return region.info()


@router.get("", response_model=RegionList, summary="List the caller's live regions")
async def list_regions(
    state: ServiceState = Depends(get_state), principal: Principal = Depends(get_principal)
) -> RegionList:
    return RegionList(regions=[r.info() for r in state.table.list(principal.uid)])


@router.get("/{region_id}", response_model=RegionInfo, summary="Describe one of the caller's regions")
async def get_region(
    region_id: RegionId, state: ServiceState = Depends(get_state), principal: Principal = Depends(get_principal)
) -> RegionInfo:
    return state.table.get(region_id, principal.uid).info()


@router.delete("/{region_id}", status_code=204, summary="Unregister one of the caller's regions")
async def unregister_region(
    region_id: RegionId,
    generation: Annotated[int | None, Query(ge=1, description="only this generation (else stale_region)")] = None,
    state: ServiceState = Depends(get_state),
    principal: Principal = Depends(get_principal),
) -> Response:
    """Retire the region at once (queued requests naming it get `stale_region`) and return once
    no running request uses it: from then on the exporter may free or reuse the memory."""
    await asyncio.to_thread(
        state.table.unregister, region_id, principal.uid, generation, state.settings.request_timeout_s
    )
    return Response(status_code=204)
