"""The wire format of results, written once for the service and the clients (no pickle anywhere).

A top-k answer travels in one of two forms; the client accepts both and hides the difference.

JSON (`application/json`, for small results)::

    {"rows": R, "topk": K, "written": [...], "result": {"values": [[...]], ...}}

  `values` holds float32 numbers printed exactly (a float32 widened to float64 round-trips) and
  `null` for -inf padding; the other fields are int32 lists. `written` names the fields that went
  into the caller's output regions instead (they are absent from `result`).

Binary (`application/vnd.litetopk.result`, for large results)::

    b"LTKR" | u32 version=1 | u32 header_bytes | header (UTF-8 JSON) | pad to 8 | arrays

  header = {"rows", "topk", "written", "fields": [{"name", "dtype", "shape", "offset", "nbytes"}]}
  where `offset` counts from the start of the array area; arrays are little-endian and C-ordered.
"""

from __future__ import annotations

import json
import math
import struct

import torch

from litetopk.kernels import TopKResult

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
        entries.append({"name": name, "dtype": dtype_name(tensor.dtype), "shape": list(tensor.shape),
                        "offset": offset, "nbytes": nbytes})
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
        header = json.loads(data[12:12 + header_len])
        start = 12 + header_len
        start += -start % 8
        buffer = bytearray(memoryview(data)[start:])  # one copy: the tensors get writable memory of their own
        fields = {}
        for e in header["fields"]:
            dtype = DTYPES[e["dtype"]]
            count = math.prod(e["shape"])
            flat = torch.frombuffer(buffer, dtype=dtype, count=count, offset=e["offset"]) if count else \
                torch.empty(0, dtype=dtype)
            fields[e["name"]] = flat.reshape(e["shape"])
        return fields, int(header["rows"]), int(header["topk"]), list(header["written"])
    except (KeyError, TypeError, ValueError, struct.error) as exc:
        raise WireFormatError(f"malformed binary result: {exc}") from exc


def assemble_result(fields: dict[str, torch.Tensor]) -> TopKResult:
    """A TopKResult from all of RESULT_FIELDS."""
    missing = [n for n in RESULT_FIELDS if n not in fields]
    if missing:
        raise WireFormatError(f"result lacks fields {missing}")
    return TopKResult(**{n: fields[n] for n in RESULT_FIELDS})


__all__ = [
    "BINARY_MEDIA_TYPE", "DTYPES", "DTYPE_NAMES", "JSON_MEDIA_TYPE", "RESULT_FIELDS", "WireFormatError",
    "assemble_result", "decode_result_binary", "decode_result_json", "dtype_name", "encode_result_binary",
    "encode_result_json", "result_nbytes", "result_shape",
]
