"""Every problem code (service/errors.py CODES) is reached by a test: over HTTP against a live
service where a CPU service can produce it, else through the one mapping function in-process."""

from __future__ import annotations

import base64
import json
import os
import uuid
from pathlib import Path

import httpx
import pytest
import torch

from litetopk.clients import InvalidRequestProblem, RegionProblem, RowFaultProblem, TopKClient
from litetopk.clients.transport import Endpoint, StdlibTransport
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
from litetopk.kernels.aiter_layout import aiter_pages_from_litetopk
from litetopk.service import CODES
from litetopk.service.errors import as_service_error, row_fault_code
from tests.problems import make_problem

#: Where each code is reached: over HTTP against a live CPU service, or (for codes a CPU service
#: cannot produce) through the mapping function in-process, or on a GPU (marked tests).
COVERED_BY = {
    "unknown_region": "test_unknown_region",
    "region_quota_exceeded": "tests/service/test_resources.py::test_region_quota_per_principal",
    "fd_exhausted": "tests/service/test_resources.py::test_parked_fds_leave_headroom_and_exhaustion_is_answered",
    "invalid_frame": "tests/service/test_ipc.py::test_bad_frames_get_problem_answers",
    "stale_region": "test_stale_region_after_unregister",
    "out_of_bounds": "test_tensor_reference_checks",
    "misaligned_offset": "test_tensor_reference_checks",
    "shm_unavailable": "test_shm_unavailable",
    "unsealed_memory": "test_unsealed_memory",
    "unknown_ticket": "test_unknown_ticket",
    "read_only_region": "test_output_access_rules",
    "output_aliases_input": "test_output_access_rules",
    "invalid_json": "test_validation_error_lists_pydantic_errors",
    "unauthenticated": "test_tcp_without_token_is_unauthenticated",
    "foreign_device": "test_foreign_device",
    "ipc_unavailable": "tests/service/test_gpu.py::test_raw_handle_that_does_not_open (GPU only)",
    "foreign_pid_namespace": "test_owner_pid_from_another_pid_namespace_is_refused",
    "bad_dtype": "test_tensor_reference_checks",
    "bad_shape": "test_tensor_reference_checks",
    "unsupported_topk": "test_unsupported_topk",
    "slot_overflow": "test_mapping_of_foreign_errors (needs a cache of > 2^25 pages, 146 GB)",
    "invalid_input": "test_mapping_of_foreign_errors (the clients send contiguous tensors on one device)",
    "validation_error": "test_validation_error_lists_pydantic_errors",
    "backend_unavailable": "test_backend_unavailable",
    "invalid_row": "test_row_faults_name_the_rows",
    "invalid_page": "test_row_faults_name_the_rows",
    "nonfinite_score": "test_row_faults_name_the_rows",
    "unsupported_data": "test_row_fault_code_prefers_the_worst_flag (the triton backend's UNSUPPORTED bit)",
    "selector_failure": "test_mapping_of_foreign_errors (the reference selector always certifies)",
    "overloaded": "tests/service/test_operations.py::test_overload_answers_429_and_finishes_queued_work",
    "not_ready": "tests/service/test_operations.py::test_not_ready_until_warm_up_then_graceful_shutdown",
    "shutting_down": "tests/service/test_executor.py::test_closed_executor_refuses_with_shutting_down",
    "timeout": "tests/service/test_operations.py::test_request_timeout",
    "payload_too_large": "test_payload_too_large",
    "device_error": "test_mapping_of_foreign_errors (needs a failing device)",
    "not_found": "test_not_found_and_method_not_allowed",
    "method_not_allowed": "test_not_found_and_method_not_allowed",
    "http_error": "test_http_error_mapping",
    "internal_error": "test_mapping_of_foreign_errors (a bug)",
}


@pytest.fixture(scope="module")
def problem():
    return make_problem(11, seq_lens=[700, 690], rows_per_seq=4)


@pytest.fixture(scope="module")
def client(service):
    with TopKClient(uds=service.uds) as c:
        yield c


@pytest.fixture(scope="module")
def http(service):
    with httpx.Client(base_url=service.url, headers=service.auth, timeout=30) as c:
        yield c


def body_for(client, p, **changes) -> dict:
    """A valid /v1/topk JSON body for problem `p` (large tensors registered), then `changes`."""
    regions = {n: client.register(getattr(p, n)) for n in ("q_fp4", "q_scale", "kv_cache", "weights")}
    body = {n: r.slice().to_wire() for n, r in regions.items()}
    for n in ("block_table", "row_to_batch", "starts", "ends"):
        t = getattr(p, n)
        body[n] = {"dtype": "int32", "shape": list(t.shape), "data": t.flatten().tolist()}
    body["topk"] = p.topk
    body.update(changes)
    return body


def assert_problem(response: httpx.Response, code: str, status: int | None = None) -> dict:
    assert response.headers["content-type"].startswith("application/problem+json"), response.text
    doc = response.json()
    assert doc["code"] == code, doc
    assert response.status_code == doc["status"] == (status or CODES[code][0]), doc
    assert {"type", "title", "status", "detail", "instance", "code"} <= set(doc), doc
    return doc


# ------------------------------------------------------------------------------ region codes


def test_unknown_region(http):
    assert_problem(http.get("/v1/regions/rdoesnotexist"), "unknown_region")


def test_stale_region_after_unregister(client, problem):
    region = client.register(problem.kv_cache)
    stale = region.slice()
    client.unregister(region)
    region.registered = True  # pretend the caller kept using it
    with pytest.raises(RegionProblem) as err:
        client.topk(problem.q_fp4, problem.q_scale, stale, *problem.args()[3:], topk=512)
    assert err.value.code == "stale_region"


def test_a_kept_http_admission_is_refused_once_its_region_is_gone(client, http, problem):
    """The same body again is admitted through its uid's kept admission (service/topk.py UidAdmissions; the mechanism:
    test_execute.py): answered as the first time while its regions live, `stale_region` once one is unregistered."""
    body = body_for(client, problem)
    raw = json.dumps(body).encode()
    answers = [http.post("/v1/topk", content=raw, headers={"content-type": "application/json"}) for _ in range(3)]
    assert [a.status_code for a in answers] == [200] * 3, answers[0].text
    assert answers[1].json() == answers[2].json() == answers[0].json()
    assert http.delete(f"/v1/regions/{body['weights']['region']}").status_code == 204
    doc = assert_problem(
        http.post("/v1/topk", content=raw, headers={"content-type": "application/json"}), "stale_region"
    )
    assert body["weights"]["region"] in doc["detail"], doc


def memfd_ticket(service, size=64, seal=True, memory=None):
    """(memory, ticket): a memfd (sealed against shrinking unless told not to) handed over."""
    import fcntl

    from litetopk.clients.memfd import hand_over_fd

    if memory is None:
        fd = os.memfd_create("test", os.MFD_ALLOW_SEALING)
        os.ftruncate(fd, size)
        if seal:
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
        memory = fd
    return memory, hand_over_fd(str(Path(service.uds).parent / "fds.sock"), memory)


def test_stale_generation_after_re_registration(client, http, problem, service):
    fd, ticket = memfd_ticket(service, size=problem.kv_cache.numel())
    first = http.post("/v1/regions", json={"kind": "memfd", "ticket": ticket, "size": problem.kv_cache.numel()}).json()
    _, ticket = memfd_ticket(service, memory=fd)
    again = http.post("/v1/regions", json={"kind": "memfd", "ticket": ticket, "size": problem.kv_cache.numel()})
    os.close(fd)
    region = client.register(problem.kv_cache)
    region.id, region.generation = first["id"], first["generation"]
    assert again.status_code == 201 and again.json()["id"] == region.id and again.json()["generation"] == 2
    body = body_for(client, problem, kv_cache=region.slice().to_wire())
    doc = assert_problem(http.post("/v1/topk", json=body), "stale_region")
    assert "generation 2" in doc["detail"]


@pytest.mark.parametrize(
    "field,change,code",
    [
        ("kv_cache", {"offset": 4352}, "out_of_bounds"),
        ("weights", {"offset": 2}, "misaligned_offset"),
        # dtypes and shapes of inputs: the operator's own check (InputDtypeError / InputShapeError)
        ("q_fp4", {"dtype": "int32", "shape": [8, 64, 16]}, "bad_dtype"),
        ("kv_cache", {"dtype": "int32", "shape": [1, 1088]}, "bad_dtype"),
        ("q_scale", {"shape": [8, 64, 2]}, "bad_shape"),
        ("weights", {"shape": [7, 64]}, "bad_shape"),
        ("kv_cache", {"shape": [2, 4351]}, "bad_shape"),
        ("ends", {"shape": [2, 4], "data": list(range(8))}, "bad_shape"),
    ],
)
def test_tensor_reference_checks(client, http, problem, field, change, code):
    body = body_for(client, problem)
    body[field] = {**body[field], **change}
    doc = assert_problem(http.post("/v1/topk", json=body), code)
    assert field in doc["detail"], doc


@pytest.fixture(scope="module")
def aiter_cache(client, problem):
    """The problem's cache in AITER's format, as two read-write regions: (values, scales) wire slices."""
    values, scales = aiter_pages_from_litetopk(problem.kv_cache)
    return client.register(values).slice().to_wire(), client.register(scales).slice().to_wire()


def _pages(ref: dict, pages: int) -> dict:
    return {**ref, "shape": [pages, *ref["shape"][1:]]}


@pytest.mark.parametrize(
    "case",
    [
        "ours-with-kv_scale",
        "page-counts-differ",
        "kv_scale-int32",
        "kv_scale-shape",
        "aiter-without-kv_scale",
        "kv_scale-out-of-bounds",
        "kv_scale-inline",
        "out-aliases-kv_scale",
    ],
)
def test_inconsistent_cache_formats_are_refused(client, http, problem, aiter_cache, case):
    """Both cache formats at the HTTP edge: every inconsistent pair is a 422 (409) with a code that
    says what to change, the service stays up, and the consistent pair answers."""
    values, scales = aiter_cache
    pages = problem.kv_cache.shape[0]
    body = body_for(client, problem, kv_cache=values, kv_scale=scales)
    code, says = {
        "ours-with-kv_scale": ("bad_shape", "takes no kv_scale"),
        "page-counts-differ": ("bad_shape", "one page per kv_cache page"),
        "kv_scale-int32": ("bad_dtype", "uint8"),
        "kv_scale-shape": ("bad_shape", "[num_pages, 1, 4, 64]"),
        "aiter-without-kv_scale": ("bad_shape", "send its scales as kv_scale"),
        "kv_scale-out-of-bounds": ("out_of_bounds", "kv_scale"),
        "kv_scale-inline": ("validation_error", "kv_scale"),
        "out-aliases-kv_scale": ("output_aliases_input", "out.counts"),
    }[case]
    if case == "ours-with-kv_scale":
        body["kv_cache"] = body_for(client, problem)["kv_cache"]
    elif case == "page-counts-differ":
        body["kv_scale"] = _pages(scales, pages - 1)
    elif case == "kv_scale-int32":
        body["kv_scale"] = {**scales, "dtype": "int32", "shape": [pages, 1, 4, 16]}
    elif case == "kv_scale-shape":
        body["kv_scale"] = {**scales, "shape": [pages, 1, 4, 32]}
    elif case == "aiter-without-kv_scale":
        del body["kv_scale"]
    elif case == "kv_scale-out-of-bounds":
        body["kv_scale"] = {**scales, "offset": 64}
    elif case == "kv_scale-inline":
        body["kv_scale"] = {"dtype": "int32", "shape": [1], "data": [0]}
    else:
        body["out"] = {"counts": {**scales, "dtype": "int32", "shape": [8]}}
    doc = assert_problem(http.post("/v1/topk", json=body), code)
    assert says in (doc["detail"] + json.dumps(doc.get("errors", ""))), doc
    assert http.get("/livez").status_code == 200
    consistent = body_for(client, problem, kv_cache=values, kv_scale=scales)
    assert http.post("/v1/topk", json=consistent).status_code == 200, "the consistent pair still answers"


def test_inline_length_must_match_shape(client, http, problem):
    body = body_for(client, problem)
    body["starts"] = {**body["starts"], "data": body["starts"]["data"][:-1]}
    assert "starts" in assert_problem(http.post("/v1/topk", json=body), "bad_shape")["detail"]


def test_output_region_checked(client, http, problem):
    small = client.register(torch.zeros(4, 512))
    body = body_for(client, problem, out={"values": small.slice().to_wire()})
    assert_problem(http.post("/v1/topk", json=body), "bad_shape")
    body["out"] = {"values": small.slice(0, torch.float32, (8, 512)).to_wire()}
    assert_problem(http.post("/v1/topk", json=body), "out_of_bounds")


def test_shm_unavailable(http, service):
    fd, ticket = memfd_ticket(service)
    read_only = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY)
    os.close(fd)
    _, ticket = memfd_ticket(service, memory=read_only)
    doc = assert_problem(
        http.post("/v1/regions", json={"kind": "memfd", "ticket": ticket, "size": 64}), "shm_unavailable"
    )
    assert "read-write" in doc["detail"], doc
    _, ticket = memfd_ticket(service, memory=read_only)
    ok = http.post("/v1/regions", json={"kind": "memfd", "ticket": ticket, "size": 64, "access": "read_only"})
    assert ok.status_code == 201 and ok.json()["access"] == "read_only", ok.text
    os.close(read_only)


def test_shm_smaller_than_declared(http, service):
    fd, ticket = memfd_ticket(service, size=16)
    os.close(fd)
    assert_problem(http.post("/v1/regions", json={"kind": "memfd", "ticket": ticket, "size": 1 << 20}), "out_of_bounds")


def test_unsealed_memory(http, service):
    fd, ticket = memfd_ticket(service, seal=False)
    os.close(fd)
    doc = assert_problem(
        http.post("/v1/regions", json={"kind": "memfd", "ticket": ticket, "size": 64}), "unsealed_memory"
    )
    assert "F_SEAL_SHRINK" in doc["detail"]


def test_unknown_ticket(http, service):
    fd, ticket = memfd_ticket(service)
    os.close(fd)
    assert http.post("/v1/regions", json={"kind": "memfd", "ticket": ticket, "size": 64}).status_code == 201
    assert_problem(http.post("/v1/regions", json={"kind": "memfd", "ticket": ticket, "size": 64}), "unknown_ticket")


def test_tcp_without_token_is_unauthenticated(service):
    for headers in ({}, {"authorization": "Bearer wrong"}):
        with httpx.Client(base_url=service.url, headers=headers) as anonymous:
            response = anonymous.get("/v1/regions")
            assert_problem(response, "unauthenticated")
            assert response.headers["www-authenticate"].startswith("Bearer")
            assert anonymous.get("/livez").status_code == 200


def test_output_access_rules(client, http, problem):
    cache = client.register(problem.kv_cache, access="read_only")
    counts = client.register(torch.zeros(8, dtype=torch.int32), access="read_only")
    body = body_for(client, problem, out={"counts": counts.slice().to_wire()})
    assert_problem(http.post("/v1/topk", json=body), "read_only_region")
    body = body_for(client, problem, kv_cache=cache.slice().to_wire())
    writable = client.register(torch.zeros(problem.kv_cache.numel() + 64, dtype=torch.uint8))
    body["kv_cache"] = writable.slice(0, torch.uint8, tuple(problem.kv_cache.shape)).to_wire()
    body["out"] = {"counts": writable.slice(problem.kv_cache.numel(), torch.int32, (8,)).to_wire()}
    assert_problem(http.post("/v1/topk", json=body), "output_aliases_input")


def test_foreign_device(http):
    registration = {
        "kind": "cuda_ipc",
        "handle": base64.b64encode(os.urandom(64)).decode(),
        "device_uuid": str(uuid.uuid4()),
        "size": 4096,
        "pid": os.getpid(),
    }
    assert "owns no GPU" in assert_problem(http.post("/v1/regions", json=registration), "foreign_device")["detail"]


# ----------------------------------------------------------------------------- request codes


def test_unsupported_topk(client, problem):
    with pytest.raises(InvalidRequestProblem) as err:
        client.topk(*problem.args(), topk=2048)
    assert err.value.code == "unsupported_topk" and "(512, 1024)" in err.value.detail


def test_backend_unavailable(client, problem):
    with pytest.raises(InvalidRequestProblem) as err:
        client.topk(*problem.args(), topk=512, backend="triton")
    assert err.value.code == "backend_unavailable" and "reference" in err.value.detail


def test_validation_error_lists_pydantic_errors(http):
    doc = assert_problem(http.post("/v1/topk", json={"topk": "many"}), "validation_error")
    assert doc["errors"] and all({"loc", "msg", "type"} <= set(e) for e in doc["errors"])
    assert_problem(
        http.post("/v1/regions", content=b"{not json", headers={"content-type": "application/json"}), "invalid_json"
    )
    assert_problem(
        http.post("/v1/topk", content=b"{not json", headers={"content-type": "application/json"}), "invalid_json"
    )
    assert_problem(
        http.post("/v1/regions", json={"kind": "shm", "name": "../etc/passwd", "size": 1}), "validation_error"
    )
    for strings in (
        {"kind": "memfd", "ticket": "t" * 16, "size": "64"},
        {"kind": "memfd", "ticket": "t" * 16, "size": 64, "pid": str(os.getpid())},
    ):
        assert_problem(http.post("/v1/regions", json=strings), "validation_error")  # no string coercion


@pytest.mark.parametrize("pid", [2**22 + 12345, 2**31, 2**40, 2**63])
def test_registration_with_an_impossible_owner_is_refused(http, service, pid):
    fd, ticket = memfd_ticket(service)
    os.close(fd)
    doc = assert_problem(
        http.post("/v1/regions", json={"kind": "memfd", "ticket": ticket, "size": 64, "pid": pid}), "validation_error"
    )
    assert "pid" in doc["detail"], doc


def test_owner_pid_from_another_pid_namespace_is_refused(http, service):
    here = os.stat("/proc/self/ns/pid").st_ino  # the test and the service share a pid namespace

    def registration(**fields):
        fd, ticket = memfd_ticket(service)
        os.close(fd)
        return {"kind": "memfd", "ticket": ticket, "size": 64, "pid": os.getpid(), **fields}

    doc = assert_problem(http.post("/v1/regions", json=registration(pid_ns=here + 1)), "foreign_pid_namespace")
    assert str(os.getpid()) in doc["detail"] and "pid=null" in doc["detail"], doc
    same = http.post("/v1/regions", json=registration(pid_ns=here))
    assert same.status_code == 201 and same.json()["pid"] == os.getpid(), same.text
    untracked = http.post("/v1/regions", json=registration(pid=None, pid_ns=here + 1))
    assert untracked.status_code == 201 and untracked.json()["pid"] is None, untracked.text


@pytest.fixture(params=["httpcore", "stdlib"])
def any_http(request, http, service):
    """`http`, or a client over the synchronous client's own transport (clients/transport.py StdlibTransport: a body
    refused on its length is answered before it is sent whole, an answer it must still read)."""
    if request.param == "httpcore":
        yield http
        return
    transport = StdlibTransport(Endpoint(service.url, None))
    with httpx.Client(base_url=service.url, headers=service.auth, timeout=30, transport=transport) as client:
        yield client


def test_payload_too_large(any_http):
    assert_problem(
        any_http.post("/v1/topk", content=b"x" * (16 * 2**20 + 1), headers={"content-type": "application/json"}),
        "payload_too_large",
    )


def test_payload_too_large_streamed(any_http):
    chunks = (b"x" * 2**20 for _ in range(17))  # no Content-Length (httpcore): counted while streaming
    assert_problem(
        any_http.post("/v1/topk", content=chunks, headers={"content-type": "application/json"}), "payload_too_large"
    )


def test_not_found_and_method_not_allowed(http):
    assert_problem(http.get("/v2/nothing"), "not_found")
    assert_problem(http.delete("/v1/topk"), "method_not_allowed")


# ---------------------------------------------------------------------------------- row codes


def _faulty(problem, kind):
    p = make_problem(11, seq_lens=[700, 690], rows_per_seq=4)
    if kind == "invalid_row":
        p.starts[2], p.ends[2] = 50, 10  # start after end
        return p, [2]
    if kind == "invalid_page":
        p.block_table[1, 3] = p.kv_cache.shape[0] + 5  # every row of sequence 1 reads page 3
        return p, [4, 5, 6, 7]
    p.weights[6, 9] = float("nan")
    return p, [6]


@pytest.mark.parametrize("code", ["invalid_row", "invalid_page", "nonfinite_score"])
def test_row_faults_name_the_rows(client, problem, code):
    p, rows = _faulty(problem, code)
    with pytest.raises(RowFaultProblem) as err:
        client.topk(*p.args(), topk=512)
    assert err.value.code == code
    assert err.value.rows == rows, err.value.problem
    assert isinstance(err.value, RowFaultError) and all(f for f in err.value.flags)


def test_mixed_row_faults_pick_the_worst_and_name_all(client, problem):
    p, _ = _faulty(problem, "nonfinite_score")
    p.starts[0], p.ends[0] = 10, 5
    with pytest.raises(RowFaultProblem) as err:
        client.topk(*p.args(), topk=512)
    assert err.value.code == "invalid_row" and err.value.rows == [0, 6]
    assert err.value.flags == [int(RowStatus.INVALID_ROW), int(RowStatus.NONFINITE)]


# --------------------------------------------------------------------------- in-process codes


@pytest.mark.parametrize(
    "exc,code",
    [
        (UnsupportedTopKError("topk=3 is not supported"), "unsupported_topk"),
        (InputDtypeError("q_fp4 must be uint8, got int32"), "bad_dtype"),
        (InputShapeError("weights must have shape [8, 64], got [7, 64]"), "bad_shape"),
        (InputError("kv_cache must be contiguous"), "invalid_input"),
        (RowFaultError("row 3 failed", [3], [int(RowStatus.SELECTOR_FAILURE)]), "selector_failure"),
        (RowFaultError("rows", [1, 2], [int(RowStatus.NONFINITE), int(RowStatus.INVALID_PAGE)]), "invalid_page"),
        (BackendUnavailableError("triton is not installed"), "backend_unavailable"),
        (DeviceError("CUDA error: an illegal memory access"), "device_error"),
        (ZeroDivisionError("a bug"), "internal_error"),
    ],
)
def test_mapping_of_foreign_errors(exc, code):
    error = as_service_error(exc)
    assert error.code == code and str(exc) in error.detail


def test_row_fault_code_prefers_the_worst_flag():
    assert row_fault_code([int(RowStatus.NONFINITE | RowStatus.INVALID_ROW)]) == "invalid_row"
    assert row_fault_code([int(RowStatus.OVERFLOW)]) == "selector_failure"
    assert row_fault_code([int(RowStatus.UNSUPPORTED)]) == "unsupported_data"
    assert row_fault_code([int(RowStatus.SLOT_OVERFLOW | RowStatus.UNSUPPORTED)]) == "slot_overflow"


@pytest.mark.asyncio
async def test_http_error_mapping():
    from fastapi import FastAPI, HTTPException

    from litetopk.service.errors import install_error_handlers

    app = FastAPI()
    install_error_handlers(app)

    @app.get("/teapot")
    def teapot():
        raise HTTPException(418, "short and stout")

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        doc = (await c.get("/teapot")).json()
    assert doc["code"] == "http_error" and doc["status"] == 400 and doc["detail"] == "short and stout"


def test_every_code_is_reached_by_a_named_test():
    assert set(COVERED_BY) == set(CODES), sorted(set(CODES) ^ set(COVERED_BY))
    root = Path(__file__).resolve().parents[2]
    for code, where in COVERED_BY.items():
        path, _, name = where.split(" ")[0].rpartition("::")
        source = (root / path).read_text() if path else Path(__file__).read_text()
        assert f"def {name}(" in source, f"{code}: {where} does not exist"


@pytest.mark.parametrize(
    "method, path, allow",
    [
        ("delete", "/v1/topk", "POST"),
        ("put", "/livez", "GET"),
        ("post", "/v1/regions/abc", "DELETE, GET"),
        ("get", "/v1/topk", "POST"),
    ],
)
def test_a_405_names_the_allowed_methods(tmp_path, method, path, allow):
    """RFC 9110 §15.5.6: a 405 carries Allow with the route's methods (routes of included routers too)."""
    from fastapi.testclient import TestClient

    from litetopk.service.app import create_app
    from litetopk.service.settings import ServiceSettings

    with TestClient(create_app(ServiceSettings(uds=str(tmp_path / "s.sock")))) as http:
        response = getattr(http, method)(path)
    assert response.status_code == 405, response.text
    assert response.headers["allow"] == allow, f"{method} {path}: {response.headers.get('allow')!r}"
    assert response.json()["code"] == "method_not_allowed"
