"""Transport: where the service is and how to reach it (httpx over TCP or a Unix socket).

`TopKClient(base_url=None, *, uds=None)`: with neither given, `LITETOPK_URL` (an http URL or
`unix:/path`) wins, then the default Unix socket when a service listens on it, then
http://127.0.0.1:8471. A default socket file that nobody listens on (left by a service that was
killed) is reported with its path (a `StaleSocketWarning`) and not used.

Over TCP the client sends the service's bearer token (`Authorization: Bearer`): the `token`
argument, else $LITETOPK_TOKEN, else the file $LITETOPK_TOKEN_FILE, else `token` beside the
default socket (`${XDG_RUNTIME_DIR:-/tmp}/litetopk/token`, written 0600 by the service) when this
user can read it, else the file the service's /v1/info names (`token_file`: a service whose socket
lives in a private directory) when this user can read it. Without one, TCP reaches only the health
routes and /v1/info.

On the Unix socket, the client's calls travel over the service's IPC channel (`ipc.sock` beside the
socket, litetopk.clients.ipc) when it is there (`transport="auto"`, the default), else HTTP;
`transport="http"` keeps HTTP, `transport="ipc"` requires the channel. Over TCP: HTTP.
"""

from __future__ import annotations

import errno
import http.cookiejar
import os
import socket
import warnings
from dataclasses import dataclass
from pathlib import Path

import httpx

from .errors import TransportError

DEFAULT_URL = "http://127.0.0.1:8471"
UDS_BASE_URL = "http://litetopk"  # host part is ignored on a Unix socket
DEFAULT_TIMEOUT = httpx.Timeout(300.0, connect=10.0)
TOKEN_ENV, TOKEN_FILE_ENV = "LITETOPK_TOKEN", "LITETOPK_TOKEN_FILE"


class StaleSocketWarning(UserWarning):
    """A Unix socket file exists but no service listens on it."""


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
    path = default_socket_path()
    if os.path.exists(path):
        if socket_listens(path):
            return Endpoint(UDS_BASE_URL, path)
        warnings.warn(
            f"{path} is a stale socket (no service listens on it: left by a service that was killed); "
            f"using {DEFAULT_URL}",
            StaleSocketWarning,
            stacklevel=4,
        )
    return Endpoint(DEFAULT_URL, None)


def socket_listens(path: str) -> bool:
    """Whether a process accepts connections on the Unix socket `path` (False: refused or not a socket)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(path)
        except OSError as exc:
            if exc.errno in (errno.ECONNREFUSED, errno.ENOENT, errno.ENOTSOCK):
                return False
            raise
    return True


def resolve_token(token: str | None) -> str | None:
    """The bearer token to send over TCP (module docstring): given, $LITETOPK_TOKEN, or read from a file."""
    if token is not None:
        return token
    if os.environ.get(TOKEN_ENV):
        return os.environ[TOKEN_ENV].strip()
    path = os.environ.get(TOKEN_FILE_ENV) or os.path.join(os.path.dirname(default_socket_path()), "token")
    try:
        with open(path) as token_file:
            return token_file.read().strip() or None
    except FileNotFoundError:
        if os.environ.get(TOKEN_FILE_ENV):
            raise
        return None
    except PermissionError:
        return None  # another user's service: TCP then refuses region operations (401, saying why)


def read_token_file(path: str) -> str | None:
    """The token in the file `path` (a service's /v1/info `token_file`), None when this user cannot read it."""
    try:
        with open(path) as token_file:
            return token_file.read().strip() or None
    except OSError:
        return None


# httpx writes a request's headers and body separately: without TCP_NODELAY, Nagle's algorithm
# holds the body until the service's delayed ACK (40 ms on Linux) on every request over TCP.
TCP_OPTIONS = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]


def _http_options(endpoint: Endpoint, token: str | None) -> tuple[dict, dict]:
    """(transport options, client headers): the socket, or TCP_NODELAY and the bearer token."""
    if endpoint.uds:
        return {"uds": endpoint.uds}, {}
    return {"socket_options": TCP_OPTIONS}, ({"authorization": f"Bearer {token}"} if token else {})


class _NoCookies(http.cookiejar.CookieJar):
    """The service sets no cookies and reads none: a jar that keeps nothing, so that httpx's per-response
    cookie extraction (http.cookiejar, ~30 us an answer) costs nothing."""

    def extract_cookies(self, response, request) -> None:
        pass

    def add_cookie_header(self, request) -> None:
        pass


HOT_PATHS = ("/v1/topk",)  # requested with their absolute URL, merged with base_url once


class _HotPaths:
    """httpx merges and parses the URL of every request (~25 us); the hot route's is merged once."""

    def _prebuild(self) -> None:
        self._hot = {path: self._merge_url(path) for path in HOT_PATHS}

    def request(self, method: str, url, **kwargs):
        return super().request(method, self._hot.get(url, url) if isinstance(url, str) else url, **kwargs)


class _Client(_HotPaths, httpx.Client):
    pass


class _AsyncClient(_HotPaths, httpx.AsyncClient):
    pass


def sync_http(endpoint: Endpoint, timeout, token: str | None = None) -> httpx.Client:
    options, headers = _http_options(endpoint, token)
    client = _Client(
        base_url=endpoint.base_url,
        transport=httpx.HTTPTransport(**options),
        timeout=timeout,
        headers=headers,
        cookies=_NoCookies(),
    )
    client._prebuild()
    return client


def async_http(endpoint: Endpoint, timeout, token: str | None = None) -> httpx.AsyncClient:
    options, headers = _http_options(endpoint, token)
    client = _AsyncClient(
        base_url=endpoint.base_url,
        transport=httpx.AsyncHTTPTransport(**options),
        timeout=timeout,
        headers=headers,
        cookies=_NoCookies(),
    )
    client._prebuild()
    return client


def transport_error(endpoint: Endpoint, exc: httpx.TransportError) -> TransportError:
    hint = ""
    if endpoint.uds and os.path.exists(endpoint.uds) and not socket_listens(endpoint.uds):
        hint = f" ({endpoint.uds} is a stale socket: the file exists but no service listens on it)"
    error = TransportError(f"litetopk service at {endpoint}: {type(exc).__name__}: {exc}{hint}")
    error.__cause__ = exc
    return error


__all__ = [
    "DEFAULT_URL",
    "Endpoint",
    "StaleSocketWarning",
    "async_http",
    "default_socket_path",
    "read_token_file",
    "resolve_endpoint",
    "resolve_token",
    "socket_listens",
    "sync_http",
    "transport_error",
]
