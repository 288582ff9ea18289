"""The one place where failures become RFC 9457 problem+json with a stable `code`.

    ServiceError                      raised by the service itself, with one of CODES (service/wire.py)
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
    UnsupportedTopKError,
)
from litetopk.kernels.errors import LiteTopKError
from litetopk.kernels.status import describe

from .wire import CODES, ROW_FLAG_CODES, problem_body

log = logging.getLogger("litetopk.service")

PROBLEM_JSON = "application/problem+json"


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
    for bit, code in ROW_FLAG_CODES:
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
    body = problem_body(error.code, error.detail, instance, **error.extensions)
    return JSONResponse(body, status_code=body["status"], headers=error.headers, media_type=PROBLEM_JSON)


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
                methods |= _methods_matching(included.routes, {**scope, "path": path[len(prefix) :] or "/"})
            continue
        match, _ = route.matches(scope)
        if match != Match.NONE and getattr(route, "methods", None):
            methods |= set(route.methods)
    return methods


def install_error_handlers(app: FastAPI) -> None:
    """Route every failure of every route through `as_service_error` and `problem_response`."""

    async def on_validation(request: Request, exc: RequestValidationError):
        errors = [
            {"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))}
            for e in exc.errors()
        ]
        first = errors[0] if errors else {"loc": [], "msg": "invalid request"}
        where = ".".join(str(x) for x in first["loc"])
        code = "invalid_json" if any(e["type"] == "json_invalid" for e in errors) else "validation_error"
        return _respond(request, ServiceError(code, f"{where}: {first['msg']}", errors=errors))

    async def on_http(request: Request, exc: StarletteHTTPException):
        code = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}.get(
            exc.status_code, "http_error"
        )
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


__all__ = [
    "CODES",
    "PROBLEM_JSON",
    "ServiceError",
    "as_service_error",
    "install_error_handlers",
    "problem_response",
    "row_fault_code",
]
