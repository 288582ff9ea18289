"""Transport: where the service is and how to reach it (HTTP over TCP or a Unix socket: httpx's client, on the
standard library's http.client for the synchronous one (StdlibTransport) and on httpcore for the async one).

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
import http.client
import http.cookiejar
import os
import select
import socket
import threading
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


class _UnixConnection(http.client.HTTPConnection):
    """http.client's connection to a Unix socket (`path`; the Host header names the service, UDS_BASE_URL)."""

    def __init__(self, path: str, timeout: float | None):
        super().__init__("litetopk", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self.path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


class _TcpConnection(http.client.HTTPConnection):
    """http.client's TCP connection with TCP_NODELAY (TCP_OPTIONS: it sends a request's headers and body apart)."""

    def connect(self) -> None:
        super().connect()
        for level, option, value in TCP_OPTIONS:
            self.sock.setsockopt(level, option, value)


def _idle_and_open(connection: http.client.HTTPConnection) -> bool:
    """Whether a kept-alive connection can carry the next request: connected, and nothing to read on it (an idle
    connection that is readable was closed by the service, e.g. at its keep-alive timeout)."""
    sock = connection.sock
    if sock is None:
        return False
    readable, _, _ = select.select([sock], [], [], 0)
    return not readable


class StdlibTransport(httpx.BaseTransport):
    """httpx's transport for the synchronous client, over the standard library's http.client: a request costs
    ~0.7 ms less than over httpcore and h11 (pure Python) on a 2-core host (bench/NOTES-service.md, session 24).
    Connections are kept alive, one per request in flight (a thread's calls reuse the idle ones); an idle connection
    the service closed is dropped before use, never written to, so that no request is sent twice. Timeouts are
    httpx's (the request's `timeout` extension: connect, then read for the exchange); failures are httpx's
    transport errors (ConnectError, ReadTimeout, RemoteProtocolError, ...), as httpx's own transport raises them."""

    def __init__(self, endpoint: Endpoint):
        self.endpoint = endpoint
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def _connection(self, timeout: dict) -> http.client.HTTPConnection:
        with self._lock:
            while self._idle:
                connection = self._idle.pop()
                if _idle_and_open(connection):
                    return connection
                connection.close()
        if self.endpoint.uds:
            connection = _UnixConnection(self.endpoint.uds, timeout.get("connect"))
        else:
            url = httpx.URL(self.endpoint.base_url)
            connection = _TcpConnection(url.host, url.port or 80, timeout=timeout.get("connect"))
        try:
            connection.connect()
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(str(exc)) from exc
        except OSError as exc:
            raise httpx.ConnectError(str(exc)) from exc
        return connection

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        timeout = request.extensions.get("timeout", {})
        body = request.read()
        connection = self._connection(timeout)
        connection.sock.settimeout(timeout.get("read"))
        try:
            connection.request(request.method, request.url.raw_path.decode("ascii"), body, dict(request.headers))
            answer = connection.getresponse()
            content = answer.read()
        except TimeoutError as exc:
            connection.close()
            raise httpx.ReadTimeout(str(exc), request=request) from exc
        except (http.client.HTTPException, OSError) as exc:
            connection.close()
            raise httpx.RemoteProtocolError(f"{type(exc).__name__}: {exc}", request=request) from exc
        if answer.will_close:
            connection.close()
        else:
            with self._lock:
                self._idle.append(connection)
        return httpx.Response(answer.status, headers=answer.getheaders(), content=content, request=request)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()


def sync_http(endpoint: Endpoint, timeout, token: str | None = None) -> httpx.Client:
    _, headers = _http_options(endpoint, token)
    client = _Client(
        base_url=endpoint.base_url,
        transport=StdlibTransport(endpoint),
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
    "StdlibTransport",
    "async_http",
    "default_socket_path",
    "read_token_file",
    "resolve_endpoint",
    "resolve_token",
    "socket_listens",
    "sync_http",
    "transport_error",
]
