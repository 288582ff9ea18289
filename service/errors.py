"""The one place where failures become RFC 9457 problem+json with a stable `code`.

    ServiceError                      raised by the service itself, with one of CODES
    litetopk.kernels errors           translated here (kernels/errors.py draws that tree):
        UnsupportedTopKError      ->  unsupported_topk
        InputDtypeError           ->  bad_dtype
        InputShapeError           ->  bad_shape
        InputError                ->  invalid_input (layout, device, range)
        RowFaultError             ->  invalid_row | invalid_page | nonfinite_score | selector_failure
                                      (the worst flag of the failing rows; every row is named)
        BackendUnavailableError   ->  backend_unavailable
        DeviceError               ->  device_error
    fastapi RequestValidationError -> validation_error (pydantic's list in `errors`), or
                                      invalid_json (400) when the body is not JSON at all
    starlette HTTPException        -> not_found | method_not_allowed | http_error
    anything else                  -> internal_error (logged with its traceback: a bug)

Body: {"type", "title", "status", "detail", "instance", "code", ...extensions}; the extensions are
`rows` / `row_flags` for row faults, `errors` for validation, `retry_after` for 429/503.
The codes are part of the API: clients dispatch on them (litetopk.clients.errors).
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from litetopk.kernels import (
    BackendUnavailableError,
    DeviceError,
    InputDtypeError,
    InputError,
    InputShapeError,
    RowFaultError,
    RowStatus,
    UnsupportedTopKError,
)
from litetopk.kernels.errors import LiteTopKError
from litetopk.kernels.status import describe

log = logging.getLogger("litetopk.service")

PROBLEM_JSON = "application/problem+json"

#: code -> (HTTP status, title). Stable: add codes, never rename them.
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
    # request contents
    "bad_dtype": (422, "A tensor has the wrong dtype"),
    "bad_shape": (422, "A tensor has the wrong shape"),
    "unsupported_topk": (422, "topk is not supported"),
    "slot_overflow": (422, "A physical slot does not fit int32"),
    "invalid_input": (422, "The operator refused the inputs"),
    "validation_error": (422, "The request body does not match the schema"),
    "invalid_json": (400, "The request body is not JSON"),
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
    "timeout": (504, "The request did not finish within the request timeout"),
    "payload_too_large": (413, "The request body is larger than the limit"),
    "device_error": (500, "The device failed"),
    "not_found": (404, "No such route"),
    "method_not_allowed": (405, "Method not allowed on this route"),
    "http_error": (400, "Bad HTTP request"),
    "internal_error": (500, "Internal error (a bug: please report it)"),
}

#: Row-fault flags, worst first: the code of a row-fault problem is the first flag any row has.
_ROW_FLAG_CODES = (
    (RowStatus.INVALID_ROW, "invalid_row"),
    (RowStatus.INVALID_PAGE, "invalid_page"),
    (RowStatus.SLOT_OVERFLOW, "slot_overflow"),
    (RowStatus.NONFINITE, "nonfinite_score"),
    (RowStatus.UNSUPPORTED, "unsupported_data"),
    (RowStatus.SELECTOR_FAILURE, "selector_failure"),
)


class ServiceError(Exception):
    """A failure the service raises itself; `code` is one of CODES."""

    def __init__(self, code: str, detail: str, *, headers: dict[str, str] | None = None, **extensions):
        if code not in CODES:
            raise KeyError(f"unknown problem code {code!r}")
        super().__init__(detail)
        self.code = code
        self.detail = detail
        self.headers = headers or {}
        self.extensions = extensions


def row_fault_code(flags: list[int]) -> str:
    """The code of a row-fault problem: the worst flag present among `flags`."""
    seen = 0
    for f in flags:
        seen |= f
    for bit, code in _ROW_FLAG_CODES:
        if seen & bit:
            return code
    return "selector_failure"


def as_service_error(exc: BaseException) -> ServiceError:
    """Translate any exception into a ServiceError (the mapping in the module docstring)."""
    if isinstance(exc, ServiceError):
        return exc
    if isinstance(exc, UnsupportedTopKError):
        return ServiceError("unsupported_topk", str(exc))
    if isinstance(exc, InputDtypeError):
        return ServiceError("bad_dtype", str(exc))
    if isinstance(exc, InputShapeError):
        return ServiceError("bad_shape", str(exc))
    if isinstance(exc, InputError):
        return ServiceError("invalid_input", str(exc))
    if isinstance(exc, RowFaultError):
        names = [describe(f) for f in exc.flags]
        return ServiceError(row_fault_code(exc.flags), str(exc), rows=exc.rows, row_flags=names)
    if isinstance(exc, BackendUnavailableError):
        return ServiceError("backend_unavailable", str(exc))
    if isinstance(exc, DeviceError):
        return ServiceError("device_error", str(exc))
    log.error("unexpected failure", exc_info=exc)
    return ServiceError("internal_error", f"{type(exc).__name__}: {exc}")


def problem_response(error: ServiceError, instance: str) -> JSONResponse:
    status, title = CODES[error.code]
    body = {"type": f"urn:litetopk:problem:{error.code}", "title": title, "status": status,
            "detail": error.detail, "instance": instance, "code": error.code, **error.extensions}
    return JSONResponse(body, status_code=status, headers=error.headers, media_type=PROBLEM_JSON)


def _respond(request: Request, error: ServiceError) -> JSONResponse:
    request.state.problem_code = error.code  # read by the metrics middleware
    return problem_response(error, request.url.path)


def _allowed_methods(request: Request) -> set[str]:
    """Methods of every route whose path matches the request's (for the 405's Allow header)."""
    return _methods_matching(request.app.router.routes, {**request.scope, "method": "GET"})


def _methods_matching(routes, scope: dict) -> set[str]:
    methods: set[str] = set()
    for route in routes:
        included = getattr(route, "original_router", None)  # FastAPI wraps included routers
        if included is not None:
            prefix = route.include_context.prefix
            path = scope["path"]
            if path.startswith(prefix):
                methods |= _methods_matching(included.routes, {**scope, "path": path[len(prefix):] or "/"})
            continue
        match, _ = route.matches(scope)
        if match != Match.NONE and getattr(route, "methods", None):
            methods |= set(route.methods)
    return methods


def install_error_handlers(app: FastAPI) -> None:
    """Route every failure of every route through `as_service_error` and `problem_response`."""

    async def on_validation(request: Request, exc: RequestValidationError):
        errors = [{"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))}
                  for e in exc.errors()]
        first = errors[0] if errors else {"loc": [], "msg": "invalid request"}
        where = ".".join(str(x) for x in first["loc"])
        code = "invalid_json" if any(e["type"] == "json_invalid" for e in errors) else "validation_error"
        return _respond(request, ServiceError(code, f"{where}: {first['msg']}", errors=errors))

    async def on_http(request: Request, exc: StarletteHTTPException):
        code = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}.get(exc.status_code, "http_error")
        headers = dict(exc.headers or {})
        if exc.status_code == 405:  # Starlette names only the first matching route's methods
            headers["Allow"] = ", ".join(sorted(_allowed_methods(request)))
        return _respond(request, ServiceError(code, str(exc.detail), headers=headers))

    async def on_any(request: Request, exc: Exception):
        return _respond(request, as_service_error(exc))

    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(ServiceError, on_any)
    app.add_exception_handler(LiteTopKError, on_any)
    app.add_exception_handler(Exception, on_any)  # a bug: answered with a code, logged, re-raised by Starlette


__all__ = ["CODES", "PROBLEM_JSON", "ServiceError", "as_service_error", "install_error_handlers",
           "problem_response", "row_fault_code"]
