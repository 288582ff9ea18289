"""Property-based requests over the whole OpenAPI (schemathesis), authenticated, over TCP and over
the Unix socket: every check (no 5xx, statuses, content types, response schemas, Allow headers,
schema-valid requests accepted, schema-invalid ones refused), and most requests reach the handlers
(the 401s of each operation are counted: none may be left once the token is sent).

The schema is the app's own (built in-process at collection, checked equal to the live
/openapi.json); the requests go to the shared live service: EXAMPLES per operation and transport.
A schema-valid request may still name what cannot exist (a region id, a ticket, a CUDA handle: the
schema cannot know them); those answers are 404, or for a registration 422 with one of
UNKNOWABLE's codes, and only those are let through the "schema-valid request accepted" check.
"""

from __future__ import annotations

import collections

import httpx
import jsonschema_rs
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.errors import FailureGroup

from litetopk.service import ServiceSettings, create_app

#: Examples per operation and transport (plus the coverage phase's cases over TCP).
EXAMPLES = 25
SPEC = create_app(ServiceSettings(uds="", warmup=False)).openapi()
schema = schemathesis.openapi.from_dict(SPEC)
# Over the socket without the coverage phase: its boundary cases (65,536-value inline arrays among them,
# ~1 min for /v1/topk on 2 cores) do not depend on the transport and run once, over TCP.
socket_schema = schemathesis.openapi.from_dict(SPEC)
socket_schema.config.phases.update(phases=["examples", "fuzzing"])
#: Registration answers a schema cannot rule out: a ticket nobody handed over, a handle that does not
#: open here, a GPU this service does not own, an owner pid of no live process.
UNKNOWABLE = {
    "POST /v1/regions": {
        "unknown_ticket",
        "foreign_device",
        "ipc_unavailable",
        "validation_error",
        "foreign_pid_namespace",
    }
}


def test_live_schema_is_the_tested_schema(service):
    assert httpx.get(f"{service.url}/openapi.json").json() == SPEC


def _schema_refuses(case) -> bool:
    """Whether the published schema itself refuses the case's body (then a 422 is the right answer,
    whatever the case was generated as)."""
    operation = SPEC["paths"][case.path][case.method.lower()]
    body_schema = operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
    if body_schema is None or not isinstance(case.body, (dict, list)):
        return False
    validator = jsonschema_rs.Draft202012Validator({**body_schema, "components": SPEC["components"]})
    return not validator.is_valid(case.body)


def _tolerated(failure, case, response) -> bool:
    if getattr(failure, "code", None) != "ST202" or response.status_code != 422:
        return False
    try:
        code = response.json().get("code")
    except ValueError:
        return False
    return code in UNKNOWABLE.get(f"{case.method} {case.path}", ()) or (
        code == "validation_error" and _schema_refuses(case)
    )


@pytest.fixture
def statuses(request):
    """The statuses of one operation's examples; after the last one, the 401s must be none."""
    seen: collections.Counter = collections.Counter()
    yield seen
    total = sum(seen.values())
    assert total and seen[401] == 0, f"{seen[401]} of {total} authenticated requests answered 401: {dict(seen)}"


def _send(case, client: httpx.Client, headers: dict) -> httpx.Response:
    kwargs = case.as_transport_kwargs(base_url=str(client.base_url), headers=headers)
    kwargs.pop("cookies", None)
    body = {k: kwargs.pop(k) for k in ("json", "data", "content") if k in kwargs}
    if "data" in body and not isinstance(body["data"], (bytes, str)):
        body = {"data": body["data"]}
    elif "data" in body:
        body = {"content": body["data"]}
    return client.request(
        kwargs.pop("method"),
        kwargs.pop("url"),
        headers=kwargs.pop("headers", None),
        params=kwargs.pop("params", None),
        **body,
    )


def _check(case, response: httpx.Response, statuses) -> None:
    statuses[response.status_code] += 1
    try:
        case.validate_response(response)
    except FailureGroup as group:
        left = [f for f in group.exceptions if not _tolerated(f, case, response)]
        if left:
            raise FailureGroup(left, group.message) from None


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_every_check_passes_over_tcp_with_the_token(case, service, statuses):
    with httpx.Client(base_url=service.url, timeout=30) as client:
        _check(case, _send(case, client, service.auth), statuses)


@socket_schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_every_check_passes_over_the_unix_socket(case, service, statuses):
    with httpx.Client(base_url="http://litetopk", transport=httpx.HTTPTransport(uds=service.uds), timeout=30) as client:
        _check(case, _send(case, client, {}), statuses)
