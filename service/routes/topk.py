"""/v1/topk over HTTP: parse the body, hand it to the request's life (service/topk.py), encode.

parse                the body (JSON + pydantic, strict); bodies above PARSE_ON_LOOP_MAX_BYTES
                     are validated in the parser process (service/body_parser.py): pydantic
                     holds the GIL while it parses, so a thread would stall the loop too
admit, execute       service/topk.py (the same for the IPC channel). A body of at most
                     KEPT_BODY_MAX_BYTES is admitted through its uid's kept admissions
                     (service/topk.py UidAdmissions, keyed by the body's bytes, as the IPC
                     channel keys a connection's by the frame's): an engine sends the same
                     body every step, which is then neither parsed nor admitted again
answer (event loop)  JSON for small results, binary (service/wire.py) for large ones
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

import msgspec
from fastapi import APIRouter, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from ..body_parser import BodyParser
from ..errors import PROBLEM_JSON
from ..principals import Principal, principal_of
from ..schemas import Problem, TopKFields, TopKJsonResponse, TopKRequest
from ..state import ServiceState
from ..topk import Admitted, Outcome, admit, call_topk, from_model, phase_durations
from ..wire import BINARY_MEDIA_TYPE, JSON_MEDIA_TYPE, encode_result_json, encode_result_prefix
from ..wire import TopKRequest as WireTopKRequest

_PROBLEMS = {
    s: {"model": Problem, "content": {PROBLEM_JSON: {}}} for s in (400, 401, 404, 409, 413, 422, 429, 500, 503, 504)
}
# The request body's schema (the route parses the body itself, see `admit_request`).
_BODY = {
    "requestBody": {
        "required": True,
        "content": {JSON_MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/TopKRequest"}}},
    }
}
PARSE_ON_LOOP_MAX_BYTES = 64 * 2**10
# Bodies up to this size are the keys of their uid's kept admissions (a decode request naming its tensors by
# region: ~1-2 KB); larger ones carry inline metadata and are parsed and admitted every time.
KEPT_BODY_MAX_BYTES = 16 * 2**10
_OK = {"model": TopKJsonResponse, "content": {BINARY_MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}}}}


@contextlib.asynccontextmanager
async def _body_parser_running(app):
    """The router's lifespan (merged into the app's): the body parser process lives as long as the
    service, started before any request so that no request pays for its start."""
    await asyncio.to_thread(BODY_PARSER.start)
    try:
        yield
    finally:
        await asyncio.to_thread(BODY_PARSER.close)


router = APIRouter(prefix="/v1", tags=["topk"], responses=_PROBLEMS, lifespan=_body_parser_running)

# ------------------------------------------------------------------------------------ answer


def _wants_binary(request: Request, nbytes: int, limit: int) -> bool:
    accept = request.headers.get("accept", "")
    binary = BINARY_MEDIA_TYPE in accept
    json_ok = not accept or JSON_MEDIA_TYPE in accept or "*/*" in accept or "application/*" in accept
    return binary and (not json_ok or nbytes > limit)


def _encode(outcome: Outcome, binary: bool) -> Response:
    if binary:
        prefix = encode_result_prefix(outcome.entries, outcome.rows, outcome.topk, outcome.written)
        return Response(b"".join((prefix, outcome.buffer)), media_type=BINARY_MEDIA_TYPE)
    doc = encode_result_json(outcome.fields(), outcome.rows, outcome.topk, outcome.written)
    return Response(json.dumps(doc, separators=(",", ":"), allow_nan=False), media_type=JSON_MEDIA_TYPE)


VALIDATION_ERRORS_MAX = 32  # errors reported for one body (a 16 MiB body could hold millions)


def validate_body(body: bytes) -> WireTopKRequest | list[dict]:
    """The body as the request layer's TopKRequest (service/wire.py), validated strictly as the
    HTTP model (schemas.TopKRequest), or the model's first VALIDATION_ERRORS_MAX errors (loc, msg, type).

    A body is validated first as written (schemas.TopKFields: pydantic-core alone, ~25 us for a
    decode request) and then decoded into the wire's type (msgspec, ~10 us); refused so, it is
    validated as TopKRequest (numbers written `3.0` taken as integers, a Python pass over the body)
    and converted (`from_model`), or answered with that model's errors."""
    try:
        TopKFields.model_validate_json(body)
        return msgspec.json.decode(body, type=WireTopKRequest)
    except (ValidationError, msgspec.MsgspecError):
        pass
    try:
        model = TopKRequest.model_validate_json(body)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False, include_context=False)[:VALIDATION_ERRORS_MAX]
        return [{"loc": ("body", *e["loc"]), "msg": e["msg"], "type": e["type"]} for e in errors]
    return from_model(model)


BODY_PARSER = BodyParser(validate_body)


def _valid_or_raise(parsed: WireTopKRequest | list[dict]) -> WireTopKRequest:
    """validate_body's request, or its errors raised (422 validation_error)."""
    if isinstance(parsed, list):
        raise RequestValidationError(parsed)
    return parsed


async def admit_request(request: Request, state: ServiceState, principal: Principal, marks: list) -> Admitted:
    """The request's admission (service/topk.py `admit`) from its body (strict, `validate_body`), marking the
    phases `parse` and `admit`. A body of at most KEPT_BODY_MAX_BYTES is looked up in its uid's kept
    admissions first (module docstring: when found and its regions are live, it is neither parsed nor checked
    again); a body larger than PARSE_ON_LOOP_MAX_BYTES is parsed in the parser process, so that /livez answers
    while it is parsed."""
    body = await request.body()
    if len(body) > KEPT_BODY_MAX_BYTES:
        parsed = await BODY_PARSER.parse(body) if len(body) > PARSE_ON_LOOP_MAX_BYTES else validate_body(body)
        req = _valid_or_raise(parsed)
        marks.append(("parse", time.perf_counter()))
        admitted = admit(req, state, principal.uid)
    else:
        parse_mark = []  # set when the body is parsed (not kept)

        def parsed_body() -> WireTopKRequest:
            req = _valid_or_raise(validate_body(body))
            parse_mark.append(("parse", time.perf_counter()))
            return req

        admitted = state.http_admissions.admit(state, principal.uid, body, parsed_body)
        marks.append(parse_mark[0] if parse_mark else ("parse", time.perf_counter()))  # kept: read and looked up
    marks.append(("admit", time.perf_counter()))
    return admitted


@router.post(
    "/topk",
    summary="Top-k index selection (litetopk_prefill) on the pinned device",
    responses={200: _OK},
    openapi_extra=_BODY,
)
async def topk(request: Request) -> Response:
    """Answers the K best keys of every query row (CONTRACT.md §1-§3).

    Results named in `out` are written into those regions (zero copy) and left out of the body;
    the rest come back as JSON, or as `application/vnd.litetopk.result` when the client accepts
    it and the result is large. Rows at fault fail the request (`invalid_row`, `invalid_page`,
    `nonfinite_score`), naming the rows; capacity events are repaired unless `repair` is false.
    """
    # the state and the principal without FastAPI's dependency solving (~0.1 ms a request on a 2-core host)
    state: ServiceState = request.app.state.service
    principal = principal_of(request, state)
    marks: list[tuple[str, float]] = []
    admitted = await admit_request(request, state, principal, marks)
    outcome = await call_topk(admitted, state, marks)
    binary = _wants_binary(request, len(outcome.buffer), state.settings.json_result_max_bytes)
    if len(outcome.buffer) > 2**20:  # large bodies are encoded off the event loop
        response = await asyncio.to_thread(_encode, outcome, binary)
    else:
        response = _encode(outcome, binary)
    marks.append(("encode", time.perf_counter()))
    response.headers["server-timing"] = server_timing(request.scope.get("state", {}).get("started"), marks)
    return response


def server_timing(started: float | None, marks: list[tuple[str, float]]) -> str:
    """`Server-Timing` of the phases in `marks` (service/topk.py phase_durations), durations in ms."""
    return ", ".join(f"{name};dur={ms:.3f}" for name, ms in phase_durations(started, marks).items())
