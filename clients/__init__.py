"""litetopk.clients: httpx clients of the litetopk service (TCP or Unix socket), sync and async.

Pipeline, one module a stage: transport (where the service is, httpx over TCP or a Unix socket)
-> client (TopKClient / AsyncTopKClient, one shared implementation of request building and
response parsing; regions.py exports tensors, wire.py reads results) -> errors (the exception
tree, one class per family of problem `code`s).

    with TopKClient() as client:                     # finds the service's Unix socket by itself
        cache = client.register(kv_cache, access="read_only")  # once: a sealed memfd or CUDA IPC
        result = client.topk(q_fp4, q_scale, cache, block_table, weights, row_to_batch, starts, ends,
                             topk=512)               # a litetopk.kernels.TopKResult
"""

from .client import AsyncTopKClient, TopKClient
from .errors import (
    AuthenticationProblem,
    DeviceProblem,
    InvalidRequestProblem,
    ProtocolError,
    RegionProblem,
    RowFaultProblem,
    ServiceProblem,
    TimeoutProblem,
    TopKClientError,
    TransportError,
    UnavailableProblem,
)
from .regions import Region, RegionSlice

__all__ = [
    "AsyncTopKClient",
    "AuthenticationProblem",
    "DeviceProblem",
    "InvalidRequestProblem",
    "ProtocolError",
    "Region",
    "RegionProblem",
    "RegionSlice",
    "RowFaultProblem",
    "ServiceProblem",
    "TimeoutProblem",
    "TopKClient",
    "TopKClientError",
    "TransportError",
    "UnavailableProblem",
]
