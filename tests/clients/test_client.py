"""The clients: request building (checked on the wire with httpx.MockTransport), typed errors,
sync and async against a live service, regions found by address, the scratch pool, cleanup."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import socket
import threading

import httpx
import pytest
import torch

from litetopk.clients import (
    AsyncTopKClient,
    DeviceProblem,
    InvalidRequestProblem,
    ProtocolError,
    RegionProblem,
    RowFaultProblem,
    ServiceProblem,
    TimeoutProblem,
    TopKClient,
    TransportError,
    UnavailableProblem,
)
from litetopk.clients.errors import problem_error
from litetopk.clients.ipc import PackedBody, http_arguments
from litetopk.clients.transport import UDS_BASE_URL, Endpoint, StdlibTransport, resolve_endpoint
from litetopk.kernels import RowFaultError, litetopk_prefill
from tests.problems import make_problem, results_equal


@pytest.fixture(scope="module")
def problem():
    return make_problem(41, seq_lens=[700, 690], rows_per_seq=4)


def reference(p):
    return litetopk_prefill(*p.args(), topk=p.topk, backend="reference")


# -------------------------------------------------------------------------- request building


class Recorder:
    """A MockTransport handler: records requests, answers registrations, fails /v1/topk."""

    def __init__(self):
        self.requests: list[httpx.Request] = []
        self.next_id = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if request.method == "POST" and request.url.path == "/v1/regions":
            self.next_id += 1
            body = json.loads(request.content)
            return httpx.Response(
                201,
                json={
                    "id": f"r{self.next_id}",
                    "generation": 1,
                    "kind": body["kind"],
                    "size": body["size"],
                    "access": body["access"],
                    "pid": body.get("pid"),
                    "device": "cpu",
                },
            )
        if request.method == "DELETE":
            return httpx.Response(204)
        return httpx.Response(
            418, json={"code": "made_up", "detail": "recorded"}, headers={"content-type": "application/problem+json"}
        )

    def topk_body(self) -> dict:
        return json.loads(next(r for r in self.requests if r.url.path == "/v1/topk").content)


def recording_client(**options) -> tuple[TopKClient, Recorder]:
    """A client whose HTTP calls go to a Recorder and whose fd handovers are recorded in
    `recorder.handed_over` (the memory objects) with a made-up ticket."""
    client = TopKClient("http://recorded", **options)
    recorder = Recorder()
    recorder.handed_over = []
    client._http = httpx.Client(base_url="http://recorded", transport=httpx.MockTransport(recorder))

    def hand_over(memory):
        recorder.handed_over.append((memory, fcntl.fcntl(memory.fd, fcntl.F_GET_SEALS)))
        return f"ticket{len(recorder.handed_over):010d}"
        yield  # a flow: it makes no HTTP call

    client._flows._hand_over = hand_over
    return client, recorder


def test_plain_tensors_go_to_scratch_and_inline(problem):
    client, recorder = recording_client()
    with pytest.raises(ServiceProblem):
        client.topk(*problem.args(), topk=512)
    body = recorder.topk_body()
    for name in ("q_fp4", "q_scale", "kv_cache", "weights"):
        assert body[name]["region"] == "r1" and body[name]["offset"] % 64 == 0, name
    assert body["starts"] == {"dtype": "int32", "shape": [8], "data": problem.starts.tolist()}
    assert body["block_table"]["shape"] == list(problem.block_table.shape)
    assert (body["topk"], body["repair"], body["backend"]) == (512, True, "auto")
    with pytest.raises(ServiceProblem):
        client.topk(*problem.args(), topk=512)
    registrations = [r for r in recorder.requests if r.url.path == "/v1/regions"]
    assert len(registrations) == 1, "the scratch region is reused by the next call"


def test_slices_of_registered_regions_travel_by_reference(problem):
    client, recorder = recording_client()
    meta = client.register(torch.arange(30, dtype=torch.int32))
    with pytest.raises(ServiceProblem):
        client.topk(*problem.args()[:5], meta.tensor[0:8], meta.tensor[8:16], meta.tensor[16:24], topk=512)
    body = recorder.topk_body()
    assert body["row_to_batch"] == {"region": meta.id, "generation": 1, "offset": 0, "dtype": "int32", "shape": [8]}
    assert body["ends"]["offset"] == 64
    assert body["q_fp4"]["region"] != meta.id


def test_kv_scale_travels_as_a_region_like_the_cache(problem):
    from litetopk.kernels.aiter_layout import aiter_pages_from_litetopk

    values, scales = aiter_pages_from_litetopk(problem.kv_cache)
    client, recorder = recording_client()
    args = list(problem.args())
    args[2] = values

    def sent(**options) -> dict:
        with pytest.raises(ServiceProblem):
            client.topk(*args, topk=512, **options)
        return json.loads([r for r in recorder.requests if r.url.path == "/v1/topk"][-1].content)

    staged = sent(kv_scale=scales)
    assert staged["kv_scale"]["region"] == staged["kv_cache"]["region"] == "r1", "plain tensors: one scratch"
    registered = client.register(scales, access="read_only")
    by_region = sent(kv_scale=registered)
    assert by_region["kv_scale"] == {
        "region": registered.id,
        "generation": 1,
        "offset": 0,
        "dtype": "uint8",
        "shape": [problem.kv_cache.shape[0], 1, 4, 64],
    }
    assert by_region["kv_cache"]["shape"] == [problem.kv_cache.shape[0], 1, 4, 64, 16]
    args[2] = problem.kv_cache
    assert "kv_scale" not in sent(), "our format sends no kv_scale"


def test_a_call_of_references_only_is_planned_once(problem):
    """A call whose every tensor is a Region or a RegionSlice sends the same body every time: it is worked
    out once (a plan); a plain tensor's values travel as they are at each call; unregistering a region
    drops the plans that name it."""
    client, recorder = recording_client()
    regions = [client.register(t, access="read_only") for t in problem.args()]
    out = {"values": client.register(torch.empty(problem.q_fp4.shape[0], 512))}
    starts = problem.starts.clone()
    for args in (regions, regions, [*regions[:6], starts, regions[7]], [*regions[:6], starts, regions[7]]):
        with pytest.raises(ServiceProblem):
            client.topk(*args, topk=512, out=out)
        starts += 1
    bodies = [json.loads(r.content) for r in recorder.requests if r.url.path == "/v1/topk"]
    assert bodies[0] == bodies[1] and bodies[0]["starts"]["region"] == regions[6].id
    assert [b["starts"]["data"] for b in bodies[2:]] == [(problem.starts + k).tolist() for k in (2, 3)]
    assert len(client._flows._plans) == 1, "only the call of references is planned"
    client.unregister(out["values"])
    assert client._flows._plans == {}, "its region unregistered, the plan is dropped"


def test_close_unregisters_everything(problem):
    client, recorder = recording_client()
    a = client.register(torch.zeros(4))
    b = client.register(torch.ones(4))
    client.close()
    deleted = {r.url.path for r in recorder.requests if r.method == "DELETE"}
    assert deleted == {f"/v1/regions/{a.id}", f"/v1/regions/{b.id}"}
    assert not a.registered and not b.registered


def registration(recorder: Recorder) -> dict:
    return json.loads(next(r for r in recorder.requests if r.url.path == "/v1/regions").content)


PID_NS = os.stat("/proc/self/ns/pid").st_ino

# owner_pid argument, LITETOPK_CLIENT_OWNER_PID, what the registration says (pid, pid_ns)
OWNER_CASES = {
    "default: this process": ("auto", None, (os.getpid(), PID_NS)),
    "None: pid null": (None, None, (None, None)),
    "a given pid": (4321, None, (4321, PID_NS)),
    "env none": ("auto", "none", (None, None)),
    "env pid": ("auto", "4321", (4321, PID_NS)),
    "argument beats env": (None, "4321", (None, None)),
}


@pytest.mark.parametrize("case", OWNER_CASES)
def test_registration_names_its_owner_and_pid_namespace(case, monkeypatch):
    owner_pid, variable, (pid, pid_ns) = OWNER_CASES[case]
    if variable is not None:
        monkeypatch.setenv("LITETOPK_CLIENT_OWNER_PID", variable)
    else:
        monkeypatch.delenv("LITETOPK_CLIENT_OWNER_PID", raising=False)
    client, recorder = recording_client(owner_pid=owner_pid)
    client.register(torch.zeros(4))
    body = registration(recorder)
    assert (body["pid"], body.get("pid_ns")) == (pid, pid_ns), f"{case}: {body}"
    client.close()


@pytest.mark.parametrize(
    "owner_pid,variable", [(0, None), ("me", None), (True, None), ("auto", "self"), ("auto", "-3")]
)
def test_bad_owner_pid_is_refused_at_construction(owner_pid, variable, monkeypatch):
    monkeypatch.setenv("LITETOPK_CLIENT_OWNER_PID", variable or "")
    for cls in (TopKClient, AsyncTopKClient):
        with pytest.raises(ValueError, match="owner_pid|LITETOPK_CLIENT_OWNER_PID"):
            cls("http://x", owner_pid=owner_pid)


@pytest.mark.parametrize("access", ["read_write", "read_only"])
def test_host_tensors_travel_as_sealed_memfds(access):
    """register() copies a CPU tensor into a memfd sealed against shrinking (and growing), hands
    its fd over and registers the ticket with the requested access; the fd is closed after."""
    client, recorder = recording_client()
    tensor = torch.randn(4, 5)
    region = client.register(tensor, access=access)
    ((memory, seals),) = recorder.handed_over
    body = registration(recorder)
    assert body["kind"] == "memfd" and body["ticket"] == "ticket0000000001" and body["access"] == access, body
    assert seals & fcntl.F_SEAL_SHRINK and seals & fcntl.F_SEAL_GROW, f"seals {seals:#x}"
    assert memory.fd == -1, "the client's fd is closed once the service has its own"
    assert torch.equal(region.tensor, tensor) and region.tensor.data_ptr() != tensor.data_ptr()
    with pytest.raises(ValueError, match="access"):
        client.register(tensor, access="write_only")
    client.close()


# ------------------------------------------------------------------------------ typed errors


@pytest.mark.parametrize(
    "code,cls",
    [
        ("unknown_region", RegionProblem),
        ("stale_region", RegionProblem),
        ("foreign_device", RegionProblem),
        ("bad_dtype", InvalidRequestProblem),
        ("payload_too_large", InvalidRequestProblem),
        ("invalid_page", RowFaultProblem),
        ("overloaded", UnavailableProblem),
        ("not_ready", UnavailableProblem),
        ("timeout", TimeoutProblem),
        ("device_error", DeviceProblem),
        ("brand_new_code", ServiceProblem),
    ],
)
def test_problem_classes(code, cls):
    error = problem_error(
        {"code": code, "detail": "d", "rows": [1], "row_flags": ["INVALID_PAGE|NONFINITE"]}, 422, retry_after="3"
    )
    assert type(error) is cls and error.code == code and error.status == 422
    if cls is RowFaultProblem:
        assert isinstance(error, RowFaultError) and error.rows == [1] and error.flags == [8 | 4]
    if cls is UnavailableProblem:
        assert error.retry_after == 3.0


def test_error_without_problem_body_is_a_protocol_error(problem):
    client = TopKClient("http://x")
    client._http = httpx.Client(
        base_url="http://x", transport=httpx.MockTransport(lambda r: httpx.Response(502, text="bad gateway"))
    )
    with pytest.raises(ProtocolError, match="502"):
        client.info()


def test_unreachable_service_is_a_transport_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connections are refused
        with TopKClient(f"http://127.0.0.1:{port}") as client, pytest.raises(TransportError):
            client.info()


def test_endpoint_resolution(monkeypatch, tmp_path):
    monkeypatch.setenv("LITETOPK_URL", "unix:/run/x.sock")
    assert resolve_endpoint(None, None).uds == "/run/x.sock"
    monkeypatch.setenv("LITETOPK_URL", "http://10.0.0.1:1234/")
    assert resolve_endpoint(None, None).base_url == "http://10.0.0.1:1234"
    monkeypatch.delenv("LITETOPK_URL")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert resolve_endpoint(None, None).base_url == "http://127.0.0.1:8471"
    with pytest.raises(ValueError):
        resolve_endpoint("http://a", "/b")


# ---------------------------------------------------------------------------- live service


def test_sync_client_over_both_transports(service, problem):
    want = reference(problem)
    for client in (TopKClient(service.url, token=service.token), TopKClient(uds=service.uds)):
        with client:
            assert client.ready()
            assert results_equal(client.topk(*problem.args(), topk=512), want) == [], client.endpoint


@pytest.mark.asyncio
@pytest.mark.parametrize("transport", ["tcp", "uds"])
async def test_async_client_concurrent_calls(service, problem, transport):
    want = reference(problem)
    client = (
        AsyncTopKClient(service.url, token=service.token) if transport == "tcp" else AsyncTopKClient(uds=service.uds)
    )
    async with client:
        cache = await client.register(problem.kv_cache)
        results = await asyncio.gather(
            *[
                client.topk(problem.q_fp4, problem.q_scale, cache, *problem.args()[3:], topk=512, result_format=fmt)
                for fmt in ("json", "binary", "auto", "auto")
            ]
        )
        assert all(results_equal(r, want) == [] for r in results)
        mine = {r["id"] for r in await client.regions()}
        assert cache.id in mine
    async with AsyncTopKClient(service.url, token=service.token) as other:
        assert cache.id not in {r["id"] for r in await other.regions()}, "close() unregistered the client's regions"


@pytest.mark.asyncio
async def test_async_client_takes_aiter_cache_format(service, problem):
    from litetopk.kernels.aiter_layout import aiter_pages_from_litetopk

    values, scales = aiter_pages_from_litetopk(problem.kv_cache)
    async with AsyncTopKClient(uds=service.uds) as client:
        scale = await client.register(scales, access="read_only")
        got = await client.topk(problem.q_fp4, problem.q_scale, values, *problem.args()[3:], topk=512, kv_scale=scale)
    assert results_equal(got, reference(problem)) == []


@pytest.mark.parametrize("transport", ["ipc", "http"])
def test_planned_calls_read_their_regions_anew_and_follow_them(service, problem, transport):
    """A planned call (every tensor a region; its body encoded once, msgpack for IPC, JSON for HTTP) reads
    the regions' contents as they are at each call, and a region the service forgot (unregistered by
    another client of the principal) is refused, as an unplanned call naming it is."""
    other = make_problem(43, seq_lens=[700, 690], rows_per_seq=4)
    rows = problem.q_fp4.shape[0]
    with TopKClient(uds=service.uds) as owner, TopKClient(uds=service.uds, transport=transport) as client:
        sent = _record_http_bodies(client._http)
        regions = [owner.register(t.clone(), access="read_only") for t in problem.args()]
        out = {"values": owner.register(torch.empty(rows, 512)), "status": owner.register(torch.empty(rows).int())}
        for p in (problem, other, problem):
            for region, tensor in zip(regions, p.args()):
                region.tensor.copy_(tensor)
            got = client.topk(*regions, topk=512, out=out)
            assert results_equal(got, reference(p)) == [] and got.values is out["values"].tensor
        assert len(client._flows._plans) == 1
        if transport == "http":
            assert sent[1:] == ["content", "content"], f"planned calls sent {sent}"
        owner.unregister(out["values"])
        with pytest.raises(RegionProblem) as err:
            client.topk(*regions, topk=512, out=out)
        assert err.value.code == "stale_region" and out["values"].id in err.value.detail, err.value
        out["values"] = owner.register(torch.empty(rows, 512))
        assert results_equal(client.topk(*regions, topk=512, out=out), reference(problem)) == []


def test_a_plans_body_goes_over_http_as_httpx_encodes_it():
    """A kept plan's body (PackedBody) is sent over HTTP as the JSON bytes httpx makes of a `json=` dict,
    with the call's other headers kept; a body that is not a plan's is left to httpx."""
    body = {"topk": 512, "weight_scale": 0.125, "inputs": {"q_fp4": {"region": "r-1", "offset": 0}}, "name": "é"}
    packed = PackedBody(body)
    want = httpx.Request("POST", "http://x/v1/topk", json=body)
    got = http_arguments({"json": packed, "headers": {"accept": "application/json"}})
    assert got["content"] == want.content, (got["content"], want.content)
    assert got["headers"] == {"accept": "application/json", "content-type": "application/json"}
    assert "json" not in got and packed.json_bytes() is got["content"], "encoded once"
    plain = {"json": body}
    assert http_arguments(plain) is plain
    with pytest.raises(ValueError):  # as httpx refuses a NaN
        PackedBody({"weight_scale": float("nan")}).json_bytes()


@pytest.mark.asyncio
@pytest.mark.parametrize("transport", ["ipc", "http"])
async def test_async_planned_calls_in_flight_together(service, problem, transport):
    """The async client's planned calls (every tensor a region) share one connection, several in flight
    at once, each answered into its own output region; over HTTP a plan's body goes as its JSON bytes."""
    rows = problem.q_fp4.shape[0]
    want = reference(problem)
    async with AsyncTopKClient(uds=service.uds, transport=transport) as client:
        sent = _record_http_bodies(client._http)
        regions = [await client.register(t, access="read_only") for t in problem.args()]
        outs = [{"values": await client.register(torch.empty(rows, 512))} for _ in range(4)]
        for _ in range(2):  # the first round makes the plans, the second uses them
            results = await asyncio.gather(*[client.topk(*regions, topk=512, out=out) for out in outs])
            assert all(results_equal(r, want) == [] for r in results)
            assert all(torch.equal(out["values"].tensor, want.values) for out in outs)
        assert len(client._flows._plans) == len(outs)
        if transport == "http":
            assert sent[-len(outs) :] == ["content"] * len(outs), f"planned calls sent {sent}"


def _record_http_bodies(http) -> list[str]:
    """Wrap the httpx client's `request`: a list, filled with how each /v1/topk call's body went (json= or
    content=)."""
    sent, request = [], http.request

    def recording(method, url, **kwargs):
        if url == "/v1/topk":
            sent.append("content" if "content" in kwargs else "json" if "json" in kwargs else "none")
        return request(method, url, **kwargs)

    http.request = recording
    return sent


def test_row_fault_is_the_kernels_row_fault_error(service, problem):
    p = make_problem(41, seq_lens=[700, 690], rows_per_seq=4)
    p.weights[3, 0] = float("inf")
    with TopKClient(service.url, token=service.token) as client, pytest.raises(RowFaultError) as err:
        client.topk(*p.args(), topk=512)
    assert err.value.rows == [3]


@pytest.mark.parametrize("transport", ["tcp", "uds"])
def test_large_results_come_back_through_a_pooled_scratch_region(service, problem, transport, monkeypatch):
    """result_format='auto' with a large result: the service writes it into a scratch shm region
    (named in `out`) instead of the body; the client copies it out, reuses the region next call."""
    import litetopk.clients.client as client_module

    monkeypatch.setattr(client_module, "RESULT_SCRATCH_MIN_BYTES", 0)
    want = reference(problem)
    client = (
        TopKClient(service.url, token=service.token)
        if transport == "tcp"
        else TopKClient(uds=service.uds, transport="http")
    )  # the bodies are read from httpx's hooks
    bodies = []
    with client:
        client._http.event_hooks["request"].append(
            lambda r: bodies.append(json.loads(r.read())) if r.url.path == "/v1/topk" else None
        )
        first = client.topk(*problem.args(), topk=512)
        second = client.topk(
            *problem.args(), topk=512, out={"counts": client.register(torch.empty(8, dtype=torch.int32))}
        )
        assert results_equal(first, want) == [] and results_equal(second, want) == []
        assert set(bodies[0]["out"]) == set(client_module.RESULT_FIELDS)
        assert bodies[0]["out"]["values"]["region"] == bodies[1]["out"]["values"]["region"], "the scratch is pooled"
        assert first.values.data_ptr() != second.values.data_ptr(), "each result owns its memory"
        json_only = client.topk(*problem.args(), topk=512, result_format="json")
        assert results_equal(json_only, want) == [] and "out" not in bodies[2]


def test_large_plain_metadata_is_staged_not_inline(problem, monkeypatch):
    """Metadata of more than INLINE_MAX_VALUES values goes into the scratch region (as int32)."""
    import litetopk.clients.client as client_module

    monkeypatch.setattr(client_module, "INLINE_MAX_VALUES", 4)
    client, recorder = recording_client()
    args = list(problem.args())
    args[6] = problem.starts.long()  # converted to int32, as the inline path does
    with pytest.raises(ServiceProblem):
        client.topk(*args, topk=512)
    body = recorder.topk_body()
    for name in ("row_to_batch", "starts", "ends"):
        assert body[name]["region"] == "r1" and body[name]["dtype"] == "int32" and body[name]["shape"] == [8], name
    assert body["block_table"]["region"] == "r1" or "data" in body["block_table"]


def test_results_come_back_in_the_body_when_the_service_has_no_fd_socket(problem, monkeypatch):
    """A service without an fd socket (/v1/info says fd_socket null: no Unix socket) cannot take
    host memory: a large result is asked for in the body, and /v1/info is asked once."""
    import litetopk.clients.client as client_module

    monkeypatch.setattr(client_module, "RESULT_SCRATCH_MIN_BYTES", 0)
    client = TopKClient("http://recorded")
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        if request.url.path == "/v1/info":
            return httpx.Response(200, json={"fd_socket": None})
        body = json.loads(request.content)
        assert "out" not in body
        return httpx.Response(
            418, json={"code": "made_up", "detail": "recorded"}, headers={"content-type": "application/problem+json"}
        )

    client._http = httpx.Client(base_url="http://recorded", transport=httpx.MockTransport(handler))
    q = client_module.RegionSlice(
        client_module.Region(
            "r9", 1, "memfd", 1 << 20, torch.zeros(1 << 20, dtype=torch.uint8), torch.zeros(1, dtype=torch.uint8)
        ),
        0,
        torch.uint8,
        (8, 64, 64),
    )
    args = (q, q, q, problem.block_table, q, problem.row_to_batch, problem.starts, problem.ends)
    for _ in range(2):
        with pytest.raises(ServiceProblem):
            client.topk(*args, topk=512)
    assert calls == ["/v1/info", "/v1/topk", "/v1/topk"]
    with pytest.raises(TransportError, match="no fd socket"):
        client.register(torch.zeros(4))


# ---------------------------------------------------------------------------- the IPC channel


@pytest.mark.parametrize("split", [1, 3, 8, 100, 70_000])
def test_ipc_answers_are_read_whole_however_they_arrive(split):
    """Answers reach the channel in pieces of any size, several in one piece, payloads larger than its
    buffer: each is read whole, its payload in memory of its own."""
    import socket as sockets
    import threading

    import msgspec

    from litetopk.clients.ipc import READ_BUFFER_BYTES, IpcChannel
    from litetopk.service.wire import FRAME, OkAnswer

    payloads = [b"", bytes(range(256)) * (READ_BUFFER_BYTES // 128), b"x" * 10]
    stream = b"".join(
        FRAME.pack(len(header), len(p)) + header + p
        for i, p in enumerate(payloads)
        for header in [msgspec.msgpack.encode(OkAnswer(id=i, value=len(p)))]
    )
    mine, theirs = sockets.socketpair()
    channel = IpcChannel.__new__(IpcChannel)  # the reading half only: no service, no hello
    channel.sock, channel.path = mine, "socketpair"
    channel._buffer, channel._start, channel._end = bytearray(READ_BUFFER_BYTES), 0, 0
    writer = threading.Thread(
        target=lambda: [theirs.sendall(stream[i : i + split]) for i in range(0, len(stream), split)]
    )
    writer.start()
    got = [channel._read() for _ in payloads]
    writer.join()
    mine.close()
    theirs.close()
    assert [(a.id, a.value, bytes(p)) for a, p in got] == [(i, len(p), p) for i, p in enumerate(payloads)], split
    assert all(isinstance(p, bytearray) for _, p in got)


# ----------------------------------------------------------------------- the synchronous transport


class TinyService:
    """An HTTP/1.1 server in threads, on a Unix socket (`path`) or TCP (path None: `url`): answers each request
    `{"n": <requests so far>}`, keeps the connection (keep=True) or closes it after the answer without saying so (a
    keep-alive timeout), or never answers (silent=True). Counts the connections it accepted; `closed` is set each time
    it closes one."""

    def __init__(self, path: str | None, *, keep: bool = True, silent: bool = False):
        self.path, self.keep, self.silent = path, keep, silent
        self.connections = self.requests = 0
        self.count = threading.Lock()
        self.closed = threading.Event()
        if path:
            self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.listener.bind(path)
            self.endpoint = Endpoint(UDS_BASE_URL, path)
        else:
            self.listener = socket.socket()
            self.listener.bind(("127.0.0.1", 0))
            self.endpoint = Endpoint(f"http://127.0.0.1:{self.listener.getsockname()[1]}", None)
        self.listener.listen()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:  # closed
                return
            with self.count:
                self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while True:
                head, sep, rest = data.partition(b"\r\n\r\n")
                if sep:
                    headers = dict(line.split(b": ", 1) for line in head.split(b"\r\n")[1:])
                    length = int(headers.get(b"content-length", 0))
                    if len(rest) >= length:
                        data = rest[length:]
                        with self.count:
                            self.requests += 1
                            body = json.dumps({"n": self.requests}).encode()
                        if self.silent:
                            conn.recv(1)  # until the client gives up
                            break
                        conn.sendall(
                            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                            b"content-length: %d\r\n\r\n%s" % (len(body), body)
                        )
                        if not self.keep:
                            break
                        continue
                chunk = conn.recv(65536)
                if not chunk:
                    break
                data += chunk
        self.closed.set()

    def close(self) -> None:
        self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread (close alone does not, on Linux)
        self.listener.close()


@pytest.mark.parametrize("where", ["unix", "tcp"])
@pytest.mark.parametrize("keep", [True, False])
def test_the_sync_transport_keeps_connections_and_drops_those_the_service_closed(tmp_path, keep, where):
    """StdlibTransport: one kept-alive connection carries a thread's calls; a connection the service closed while it
    was idle is dropped before use (a new one carries the call: nothing is sent twice, nothing fails)."""
    service = TinyService(str(tmp_path / "s.sock") if where == "unix" else None, keep=keep)
    with httpx.Client(base_url=service.endpoint.base_url, transport=StdlibTransport(service.endpoint)) as client:
        for n in range(1, 4):
            assert client.post("/v1/topk", content=b"{}").json() == {"n": n}
            if not keep:
                assert service.closed.wait(10), "the service closed the connection"
                service.closed.clear()
    assert service.connections == (1 if keep else 3) and service.requests == 3
    service.close()


def test_the_sync_transport_serves_threads_on_a_connection_each(tmp_path):
    """Calls from several threads share one client: each call in flight has its own connection, none more than the
    threads, every answer whole."""
    service = TinyService(str(tmp_path / "s.sock"))
    answers = []
    with httpx.Client(base_url=UDS_BASE_URL, transport=StdlibTransport(service.endpoint)) as client:

        def calls():
            answers.extend(client.post("/v1/topk", content=b"{}").json()["n"] for _ in range(20))

        threads = [threading.Thread(target=calls) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    assert sorted(answers) == list(range(1, 81)) and 1 <= service.connections <= 4, (service.connections, answers)
    service.close()


def test_the_sync_transport_refuses_a_scheme_it_cannot_speak():
    with pytest.raises(ValueError, match="http:// or https://"):
        StdlibTransport(Endpoint("ftp://127.0.0.1:21", None))


def test_a_service_that_never_answers_is_a_read_timeout(tmp_path):
    service = TinyService(str(tmp_path / "s.sock"), silent=True)
    with TopKClient(uds=service.path, transport="http", timeout=httpx.Timeout(0.3)) as client:
        with pytest.raises(TransportError, match="ReadTimeout"):
            client.info()
    service.close()
