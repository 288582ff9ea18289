"""Transport: where the service is and how to reach it (HTTP over TCP or a Unix socket: httpx's client, on the
standard library's http.client for the synchronous one (StdlibTransport), on httpcore for the async one).

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
import socket
import ssl
import threading
import time
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


# An idle connection older than this is closed rather than reused: the service closes its side after 5 s (uvicorn's
# keep-alive timeout), and a connection it is closing at that moment would lose the request written to it.
KEEP_IDLE_S = 4.0
KEEP_CONNECTIONS = 20  # idle connections kept at most (more are closed when their call ends)


def _still_open(connection: http.client.HTTPConnection) -> bool:
    """Whether an idle kept-alive connection can carry the next request: connected and nothing to read on it (an
    idle connection with data or an end of file to read was closed by the service). A non-blocking peek: no file
    descriptor limit (select's 1,024)."""
    sock = connection.sock
    if sock is None:
        return False
    timeout = sock.gettimeout()
    sock.setblocking(False)  # (a socket timeout would make Python wait for data, MSG_DONTWAIT or not)
    try:
        sock.recv(1, socket.MSG_PEEK)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        sock.settimeout(timeout)
    return False


class StdlibTransport(httpx.BaseTransport):
    """httpx's transport for the synchronous client, over the standard library's http.client (httpx's own runs
    httpcore and h11, pure Python: 0.3-0.6 ms more a call at the client over the Unix socket on a 2-core host,
    bench/NOTES-service.md, session 24). To the endpoint's Unix socket, or http:// or https:// (TLS with the default
    context: certificates verified) over TCP with TCP_NODELAY.

    Connections are kept alive, one per call in flight: a call takes an idle one (the most recent) or opens one,
    and gives it back after the answer unless the service said it closes it. An idle connection is dropped, never
    written to, when it is older than KEEP_IDLE_S or the service closed it, so that no request is sent twice;
    at most KEEP_CONNECTIONS idle ones are kept. Timeouts are the request's (httpx's `timeout` extension: connect,
    write while sending, read while receiving). Failures are httpx's transport errors: ConnectError /
    ConnectTimeout, WriteError / WriteTimeout (unless the service answered before the request was sent whole, e.g.
    413: that answer is returned), ReadError / ReadTimeout, RemoteProtocolError (a malformed answer or the
    connection closed before one). `close()` closes the idle connections now and those in use when their call ends."""

    def __init__(self, endpoint: Endpoint):
        self.endpoint = endpoint
        if not endpoint.uds:
            url = httpx.URL(endpoint.base_url)
            if url.scheme not in ("http", "https"):
                raise ValueError(f"{endpoint.base_url}: the service is reached over http:// or https://")
            self._tcp = (url.scheme, url.host, url.port)
        self._idle: list[tuple[http.client.HTTPConnection, float]] = []  # (connection, idle since), oldest first
        self._lock = threading.Lock()
        self._closed = False

    def _open(self, timeout: float | None) -> http.client.HTTPConnection:
        if self.endpoint.uds:
            return _UnixConnection(self.endpoint.uds, timeout)
        scheme, host, port = self._tcp
        if scheme == "https":
            return http.client.HTTPSConnection(host, port or 443, timeout=timeout, context=ssl.create_default_context())
        return http.client.HTTPConnection(host, port or 80, timeout=timeout)  # it sets TCP_NODELAY

    def _connection(self, timeout: dict) -> http.client.HTTPConnection:
        now = time.monotonic()
        with self._lock:
            while self._idle:
                connection, since = self._idle.pop()
                if now - since < KEEP_IDLE_S and _still_open(connection):
                    return connection
                connection.close()
        connection = self._open(timeout.get("connect"))
        try:
            connection.connect()
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(str(exc)) from exc
        except OSError as exc:
            raise httpx.ConnectError(str(exc)) from exc
        return connection

    def _give_back(self, connection: http.client.HTTPConnection, answer: http.client.HTTPResponse) -> None:
        with self._lock:
            if not (self._closed or answer.will_close or len(self._idle) >= KEEP_CONNECTIONS):
                self._idle.append((connection, time.monotonic()))
                return
        connection.close()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        timeout = request.extensions.get("timeout", {})
        body = request.read() or None
        # the body is sent whole (read above): a length, never httpx's chunked framing
        headers = {k: v for k, v in request.headers.items() if k != "transfer-encoding"}
        connection = self._connection(timeout)
        try:
            try:
                connection.sock.settimeout(timeout.get("write"))
                connection.request(request.method, request.url.raw_path.decode("ascii"), body, headers)
            except OSError as exc:  # the service may have answered already (a body refused on its length: 413)
                answer = self._early_answer(connection, exc, request, timeout.get("read"))
            else:
                connection.sock.settimeout(timeout.get("read"))
                answer = connection.getresponse()
            content = answer.read()
        except httpx.TransportError:
            connection.close()
            raise
        except TimeoutError as exc:
            connection.close()
            raise httpx.ReadTimeout(str(exc), request=request) from exc
        except http.client.HTTPException as exc:
            connection.close()
            raise httpx.RemoteProtocolError(f"{type(exc).__name__}: {exc}", request=request) from exc
        except OSError as exc:
            connection.close()
            raise httpx.ReadError(f"{type(exc).__name__}: {exc}", request=request) from exc
        except BaseException:
            connection.close()
            raise
        self._give_back(connection, answer)
        headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in answer.getheaders()]
        return httpx.Response(answer.status, headers=headers, content=content, request=request)

    @staticmethod
    def _early_answer(connection: http.client.HTTPConnection, error: OSError, request: httpx.Request, timeout):
        """The answer the service sent before the request was written whole (read within `timeout`), else the
        write's error."""
        try:
            connection.sock.settimeout(timeout)
            return connection.getresponse()
        except (http.client.HTTPException, OSError, AttributeError):
            kind = httpx.WriteTimeout if isinstance(error, TimeoutError) else httpx.WriteError
            raise kind(f"{type(error).__name__}: {error}", request=request) from error

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for connection, _ in idle:
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
