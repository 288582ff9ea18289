"""The IPC channel against a real service: the same answers and problems as HTTP, bad frames
answered (or the connection closed when the framing is lost), hostile frames fuzzed (hypothesis),
and the service up after each."""

from __future__ import annotations

import socket
import struct

import msgspec
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from litetopk.clients import InvalidRequestProblem, RegionProblem, TopKClient
from litetopk.kernels import litetopk_prefill
from litetopk.service.settings import ServiceSettings
from litetopk.service.wire import FRAME, Hello, IpcAnswer, OkAnswer, ProblemAnswer
from tests.problems import make_problem, results_equal
from tests.servers import wait_until

DECODER = msgspec.msgpack.Decoder(IpcAnswer)


@pytest.fixture(scope="module")
def problem():
    return make_problem(41, seq_lens=[700, 690], rows_per_seq=4)


def reference(p):
    return litetopk_prefill(*p.args(), topk=p.topk, backend="reference")


class Raw:
    """A raw connection to the IPC socket: frames in, answers out (None: the service closed it)."""

    def __init__(self, path: str):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(20)
        self.sock.connect(path)
        hello = self.read()
        assert isinstance(hello, Hello), hello

    def send(self, header: bytes, payload: bytes = b"", declared: int | None = None) -> None:
        self.sock.sendall(FRAME.pack(len(header) if declared is None else declared, len(payload)) + header + payload)

    def read(self):
        prefix = self._exact(FRAME.size)
        if prefix is None:
            return None
        header_bytes, payload_bytes = FRAME.unpack(prefix)
        header = self._exact(header_bytes)
        self._exact(payload_bytes)
        return DECODER.decode(header)

    def _exact(self, n: int) -> bytes | None:
        data = b""
        while len(data) < n:
            try:
                chunk = self.sock.recv(n - len(data))
            except ConnectionResetError:
                return None
            if not chunk:
                return None
            data += chunk
        return data

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "Raw":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def ask(raw: Raw, message: dict):
    raw.send(msgspec.msgpack.encode(message))
    return raw.read()


def test_ipc_answers_equal_in_process_and_http(service, problem):
    want = reference(problem)
    with TopKClient(uds=service.uds) as ipc, TopKClient(uds=service.uds, transport="http") as http:
        assert ipc.transport == "ipc" and http.transport == "http"
        assert results_equal(ipc.topk(*problem.args(), topk=512), want) == []
        cache = ipc.register(problem.kv_cache, access="read_only")
        values = ipc.register(torch.zeros(problem.q_fp4.shape[0], 512))
        got = ipc.topk(problem.q_fp4, problem.q_scale, cache, *problem.args()[3:], topk=512, out={"values": values})
        assert results_equal(got, want) == [] and torch.equal(values.tensor, want.values)
        assert {r["id"] for r in ipc.regions()} == {r["id"] for r in http.regions()}, "one principal, both transports"


def test_ipc_problems_are_http_problems(service, problem):
    with TopKClient(uds=service.uds) as ipc:
        with pytest.raises(InvalidRequestProblem) as err:
            ipc.topk(*problem.args(), topk=7)
        assert err.value.code == "unsupported_topk" and err.value.status == 422
    with Raw(service.ipc) as raw:
        answer = ask(raw, {"op": "region", "id": 5, "region": "rnone"})
        assert isinstance(answer, ProblemAnswer) and answer.id == 5 and answer.problem["code"] == "unknown_region"


def _alive(service) -> bool:
    with Raw(service.ipc) as raw:
        return isinstance(ask(raw, {"op": "ready", "id": 1}), OkAnswer)


def test_bad_frames_get_problem_answers(service):
    with Raw(service.ipc) as raw:
        raw.send(b"\xc1 not msgpack")  # 0xc1 is never valid msgpack
        answer = raw.read()
        assert isinstance(answer, ProblemAnswer) and answer.problem["code"] == "invalid_frame", answer
        for message in (
            {"op": "nope", "id": 3},
            {"op": "info", "id": 4, "extra": 1},
            {"op": "info", "id": "4"},
            {"op": "topk", "id": 6, "request": {"topk": "512"}},
        ):
            answer = ask(raw, message)
            assert isinstance(answer, ProblemAnswer) and answer.problem["code"] == "validation_error", (message, answer)
        assert answer.id == 6, "the id is read back when the message has one"
        assert isinstance(ask(raw, {"op": "info", "id": 7}), OkAnswer), "the connection stays open"
    with Raw(service.ipc) as raw:  # framing lost: a header over the limit
        raw.send(b"", declared=2**31)
        answer = raw.read()
        assert isinstance(answer, ProblemAnswer) and answer.problem["code"] == "payload_too_large"
        assert raw.read() is None, "the connection is closed"
    with Raw(service.ipc) as raw:  # a request carrying a payload
        raw.send(msgspec.msgpack.encode({"op": "info", "id": 1}), payload=b"xx")
        assert raw.read().problem["code"] == "invalid_frame" and raw.read() is None
    with Raw(service.ipc) as raw:  # truncated: the peer goes away mid-frame
        raw.sock.sendall(struct.pack("<II", 100, 0) + b"\x81")
    assert _alive(service)


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(
    frames=st.lists(
        st.one_of(
            st.binary(max_size=64),
            st.dictionaries(
                st.sampled_from(["op", "id", "request", "region", "registration", "generation", "x"]),
                st.one_of(
                    st.integers(-(2**63), 2**64 - 1),
                    st.text(max_size=8),
                    st.sampled_from(["topk", "register", "unregister", "regions", "region", "info", "ready"]),
                    st.none(),
                    st.dictionaries(st.text(max_size=6), st.integers(-(2**63), 2**63), max_size=4),
                ),
                max_size=5,
            ).map(msgspec.msgpack.encode),
        ),
        min_size=1,
        max_size=4,
    )
)
def test_hostile_frames_are_answered_and_the_service_stays_up(service, frames):
    with Raw(service.ipc) as raw:
        for header in frames:
            raw.send(header)
            answer = raw.read()
            assert answer is None or isinstance(answer, (ProblemAnswer, OkAnswer)), answer
            if answer is None:
                break
            if isinstance(answer, ProblemAnswer):
                assert answer.problem["status"] < 500, answer.problem
    assert _alive(service)


def test_a_repeated_request_is_admitted_again_once_its_region_is_gone(service, problem):
    """A connection keeps the admission of a request it sees again (the same bytes: the same regions,
    new contents); a region unregistered since, here from another connection of the same principal,
    is found when the request comes again, and answered as a lookup by id answers it."""
    want = reference(problem)
    with TopKClient(uds=service.uds) as ipc:
        regions = [ipc.register(t, access="read_only") for t in problem.args()]  # every input named by region
        for _ in range(3):
            assert results_equal(ipc.topk(*regions, topk=512), want) == []
        cache = regions[2]
        with Raw(service.ipc) as raw:
            answer = ask(raw, {"op": "unregister", "id": 1, "region": cache.id, "generation": cache.generation})
            assert isinstance(answer, OkAnswer), answer
        with pytest.raises(RegionProblem) as err:
            ipc.topk(*regions, topk=512)
        assert err.value.code in ("unknown_region", "stale_region") and cache.id in err.value.detail, err.value
        assert results_equal(ipc.topk(*regions[:2], problem.kv_cache, *regions[3:], topk=512), want) == []


def _connect(path: str) -> tuple[socket.socket, object]:
    """A new connection to the IPC socket and the first message the service sends on it."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(20)
    sock.connect(path)
    header_bytes, _ = FRAME.unpack(sock.recv(FRAME.size, socket.MSG_WAITALL))
    return sock, DECODER.decode(sock.recv(header_bytes, socket.MSG_WAITALL))


def _greeted(path: str) -> bool:
    sock, first = _connect(path)
    sock.close()
    return isinstance(first, Hello)


def test_one_uid_cannot_take_every_connection(service):
    """Past ipc_max_connections_per_uid connections of one uid (the setting, as Hello and /v1/info report
    it), the next is answered `overloaded` (instead of Hello) and closed; once the peer closes some, it
    connects again."""
    sock, hello = _connect(service.ipc)
    sock.close()
    limits = {name: hello.info[name] for name in ("ipc_max_connections", "ipc_max_connections_per_uid")}
    assert limits == {"ipc_max_connections": 1024, "ipc_max_connections_per_uid": 256}, limits
    assert hello.info["ipc_max_in_flight"] == ServiceSettings.model_fields["ipc_max_in_flight"].default
    held, refused = [], None
    try:
        for _ in range(limits["ipc_max_connections_per_uid"] + 1):
            sock, first = _connect(service.ipc)
            held.append(sock)
            if not isinstance(first, Hello):
                refused = first
                break
        assert isinstance(refused, ProblemAnswer) and refused.problem["code"] == "overloaded", refused
        assert held[-1].recv(1) == b"", "the refused connection is closed"
    finally:
        for sock in held:
            sock.close()
    wait_until(lambda: _greeted(service.ipc))  # the service sees the closed ones go
    assert _alive(service)
