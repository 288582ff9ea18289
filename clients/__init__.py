"""litetopk.clients: httpx clients of the litetopk service (TCP or Unix socket), sync and async.

Pipeline, one module a stage: transport (where the service is, httpx over TCP or a Unix socket)
-> client (TopKClient / AsyncTopKClient, one shared implementation of request building and
response parsing; regions.py exports tensors, wire.py reads results) -> errors (the exception
tree, one class per family of problem `code`s).

    with TopKClient(uds="/run/user/1000/litetopk/litetopk.sock") as client:
        cache = client.register(kv_cache)            # once: shared memory or CUDA IPC, no copy on calls
        result = client.topk(q_fp4, q_scale, cache, block_table, weights, row_to_batch, starts, ends,
                             topk=512)               # a litetopk.kernels.TopKResult
"""

from .client import AsyncTopKClient, TopKClient
from .errors import (
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
