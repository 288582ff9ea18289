"""Transport: where the service is and how to reach it (httpx over TCP or a Unix socket).

`TopKClient(base_url=None, *, uds=None)`: with neither given, `LITETOPK_URL` (an http URL or
`unix:/path`) wins, then the default Unix socket when it exists, then http://127.0.0.1:8471.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path

import httpx

from .errors import TransportError

DEFAULT_URL = "http://127.0.0.1:8471"
UDS_BASE_URL = "http://litetopk"  # host part is ignored on a Unix socket
DEFAULT_TIMEOUT = httpx.Timeout(300.0, connect=10.0)


def default_socket_path() -> str:
    """`${XDG_RUNTIME_DIR:-/tmp}/litetopk/litetopk.sock` (= litetopk.service.settings.default_socket_path)."""
    return str(Path(os.environ.get("XDG_RUNTIME_DIR") or "/tmp") / "litetopk" / "litetopk.sock")


@dataclass(frozen=True)
class Endpoint:
    base_url: str
    uds: str | None

    def __str__(self) -> str:
        return f"unix:{self.uds}" if self.uds else self.base_url


def resolve_endpoint(base_url: str | None, uds: str | None) -> Endpoint:
    if base_url is not None and uds is not None:
        raise ValueError("give base_url or uds, not both")
    if uds is not None:
        return Endpoint(UDS_BASE_URL, uds)
    if base_url is not None:
        return Endpoint(base_url.rstrip("/"), None)
    env = os.environ.get("LITETOPK_URL")
    if env:
        return resolve_endpoint(None, env[5:]) if env.startswith("unix:") else resolve_endpoint(env, None)
    if os.path.exists(default_socket_path()):
        return Endpoint(UDS_BASE_URL, default_socket_path())
    return Endpoint(DEFAULT_URL, None)


# httpx writes a request's headers and body separately: without TCP_NODELAY, Nagle's algorithm
# holds the body until the service's delayed ACK (40 ms on Linux) on every request over TCP.
TCP_OPTIONS = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]


def sync_http(endpoint: Endpoint, timeout) -> httpx.Client:
    if endpoint.uds:
        transport = httpx.HTTPTransport(uds=endpoint.uds)
    else:
        transport = httpx.HTTPTransport(socket_options=TCP_OPTIONS)
    return httpx.Client(base_url=endpoint.base_url, transport=transport, timeout=timeout)


def async_http(endpoint: Endpoint, timeout) -> httpx.AsyncClient:
    if endpoint.uds:
        transport = httpx.AsyncHTTPTransport(uds=endpoint.uds)
    else:
        transport = httpx.AsyncHTTPTransport(socket_options=TCP_OPTIONS)
    return httpx.AsyncClient(base_url=endpoint.base_url, transport=transport, timeout=timeout)


def transport_error(endpoint: Endpoint, exc: httpx.TransportError) -> TransportError:
    error = TransportError(f"litetopk service at {endpoint}: {type(exc).__name__}: {exc}")
    error.__cause__ = exc
    return error


__all__ = ["DEFAULT_URL", "Endpoint", "async_http", "default_socket_path", "resolve_endpoint", "sync_http",
           "transport_error"]
