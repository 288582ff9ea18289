"""ASGI middleware around every route: the request-size limit and the request metrics.

`RequestGuard` answers 413 `payload_too_large` for a Content-Length above the limit before the
route runs, counts streamed bodies (chunked uploads) against the same limit, and records
`litetopk_requests_total{route,method,code}` and `litetopk_request_seconds{route}` (route = the
route's path template, so ids in paths do not explode the label set).
"""

from __future__ import annotations

import time

from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import ServiceError, problem_response
from .metrics import ServiceMetrics

LARGE_BODY_PATHS = ("/v1/topk",)  # the routes whose bodies may reach max_request_bytes (inline metadata)
SMALL_BODY_MAX_BYTES = 64 * 2**10  # every other body (registrations) is small: parsed on the event loop


class _TooLarge(StarletteHTTPException):
    """Raised from `receive` mid-body; the route's body parsing re-raises it, errors.py maps 413."""

    def __init__(self, limit: int):
        super().__init__(413, f"the streamed body went past the limit of {limit} bytes")


class RequestGuard:
    def __init__(self, app: ASGIApp, *, max_request_bytes: int, metrics: ServiceMetrics):
        self.app = app
        self.max_bytes = max_request_bytes
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = {"code": 500}
        state = scope.setdefault("state", {})
        state["started"] = started  # the routes' Server-Timing counts from here (body read + parsing)

        async def send_tracking(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        limit = self.max_bytes if scope.get("path") in LARGE_BODY_PATHS else min(self.max_bytes, SMALL_BODY_MAX_BYTES)
        too_large = self._declared_too_large(scope, limit)
        try:
            if too_large:
                await self._refuse(scope, send_tracking, state, f"the body declares {too_large} bytes", limit)
            else:
                await self.app(scope, self._counting(receive, limit), send_tracking)
        except Exception:
            state.setdefault("problem_code", "internal_error")
            raise
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            code = state.get("problem_code") or ("ok" if status["code"] < 400 else str(status["code"]))
            self.metrics.requests.labels(route, scope["method"], code).inc()
            self.metrics.latency.labels(route).observe(time.perf_counter() - started)

    @staticmethod
    def _declared_too_large(scope: Scope, limit: int) -> int:
        for key, value in scope["headers"]:
            if key == b"content-length":
                try:
                    size = int(value)
                except ValueError:
                    return 0
                return size if size > limit else 0
        return 0

    @staticmethod
    def _counting(receive: Receive, limit: int) -> Receive:
        seen = 0

        async def wrapped() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise _TooLarge(limit)
            return message

        return wrapped

    async def _refuse(self, scope: Scope, send: Send, state: dict, why: str, limit: int) -> None:
        state["problem_code"] = "payload_too_large"
        error = ServiceError(
            "payload_too_large",
            f"{why}; the limit is {limit} bytes (register large tensors as regions instead of sending them)",
        )
        response = problem_response(error, scope.get("path", ""))
        await response(scope, _no_receive, send)


async def _no_receive() -> Message:
    return {"type": "http.disconnect"}


__all__ = ["RequestGuard"]
