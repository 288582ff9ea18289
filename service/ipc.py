"""The IPC channel: length-prefixed msgpack frames on a Unix socket, beside HTTP, for the hot path.

    <socket dir>/ipc.sock (SOCK_STREAM, the HTTP socket's mode and group)
    on connect   the peer's uid, gid, pid (SO_PEERCRED) are its principal, as on the HTTP socket;
                 the service sends `Hello` (protocol, /v1/info's document, the principal)
    a frame      u32 header bytes | u32 payload bytes | msgpack header | payload (service/wire.py)
    requests     TopKOp, RegisterOp, UnregisterOp, RegionsOp, RegionOp, InfoOp, ReadyOp, each with
                 an `id`; several may be in flight on one connection (at most MAX_IN_FLIGHT: then
                 `overloaded`; top-k requests also wait in the device queue, `overloaded` when it is
                 full, as over HTTP); answers come as they finish, with the request's id

A request is served by the same code as its HTTP route (service/topk.py for top-k, the region table
for regions), so it meets the same principal, regions, limits, problem codes and answers; a
problem is HTTP's problem+json document in a `ProblemAnswer`. A top-k answer's result fields not
written into regions follow its header in the frame's payload (wire.result_layout), sent from the
answer buffer without a copy.

Bad frames: a header that is not msgpack is `invalid_frame`, a message of an unknown op, with
unknown fields or wrong types is `validation_error` (answered with its id when one can be read);
the connection stays open. When the framing itself cannot be trusted (a header larger than
`MAX_REQUEST_BYTES`: `payload_too_large`; a request carrying a payload: `invalid_frame`) the
problem is sent and the connection closed. A peer that closes mid-frame or mid-request is
dropped; its queued requests are cancelled. Nothing a peer sends stops the service.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time

import msgspec
from pydantic import TypeAdapter, ValidationError

from .errors import ServiceError, as_service_error
from .fdpass import peer_credentials
from .principals import Principal
from .schemas import CudaIpcRegistration, RegionRegistration
from .topk import call_topk, phase_durations
from .wire import (
    FRAME,
    IPC_PROTOCOL,
    Hello,
    InfoOp,
    IpcRequest,
    MessageIdOnly,
    OkAnswer,
    ProblemAnswer,
    ReadyOp,
    RegionOp,
    RegionsOp,
    RegisterOp,
    ResultField,
    TopKAnswer,
    TopKOp,
    UnregisterOp,
    problem_body,
)

log = logging.getLogger("litetopk.service")

_REGISTRATION = TypeAdapter(RegionRegistration)
_DECODER = msgspec.msgpack.Decoder(IpcRequest)
_ID_DECODER = msgspec.msgpack.Decoder(MessageIdOnly)
_ENCODER = msgspec.msgpack.Encoder()
INSTANCE = "ipc"
MAX_IN_FLIGHT = 1024  # requests of one connection in flight at once (top-k ones also meet the device queue's bound)


def encode_frame(message, payload=b"") -> list:
    """The frame's parts: prefix + header in one bytes object, then the payload as it is."""
    header = _ENCODER.encode(message)
    head = FRAME.pack(len(header), len(payload)) + header
    return [head, payload] if len(payload) else [head]


class IpcConnection(asyncio.Protocol):
    """One client connection (module docstring)."""

    def __init__(self, server: "IpcServer"):
        self.server = server
        self.state = server.state
        self.buffer = bytearray()
        self.tasks: set[asyncio.Task] = set()
        self.transport: asyncio.Transport | None = None
        self.principal: Principal | None = None
        self.closing = False

    # -- connection ------------------------------------------------------------------------------

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.server.connections.add(self)
        pid, uid, gid = peer_credentials(transport.get_extra_info("socket"))
        self.principal = Principal(uid=uid, gid=gid, pid=pid, via="ipc")
        self.send(Hello(protocol=IPC_PROTOCOL, info=self.state.info(), principal={"uid": uid, "gid": gid, "pid": pid}))

    def connection_lost(self, exc) -> None:
        self.closing = True
        self.server.connections.discard(self)
        for task in self.tasks:
            task.cancel()  # a queued job is then skipped by the worker

    def send(self, message, payload=b"") -> None:
        if self.transport is None or self.transport.is_closing():
            return
        for part in encode_frame(message, payload):
            self.transport.write(part)

    def fail(self, id_: int, error: ServiceError, *, close: bool = False) -> None:
        body = problem_body(error.code, error.detail, INSTANCE, **error.extensions)
        self.send(ProblemAnswer(id=id_, problem=body))
        self.server.count("error", error.code)
        if close:
            self.closing = True
            self.transport.close()

    # -- frames ----------------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        self.buffer += data
        limit = self.state.settings.max_request_bytes
        while len(self.buffer) >= FRAME.size:
            header_bytes, payload_bytes = FRAME.unpack_from(self.buffer)
            if header_bytes > limit:
                self.fail(0, ServiceError("payload_too_large", f"a frame header of {header_bytes} bytes: at most "
                                          f"{limit} (LITETOPK_MAX_REQUEST_BYTES); the connection is closed"), close=True)
                return
            if payload_bytes:
                self.fail(0, ServiceError("invalid_frame", f"a request frame carries {payload_bytes} payload bytes; "
                                          "requests carry none (tensors travel in regions); the connection is "
                                          "closed"), close=True)
                return
            end = FRAME.size + header_bytes
            if len(self.buffer) < end:
                return
            header = bytes(memoryview(self.buffer)[FRAME.size:end])
            del self.buffer[:end]
            self.dispatch(header, time.perf_counter())

    def dispatch(self, header: bytes, started: float) -> None:
        try:
            message = _DECODER.decode(header)
        except msgspec.ValidationError as exc:
            self.fail(_message_id(header), ServiceError("validation_error", f"the message does not match the "
                                                        f"protocol: {exc}", errors=[{"msg": str(exc)}]))
            return
        except msgspec.DecodeError as exc:
            self.fail(0, ServiceError("invalid_frame", f"the frame's header is not a msgpack message: {exc}"))
            return
        if len(self.tasks) >= MAX_IN_FLIGHT:
            self.fail(message.id, ServiceError("overloaded", f"{len(self.tasks)} requests of this connection are in "
                                               "flight already", retry_after=self.state.settings.retry_after_s))
            return
        task = asyncio.get_running_loop().create_task(self.serve(message, started))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def serve(self, message, started: float) -> None:
        try:
            if isinstance(message, TopKOp):
                await self.topk(message, started)
                return
            value = await self.answer(message)
            self.send(OkAnswer(id=message.id, value=value))
            self.server.count(message.__struct_config__.tag, "ok")
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # every failure is a problem answer (errors.py's mapping), never a crash
            self.fail(message.id, as_service_error(exc))

    async def topk(self, message: TopKOp, started: float) -> None:
        marks = [("parse", time.perf_counter())]
        outcome = await call_topk(message.request, self.state, self.principal, marks)
        marks.append(("encode", time.perf_counter()))
        fields = [ResultField(e["name"], e["dtype"], e["shape"], e["offset"], e["nbytes"]) for e in outcome.entries]
        self.send(TopKAnswer(id=message.id, rows=outcome.rows, topk=outcome.topk, written=outcome.written,
                             fields=fields, timing=phase_durations(started, marks)), outcome.buffer)
        self.server.count("topk", "ok", time.perf_counter() - started)

    async def answer(self, message):
        """The value of a region, info or readiness request (what the HTTP route answers as JSON)."""
        table, uid = self.state.table, self.principal.uid
        if isinstance(message, RegisterOp):
            try:
                registration = _REGISTRATION.validate_python(message.registration, strict=True)
            except ValidationError as exc:
                errors = exc.errors(include_url=False, include_input=False, include_context=False)[:32]
                raise ServiceError("validation_error", f"registration: {errors[0]['msg'] if errors else exc}",
                                   errors=[{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]}
                                           for e in errors]) from None
            if isinstance(registration, CudaIpcRegistration):
                region = await asyncio.to_thread(table.register_cuda_ipc, registration, uid)
            else:
                fd = self.state.tickets.take(registration.ticket, uid)
                region = await asyncio.to_thread(table.register_memfd, registration, fd, uid)
            return region.info().model_dump()
        if isinstance(message, UnregisterOp):
            await asyncio.to_thread(table.unregister, message.region, uid, message.generation,
                                    self.state.settings.request_timeout_s)
            return None
        if isinstance(message, RegionsOp):
            return {"regions": [r.info().model_dump() for r in table.list(uid)]}
        if isinstance(message, RegionOp):
            return table.get(message.region, uid).info().model_dump()
        if isinstance(message, InfoOp):
            return self.state.info()
        if isinstance(message, ReadyOp):
            return self.state.readiness()
        raise ServiceError("validation_error", f"unknown message {type(message).__name__}")


def _message_id(header: bytes) -> int:
    """The `id` of a message that failed to decode (0 when even that cannot be read)."""
    try:
        return _ID_DECODER.decode(header).id
    except (msgspec.DecodeError, msgspec.ValidationError):
        return 0


class IpcServer:
    """The listening IPC socket at `path` on the running event loop (`start`, `close`: close unlinks it)."""

    def __init__(self, state, path: str, mode: int = 0o600, gid: int | None = None):
        self.state, self.path, self.mode, self.gid = state, path, mode, gid
        self.connections: set[IpcConnection] = set()
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        if os.path.lexists(self.path):
            os.unlink(self.path)  # ours: the directory is private to the service's uid (settings.socket_dir)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(self.path)
        if self.gid is not None:
            os.chown(self.path, -1, self.gid)
        os.chmod(self.path, self.mode)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(lambda: IpcConnection(self), sock=sock, backlog=128)

    def count(self, op: str, code: str, seconds: float | None = None) -> None:
        metrics = self.state.metrics
        metrics.requests.labels(f"ipc:{op}", "IPC", code).inc()
        if seconds is not None:
            metrics.latency.labels(f"ipc:{op}").observe(seconds)

    async def close(self) -> None:
        """Stop accepting, let every connection's requests finish (they are answered), close them."""
        if self._server is not None:
            self._server.close()
        tasks = [t for c in list(self.connections) for t in c.tasks]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        for connection in list(self.connections):
            if connection.transport is not None:
                connection.transport.close()
        if os.path.lexists(self.path):
            os.unlink(self.path)


__all__ = ["IpcConnection", "IpcServer", "encode_frame"]
