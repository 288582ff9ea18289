"""`python -m litetopk.service [--flags]`: uvicorn, one worker, the same app on TCP and a Unix socket.

Both listening sockets are bound here and handed to one uvicorn Server, so there is one event
loop, one lifespan (one device worker) and one graceful shutdown (SIGINT/SIGTERM: stop accepting,
finish in-flight and queued requests, then exit; the socket file is removed on every exit path
but SIGKILL). The start line of the log says where the service listens (`--port 0` picks a free
port), with the backend and device; "ready" follows after the warm-up.

`python -m litetopk.service --check livez|readyz [--flags]` is the probe (the image's HEALTHCHECK):
it reads the same settings, asks the running service over its Unix socket (when one is
configured, else over TCP on the configured address, loopback for 0.0.0.0 / ::) and exits 0 on
200, 1 otherwise, saying why on stderr. It loads neither torch nor the app.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import signal
import socket
import stat
import sys

from .settings import ServiceSettings, cli_parser, settings_from_args

log = logging.getLogger("litetopk.service")

CHECK_TIMEOUT_S = 4.0  # below the HEALTHCHECK --timeout (Dockerfile)
WILDCARD_TO_LOOPBACK = {"0.0.0.0": "127.0.0.1", "::": "::1", "": None}


def bind_tcp(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto=IPPROTO_TCP explicitly: asyncio turns on TCP_NODELAY only for accepted sockets whose
    # proto says TCP (they inherit it from this one); without it every response that is written in
    # two parts waits for the client's delayed ACK (40 ms on Linux).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


def bind_unix(settings: ServiceSettings) -> socket.socket:
    """Bind the Unix socket (mode `uds_mode`, group `uds_group`) inside its private directory
    (`ServiceSettings.socket_dir`), replacing a stale socket file only."""
    settings.socket_dir()
    path = settings.uds
    if os.path.lexists(path):
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise FileExistsError(f"{path} exists and is not a socket; choose another --uds")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
        except (ConnectionRefusedError, FileNotFoundError):
            os.unlink(path)  # left behind by a process that died
        else:
            raise OSError(f"another service already listens on {path}")
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    gid = settings.socket_group_id()
    if gid is not None:
        os.chown(path, -1, gid)
    os.chmod(path, settings.uds_mode)
    return sock


def check_target(settings: ServiceSettings) -> tuple[str | None, str]:
    """(Unix socket path or None, base URL) the probe asks: the socket when configured, else TCP."""
    if settings.uds:
        return settings.uds, "http://litetopk"
    host = WILDCARD_TO_LOOPBACK.get(settings.host, settings.host)
    if not host or not settings.port:
        raise ValueError("nothing to probe: no Unix socket (--uds '') and no fixed TCP address (--host, --port)")
    return None, f"http://[{host}]:{settings.port}" if ":" in host else f"http://{host}:{settings.port}"


def check(settings: ServiceSettings, route: str) -> int:
    """Probe `/livez` or `/readyz` of the running service: 0 when it answers 200, else 1."""
    import httpx

    try:
        uds, base_url = check_target(settings)
    except ValueError as exc:
        print(f"litetopk --check {route}: {exc}", file=sys.stderr)
        return 1
    where = f"unix:{uds}" if uds else base_url
    transport = httpx.HTTPTransport(uds=uds) if uds else None
    try:
        with httpx.Client(base_url=base_url, transport=transport, timeout=CHECK_TIMEOUT_S) as client:
            response = client.get(f"/{route}")
    except httpx.HTTPError as exc:
        print(f"litetopk --check {route}: no answer from {where}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    if response.status_code == 200:
        return 0
    try:
        problem = response.json()
        why = f"{problem['code']}: {problem['detail']}"
    except (ValueError, KeyError, TypeError):
        why = response.text[:200]
    print(f"litetopk --check {route}: {where} answered {response.status_code} ({why})", file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    parser = cli_parser()
    parser.add_argument(
        "--check",
        choices=("livez", "readyz"),
        default=None,
        help="probe the running service (same settings) instead of starting one; exit 0 or 1",
    )
    args = parser.parse_args(argv)
    settings = settings_from_args(args)
    if args.check:
        return check(settings, args.check)
    try:
        settings.torch_device()  # a GPU named by UUID that is not visible fails here, before binding
    except ValueError as exc:
        print(f"litetopk: {exc}", file=sys.stderr)
        return 2
    import uvicorn

    from .app import create_app
    from .logs import logging_config
    from .principals import peer_protocol_class

    try:  # before any socket is bound: a missing pinned dependency leaves no socket file behind
        loop, protocol = event_loop(), peer_protocol_class()
    except RuntimeError as exc:
        print(f"litetopk: {exc}", file=sys.stderr)
        return 2
    raise_fd_limit()
    sockets, where = [], []
    if settings.host:
        tcp = bind_tcp(settings.host, settings.port)
        sockets.append(tcp)
        host, port = tcp.getsockname()[:2]
        where.append(f"http://{host}:{port}" if ":" not in host else f"http://[{host}]:{port}")
    if settings.uds:
        sockets.append(bind_unix(settings))
        where.append(f"unix:{settings.uds}")
    if not sockets:
        print("litetopk: both --host and --uds are empty; nothing to listen on", file=sys.stderr)
        return 2
    app = create_app(settings, listening=" and ".join(where))
    config = uvicorn.Config(
        app,
        workers=1,
        lifespan="on",
        log_config=logging_config(settings.log_level),
        log_level=settings.log_level,
        http=protocol,
        loop=loop,
        # one second past the grace period: the service answers what is still queued first (shutting_down)
        timeout_graceful_shutdown=math.ceil(settings.shutdown_timeout_s) + 1,
        access_log=settings.log_level == "debug",
    )
    # uvicorn re-raises the SIGTERM it shut down on; as SystemExit it reaches the `finally` below
    # (the default action would end the process first and leave the socket file behind).
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        _server_class()(config, app).run(sockets=sockets)
    finally:
        if settings.uds and os.path.lexists(settings.uds):
            os.unlink(settings.uds)
    return 0


def raise_fd_limit() -> None:
    """RLIMIT_NOFILE's soft limit raised to its hard limit (a warning when it cannot be). Connections, parked fds and
    owners' pidfds all take fds; at the limit uvloop resets the HTTP connections it cannot accept (and, should
    libuv lose its own spare fd to another thread meanwhile, closes the listener on the next shortage), so
    the service runs at the highest limit it is allowed (nothing here polls fds with select())."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (OSError, ValueError) as exc:  # e.g. a hard limit of RLIM_INFINITY beyond the kernel's nr_open
            log.warning("RLIMIT_NOFILE stays at %d (the hard limit %d could not be taken: %s)", soft, hard, exc)


def event_loop() -> str:
    """uvicorn's event loop: uvloop (libuv, a pinned dependency: named, not uvicorn's "auto", so that an environment
    without it fails at start instead of serving on asyncio's loop, ~0.1 ms slower a request over the Unix socket on
    a 2-core host)."""
    try:
        import uvloop  # noqa: F401
    except ImportError as error:
        raise RuntimeError("the service needs uvloop (pinned in pyproject.toml: pip install uvloop==0.22.1)") from error
    return "uvloop"


def _server_class():
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, telling the app when a shutdown signal arrives (its grace period starts)."""

        def __init__(self, config, app):
            super().__init__(config)
            self.app = app

        def handle_exit(self, sig, frame) -> None:
            state = getattr(self.app.state, "service", None)
            if state is not None and self.started:
                try:
                    asyncio.get_running_loop().call_soon_threadsafe(state.begin_shutdown)
                except RuntimeError:  # no loop running (any more)
                    pass
            super().handle_exit(sig, frame)

    return Server


def _exit_on_sigterm(signum, frame) -> None:
    # once: a later SIGTERM (e.g. a supervisor's second one) must not raise again inside the
    # interpreter's exit handlers, after the socket is already gone
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    sys.exit(main())
