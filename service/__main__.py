"""`python -m litetopk.service [--flags]`: uvicorn, one worker, the same app on TCP and a Unix socket.

Both listening sockets are bound here and handed to one uvicorn Server, so there is one event
loop, one lifespan (one device worker) and one graceful shutdown (SIGINT/SIGTERM: stop accepting,
finish in-flight and queued requests, then exit). The first line on stderr after binding says
where the service listens (`--port 0` picks a free port).
"""

from __future__ import annotations

import logging
import os
import socket
import stat
import sys

import uvicorn

from .app import create_app
from .settings import ServiceSettings, parse_cli

log = logging.getLogger("litetopk.service")


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
    """Bind the Unix socket inside its 0700 directory, replacing a stale socket file only."""
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
    os.chmod(path, 0o600)
    return sock


def main(argv: list[str] | None = None) -> int:
    settings = parse_cli(argv)
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
    print(f"litetopk listening on {' and '.join(where)}", file=sys.stderr, flush=True)
    config = uvicorn.Config(
        create_app(settings), workers=1, lifespan="on", log_level=settings.log_level,
        timeout_graceful_shutdown=int(settings.shutdown_timeout_s), access_log=settings.log_level == "debug",
    )
    try:
        uvicorn.Server(config).run(sockets=sockets)
    finally:
        if settings.uds and os.path.exists(settings.uds):
            os.unlink(settings.uds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
