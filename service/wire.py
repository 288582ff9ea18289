"""The wire format, written once for the service and the clients (no pickle anywhere).

What both sides must spell alike lives here and only here: the dtype names of tensors, the result
fields and their encodings, the problem codes (with their HTTP status and title), the fd handover
protocol's constants and socket names, and the IPC channel's frames (service/ipc.py serves them,
litetopk.clients.ipc speaks them).

A top-k answer over HTTP travels in one of two forms; the client accepts both and hides the difference.

JSON (`application/json`, for small results)::

    {"rows": R, "topk": K, "written": [...], "result": {"values": [[...]], ...}}

  `values` holds float32 numbers printed exactly (a float32 widened to float64 round-trips) and
  `null` for -inf padding; the other fields are int32 lists. `written` names the fields that went
  into the caller's output regions instead (they are absent from `result`).

Binary (`application/vnd.litetopk.result`, for large results)::

    b"LTKR" | u32 version=1 | u32 header_bytes | header (UTF-8 JSON) | pad to 8 | arrays

  header = {"rows", "topk", "written", "fields": [{"name", "dtype", "shape", "offset", "nbytes"}]}
  where `offset` counts from the start of the array area; arrays are little-endian and C-ordered.
  `result_layout` places the fields of the array area; the IPC channel uses the same layout.

IPC frames (Unix socket `ipc.sock` beside the HTTP socket)::

    u32 header_bytes | u32 payload_bytes | header (msgpack, one message below) | payload (raw bytes)

  Client -> service: `TopKOp`, `RegisterOp`, `UnregisterOp`, `RegionsOp`, `RegionOp`, `InfoOp`, `ReadyOp`
  (tagged by `op`, strict: unknown fields and wrong types are refused), each with an `id` the
  answer repeats; payload_bytes is 0. Service -> client: `Hello` first (protocol, limits,
  principal), then one answer per request, in any order: `TopKAnswer` (payload: the result fields
  not written into regions, laid out by `result_layout`), `OkAnswer` (`value`: what the HTTP route
  answers as JSON) or `ProblemAnswer` (`problem`: the HTTP route's problem+json body).
"""

from __future__ import annotations

import fcntl
import json
import math
import struct
from typing import Annotated, Any, Literal, Optional, Union

import msgspec
import torch

from litetopk.kernels import RowStatus, TopKResult

JSON_MEDIA_TYPE = "application/json"
BINARY_MEDIA_TYPE = "application/vnd.litetopk.result"
MAGIC = b"LTKR"
VERSION = 1

#: dtype names on the wire -> torch dtypes (one spelling for each).
DTYPES: dict[str, torch.dtype] = {
    "uint8": torch.uint8,
    "int32": torch.int32,
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}

#: TopKResult fields in order, with their dtypes and whether they are [rows, K] or [rows].
RESULT_FIELDS: dict[str, tuple[torch.dtype, bool]] = {
    "values": (torch.float32, True),
    "raw_indices": (torch.int32, True),
    "physical_indices": (torch.int32, True),
    "counts": (torch.int32, False),
    "status": (torch.int32, False),
    "repaired": (torch.int32, False),
    "candidates": (torch.int32, False),
}


class WireFormatError(ValueError):
    """A result body that does not follow this module's format."""


FIELD_ALIGNMENT = 8  # bytes: where each field of a result_layout starts


def result_layout(names, rows: int, topk: int) -> tuple[list[dict], int]:
    """([{name, dtype, shape, offset, nbytes}], total bytes) of result fields `names` laid out one after
    another, each on a FIELD_ALIGNMENT boundary (the array area of the binary form and of an IPC answer)."""
    entries, offset = [], 0
    for name in names:
        shape = list(result_shape(name, rows, topk))
        nbytes = math.prod(shape) * 4
        entries.append(
            {
                "name": name,
                "dtype": dtype_name(RESULT_FIELDS[name][0]),
                "shape": shape,
                "offset": offset,
                "nbytes": nbytes,
            }
        )
        offset += nbytes + (-nbytes % FIELD_ALIGNMENT)
    return entries, offset


def layout_padding(entries: list[dict]) -> list[tuple[int, int]]:
    """[start, end) of the padding bytes after each field of a result_layout (a field of an odd number of
    int32 values ends 4 bytes short of its FIELD_ALIGNMENT boundary): a buffer filled by one copy of a reused
    device buffer must zero them, or they carry whatever an earlier call left there."""
    ends = [e["offset"] + e["nbytes"] for e in entries]
    return [(end, end + (-end % FIELD_ALIGNMENT)) for end in ends if end % FIELD_ALIGNMENT]


def fields_in(buffer, entries: list[dict]) -> dict[str, torch.Tensor]:
    """{name: tensor} viewing the fields `entries` (result_layout) inside `buffer` (no copy)."""
    fields = {}
    for e in entries:
        dtype, count = DTYPES[e["dtype"]], math.prod(e["shape"])
        flat = (
            torch.frombuffer(buffer, dtype=dtype, count=count, offset=e["offset"])
            if count
            else torch.empty(0, dtype=dtype)
        )
        fields[e["name"]] = flat.view(e["shape"])
    return fields


def dtype_name(dtype: torch.dtype) -> str:
    if dtype not in DTYPE_NAMES:
        raise ValueError(f"dtype {dtype} cannot travel; supported: {sorted(DTYPES)}")
    return DTYPE_NAMES[dtype]


def result_shape(name: str, rows: int, topk: int) -> tuple[int, ...]:
    return (rows, topk) if RESULT_FIELDS[name][1] else (rows,)


def result_nbytes(rows: int, topk: int, fields) -> int:
    return sum(math.prod(result_shape(n, rows, topk)) * 4 for n in fields)


# ---------------------------------------------------------------------------------------- JSON


def encode_result_json(fields: dict[str, torch.Tensor], rows: int, topk: int, written: list[str]) -> dict:
    """The JSON body for the CPU tensors `fields` (a subset of RESULT_FIELDS)."""
    out = {}
    for name, tensor in fields.items():
        if name == "values":
            out[name] = [[None if v == -math.inf else v for v in row] for row in tensor.tolist()]
        else:
            out[name] = tensor.tolist()
    return {"rows": rows, "topk": topk, "written": list(written), "result": out}


def decode_result_json(body: dict) -> tuple[dict[str, torch.Tensor], int, int, list[str]]:
    """(fields, rows, topk, written) from a JSON body."""
    try:
        rows, topk, written, result = int(body["rows"]), int(body["topk"]), list(body["written"]), body["result"]
        fields = {}
        for name, data in result.items():
            dtype, _ = RESULT_FIELDS[name]
            if name == "values":
                data = [[-math.inf if v is None else v for v in row] for row in data]
            tensor = torch.tensor(data, dtype=dtype) if data else torch.empty(0, dtype=dtype)
            fields[name] = tensor.reshape(result_shape(name, rows, topk))
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise WireFormatError(f"malformed JSON result: {exc}") from exc
    return fields, rows, topk, written


# -------------------------------------------------------------------------------------- binary


def encode_result_binary(fields: dict[str, torch.Tensor], rows: int, topk: int, written: list[str]) -> bytes:
    """The binary body for the CPU tensors `fields` (module docstring)."""
    entries, chunks, offset = [], [], 0
    for name, tensor in fields.items():
        # a view of the tensor's memory, not .tobytes(): the join below is the only copy
        data = memoryview(tensor.contiguous().numpy().reshape(-1)).cast("B")
        nbytes = data.nbytes
        entries.append(
            {
                "name": name,
                "dtype": dtype_name(tensor.dtype),
                "shape": list(tensor.shape),
                "offset": offset,
                "nbytes": nbytes,
            }
        )
        chunks.append(data)
        pad = -nbytes % 8
        chunks.append(b"\0" * pad)
        offset += nbytes + pad
    header = json.dumps({"rows": rows, "topk": topk, "written": list(written), "fields": entries}).encode()
    prefix = MAGIC + struct.pack("<II", VERSION, len(header)) + header
    prefix += b"\0" * (-len(prefix) % 8)
    return b"".join([prefix, *chunks])


def decode_result_binary(data: bytes) -> tuple[dict[str, torch.Tensor], int, int, list[str]]:
    """(fields, rows, topk, written) from a binary body; the tensors own their memory."""
    try:
        if data[:4] != MAGIC:
            raise WireFormatError("not a litetopk binary result (bad magic)")
        version, header_len = struct.unpack_from("<II", data, 4)
        if version != VERSION:
            raise WireFormatError(f"binary result version {version}; this client reads {VERSION}")
        header = json.loads(data[12 : 12 + header_len])
        start = 12 + header_len
        start += -start % 8
        buffer = bytearray(memoryview(data)[start:])  # one copy: the tensors get writable memory of their own
        fields = {}
        for e in header["fields"]:
            dtype = DTYPES[e["dtype"]]
            count = math.prod(e["shape"])
            flat = (
                torch.frombuffer(buffer, dtype=dtype, count=count, offset=e["offset"])
                if count
                else torch.empty(0, dtype=dtype)
            )
            fields[e["name"]] = flat.reshape(e["shape"])
        return fields, int(header["rows"]), int(header["topk"]), list(header["written"])
    except (KeyError, TypeError, ValueError, struct.error) as exc:
        raise WireFormatError(f"malformed binary result: {exc}") from exc


def encode_result_prefix(entries: list[dict], rows: int, topk: int, written: list[str]) -> bytes:
    """The binary form's bytes before its array area, for fields laid out by `result_layout`."""
    header = json.dumps({"rows": rows, "topk": topk, "written": list(written), "fields": entries}).encode()
    prefix = MAGIC + struct.pack("<II", VERSION, len(header)) + header
    return prefix + b"\0" * (-len(prefix) % 8)


def assemble_result(fields: dict[str, torch.Tensor]) -> TopKResult:
    """A TopKResult from all of RESULT_FIELDS."""
    missing = [n for n in RESULT_FIELDS if n not in fields]
    if missing:
        raise WireFormatError(f"result lacks fields {missing}")
    return TopKResult(**{n: fields[n] for n in RESULT_FIELDS})


# ------------------------------------------------------------------------------- problem codes

#: code -> (HTTP status, title). Stable: add codes, never rename them. The service answers them
#: (service/errors.py), the clients raise one exception family per code (litetopk.clients.errors).
CODES: dict[str, tuple[int, str]] = {
    # regions
    "unknown_region": (404, "No region with this id was ever registered"),
    "stale_region": (409, "The region was unregistered, re-registered or its owner died"),
    "out_of_bounds": (422, "The tensor does not fit inside its region"),
    "misaligned_offset": (422, "The byte offset is not a multiple of the dtype's size"),
    "shm_unavailable": (422, "The host memory cannot be mapped as registered"),
    "unsealed_memory": (422, "The fd handed over is not a memfd sealed against shrinking"),
    "unknown_ticket": (422, "No fd was handed over under this ticket by this principal"),
    "read_only_region": (409, "An output names a read-only region"),
    "output_aliases_input": (422, "An output names a region an input of the same request reads"),
    "foreign_device": (422, "The CUDA IPC handle belongs to a device this service does not own"),
    "ipc_unavailable": (422, "CUDA IPC handles cannot be opened by this service"),
    "foreign_pid_namespace": (422, "The owner pid is from another pid namespace than the service's"),
    "region_quota_exceeded": (409, "The principal holds as many regions (or region bytes) as it may"),
    # request contents
    "bad_dtype": (422, "A tensor has the wrong dtype"),
    "bad_shape": (422, "A tensor has the wrong shape"),
    "unsupported_topk": (422, "topk is not supported"),
    "slot_overflow": (422, "A physical slot does not fit int32"),
    "invalid_input": (422, "The operator refused the inputs"),
    "validation_error": (422, "The request body does not match the schema"),
    "invalid_json": (400, "The request body is not JSON"),
    "invalid_frame": (400, "The IPC frame is not a message of this protocol"),
    "unauthenticated": (401, "Region operations need a principal: the Unix socket or the bearer token"),
    "backend_unavailable": (409, "The requested backend is not the one this service runs"),
    # rows
    "invalid_row": (422, "Rows have a bad batch index or window"),
    "invalid_page": (422, "Rows read a page outside the cache"),
    "nonfinite_score": (422, "Rows have a NaN/inf weight or score"),
    "unsupported_data": (422, "Rows hold vectors the backend cannot score exactly (use backend reference)"),
    "selector_failure": (500, "The selector could not certify rows"),
    # operations
    "overloaded": (429, "The device queue is full"),
    "not_ready": (503, "The service has not finished its warm-up"),
    "shutting_down": (503, "The service is draining its queue before exit"),
    "fd_exhausted": (503, "The service has no file descriptors left"),
    "timeout": (504, "The request did not finish within the request timeout"),
    "payload_too_large": (413, "The request body is larger than the limit"),
    "device_error": (500, "The device failed"),
    "not_found": (404, "No such route"),
    "method_not_allowed": (405, "Method not allowed on this route"),
    "http_error": (400, "Bad HTTP request"),
    "internal_error": (500, "Internal error (a bug: please report it)"),
}

#: Row-fault flags, worst first: the code of a row-fault problem is the first flag any row has.
ROW_FLAG_CODES = (
    (RowStatus.INVALID_ROW, "invalid_row"),
    (RowStatus.INVALID_PAGE, "invalid_page"),
    (RowStatus.SLOT_OVERFLOW, "slot_overflow"),
    (RowStatus.NONFINITE, "nonfinite_score"),
    (RowStatus.UNSUPPORTED, "unsupported_data"),
    (RowStatus.SELECTOR_FAILURE, "selector_failure"),
)


def problem_body(code: str, detail: str, instance: str, **extensions) -> dict:
    """The RFC 9457 problem document of `code` (HTTP's problem+json body; an IPC ProblemAnswer's `problem`)."""
    status, title = CODES[code]
    return {
        "type": f"urn:litetopk:problem:{code}",
        "title": title,
        "status": status,
        "detail": detail,
        "instance": instance,
        "code": code,
        **extensions,
    }


# ------------------------------------------------------------------------ sockets beside the HTTP one

FD_SOCKET_NAME = "fds.sock"  # SOCK_SEQPACKET: sealed memfds handed over (litetopk.clients.memfd)
IPC_SOCKET_NAME = "ipc.sock"  # SOCK_STREAM: the IPC channel (service/ipc.py)
TOKEN_FILE_NAME = "token"  # the TCP bearer token (0600)
HANDOVER_MESSAGE = b"litetopk-fd/1"
SEALS_REQUIRED = fcntl.F_SEAL_SHRINK  # a host region's memfd must carry at least these seals
TICKET_TTL_S = 60.0

# ----------------------------------------------------------------------------------- IPC frames

IPC_PROTOCOL = 1
FRAME = struct.Struct("<II")  # header bytes, payload bytes
MessageId = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
RegionId = Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
Dim = Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1)]
Int32 = Annotated[int, msgspec.Meta(ge=-(2**31), le=2**31 - 1)]
INLINE_VALUES_MAX = 2**16  # values one inline tensor may hold (larger metadata goes in a region)


class _Strict(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """Unknown fields are refused; msgpack decoding never coerces (a string is not an int)."""


class RegionSlice(_Strict):
    """`shape` elements of `dtype`, C-contiguous, at byte `offset` of region `region`/`generation`."""

    region: RegionId
    generation: Annotated[int, msgspec.Meta(ge=1)]
    dtype: Literal["uint8", "int32", "float32", "bfloat16"]
    shape: Annotated[list[Dim], msgspec.Meta(max_length=5)]
    offset: Annotated[int, msgspec.Meta(ge=0, le=2**50)] = 0


class TensorArg(_Strict):
    """Row metadata (block_table, row_to_batch, starts, ends): a region slice (`region`,
    `generation`, `offset`, `dtype`, `shape`) or inline int32 values (`data` with `shape`, at most
    2 dims and INLINE_VALUES_MAX values). `tensor_arg_problem` says what is wrong with a mix."""

    shape: Annotated[list[Dim], msgspec.Meta(max_length=5)]
    dtype: Literal["uint8", "int32", "float32", "bfloat16"] = "int32"
    region: Optional[RegionId] = None
    generation: Optional[Annotated[int, msgspec.Meta(ge=1)]] = None
    offset: Annotated[int, msgspec.Meta(ge=0, le=2**50)] = 0
    data: Optional[Annotated[list[Int32], msgspec.Meta(max_length=INLINE_VALUES_MAX)]] = None


def tensor_arg_problem(arg: TensorArg) -> str | None:
    """Why `arg` is neither a region slice nor inline data (None: it is one of them)."""
    if arg.data is None:
        return (
            None
            if arg.region is not None and arg.generation is not None
            else "give `region` and `generation` (a region slice) or `data` (inline int32 values)"
        )
    if arg.region is not None or arg.generation is not None or arg.offset:
        return "inline data (`data`) takes no `region`, `generation` or `offset`"
    if arg.dtype != "int32" or len(arg.shape) > 2:
        return "inline data is int32 with at most 2 dims"
    return None


class OutputRegions(_Strict):
    values: Optional[RegionSlice] = None
    raw_indices: Optional[RegionSlice] = None
    physical_indices: Optional[RegionSlice] = None
    counts: Optional[RegionSlice] = None
    status: Optional[RegionSlice] = None
    repaired: Optional[RegionSlice] = None
    candidates: Optional[RegionSlice] = None


class TopKRequest(_Strict):
    """The arguments of one top-k call, the same fields and bounds as HTTP's body (service/schemas.py)."""

    q_fp4: RegionSlice
    q_scale: RegionSlice
    kv_cache: RegionSlice
    weights: RegionSlice
    block_table: TensorArg
    row_to_batch: TensorArg
    starts: TensorArg
    ends: TensorArg
    topk: int
    kv_scale: Optional[RegionSlice] = None
    weight_scale: float = 1.0
    repair: bool = True
    backend: Literal["auto", "reference", "triton", "flydsl"] = "auto"
    out: Optional[OutputRegions] = None


class TopKOp(_Strict, tag_field="op", tag="topk"):
    id: MessageId
    request: TopKRequest


class TopKOpRaw(_Strict, tag_field="op", tag="topk"):
    """A TopKOp whose request is left as its msgpack bytes (the service's connections keep the
    admissions of requests by these bytes; a request is decoded as TopKRequest when it is new)."""

    id: MessageId
    request: msgspec.Raw


class RegisterOp(_Strict, tag_field="op", tag="register"):
    """`registration`: the body of POST /v1/regions (validated by the same model)."""

    id: MessageId
    registration: dict[str, Any]


class UnregisterOp(_Strict, tag_field="op", tag="unregister"):
    id: MessageId
    region: RegionId
    generation: Optional[Annotated[int, msgspec.Meta(ge=1)]] = None


class RegionsOp(_Strict, tag_field="op", tag="regions"):
    id: MessageId


class RegionOp(_Strict, tag_field="op", tag="region"):
    id: MessageId
    region: RegionId


class InfoOp(_Strict, tag_field="op", tag="info"):
    id: MessageId


class ReadyOp(_Strict, tag_field="op", tag="ready"):
    id: MessageId


IpcRequest = Union[TopKOp, RegisterOp, UnregisterOp, RegionsOp, RegionOp, InfoOp, ReadyOp]
IpcRequestRaw = Union[TopKOpRaw, RegisterOp, UnregisterOp, RegionsOp, RegionOp, InfoOp, ReadyOp]


class MessageIdOnly(msgspec.Struct):
    """What is read of a message that failed to decode, to address the problem answer."""

    id: MessageId = 0


class Hello(msgspec.Struct, tag_field="op", tag="hello"):
    protocol: int
    info: dict[str, Any]  # /v1/info's document: device, backend, limits
    principal: dict[str, Any]  # uid, gid, pid (SO_PEERCRED)


class ResultField(msgspec.Struct, array_like=True):
    name: str
    dtype: str
    shape: list[int]
    offset: int
    nbytes: int


class TopKAnswer(msgspec.Struct, tag_field="op", tag="result"):
    id: int
    rows: int
    topk: int
    written: list[str]
    fields: list[ResultField]  # in the frame's payload (result_layout)
    timing: dict[str, float]  # the phases in ms (HTTP's Server-Timing)


class OkAnswer(msgspec.Struct, tag_field="op", tag="ok"):
    id: int
    value: Any = None


class ProblemAnswer(msgspec.Struct, tag_field="op", tag="problem"):
    id: int
    problem: dict[str, Any]


IpcAnswer = Union[Hello, TopKAnswer, OkAnswer, ProblemAnswer]


__all__ = [
    "BINARY_MEDIA_TYPE",
    "CODES",
    "DTYPES",
    "DTYPE_NAMES",
    "FD_SOCKET_NAME",
    "FRAME",
    "HANDOVER_MESSAGE",
    "IPC_PROTOCOL",
    "IPC_SOCKET_NAME",
    "INLINE_VALUES_MAX",
    "JSON_MEDIA_TYPE",
    "RESULT_FIELDS",
    "ROW_FLAG_CODES",
    "SEALS_REQUIRED",
    "TICKET_TTL_S",
    "TOKEN_FILE_NAME",
    "WireFormatError",
    "Hello",
    "InfoOp",
    "IpcAnswer",
    "IpcRequest",
    "IpcRequestRaw",
    "MessageIdOnly",
    "TensorArg",
    "tensor_arg_problem",
    "OkAnswer",
    "OutputRegions",
    "ProblemAnswer",
    "RegionOp",
    "RegionSlice",
    "ReadyOp",
    "RegionsOp",
    "RegisterOp",
    "ResultField",
    "TopKAnswer",
    "TopKOp",
    "TopKOpRaw",
    "TopKRequest",
    "UnregisterOp",
    "assemble_result",
    "decode_result_binary",
    "decode_result_json",
    "dtype_name",
    "encode_result_binary",
    "encode_result_json",
    "encode_result_prefix",
    "fields_in",
    "layout_padding",
    "problem_body",
    "result_layout",
    "result_nbytes",
    "result_shape",
]
