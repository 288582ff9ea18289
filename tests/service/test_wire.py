"""The result wire format: JSON and binary round-trips, -inf padding, malformed bodies refused."""

from __future__ import annotations

import json
import math

import pytest
import torch

from litetopk.service.schemas import DTypeName
from litetopk.service.wire import (
    DTYPES,
    RESULT_FIELDS,
    WireFormatError,
    assemble_result,
    decode_result_binary,
    decode_result_json,
    encode_result_binary,
    encode_result_json,
    result_nbytes,
)


def ref_fields(rows: int, k: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(rows, k, generator=g)
    values[:, k // 2 :] = -math.inf  # padded rows
    ints = lambda *shape: torch.randint(-1, 2**31 - 1, shape, generator=g, dtype=torch.int32)  # noqa: E731
    return {
        "values": values,
        "raw_indices": ints(rows, k),
        "physical_indices": ints(rows, k),
        "counts": ints(rows),
        "status": ints(rows),
        "repaired": ints(rows),
        "candidates": ints(rows),
    }


@pytest.mark.parametrize("rows,k", [(0, 512), (1, 512), (5, 1024)])
@pytest.mark.parametrize("form", ["json", "binary"])
def test_round_trip_is_exact(rows, k, form):
    fields = ref_fields(rows, k)
    if form == "json":
        decoded, r, kk, written = decode_result_json(json.loads(json.dumps(encode_result_json(fields, rows, k, []))))
    else:
        decoded, r, kk, written = decode_result_binary(encode_result_binary(fields, rows, k, []))
    assert (r, kk, written) == (rows, k, [])
    result = assemble_result(decoded)
    for name in RESULT_FIELDS:
        assert torch.equal(getattr(result, name), fields[name]), (name, rows, k, form)


def test_written_fields_are_left_out():
    fields = ref_fields(2, 512)
    partial = {n: t for n, t in fields.items() if n != "values"}
    decoded, *_, written = decode_result_binary(encode_result_binary(partial, 2, 512, ["values"]))
    assert written == ["values"] and "values" not in decoded
    with pytest.raises(WireFormatError):
        assemble_result(decoded)
    assert result_nbytes(2, 512, partial) == 2 * 512 * 4 * 2 + 2 * 4 * 4


@pytest.mark.parametrize("body", [b"", b"NOPE" + bytes(20), b"LTKR\x02\x00\x00\x00\x02\x00\x00\x00{}"])
def test_malformed_binary(body):
    with pytest.raises(WireFormatError):
        decode_result_binary(body)


def test_malformed_json():
    with pytest.raises(WireFormatError):
        decode_result_json({"rows": 1, "topk": 512, "written": [], "result": {"counts": [1, 2]}})


def test_service_and_wire_agree_on_dtype_names():
    assert set(DTypeName.__args__) == set(DTYPES)


# ------------------------------------------------------------------- one request, two transports


def _body(**changes) -> dict:
    ref = {"region": "r0123", "generation": 1, "offset": 0, "dtype": "uint8", "shape": [4, 64, 64]}
    body = {
        "q_fp4": ref,
        "q_scale": ref,
        "kv_cache": ref,
        "weights": {**ref, "dtype": "float32"},
        "block_table": {"dtype": "int32", "shape": [1, 2], "data": [0, 1]},
        "row_to_batch": ref,
        "starts": ref,
        "ends": ref,
        "topk": 512,
    }
    body.update(changes)
    return body


_CASES = [
    ("plain", _body(), True),
    (
        "out regions",
        _body(out={"values": {"region": "r9", "generation": 2, "dtype": "float32", "shape": [4, 512]}}),
        True,
    ),
    ("unknown field", _body(extra=1), False),
    ("a string for an int", _body(topk="512"), False),
    ("six dims", _body(q_fp4={"region": "r", "generation": 1, "dtype": "uint8", "shape": [1] * 6}), False),
    ("generation 0", _body(q_fp4={"region": "r", "generation": 0, "dtype": "uint8", "shape": [1]}), False),
    (
        "a region id with a slash",
        _body(q_fp4={"region": "a/b", "generation": 1, "dtype": "uint8", "shape": [1]}),
        False,
    ),
    ("inline past the cap", _body(starts={"dtype": "int32", "shape": [2**16 + 1], "data": [0] * (2**16 + 1)}), False),
    ("an unknown dtype", _body(q_fp4={"region": "r", "generation": 1, "dtype": "int8", "shape": [1]}), False),
    ("an unknown backend", _body(backend="cuda"), False),
]


@pytest.mark.parametrize("case, body, valid", _CASES)
def test_http_and_ipc_validate_a_request_alike(case, body, valid):
    """The HTTP model (service/schemas.py) and the IPC frame's type (service/wire.py) accept and refuse
    the same requests (the IPC decodes msgpack, where an int is never a string)."""
    import msgspec
    from pydantic import ValidationError

    from litetopk.service.schemas import TopKRequest as HttpRequest
    from litetopk.service.topk import from_model
    from litetopk.service.wire import TopKRequest as IpcRequest

    try:
        model = HttpRequest.model_validate_json(json.dumps(body))
        http_ok = True
    except ValidationError:
        http_ok = False
    try:
        frame = msgspec.msgpack.decode(msgspec.msgpack.encode(body), type=IpcRequest)
        ipc_ok = True
    except msgspec.ValidationError:
        ipc_ok = False
    assert (http_ok, ipc_ok) == (valid, valid), case
    if valid:
        assert from_model(model) == frame, f"{case}: HTTP's request reaches the request layer as IPC's does"


@pytest.mark.parametrize(
    "case, body, valid",
    [
        *_CASES,
        ("an integer written 512.0", _body(topk=512.0), True),
        (
            "a dim written 4.0",
            _body(q_fp4={"region": "r", "generation": 1, "dtype": "uint8", "shape": [4.0, 64, 64]}),
            True,
        ),
        ("a fraction for an int", _body(topk=512.5), False),
        (
            "region slice metadata without its dtype",
            _body(starts={"region": "r", "generation": 1, "shape": [4]}),
            False,
        ),
        ("inline data with a region", _body(starts={"shape": [1], "data": [0], "region": "r"}), False),
    ],
)
def test_the_route_parses_a_body_as_the_http_model(case, body, valid):
    """/v1/topk validates a body as written first (schemas.TopKFields, then msgspec into the wire's
    type), and only when that refuses it as schemas.TopKRequest: the same requests are accepted, as
    the same request, and the same are refused, with the model's errors."""
    from pydantic import ValidationError

    from litetopk.service.routes.topk import validate_body
    from litetopk.service.schemas import TopKRequest as HttpRequest
    from litetopk.service.topk import from_model

    raw = json.dumps(body).encode()
    parsed = validate_body(raw)
    try:
        model = HttpRequest.model_validate_json(raw)
    except ValidationError as exc:
        assert not valid and isinstance(parsed, list) and parsed, case
        assert [e["type"] for e in parsed] == [e["type"] for e in exc.errors()][: len(parsed)], case
        return
    assert valid and not isinstance(parsed, list), case
    assert parsed == from_model(model), f"{case}: the route's request is the model's"
