"""A real `python -m litetopk.service` child process, for the tests and the benchmarks alike.

    with ServiceProcess(directory, device="cpu", queue_size=8) as service:
        TopKClient(uds=service.uds)                      # IPC (or HTTP) over the Unix socket
        TopKClient(service.url, token=service.token)     # HTTP over TCP, authenticated

Every keyword is a service flag (`queue_size=8` -> `--queue-size 8`; True / False -> `--x` /
`--no-x`). The socket lives in `<directory>/sock/`, a private directory; TCP takes a free port.
Readiness is asked of the service itself, never read from its log (which may be at any level):
`/readyz` (or `/livez` with `wait_ready=False`) over the Unix socket, polled until a deadline; the
TCP address and the token file come from `/v1/info`. Whatever fails while starting (the process
exits, the deadline passes, the caller is interrupted), the process is stopped before the error
propagates, and the child gets SIGTERM when its parent dies (PR_SET_PDEATHSIG): no orphans.
`stop()` sends SIGTERM (graceful shutdown), then SIGKILL when it hangs.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from bench.common import REPO_ROOT

POLL_S = 0.05  # between readiness probes (each probe is bounded by the overall deadline)
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def service_argv(entry: tuple[str, ...], flags: dict) -> list[str]:
    argv = [sys.executable, *entry]
    for key, value in flags.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is False:
            argv.append(f"--no-{key.replace('_', '-')}")
        else:
            argv += [flag, str(value)]
    return argv


class ServiceProcess:
    """The service as a child process (module docstring)."""

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        wait_ready: bool = True,
        timeout: float = 120.0,
        entry: tuple[str, ...] = ("-m", "litetopk.service"),
        env: dict | None = None,
        log_name: str = "service.log",
        **settings,
    ):
        self.directory = Path(directory)
        self.uds = str(settings.get("uds") or self.directory / "sock" / "litetopk.sock")
        self.log_path = self.directory / log_name
        flags = {
            "host": "127.0.0.1",
            "port": 0,
            "uds": self.uds,
            "device": "cpu",
            "log_level": "info",
            "region_check_interval_s": 0.2,
            **settings,
        }
        self.settings = flags
        child_env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **(env or {})}
        self._log = open(self.log_path, "w")
        self.process = subprocess.Popen(
            service_argv(entry, flags),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=child_env,
            cwd=REPO_ROOT,
            preexec_fn=_die_with_parent,
        )
        self.url: str | None = None
        self.info: dict = {}
        try:
            self._wait("/readyz" if wait_ready else "/livez", timeout)
        except BaseException as exc:
            self.stop()
            if not isinstance(exc, (RuntimeError, TimeoutError)):  # interrupted or failed otherwise (the two carry it)
                sys.stderr.write(f"the service's log when its start was interrupted:\n{self.log()[-3000:]}\n")
            raise

    # -- what a caller needs -------------------------------------------------------------------------

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def ipc(self) -> str:
        return str(Path(self.uds).parent / "ipc.sock")

    @property
    def token(self) -> str:
        return Path(self.info.get("token_file") or Path(self.uds).parent / "token").read_text().strip()

    @property
    def auth(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.token}"}

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text()

    def http(self, timeout: float = 10.0) -> httpx.Client:
        """An httpx client over the Unix socket (the service's own principal)."""
        return httpx.Client(base_url="http://litetopk", transport=httpx.HTTPTransport(uds=self.uds), timeout=timeout)

    # -- life ----------------------------------------------------------------------------------------

    def _wait(self, route: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self.http(timeout=5.0) as client:
            while True:
                if self.process.poll() is not None:
                    raise RuntimeError(f"the service exited with {self.process.returncode}:\n{self.log()}")
                try:
                    if client.get(route).status_code == 200:
                        self.info = client.get("/v1/info").json()
                        self.url = self.info.get("http_url")
                        return
                except httpx.TransportError:
                    pass  # not listening yet
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the service did not answer {route} 200 within {timeout} s:\n{self.log()}")
                time.sleep(POLL_S)

    def terminate(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = 30.0) -> int | None:
        self.terminate()
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._log.close()
        return self.process.returncode

    def __enter__(self) -> "ServiceProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


__all__ = ["ServiceProcess", "service_argv"]
