"""The IPC channel: length-prefixed msgpack frames on a Unix socket, beside HTTP, for the hot path.

    <socket dir>/ipc.sock (SOCK_STREAM, the HTTP socket's mode and group)
    on connect   the peer's uid, gid, pid (SO_PEERCRED) are its principal, as on the HTTP socket;
                 the service sends `Hello` (protocol, /v1/info's document, the principal)
    a frame      u32 header bytes | u32 payload bytes | msgpack header | payload (service/wire.py)
    requests     TopKOp, RegisterOp, UnregisterOp, RegionsOp, RegionOp, InfoOp, ReadyOp, each with
                 an `id`; several may be in flight on one connection (at most ipc_max_in_flight: then
                 `overloaded`; top-k requests also wait in the device queue, `overloaded` when it is
                 full, as over HTTP); answers come as they finish, with the request's id

A request is served by the same code as its HTTP route (service/topk.py for top-k, the region table
for regions), so it meets the same principal, regions, limits, problem codes and answers; a
problem is HTTP's problem+json document in a `ProblemAnswer`. A top-k answer's result fields not
written into regions follow its header in the frame's payload (wire.result_layout), sent from the
answer buffer without a copy.

Threads, not the event loop: the hot path's cost is mostly hand-offs between threads (event loop
-> device worker -> event loop: ~110 us a request on a loaded 2-core host, bench/NOTES-service.md),
so each connection has a thread of its own that reads its frames (blocking, into one buffer) and
serves them there:

    top-k       decoded and admitted on the connection's thread; when the device is idle it is
                executed there too and answered before the next frame is read (no hand-off:
                service/topk.py run_topk_if_idle); when the device is busy it waits in the device queue
                behind the others and the device worker sends its answer; at its deadline
                (REQUEST_TIMEOUT_S) the connection's thread answers `timeout` and drops it;
    the others  served on the connection's thread (a registration maps memory; an unregistration
                waits for the requests running on the region: this connection's next frames wait)

A thread accepts connections (at most ipc_max_connections, ipc_max_connections_per_uid of one uid (settings,
reported by /v1/info and Hello): beyond,
the peer gets `overloaded` instead of `Hello` and is closed; no fd left to accept with is logged
once per interval and retried, never a spin). Answers are written by whichever thread has them,
one frame at a time under the connection's lock and without blocking (MSG_DONTWAIT): what the peer
does not take at once is sent by a flusher thread, and the connection reads no frame until it is
sent (a peer that does not read its answers stalls itself only, and holds at most its answers in
flight).

Bad frames: a header that is not msgpack is `invalid_frame`, a message of an unknown op, with
unknown fields or wrong types is `validation_error` (answered with its id when one can be read);
the connection stays open. When the framing itself cannot be trusted (a header larger than
`MAX_REQUEST_BYTES`: `payload_too_large`; a request carrying a payload: `invalid_frame`) the
problem is sent and the connection closed. A peer that closes mid-frame or mid-request is
dropped; its queued requests are cancelled. Nothing a peer sends stops the service.
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import logging
import os
import select
import socket
import threading
import time

import msgspec
from pydantic import TypeAdapter, ValidationError

from .errors import ServiceError, as_service_error
from .fdpass import peer_credentials
from .logs import OncePerInterval
from .principals import Principal
from .schemas import CudaIpcRegistration, RegionRegistration
from .topk import Admissions, Outcome, phase_durations, queue_topk, run_topk_if_idle
from .wire import (
    FRAME,
    IPC_PROTOCOL,
    Hello,
    InfoOp,
    IpcRequest,
    IpcRequestRaw,
    MessageIdOnly,
    OkAnswer,
    ProblemAnswer,
    ReadyOp,
    RegionOp,
    RegionsOp,
    RegisterOp,
    ResultField,
    TopKAnswer,
    TopKOpRaw,
    TopKRequest,
    UnregisterOp,
    problem_body,
)

log = logging.getLogger("litetopk.service")

_REGISTRATION = TypeAdapter(RegionRegistration)
_DECODER = msgspec.msgpack.Decoder(IpcRequestRaw)  # the frame, a top-k request's own fields left as bytes
_REQUEST_DECODER = msgspec.msgpack.Decoder(TopKRequest)
_STRICT_DECODER = msgspec.msgpack.Decoder(IpcRequest)  # the whole frame at once: its errors say where
_ID_DECODER = msgspec.msgpack.Decoder(MessageIdOnly)
_ENCODER = msgspec.msgpack.Encoder()
INSTANCE = "ipc"
READ_BUFFER_BYTES = 64 * 2**10  # a connection's buffer to start with (grown to its largest frame)
ACCEPT_POLL_S = 0.2


def encode_frame(message, payload=b"") -> list:
    """The frame's parts: prefix + header in one bytes object, then the payload as it is."""
    header = _ENCODER.encode(message)
    head = FRAME.pack(len(header), len(payload)) + header
    return [head, payload] if len(payload) else [head]


class _InFlight:
    """A top-k request between its frame and its answer: its id, the perf_counter() after which it is
    answered `timeout`, its queued job (when the device was busy)."""

    __slots__ = ("id", "deadline", "job")

    def __init__(self, id_: int, deadline: float):
        self.id, self.deadline, self.job = id_, deadline, None


class IpcConnection:
    """One client connection and its thread (module docstring)."""

    def __init__(self, server: "IpcServer", sock: socket.socket, principal: Principal):
        self.server, self.state, self.sock, self.principal = server, server.state, sock, principal
        self.lock = threading.Lock()  # the socket's writes, `in_flight`, the flusher's state
        self.flushed = threading.Condition(self.lock)
        self.in_flight: dict[int, _InFlight] = {}
        self.serving = False  # a frame is being served on the connection's thread
        self.closed = False
        self._keys = itertools.count()
        self.admissions = Admissions(self.state, principal.uid)  # used by the connection's thread only
        self._backlog: list = []  # parts the peer did not take at once, sent by the flusher
        self._flushing = False
        self.thread = threading.Thread(target=self._run, name=f"litetopk-ipc-{principal.pid}", daemon=True)

    # -- the connection's thread -------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self.send(
                Hello(
                    protocol=IPC_PROTOCOL,
                    info=self.state.info(),
                    principal={"uid": self.principal.uid, "gid": self.principal.gid, "pid": self.principal.pid},
                )
            )
            self._read_frames()
        except OSError:
            pass  # the peer went away
        except Exception:  # a bug: logged, the connection dropped, the service up
            log.exception("IPC connection of %s failed", self.principal)
        finally:
            self._close()

    def _read_frames(self) -> None:
        """Read frames into one buffer and serve each complete one, until the peer closes."""
        limit = self.state.settings.max_request_bytes
        buffer = bytearray(READ_BUFFER_BYTES)
        view = memoryview(buffer)
        start = end = 0
        poller = select.poll()
        poller.register(self.sock, select.POLLIN)
        try:
            while True:
                wanted = FRAME.size
                while end - start >= FRAME.size:
                    header_bytes, payload_bytes = FRAME.unpack_from(buffer, start)
                    if header_bytes > limit:
                        self.fail(
                            0,
                            ServiceError(
                                "payload_too_large",
                                f"a frame header of {header_bytes} bytes: at "
                                f"most {limit} (LITETOPK_MAX_REQUEST_BYTES); the connection is "
                                "closed",
                            ),
                        )
                        return
                    if payload_bytes:
                        self.fail(
                            0,
                            ServiceError(
                                "invalid_frame",
                                f"a request frame carries {payload_bytes} payload "
                                "bytes; requests carry none (tensors travel in regions); the "
                                "connection is closed",
                            ),
                        )
                        return
                    wanted = FRAME.size + header_bytes
                    if end - start < wanted:
                        break
                    # a copy (~1 KiB): what the decoded message keeps (a top-k request's bytes) must not
                    # pin the buffer, which grows and shrinks
                    self._dispatch(bytes(view[start + FRAME.size : start + wanted]), time.perf_counter())
                    start += wanted
                    wanted = FRAME.size
                if start == end:
                    start = end = 0
                    if len(buffer) > READ_BUFFER_BYTES:  # back to its size after a large frame
                        view.release()
                        del buffer[READ_BUFFER_BYTES:]
                        view = memoryview(buffer)
                elif len(buffer) - start < wanted or start > len(buffer) // 2:
                    buffer[: end - start] = bytes(view[start:end])  # the partial frame to the front
                    start, end = 0, end - start
                if len(buffer) < wanted:  # a frame larger than any before (at most the limit)
                    view.release()
                    buffer.extend(bytes(wanted - len(buffer)))
                    view = memoryview(buffer)
                self._wait_until_readable(poller)
                got = self.sock.recv_into(view[end:])
                if not got:
                    return
                end += got
        finally:
            view.release()

    def _wait_until_readable(self, poller) -> None:
        """Block until a frame can be read: first until the answers the peer has not taken are sent
        (backpressure), then, with requests waiting in the device queue, answering `timeout` to each
        whose deadline passes meanwhile."""
        with self.lock:
            while self._flushing and not self.closed:
                self.flushed.wait()
            if not self.in_flight:
                return  # recv blocks
        while True:
            with self.lock:
                deadline = min((f.deadline for f in self.in_flight.values()), default=None)
            if deadline is None:
                return  # recv blocks
            if poller.poll(max(0.0, deadline - time.perf_counter()) * 1e3 + 1):
                return
            self._expire(time.perf_counter())

    def _expire(self, now: float) -> None:
        with self.lock:
            late = [key for key, f in self.in_flight.items() if f.deadline <= now]
            expired = [self.in_flight.pop(key) for key in late]
        for request in expired:
            if request.job is not None:
                request.job.cancelled = True  # skipped by the worker when it has not started it
            self.fail(request.id, _timeout(self.state))

    def _dispatch(self, header, started: float) -> None:
        self.serving = True
        try:
            try:
                message = _DECODER.decode(header)  # a top-k request's own fields stay msgpack (TopKOpRaw)
            except (msgspec.ValidationError, msgspec.DecodeError):
                self.fail(*_frame_problem(header))
                return
            if message.__class__ is TopKOpRaw:
                self._topk(message, header, started)
                return
            try:
                value = self._answer(message)
            except BaseException as exc:  # every failure is a problem answer (errors.py's mapping), never a crash
                self.fail(message.id, as_service_error(exc))
                return
            self.send(OkAnswer(id=message.id, value=value))
            self.server.count(message.__struct_config__.tag, "ok")
        finally:
            self.serving = False

    def _topk(self, message: TopKOpRaw, header, started: float) -> None:
        """Admit, then execute here when the device is idle (answered at once), else queue it."""
        marks = [("parse", time.perf_counter())]
        try:
            admitted = self.admissions.admit(bytes(message.request), lambda: _request(message, header))
            marks.append(("admit", time.perf_counter()))
            outcome = run_topk_if_idle(admitted, self.state, marks)
        except BaseException as exc:  # a malformed request, admission, shutting_down
            if isinstance(exc, msgspec.MsgspecError):
                self.fail(*_frame_problem(header))
            else:
                self.fail(message.id, as_service_error(exc))
            return
        if outcome is not None:
            self._answer_topk(message.id, started, marks, outcome)
        else:
            self._queue(message.id, admitted, started, marks)

    def _queue(self, id_: int, admitted, started: float, marks: list) -> None:
        """Queue an admitted request for the device worker, which answers it (`_answer_queued`)."""
        key = next(self._keys)
        request = _InFlight(id_, started + self.state.settings.request_timeout_s)
        with self.lock:
            if len(self.in_flight) >= self.state.settings.ipc_max_in_flight:
                request = None
            else:
                self.in_flight[key] = request
        if request is None:
            self.fail(
                id_,
                ServiceError(
                    "overloaded",
                    f"{self.state.settings.ipc_max_in_flight} requests of this connection are in flight already",
                    retry_after=self.state.settings.retry_after_s,
                ),
            )
            return
        try:
            job = queue_topk(
                admitted, self.state, marks, lambda outcome: self._answer_queued(key, started, marks, outcome)
            )
        except BaseException as exc:  # overloaded (the device queue is full), shutting_down
            with self.lock:
                self.in_flight.pop(key, None)
            self.fail(id_, as_service_error(exc))
            return
        request.job = job  # cancelled at its deadline, or when the peer goes away

    def _answer_queued(self, key: int, started: float, marks: list, outcome) -> None:
        """Answer queued request `key` (on the worker thread), unless it was answered `timeout` or its peer
        went away meanwhile."""
        with self.lock:
            request = self.in_flight.pop(key, None)
        if request is not None:
            self._answer_topk(request.id, started, marks, outcome)

    def _answer_topk(self, id_: int, started: float, marks: list, outcome) -> None:
        """Send the answer of top-k request `id_` (its deadline passed: `timeout`, whichever thread ran it)."""
        ok, value = outcome
        if time.perf_counter() > started + self.state.settings.request_timeout_s:
            self.fail(id_, _timeout(self.state))
            return
        if not ok:
            self.fail(id_, as_service_error(value))
            return
        result: Outcome = value
        marks.append(("encode", time.perf_counter()))
        fields = [ResultField(e["name"], e["dtype"], e["shape"], e["offset"], e["nbytes"]) for e in result.entries]
        self.server.count("topk", "ok", time.perf_counter() - started)
        self.send(
            TopKAnswer(
                id=id_,
                rows=result.rows,
                topk=result.topk,
                written=result.written,
                fields=fields,
                timing=phase_durations(started, marks),
            ),
            result.buffer,
        )

    def _answer(self, message):
        """The value of a region, info or readiness request (what the HTTP route answers as JSON)."""
        table, uid = self.state.table, self.principal.uid
        if isinstance(message, RegisterOp):
            try:
                registration = _REGISTRATION.validate_python(message.registration, strict=True)
            except ValidationError as exc:
                errors = exc.errors(include_url=False, include_input=False, include_context=False)[:32]
                raise ServiceError(
                    "validation_error",
                    f"registration: {errors[0]['msg'] if errors else exc}",
                    errors=[{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in errors],
                ) from None
            if isinstance(registration, CudaIpcRegistration):
                region = table.register_cuda_ipc(registration, uid)
            else:
                fd = self.state.tickets.take(registration.ticket, uid)
                region = table.register_memfd(registration, fd, uid)
            return region.info().model_dump()
        if isinstance(message, UnregisterOp):
            table.unregister(message.region, uid, message.generation, self.state.settings.request_timeout_s)
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

    def _close(self) -> None:
        with self.lock:
            self.closed = True
            dropped, self.in_flight = list(self.in_flight.values()), {}
            self._backlog = []
        for request in dropped:
            if request.job is not None:
                request.job.cancelled = True  # a queued job is then skipped by the worker
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # ends a flusher's send
        except OSError:
            pass
        with self.lock:
            while self._flushing:
                self.flushed.wait()
        self.sock.close()
        self.server.forget(self)

    # -- answers (any thread) ----------------------------------------------------------------------

    def send(self, message, payload=b"") -> None:
        """Write one frame: at once when the peer takes it, else through the flusher (module docstring)."""
        parts = encode_frame(message, payload)
        with self.lock:
            if self.closed:
                return
            if self._flushing:
                self._backlog.extend(parts)
                return
            try:
                sent = self.sock.sendmsg(parts, (), socket.MSG_DONTWAIT)
            except BlockingIOError:
                sent = 0
            except OSError:
                return  # the peer went away: its thread finds out when it reads
            if sent == len(parts[0]) + len(payload):
                return
            self._backlog, self._flushing = _unsent(parts, sent), True
        threading.Thread(target=self._flush, name=f"litetopk-ipc-flush-{self.principal.pid}", daemon=True).start()

    def _flush(self) -> None:
        try:
            while True:
                with self.lock:
                    chunks, self._backlog = self._backlog, []
                    if not chunks or self.closed:
                        return
                for chunk in chunks:
                    self.sock.sendall(chunk)  # blocks this thread only, until the peer reads
        except OSError:
            pass  # the peer went away: its thread finds out when it reads
        finally:
            with self.lock:
                self._flushing, self._backlog = False, []
                self.flushed.notify_all()

    def fail(self, id_: int, error: ServiceError) -> None:
        body = problem_body(error.code, error.detail, INSTANCE, **error.extensions)
        self.send(ProblemAnswer(id=id_, problem=body))
        self.server.count("error", error.code)


def _unsent(parts: list, sent: int) -> list:
    """What is left of `parts` after `sent` bytes of them went out."""
    rest = []
    for part in parts:
        if sent >= len(part):
            sent -= len(part)
            continue
        rest.append(memoryview(part)[sent:] if sent else part)
        sent = 0
    return rest


def _timeout(state) -> ServiceError:
    return ServiceError("timeout", f"no answer within {state.settings.request_timeout_s} s (queue wait + device time)")


def _request(message: TopKOpRaw, header) -> TopKRequest:
    """The TopKRequest of a top-k message (msgspec's errors raised as decoding the whole frame raises them)."""
    try:
        return _REQUEST_DECODER.decode(message.request)
    except msgspec.MsgspecError:
        _STRICT_DECODER.decode(header)  # the error, located in the frame (`$.request...`)
        raise


def _frame_problem(header) -> tuple[int, ServiceError]:
    """(id to answer, problem) of a frame that does not decode as a message of the protocol."""
    try:
        _STRICT_DECODER.decode(header)
    except msgspec.ValidationError as exc:
        return _message_id(header), ServiceError(
            "validation_error", f"the message does not match the protocol: {exc}", errors=[{"msg": str(exc)}]
        )
    except msgspec.DecodeError as exc:
        return 0, ServiceError("invalid_frame", f"the frame's header is not a msgpack message: {exc}")
    raise AssertionError("a frame that did not decode once decoded")


def _message_id(header) -> int:
    """The `id` of a message that failed to decode (0 when even that cannot be read)."""
    try:
        return _ID_DECODER.decode(header).id
    except (msgspec.DecodeError, msgspec.ValidationError):
        return 0


class IpcServer:
    """The listening IPC socket at `path` and its accept thread (`start`, `close`: close unlinks it)."""

    def __init__(self, state, path: str, mode: int = 0o600, gid: int | None = None):
        self.state, self.path, self.mode, self.gid = state, path, mode, gid
        self.connections: set[IpcConnection] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._shortage = OncePerInterval(log, state.settings.resource_log_interval_s)
        self._counters: dict = {}

    async def start(self) -> None:
        if os.path.lexists(self.path):
            os.unlink(self.path)  # ours: the directory is private to the service's uid (settings.socket_dir)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(self.path)
        if self.gid is not None:
            os.chown(self.path, -1, self.gid)
        os.chmod(self.path, self.mode)
        sock.listen(128)
        sock.settimeout(ACCEPT_POLL_S)
        self._listener = sock
        self._thread = threading.Thread(target=self._accept, name="litetopk-ipc-accept", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                sock, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError as exc:
                if self._stop.is_set():
                    return
                if exc.errno in (errno.EMFILE, errno.ENFILE):
                    self._shortage.warning(
                        "IPC socket %s: no file descriptors left (%s); connections wait (raise "
                        "the service's RLIMIT_NOFILE, or fewer regions)",
                        self.path,
                        exc,
                    )
                else:
                    self._shortage.warning("IPC socket %s: accept failed: %s", self.path, exc)
                self._stop.wait(ACCEPT_POLL_S)  # never a spin
                continue
            try:
                self._admit(sock)
            except Exception:  # e.g. no thread can be started: this peer is refused, the service goes on
                log.exception("IPC socket %s: a connection could not be served", self.path)
                sock.close()

    def _admit(self, sock: socket.socket) -> None:
        sock.settimeout(None)
        pid, uid, gid = peer_credentials(sock)
        connection = IpcConnection(self, sock, Principal(uid=uid, gid=gid, pid=pid, via="ipc"))
        with self._lock:
            mine = sum(c.principal.uid == uid for c in self.connections)
            s = self.state.settings
            full = len(self.connections) >= s.ipc_max_connections or mine >= s.ipc_max_connections_per_uid
            if not full:
                self.connections.add(connection)
        if full:
            connection.fail(
                0,
                ServiceError(
                    "overloaded",
                    f"the IPC channel serves at most {s.ipc_max_connections} "
                    f"connections, {s.ipc_max_connections_per_uid} of one uid; close some",
                    retry_after=self.state.settings.retry_after_s,
                ),
            )
            sock.close()
            return
        connection.thread.start()

    def forget(self, connection: IpcConnection) -> None:
        with self._lock:
            self.connections.discard(connection)

    def count(self, op: str, code: str, seconds: float | None = None) -> None:
        """litetopk_requests_total (and the latency of answers) of IPC requests (children looked up once)."""
        counters = self._counters.get((op, code))
        if counters is None:
            metrics = self.state.metrics
            counters = self._counters[(op, code)] = (
                metrics.requests.labels(f"ipc:{op}", "IPC", code),
                metrics.latency.labels(f"ipc:{op}"),
            )
        counters[0].inc()
        if seconds is not None:
            counters[1].observe(seconds)

    async def close(self) -> None:
        """Stop accepting, let every connection's requests finish (they are answered), close them."""
        self._stop.set()
        await asyncio.to_thread(self._drain)
        if os.path.lexists(self.path):
            os.unlink(self.path)

    def _drain(self) -> None:
        if self._thread is not None:
            self._thread.join()
        if self._listener is not None:
            self._listener.close()
        deadline = time.monotonic() + self.state.settings.shutdown_timeout_s + 1
        while time.monotonic() < deadline:
            with self._lock:
                connections = list(self.connections)
            if not any(c.in_flight or c.serving for c in connections):
                break
            time.sleep(0.01)
        for connection in connections:
            try:
                connection.sock.shutdown(socket.SHUT_RDWR)  # its thread reads the end and closes it
            except OSError:
                pass
        for connection in connections:
            connection.thread.join(max(0.0, deadline - time.monotonic()))


__all__ = ["IpcConnection", "IpcServer", "encode_frame"]
