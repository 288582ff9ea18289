"""Host memory a service can trust: sealed memfds, handed over a Unix socket (SCM_RIGHTS).

A host region is a memfd (anonymous, nameless memory) sealed against shrinking
(F_SEAL_SHRINK): whatever its owner does afterwards (truncate: refused by the seal; unmap; exit),
the memory the service mapped stays there, so the service never faults on it (no SIGBUS).

How an fd reaches the service. HTTP cannot carry a file descriptor, so registration takes two
steps over two sockets in the service's private socket directory:

    1. connect to `fds.sock` (SOCK_SEQPACKET) and send one message: HANDOVER_MESSAGE with the fd
       as SCM_RIGHTS ancillary data; the service reads the sender's uid (SO_PEERCRED) and answers
       {"ticket": "..."} (or {"code": ..., "detail": ...}): a one-time name for that fd, valid
       TICKET_TTL_S seconds and only for the same uid;
    2. POST /v1/regions {"kind": "memfd", "ticket": ..., "size": ..., "access": ...}: the service
       checks the seals and maps the fd; a ticket is consumed by its first registration.
"""

from __future__ import annotations

import array
import fcntl
import json
import mmap
import os
import socket

from litetopk.service.wire import FD_SOCKET_NAME, HANDOVER_MESSAGE, SEALS_REQUIRED, TICKET_TTL_S

REPLY_MAX_BYTES = 4096
HANDOVER_TIMEOUT_S = 10.0
#: The seals a service requires; SEALS_APPLIED are the ones this client sets (size fixed for good).
SEALS_APPLIED = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


class HandoverError(OSError):
    """The service's fd socket refused the fd or could not be reached (the message says which);
    `problem` is the service's answer ({"code", "detail"}) when it refused."""

    problem: dict | None = None


class SealedMemory:
    """`size` bytes of a new memfd, sealed (SEALS_APPLIED) and mapped shared and writable here.

    `fd` stays open until `close_fd()` (after the handover); the mapping lives while any tensor
    views it. Nothing is left behind in any file system: the memory is freed when the last
    mapping and fd (here and in the service) are gone.
    """

    def __init__(self, size: int, name: str = "litetopk"):
        self.size = size
        self.fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(self.fd, size)
            fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, SEALS_APPLIED)
            self.mapping = mmap.mmap(self.fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(self.fd)
            raise

    def close_fd(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def hand_over_fd(socket_path: str, fd: int, timeout: float = HANDOVER_TIMEOUT_S) -> str:
    """Send `fd` to the service's fd socket; return the one-time ticket (HandoverError otherwise)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(socket_path)
            sock.sendmsg([HANDOVER_MESSAGE], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])
            reply = sock.recv(REPLY_MAX_BYTES)
        except OSError as exc:
            raise HandoverError(
                f"cannot hand the memory over to the service at {socket_path}: {exc.strerror or exc}"
            ) from exc
    try:
        doc = json.loads(reply)
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or not isinstance(doc.get("ticket"), str):
        detail = doc.get("detail") if isinstance(doc, dict) else reply[:200]
        error = HandoverError(f"the service at {socket_path} refused the memory: {detail}")
        error.problem = doc if isinstance(doc, dict) and "code" in doc else None
        raise error
    return doc["ticket"]


__all__ = [
    "FD_SOCKET_NAME",
    "HANDOVER_MESSAGE",
    "HandoverError",
    "SEALS_APPLIED",
    "SEALS_REQUIRED",
    "SealedMemory",
    "TICKET_TTL_S",
    "hand_over_fd",
]
