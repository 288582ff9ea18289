"""The errors of `litetopk.clients`, as one tree.

    TopKClientError                       base of everything the clients raise on purpose
    ├── TransportError                    the service could not be reached or the connection
    │                                     broke (from httpx.TransportError)
    ├── ProtocolError                     the service answered something that is not this API
    │                                     (an unreadable result body, a problem without code)
    └── ServiceProblem                    the service answered RFC 9457 problem+json; `.code`,
        │                                 `.status`, `.detail`, `.problem` (the whole body)
        ├── RegionProblem                 unknown_region, stale_region, out_of_bounds,
        │                                 misaligned_offset, shm_unavailable, unsealed_memory,
        │                                 unknown_ticket, read_only_region, output_aliases_input,
        │                                 foreign_device, ipc_unavailable, foreign_pid_namespace,
        │                                 region_quota_exceeded
        ├── AuthenticationProblem         unauthenticated (401: TCP without the bearer token)
        ├── InvalidRequestProblem         bad_dtype, bad_shape, unsupported_topk,
        │                                 invalid_input, validation_error, invalid_json, invalid_frame,
        │                                 payload_too_large,
        │                                 backend_unavailable, not_found, method_not_allowed
        ├── RowFaultProblem               invalid_row, invalid_page, slot_overflow, nonfinite_score,
        │   (also kernels.RowFaultError)  unsupported_data, selector_failure; `.rows`, `.flags`
        ├── UnavailableProblem            overloaded (429), not_ready, shutting_down, fd_exhausted (503);
        │                                 `.retry_after` seconds
        ├── TimeoutProblem                timeout (504)
        └── DeviceProblem                 device_error, internal_error

`RowFaultProblem` is also a `litetopk.kernels.RowFaultError`, so code written against the in-process
operator (`result.raise_for_status()`) catches row faults from the service unchanged.
"""

from __future__ import annotations

from litetopk.kernels import RowFaultError
from litetopk.kernels.status import RowStatus


class TopKClientError(Exception):
    """Base class of every error `litetopk.clients` raises on purpose."""


class TransportError(TopKClientError):
    """The service could not be reached, or the connection broke mid-request."""


class ProtocolError(TopKClientError):
    """The answer does not follow the litetopk API."""


class ServiceProblem(TopKClientError):
    """An RFC 9457 problem answered by the service; dispatch on `.code`."""

    def __init__(self, problem: dict, status: int):
        self.problem = problem
        self.code = str(problem.get("code", "unknown"))
        self.status = status
        self.detail = str(problem.get("detail", ""))
        Exception.__init__(self, f"[{self.code}] {self.detail}")  # not super(): RowFaultProblem mixes in RowFaultError


class RegionProblem(ServiceProblem):
    """A region named by the request is unknown, stale, too small, or cannot be opened."""


class AuthenticationProblem(ServiceProblem):
    """TCP without the service's bearer token (or a wrong one): region operations are refused."""


class InvalidRequestProblem(ServiceProblem):
    """The request itself is malformed (dtype, shape, topk, size, schema)."""


class RowFaultProblem(ServiceProblem, RowFaultError):
    """Rows of the request cannot be answered; `.rows` and `.flags` (RowStatus bits) name them."""

    def __init__(self, problem: dict, status: int):
        ServiceProblem.__init__(self, problem, status)
        self.rows = [int(r) for r in problem.get("rows", [])]
        self.flags = [_parse_flags(f) for f in problem.get("row_flags", [])]


class UnavailableProblem(ServiceProblem):
    """The service cannot take the request now; retry after `.retry_after` seconds."""

    def __init__(self, problem: dict, status: int, retry_after: float | None = None):
        super().__init__(problem, status)
        self.retry_after = retry_after


class TimeoutProblem(ServiceProblem):
    """The request did not finish within the service's request timeout."""


class DeviceProblem(ServiceProblem):
    """The device (or the service itself) failed."""


_CLASSES: dict[str, type[ServiceProblem]] = {}
for _cls, _codes in (
    (
        RegionProblem,
        "unknown_region stale_region out_of_bounds misaligned_offset shm_unavailable unsealed_memory "
        "unknown_ticket read_only_region output_aliases_input foreign_device ipc_unavailable "
        "foreign_pid_namespace region_quota_exceeded",
    ),
    (AuthenticationProblem, "unauthenticated"),
    (
        InvalidRequestProblem,
        "bad_dtype bad_shape unsupported_topk invalid_input validation_error "
        "invalid_json invalid_frame "
        "payload_too_large backend_unavailable not_found method_not_allowed http_error",
    ),
    (RowFaultProblem, "invalid_row invalid_page slot_overflow nonfinite_score unsupported_data selector_failure"),
    (UnavailableProblem, "overloaded not_ready shutting_down fd_exhausted"),
    (TimeoutProblem, "timeout"),
    (DeviceProblem, "device_error internal_error"),
):
    for _code in _codes.split():
        _CLASSES[_code] = _cls


def _parse_flags(text: str) -> int:
    flags = 0
    for name in str(text).split("|"):
        if name in RowStatus.__members__:
            flags |= int(RowStatus[name])
    return flags


def problem_error(problem: dict, status: int, retry_after: str | None = None) -> ServiceProblem:
    """The typed exception for a problem body (ServiceProblem itself for a code this client does not know)."""
    cls = _CLASSES.get(str(problem.get("code")), ServiceProblem)
    if cls is UnavailableProblem:
        seconds = float(retry_after) if retry_after and retry_after.replace(".", "", 1).isdigit() else None
        return UnavailableProblem(problem, status, seconds)
    return cls(problem, status)


__all__ = [
    "AuthenticationProblem",
    "DeviceProblem",
    "InvalidRequestProblem",
    "ProtocolError",
    "RegionProblem",
    "RowFaultProblem",
    "ServiceProblem",
    "TimeoutProblem",
    "TopKClientError",
    "TransportError",
    "UnavailableProblem",
    "problem_error",
]
