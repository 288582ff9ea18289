"""The fd socket: file descriptors handed over with SCM_RIGHTS, named by one-time tickets.

The protocol (one message each way per connection) is litetopk.clients.memfd's. A thread accepts
on a SOCK_SEQPACKET socket beside the HTTP socket (same directory, same mode), reads the sender's
uid with SO_PEERCRED, takes exactly one fd and answers a ticket. `FdTickets.take(ticket, uid)`
gives the fd to the registration that names the ticket, once, and only when the HTTP caller is
the same uid; unclaimed fds are closed after TICKET_TTL_S. Parked fds never take the last
`fd_headroom()` of the service's fd limit: those are left to HTTP and IPC connections, owners'
pidfds and CUDA, so a client parking fds cannot starve the other sockets (the HTTP loop, uvloop,
resets connections it has no fd to accept with). Nothing here looks at the fd's contents:
service/memory.py checks the seals when the registration maps it.
"""

from __future__ import annotations

import array
import errno
import json
import logging
import os
import resource
import secrets
import socket
import struct
import threading
import time
from dataclasses import dataclass

from .errors import ServiceError
from .logs import OncePerInterval
from .wire import HANDOVER_MESSAGE, TICKET_TTL_S

log = logging.getLogger("litetopk.service")

MAX_TICKETS_PER_UID = 256  # unclaimed fds one uid may park at a time
FD_HEADROOM_MIN = 16  # fds never taken by parking: at least this many, and 1/16 of RLIMIT_NOFILE
ACCEPT_POLL_S = 0.2
CONNECTION_TIMEOUT_S = 2.0
_CREDENTIALS = struct.Struct("3i")  # struct ucred: pid, uid, gid


FD_EXHAUSTED = {
    "code": "fd_exhausted",
    "detail": "the service has no file descriptors left to receive the memory "
    "with; retry later (its operator raises RLIMIT_NOFILE or frees regions)",
}


def _open_reserve() -> int | None:
    try:
        return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


def fd_headroom() -> int:
    """The fds a handover leaves free at least: max(FD_HEADROOM_MIN, RLIMIT_NOFILE's soft limit / 16)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return FD_HEADROOM_MIN if soft == resource.RLIM_INFINITY else max(FD_HEADROOM_MIN, soft // 16)


def fds_free() -> int | None:
    """How many more fds this process may open now (RLIMIT_NOFILE's soft limit less those open); 0 when
    not even the listing's own fd can be opened; None when it cannot be known (no /proc, no limit)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        open_now = len(os.listdir("/proc/self/fd")) - 1  # the listing's own fd is listed too
    except OSError as exc:
        return 0 if exc.errno in (errno.EMFILE, errno.ENFILE) else None
    return None if soft == resource.RLIM_INFINITY else soft - open_now


def peer_credentials(sock) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a connected Unix socket (SO_PEERCRED)."""
    return _CREDENTIALS.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDENTIALS.size))


@dataclass
class _Ticket:
    fd: int
    uid: int
    expires: float


class FdTickets:
    """Unclaimed fds by ticket (thread-safe)."""

    def __init__(self, ttl_s: float = TICKET_TTL_S):
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._tickets: dict[str, _Ticket] = {}

    def issue(self, fd: int, uid: int) -> str:
        """Park `fd` (owned from now on) for `uid`; ServiceError `overloaded` past MAX_TICKETS_PER_UID."""
        self.expire()
        with self._lock:
            if sum(t.uid == uid for t in self._tickets.values()) >= MAX_TICKETS_PER_UID:
                os.close(fd)
                raise ServiceError(
                    "overloaded",
                    f"uid {uid} already has {MAX_TICKETS_PER_UID} unclaimed fds; "
                    "register them (or wait for them to expire) first",
                )
            ticket = secrets.token_urlsafe(18)
            self._tickets[ticket] = _Ticket(fd, uid, time.monotonic() + self.ttl_s)
        return ticket

    def take(self, ticket: str, uid: int) -> int:
        """The fd behind `ticket`, now owned by the caller; `unknown_ticket` unless `uid` parked it."""
        with self._lock:
            entry = self._tickets.get(ticket)
            if entry is not None and entry.uid == uid and entry.expires > time.monotonic():
                del self._tickets[ticket]
                return entry.fd
        raise ServiceError(
            "unknown_ticket",
            f"no fd was handed over under this ticket by uid {uid} in the last "
            f"{self.ttl_s:.0f} s (tickets are one-time and belong to the uid that sent the fd)",
        )

    def expire(self) -> None:
        now = time.monotonic()
        with self._lock:
            old = [k for k, t in self._tickets.items() if t.expires <= now]
            fds = [self._tickets.pop(k).fd for k in old]
        for fd in fds:
            os.close(fd)

    def close_all(self) -> None:
        with self._lock:
            fds = [t.fd for t in self._tickets.values()]
            self._tickets.clear()
        for fd in fds:
            os.close(fd)


class FdSocket:
    """The listening fd socket at `path` and its accept thread (`start`, `stop`: stop unlinks it)."""

    def __init__(
        self, path: str, tickets: FdTickets, mode: int = 0o600, gid: int | None = None, log_interval_s: float = 10.0
    ):
        self.path = path
        self.tickets = tickets
        self._shortage = OncePerInterval(log, log_interval_s)  # no fd left
        self._headroom = OncePerInterval(log, log_interval_s)  # parking stopped at the headroom
        self._reserve = _open_reserve()  # given up for a moment to answer `fd_exhausted` when none are left
        if os.path.lexists(path):
            os.unlink(path)  # ours: the directory is private to the service's uid (settings.socket_dir)
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._listener.bind(path)
        if gid is not None:
            os.chown(path, -1, gid)
        os.chmod(path, mode)
        self._listener.listen(64)
        self._listener.settimeout(ACCEPT_POLL_S)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="litetopk-fd-socket", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5 * ACCEPT_POLL_S + CONNECTION_TIMEOUT_S)
        self._listener.close()
        if self._reserve is not None:
            os.close(self._reserve)
            self._reserve = None
        if os.path.lexists(self.path):
            os.unlink(self.path)

    def _serve(self) -> None:
        while not self._stop.is_set():
            if self._reserve is None:  # given up to answer at exhaustion (its slot may have gone to another thread)
                self._reserve = _open_reserve()
            try:
                conn, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE):
                    self._refuse_without_fds(exc)
                else:
                    self._shortage.warning("fd socket %s: accept failed: %s", self.path, exc)
                    self._stop.wait(ACCEPT_POLL_S)  # never a spin
                continue
            self._handle(conn)

    def _handle(self, conn: socket.socket) -> None:
        """Read one handover from `conn`, answer it, close it."""
        with conn:
            conn.settimeout(CONNECTION_TIMEOUT_S)
            try:
                conn.send(json.dumps(self._answer(conn)).encode())
            except OSError as exc:  # the peer went away or stalled: nothing parked for it
                log.info("fd socket %s: a handover failed: %s", self.path, exc)

    def _refuse_without_fds(self, exc: OSError) -> None:
        """No fd left to accept with: give up the reserve fd for a moment, accept, read the handover
        (its fd is dropped: none is left to receive it with) and answer `fd_exhausted` (the serving loop takes
        the reserve again before its next accept); log once per interval; wait a poll interval when even that
        fails."""
        self._shortage.warning(
            "fd socket %s: no file descriptors left (%s); handovers are answered fd_exhausted "
            "(raise the service's RLIMIT_NOFILE, or fewer unclaimed fds)",
            self.path,
            exc,
        )
        if self._reserve is None:
            self._stop.wait(ACCEPT_POLL_S)
            return
        os.close(self._reserve)
        self._reserve = None
        try:
            conn, _ = self._listener.accept()
            self._handle(conn)
        except OSError:
            self._stop.wait(ACCEPT_POLL_S)

    def _answer(self, conn: socket.socket) -> dict:
        _, uid, _ = peer_credentials(conn)
        message, ancillary, flags, _ = conn.recvmsg(len(HANDOVER_MESSAGE) + 64, socket.CMSG_SPACE(8 * 4))
        fds = array.array("i")
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
        if flags & socket.MSG_CTRUNC:  # the kernel dropped the fd: none left to receive it into
            for fd in fds:
                os.close(fd)
            self._shortage.warning("fd socket %s: a handed-over fd was dropped: no file descriptors left", self.path)
            return FD_EXHAUSTED
        if message != HANDOVER_MESSAGE or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            return {
                "code": "validation_error",
                "detail": f"send exactly one fd with the message {HANDOVER_MESSAGE!r} (got {len(fds)} fds)",
            }
        free, headroom = fds_free(), fd_headroom()
        if free is not None and free < headroom:  # parking this one would eat into what the connections need
            os.close(fds[0])
            self._headroom.warning(
                "fd socket %s: fd headroom reached (%d fds free, %d kept for connections); handovers are "
                "answered fd_exhausted (raise the service's RLIMIT_NOFILE, or fewer unclaimed fds)",
                self.path,
                free,
                headroom,
            )
            return FD_EXHAUSTED
        try:
            return {"ticket": self.tickets.issue(fds[0], uid)}
        except ServiceError as exc:
            return {"code": exc.code, "detail": exc.detail}


__all__ = ["FdSocket", "FdTickets", "fd_headroom", "fds_free", "peer_credentials"]
