"""Principals: who is calling. Every region belongs to the principal that registered it.

    Unix socket  the peer's credentials (SO_PEERCRED, read once per connection by
                 `PeerCredentialsProtocol`): principal = its uid (gid and pid are recorded).
    TCP          `Authorization: Bearer <token>`, the token the service writes at start into a
                 0600 file beside its socket (`<socket dir>/token`, readable only by the
                 service's uid and root): principal = the service's own uid. Without a valid
                 token a TCP caller may reach the health routes and /v1/info only; every region
                 operation (and /v1/topk, which names regions) answers 401 `unauthenticated`.

Two callers of the same uid are the same principal (they could read each other's memory anyway);
a caller never sees, uses or deletes a region of another uid (it is answered as if it did not
exist: `unknown_region`).
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
from dataclasses import dataclass
from pathlib import Path

from fastapi import Depends, Request

from .errors import ServiceError
from .fdpass import peer_credentials
from .state import ServiceState, get_state

log = logging.getLogger("litetopk.service")

PEER_SCOPE_KEY = "litetopk.peer"  # scope["extensions"][PEER_SCOPE_KEY] = (pid, uid, gid) on the Unix socket


@dataclass(frozen=True)
class Principal:
    uid: int
    gid: int
    pid: int | None  # the peer process on the Unix socket; None over TCP
    via: str  # "unix" or "token"

    def __str__(self) -> str:
        return f"uid {self.uid}" + (f" (pid {self.pid})" if self.pid else " (bearer token)")


def peer_protocol_class():
    """uvicorn's HTTP protocol on httptools (the C parser, a pinned dependency: named here, so that an
    environment without it fails at start instead of serving on uvicorn's pure-Python fallback, ~0.1 ms slower
    a request), recording the peer credentials of every Unix-socket connection."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError as error:  # httptools missing
        raise RuntimeError(
            "the service needs httptools (pinned in pyproject.toml: pip install httptools==0.8.0)"
        ) from error

    class PeerCredentialsProtocol(HttpToolsProtocol):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            sock = transport.get_extra_info("socket")
            if sock is None or sock.family != socket.AF_UNIX:
                return
            peer, app = peer_credentials(sock), self.app

            async def with_peer(scope, receive, send):
                scope.setdefault("extensions", {})[PEER_SCOPE_KEY] = peer
                await app(scope, receive, send)

            self.app = with_peer

    return PeerCredentialsProtocol


async def get_principal(request: Request, state: ServiceState = Depends(get_state)) -> Principal:
    """FastAPI dependency: the caller's principal, or 401 `unauthenticated` (principal_of)."""
    return principal_of(request, state)


def principal_of(request: Request, state: ServiceState) -> Principal:
    """The caller's principal (module docstring), or 401 `unauthenticated`."""
    peer = (request.scope.get("extensions") or {}).get(PEER_SCOPE_KEY)
    if peer is not None:
        pid, uid, gid = peer
        return Principal(uid=uid, gid=gid, pid=pid, via="unix")
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if (
        state.token
        and scheme.lower() == "bearer"
        and secrets.compare_digest(token.strip().encode(), state.token.encode())
    ):
        return Principal(uid=os.getuid(), gid=os.getgid(), pid=None, via="token")
    where = f"the bearer token in {state.token_path}" if state.token_path else "a bearer token (none is configured)"
    raise ServiceError(
        "unauthenticated",
        f"region operations over TCP need {where} (Authorization: Bearer "
        "<token>; litetopk.clients sends it by default), or connect over the Unix socket",
        headers={"WWW-Authenticate": 'Bearer realm="litetopk"'},
    )


def write_token_file(path: Path) -> str:
    """A fresh token written to `path` (mode 0600, created anew, links not followed)."""
    token = secrets.token_urlsafe(32)
    with _directory(path.parent) as dir_fd:
        try:
            os.unlink(path.name, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        fd = os.open(
            path.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd
        )
        with os.fdopen(fd, "w") as out:
            out.write(token + "\n")
    return token


def remove_token_file(path: Path) -> None:
    try:
        with _directory(path.parent) as dir_fd:
            os.unlink(path.name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass


class _directory:
    def __init__(self, path: Path):
        self.fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)

    def __enter__(self) -> int:
        return self.fd

    def __exit__(self, *exc) -> None:
        os.close(self.fd)


__all__ = [
    "PEER_SCOPE_KEY",
    "Principal",
    "get_principal",
    "peer_protocol_class",
    "principal_of",
    "remove_token_file",
    "write_token_file",
]
