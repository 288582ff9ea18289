"""The client side of the service's IPC channel (service/ipc.py; frames in litetopk.service.wire).

`IpcChannel` (blocking) and `AsyncIpcChannel` (asyncio) connect to `ipc.sock` beside the service's
Unix socket, read its `Hello`, and answer the client's calls, which are written once for both
transports as HTTP calls `(method, path, kwargs)` (client.py): `request(method, path, **kwargs)`
maps each route onto its IPC message and returns an `IpcResponse`, which reads like the
httpx.Response of the same route (status, content type, JSON document), plus, for a top-k answer,
`result` = (fields, written) decoded from the frame's payload without a copy (the tensors view the
received bytes). The async channel multiplexes requests over one connection by message id.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import socket
import struct
import threading
from pathlib import Path

import msgspec

from litetopk.service.wire import (
    FRAME,
    IPC_PROTOCOL,
    IPC_SOCKET_NAME,
    Hello,
    IpcAnswer,
    OkAnswer,
    TopKAnswer,
    fields_in,
)

from .errors import ProtocolError, TransportError

CONNECT_TIMEOUT_S = 10.0
READ_BUFFER_BYTES = 64 * 2**10
_DECODER = msgspec.msgpack.Decoder(IpcAnswer)
_ENCODER = msgspec.msgpack.Encoder()


def ipc_socket_path(uds: str) -> str:
    """Where the IPC channel of the service listening on Unix socket `uds` is."""
    return str(Path(uds).parent / IPC_SOCKET_NAME)


class IpcResponse:
    """One answer, read like the httpx.Response of the same HTTP route (module docstring)."""

    __slots__ = ("status_code", "_headers", "_doc", "result", "_timing")

    def __init__(self, status_code: int, doc, headers: dict, result=None, timing: dict | None = None):
        self.status_code, self._doc, self._headers, self.result = status_code, doc, headers, result
        self._timing = timing  # a top-k answer's phases: its Server-Timing header, written when read

    @property
    def headers(self) -> dict:
        if self._timing is not None:
            self._headers["server-timing"] = ", ".join(f"{k};dur={v:.3f}" for k, v in self._timing.items())
            self._timing = None
        return self._headers

    @property
    def is_success(self) -> bool:
        return 200 <= self.status_code < 300

    def json(self):
        return self._doc

    @property
    def text(self) -> str:
        return str(self._doc)


class PackedBody(dict):
    """A request body that never changes (a kept top-k plan's, client.py), encoded once a transport: the
    IPC channel sends its msgpack (`packed`, worked out at once), HTTP its JSON (`http_arguments`, worked
    out at the first HTTP call: httpx would encode the dict again on every call, ~60 us for a decode
    request on a 2-core VM)."""

    __slots__ = ("packed", "_json")

    def __init__(self, body: dict):
        super().__init__(body)
        self.packed = msgspec.Raw(_ENCODER.encode(body))
        self._json = None

    def json_bytes(self) -> bytes:
        """The body as httpx encodes a `json=` argument (compact, UTF-8, no NaN: ValueError as httpx's)."""
        if self._json is None:
            self._json = json.dumps(self, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
        return self._json


def http_arguments(kwargs: dict) -> dict:
    """httpx's arguments of a call of the client's flows: a PackedBody sent as its JSON bytes."""
    body = kwargs.get("json")
    if body.__class__ is not PackedBody:
        return kwargs
    rest = {k: v for k, v in kwargs.items() if k != "json"}
    headers = {**(kwargs.get("headers") or {}), "content-type": "application/json"}
    return {**rest, "content": body.json_bytes(), "headers": headers}


def message_for(id_: int, method: str, path: str, kwargs: dict) -> dict:
    """The IPC message of an HTTP call of the client's flows."""
    if path == "/v1/topk" and method == "POST":
        body = kwargs["json"]
        return {"op": "topk", "id": id_, "request": body.packed if body.__class__ is PackedBody else body}
    if path == "/v1/regions" and method == "POST":
        return {"op": "register", "id": id_, "registration": kwargs["json"]}
    if path == "/v1/regions" and method == "GET":
        return {"op": "regions", "id": id_}
    if path.startswith("/v1/regions/") and method == "DELETE":
        generation = (kwargs.get("params") or {}).get("generation")
        return {"op": "unregister", "id": id_, "region": path.rsplit("/", 1)[1], "generation": generation}
    if path.startswith("/v1/regions/") and method == "GET":
        return {"op": "region", "id": id_, "region": path.rsplit("/", 1)[1]}
    if path == "/v1/info":
        return {"op": "info", "id": id_}
    if path == "/readyz":
        return {"op": "ready", "id": id_}
    raise ValueError(f"{method} {path} has no IPC message")


def response_for(answer, payload: bytearray) -> IpcResponse:
    if answer.__class__ is TopKAnswer:
        entries = [{"name": f.name, "dtype": f.dtype, "shape": f.shape, "offset": f.offset} for f in answer.fields]
        return IpcResponse(
            200,
            None,
            {"content-type": "application/vnd.litetopk.ipc"},
            (fields_in(payload, entries) if entries else {}, answer.written),
            answer.timing,
        )
    if isinstance(answer, OkAnswer):
        return IpcResponse(204 if answer.value is None else 200, answer.value, {"content-type": "application/json"})
    problem = answer.problem
    headers = {"content-type": "application/problem+json"}
    if problem.get("retry_after") is not None:
        headers["retry-after"] = str(problem["retry_after"])
    return IpcResponse(int(problem.get("status", 500)), problem, headers)


def _check_hello(answer, path: str) -> Hello:
    if not isinstance(answer, Hello) or answer.protocol != IPC_PROTOCOL:
        raise ProtocolError(f"{path} did not greet with IPC protocol {IPC_PROTOCOL}: {answer!r}")
    return answer


class IpcChannel:
    """A blocking connection to the IPC channel at `path` (one request at a time; thread-safe).

    Answers are read into one buffer, as much as the socket holds at a time (an answer's frame
    usually in one recv); a payload larger than the buffer goes straight into its own memory."""

    def __init__(self, path: str, timeout: float | None = None):
        self.path = path
        self._buffer = bytearray(READ_BUFFER_BYTES)
        self._start = self._end = 0  # the unread bytes: _buffer[_start:_end]
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(CONNECT_TIMEOUT_S)
        self.timeout = timeout
        try:
            self.sock.connect(path)
            _set_timeout(self.sock, timeout)
            self.hello = _check_hello(self._read()[0], path)
        except OSError as exc:
            self.sock.close()
            raise TransportError(f"litetopk IPC channel at {self.path}: {_reason(exc, timeout)}") from exc
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def _buffered(self, count: int) -> None:
        """Read until `count` bytes are unread in the buffer (grown when they do not fit)."""
        if self._end - self._start >= count:
            return
        if len(self._buffer) - self._start < count:  # move the unread bytes to the front (and grow)
            unread = self._buffer[self._start : self._end]
            if len(self._buffer) < count:
                self._buffer = bytearray(count)
            self._buffer[: len(unread)] = unread
            self._start, self._end = 0, len(unread)
        while self._end - self._start < count:
            if self._end:
                with memoryview(self._buffer) as view:
                    got = self.sock.recv_into(view[self._end :])
            else:  # the buffer is empty (an answer usually comes whole): no view needed
                got = self.sock.recv_into(self._buffer)
            if not got:
                raise TransportError(f"litetopk IPC channel at {self.path}: the service closed the connection")
            self._end += got

    def _read(self):
        """The next frame's (answer, payload): the header decoded from the buffer; the payload in memory
        of its own (the result's tensors view it), what the buffer does not hold read into it directly."""
        if self._end - self._start < FRAME.size:
            self._buffered(FRAME.size)
        header_bytes, payload_bytes = FRAME.unpack_from(self._buffer, self._start)
        if self._end - self._start < FRAME.size + header_bytes:
            self._buffered(FRAME.size + header_bytes)
        header_start = self._start + FRAME.size
        header_end = header_start + header_bytes
        try:
            answer = _DECODER.decode(memoryview(self._buffer)[header_start:header_end])
        except msgspec.MsgspecError as exc:
            raise ProtocolError(f"unreadable IPC answer: {exc}") from exc
        have = min(self._end - header_end, payload_bytes)
        payload = self._buffer[header_end : header_end + have]  # a copy: the buffer is reused
        self._start = header_end + have
        if self._start == self._end:
            self._start = self._end = 0
        if have < payload_bytes:  # a large payload: the rest straight from the socket
            payload.extend(bytes(payload_bytes - have))
            with memoryview(payload) as rest:
                rest = rest[have:]
                while rest.nbytes:
                    got = self.sock.recv_into(rest)
                    if not got:
                        raise TransportError(f"litetopk IPC channel at {self.path}: the service closed the connection")
                    rest = rest[got:]
        return answer, payload

    def request(self, method: str, path: str, **kwargs) -> IpcResponse:
        with self._lock:
            id_ = next(self._ids)
            header = _ENCODER.encode(message_for(id_, method, path, kwargs))
            try:
                self.sock.sendall(FRAME.pack(len(header), 0) + header)
                while True:
                    answer, payload = self._read()
                    if getattr(answer, "id", None) in (id_, 0):
                        return response_for(answer, payload)
            except OSError as exc:
                raise TransportError(f"litetopk IPC channel at {self.path}: {_reason(exc, self.timeout)}") from exc

    def close(self) -> None:
        self.sock.close()


def _set_timeout(sock: socket.socket, timeout: float | None) -> None:
    """Bound each blocking send and receive by `timeout` seconds in the kernel (SO_SNDTIMEO /
    SO_RCVTIMEO) and leave the socket in blocking mode: a socket with a Python-level timeout polls
    before every send and every receive, two syscalls more a request (~3-6 us on a 2-core VM,
    bench/NOTES-service.md). A timeout the kernel cannot take (0: non-blocking) stays Python's."""
    if timeout is None:
        sock.settimeout(None)
        return
    if not timeout > 0 or timeout >= 2**31:
        sock.settimeout(timeout)
        return
    sock.settimeout(None)
    seconds = int(timeout)
    micros = max(int((timeout - seconds) * 1e6), 0 if seconds else 1)  # never 0 s 0 us: that is no timeout
    value = struct.pack("@ll", seconds, micros)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)


def _reason(exc: OSError, timeout: float | None) -> str:
    """What went wrong, in words: a kernel timeout surfaces as EAGAIN on a blocking socket."""
    if isinstance(exc, (BlockingIOError, TimeoutError)):
        return f"timed out (no answer within {timeout} s)"
    return str(exc)


class AsyncIpcChannel:
    """An asyncio connection to the IPC channel: requests in flight together, matched by id."""

    def __init__(self, path: str):
        self.path = path
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self._reader = self._writer = self._task = None
        self.hello: Hello | None = None

    async def connect(self) -> "AsyncIpcChannel":
        try:
            self._reader, self._writer = await asyncio.open_unix_connection(self.path, limit=2**24)
            self.hello = _check_hello((await self._read())[0], self.path)
        except OSError as exc:
            raise TransportError(f"litetopk IPC channel at {self.path}: {exc}") from exc
        self._task = asyncio.get_running_loop().create_task(self._dispatch())
        return self

    async def _read(self):
        prefix = await self._reader.readexactly(FRAME.size)
        header_bytes, payload_bytes = FRAME.unpack(prefix)
        header = await self._reader.readexactly(header_bytes)
        payload = bytearray(await self._reader.readexactly(payload_bytes)) if payload_bytes else bytearray()
        return _DECODER.decode(header), payload

    async def _dispatch(self) -> None:
        error: BaseException = TransportError(f"litetopk IPC channel at {self.path}: the service closed the connection")
        try:
            while True:
                answer, payload = await self._read()
                future = self._pending.pop(getattr(answer, "id", -1), None)
                if future is not None and not future.done():
                    future.set_result(response_for(answer, payload))
                elif getattr(answer, "id", None) == 0:  # a problem the service could not address: fail everyone
                    error = ProtocolError(f"the IPC channel refused a frame: {answer!r}")
                    break
        except (asyncio.IncompleteReadError, OSError, msgspec.MsgspecError) as exc:
            error = TransportError(f"litetopk IPC channel at {self.path}: {type(exc).__name__}: {exc}")
        finally:
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(error)
            self._pending.clear()

    async def request(self, method: str, path: str, **kwargs) -> IpcResponse:
        id_ = next(self._ids)
        header = _ENCODER.encode(message_for(id_, method, path, kwargs))
        future = asyncio.get_running_loop().create_future()
        self._pending[id_] = future
        if self._task is None or self._task.done():
            self._pending.pop(id_, None)
            raise TransportError(f"litetopk IPC channel at {self.path} is closed")
        self._writer.write(FRAME.pack(len(header), 0) + header)
        try:
            return await future
        finally:
            self._pending.pop(id_, None)

    async def aclose(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if self._task is not None:
            self._task.cancel()


def reachable(uds: str | None) -> str | None:
    """The IPC socket beside `uds` when it exists (the client then tries it), else None."""
    if not uds:
        return None
    path = ipc_socket_path(uds)
    return path if os.path.exists(path) else None


__all__ = [
    "AsyncIpcChannel",
    "IpcChannel",
    "IpcResponse",
    "PackedBody",
    "http_arguments",
    "ipc_socket_path",
    "message_for",
    "reachable",
    "response_for",
]
