"""The HTTP edge: pydantic models of every request and response body (validated once, here).

A large tensor is always a `RegionSlice` (region id + generation + byte offset + dtype + shape of a
registered region); small row metadata (block_table, row_to_batch, starts, ends) may instead be
an `InlineTensor` (int32, flat list + shape). Nothing on the wire is pickled.
"""

from __future__ import annotations

import base64
import binascii
from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from litetopk.clients.owners import PID_MAX_LIMIT
from litetopk.kernels import SUPPORTED_TOPK

DTypeName = Literal["uint8", "int32", "float32", "bfloat16"]  # = litetopk.service.wire.DTYPES (tested)


def _integral(value):
    """JSON Schema's integer includes numbers written with a zero fraction (`3.0`): such a number is
    taken as the integer, alone, in a list or in an object, at any depth (a string, a bool or a
    fraction is still refused; `weight_scale`, a real number, is left as it is)."""
    if value.__class__ is float:
        return int(value) if value.is_integer() and abs(value) < 2**63 else value
    if value.__class__ is list:
        return [_integral(v) for v in value]
    if value.__class__ is dict:
        return {k: v if k == "weight_scale" else _integral(v) for k, v in value.items()}
    return value


Dim = Annotated[int, Field(ge=0, le=2**31 - 1)]
Int32 = Annotated[int, Field(ge=-(2**31), le=2**31 - 1)]
RegionId = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
Pid = Annotated[
    int,
    Field(
        ge=1,
        le=PID_MAX_LIMIT,
        description="owner process (at most the host's pid_max); its regions are dropped when it dies",
    ),
]
Access = Annotated[
    Literal["read_only", "read_write"],
    Field(description="read_write regions may be named in `out`; read_only regions (mapped read-only) never are"),
]
Ticket = Annotated[str, Field(min_length=16, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
# 64 bytes in standard base64: 88 characters, the last data character carrying 2 bits (A, Q, g or w).
EVENT_HANDLE_PATTERN = r"^[A-Za-z0-9+/]{85}[AQgw]==$"
# Values one inline tensor may hold: it bounds what a parsed body costs the event loop (unpickling
# 4 x 65536 values from the parser process: ~8 ms; service/routes/topk.py BodyParser).
INLINE_VALUES_MAX = 2**16
# A GPU UUID as nvidia-smi (GPU-...) or torch (bare, hyphenated) spells it, hyphens optional.
GPU_UUID_PATTERN = r"^([Gg][Pp][Uu]-)?[0-9A-Fa-f]{8}-?[0-9A-Fa-f]{4}-?[0-9A-Fa-f]{4}-?[0-9A-Fa-f]{4}-?[0-9A-Fa-f]{12}$"


class _Strict(BaseModel):
    """Unknown fields are refused and nothing is coerced ("64" is not an int, 1 is not a bool)."""

    model_config = ConfigDict(extra="forbid", strict=True)


class _Body(_Strict):
    """A request body: a number written `3.0` is taken as an integer anywhere in it (`_integral`, one
    pass over the whole body at its top; nested models have no validator of their own)."""

    @model_validator(mode="before")
    @classmethod
    def _integral_numbers(cls, data):
        return _integral(data) if isinstance(data, dict) else data


def _b64(value: str | None, what: str, length: int | None = None) -> bytes | None:
    if value is None:
        return None
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"{what} must be standard base64") from exc
    if length is not None and len(raw) != length:
        raise ValueError(f"{what} must encode {length} bytes, got {len(raw)}")
    return raw


# ------------------------------------------------------------------------------------- regions


class MemfdRegistration(_Body):
    """Host memory: a sealed memfd handed over the fd socket (litetopk.clients.memfd), named by its ticket.

    The service maps the first `size` bytes of the fd; it must be a memfd sealed with F_SEAL_SHRINK
    (`unsealed_memory` otherwise), and open for writing when `access` is read_write.
    """

    kind: Literal["memfd"]
    ticket: Ticket = Field(description="the one-time ticket the fd socket answered for the fd (same uid)")
    size: int = Field(ge=1, le=2**40, description="bytes of the memfd to map (from its start)")
    access: Access = "read_write"
    pid: Pid | None = None
    pid_ns: int | None = Field(
        None,
        ge=1,
        description="the owner's pid namespace (st_ino of /proc/self/ns/pid); a "
        "pid from another namespace than the service's is refused (foreign_pid_namespace)",
    )


class TorchIpcFields(_Strict):
    """torch's own CUDA IPC bookkeeping (`UntypedStorage._share_cuda_()`), all base64 or numbers."""

    ref_counter_handle: str
    ref_counter_offset: int = Field(ge=0)
    event_handle: str | None = Field(
        None,
        min_length=88,
        max_length=88,
        pattern=EVENT_HANDLE_PATTERN,
        description="base64 of the 64-byte cudaIpcEventHandle_t",
    )
    event_sync_required: bool = False

    @field_validator("ref_counter_handle")
    @classmethod
    def _check_counter(cls, v: str) -> str:
        _b64(v, "ref_counter_handle")
        return v

    @field_validator("event_handle")
    @classmethod
    def _check_event(cls, v: str | None) -> str | None:
        _b64(v, "event_handle", 64)
        return v


class CudaIpcRegistration(_Body):
    """Device memory exported by `cudaIpcGetMemHandle` (64 raw bytes, base64) on the GPU `device_uuid`.

    The region is the `size` bytes at `offset` bytes from the start of the exported allocation.
    With `torch` set the service opens it the way torch.multiprocessing does (reference counted);
    without, through `cuda.bindings.runtime.cudaIpcOpenMemHandle`.
    """

    kind: Literal["cuda_ipc"]
    handle: str = Field(
        min_length=88,
        max_length=96,
        description="base64 of the 64-byte cudaIpcMemHandle_t, or of "
        "torch's own handle bytes (`_share_cuda_`, 66 bytes in torch 2.11) when `torch` is set",
    )
    device_uuid: str = Field(
        pattern=GPU_UUID_PATTERN,
        description="the GPU's UUID (as nvidia-smi or torch prints "
        "it: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx, with or without GPU-)",
    )
    size: int = Field(ge=1, le=2**40)
    offset: int = Field(0, ge=0, le=2**40)
    access: Access = "read_write"
    pid: Pid | None = None
    pid_ns: int | None = Field(None, ge=1, description="the owner's pid namespace (as for memfd)")
    torch: TorchIpcFields | None = None

    @model_validator(mode="after")
    def _check_handle(self) -> "CudaIpcRegistration":
        raw = _b64(self.handle, "handle")
        if self.torch is None and len(raw) != 64:
            raise ValueError(f"handle must encode the 64-byte cudaIpcMemHandle_t, got {len(raw)} bytes")
        if self.torch is not None and not 64 <= len(raw) <= 72:
            raise ValueError(f"handle must encode torch's 64-72 byte IPC handle, got {len(raw)} bytes")
        return self

    def handle_bytes(self) -> bytes:
        return _b64(self.handle, "handle")


RegionRegistration = Annotated[Union[MemfdRegistration, CudaIpcRegistration], Field(discriminator="kind")]


class RegionInfo(BaseModel):
    id: str
    generation: int
    kind: Literal["memfd", "cuda_ipc"]
    size: int
    access: Literal["read_only", "read_write"]
    pid: int | None
    device: str


class RegionList(BaseModel):
    regions: list[RegionInfo]


# ---------------------------------------------------------------------------------------- topk


class RegionSlice(_Strict):
    """`shape` elements of `dtype`, C-contiguous, at byte `offset` of region `region`/`generation`."""

    region: RegionId
    generation: int = Field(ge=1)
    offset: int = Field(0, ge=0, le=2**50)
    dtype: DTypeName
    shape: list[Dim] = Field(max_length=5)  # AITER's kv_cache [pages, 1, 4, 64, 16] has five


class InlineTensor(_Strict):
    """Small int32 metadata sent in the body: `data` is the flat C-ordered list of `shape`, at most
    INLINE_VALUES_MAX values (larger metadata goes in a region, as the clients do past 1024)."""

    dtype: Literal["int32"] = "int32"
    shape: list[Dim] = Field(max_length=2)
    data: list[Int32] = Field(max_length=INLINE_VALUES_MAX)


TensorArg = Union[RegionSlice, InlineTensor]


class OutputRegions(_Strict):
    """Result fields to write into caller regions (zero copy); the others come back in the body."""

    values: RegionSlice | None = None
    raw_indices: RegionSlice | None = None
    physical_indices: RegionSlice | None = None
    counts: RegionSlice | None = None
    status: RegionSlice | None = None
    repaired: RegionSlice | None = None
    candidates: RegionSlice | None = None


class TopKFields(_Strict):
    """TopKRequest's fields, validated as they are written: a body this accepts (as pydantic-core parses
    JSON, without a Python call) TopKRequest accepts as the same request; one it refuses is validated
    again as TopKRequest, which takes `3.0` for an integer and says what is wrong (routes/topk.py)."""

    q_fp4: RegionSlice
    q_scale: RegionSlice
    kv_cache: RegionSlice = Field(
        description="uint8 [num_pages, 4352] (our format, or a view of 4352-byte pages "
        "such as [num_pages, 64, 1, 68]); with kv_scale, AITER's values uint8 "
        "[num_pages, 1, 4, 64, 16] (docs/cache-layouts.md)"
    )
    kv_scale: RegionSlice | None = Field(
        None,
        description="AITER's cache format: its scales, uint8 "
        "[num_pages, 1, 4, 64], one page per kv_cache page; omitted for our "
        "format (a cache is always a region, never inline)",
    )
    weights: RegionSlice
    block_table: TensorArg
    row_to_batch: TensorArg
    starts: TensorArg
    ends: TensorArg
    topk: int = Field(
        description="one of litetopk.kernels.SUPPORTED_TOPK (anything else: unsupported_topk)",
        json_schema_extra={"enum": list(SUPPORTED_TOPK)},
    )
    weight_scale: float = Field(1.0, allow_inf_nan=False)
    repair: bool = True
    backend: Literal["auto", "reference", "triton", "flydsl"] = Field(
        "auto", description="'auto' or the backend this service runs (anything else: backend_unavailable)"
    )
    out: OutputRegions | None = None


class TopKRequest(_Body, TopKFields):
    """The arguments of `litetopk_prefill` (CONTRACT.md §2), tensors named by region or inline."""


class TopKJsonResponse(BaseModel):
    """JSON form of a result (litetopk.service.wire); `values` uses null for -inf padding."""

    rows: int
    topk: int
    written: list[str]
    result: dict[str, list]


class ServiceInfo(BaseModel):
    device: str
    device_uuid: str | None
    backend: str
    supported_topk: list[int]
    queue_size: int
    max_request_bytes: int
    request_timeout_s: float
    fd_socket: str | None = Field(description="the socket host memory is handed over on (litetopk.clients.memfd)")
    http_url: str | None = Field(description="where HTTP listens on TCP (None: TCP off)")
    ipc_socket: str | None = Field(description="the IPC channel's socket (msgpack frames; None: not served)")
    token_file: str | None = Field(description="where the TCP bearer token is (readable by the service's user only)")
    max_regions_per_principal: int = Field(description="live regions one principal may hold")
    max_region_bytes_per_principal: int = Field(description="bytes of live regions one principal may hold")
    graphs: bool = Field(description="repeated request shapes are replayed from CUDA graphs")
    max_rows: int = Field(description="query rows a request may send (the device workspace is sized for it)")
    max_keys: int = Field(description="the longest key window a row may see (window end); longer: invalid_row")
    max_batch: int = Field(description="sequences (block-table rows) a request may send")
    ipc_max_connections: int = Field(description="IPC connections the service serves at once")
    ipc_max_connections_per_uid: int = Field(description="IPC connections of one uid at once")
    ipc_max_in_flight: int = Field(description="requests of one IPC connection in flight at once")
    version: str


class Problem(BaseModel):
    """RFC 9457 problem details; `code` is stable (litetopk.service.errors.CODES)."""

    model_config = ConfigDict(extra="allow")
    type: str
    title: str
    status: int
    detail: str
    instance: str
    code: str


__all__ = [
    "CudaIpcRegistration",
    "INLINE_VALUES_MAX",
    "InlineTensor",
    "MemfdRegistration",
    "OutputRegions",
    "Problem",
    "RegionInfo",
    "RegionList",
    "RegionRegistration",
    "RegionSlice",
    "ServiceInfo",
    "TensorArg",
    "TopKFields",
    "TopKJsonResponse",
    "TopKRequest",
    "TorchIpcFields",
]
