"""The body parser: large request bodies validated in a process of their own, off the event loop.

pydantic holds the GIL while it parses JSON (a 16 MiB /v1/topk body: ~250 ms here), so parsing in
a thread stalls the event loop as much as parsing on it. `BodyParser(validate)` runs
`validate(body)` in one parser process instead; the service's GIL is held only to hand the bytes
over and to unpickle the answer (the caller keeps that small: /v1/topk's schema bounds inline data).

    started   by `start()` when the service starts (the /v1/topk router's lifespan; else with the
              first body): spawned from a thread, it ignores SIGINT, lowers its priority to
              PARSER_NICENESS and only then imports `validate`'s module (this module is
              torch-free), so neither its start nor its work competes with the event loop;
    serving   one body at a time over a pipe (bytes in, the pickled answer out); bodies wait their
              turn in the parser's own thread, never in the event loop;
    died      (killed, out of memory): another is started and the body parsed once more; a body
              on which it dies twice is `internal_error`;
    closed    by `close()` (terminated: it holds nothing), and with the service in any case.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import multiprocessing
import os
import signal
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

log = logging.getLogger("litetopk.service")

PARSER_NICENESS = 10  # the parser yields the CPU to the service's event loop and device worker
STOP_TIMEOUT_S = 5.0


def _serve(conn, module: str, name: str) -> None:
    """The parser process: answer `validate(body)` for every body received on `conn`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the service stops it
    os.nice(PARSER_NICENESS)
    validate = getattr(importlib.import_module(module), name)  # the heavy import, niced
    while True:
        try:
            body = conn.recv_bytes()
        except EOFError:  # the service closed its end
            return
        conn.send(validate(body))


class BodyParser:
    """`await parser.parse(body)` = `validate(body)` in the parser process (module docstring);
    `validate` must be a module-level function (the process imports it by name)."""

    def __init__(self, validate: Callable[[bytes], object]) -> None:
        self.validate = validate
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="litetopk-body-parser")
        self._process = None
        self._conn = None

    async def parse(self, body: bytes):
        return await asyncio.get_running_loop().run_in_executor(self._thread, self._parse, body)

    def start(self) -> None:
        """Start the parser process now, not with the first body (returns once it is spawned)."""
        self._thread.submit(self._started).result()

    def close(self) -> None:
        """End the parser process (after the body it is parsing); a later body starts another."""
        self._thread.submit(self._discard).result()

    # -- on the parser's thread -----------------------------------------------------------------

    def _parse(self, body: bytes):
        try:
            return self._exchange(body)
        except (EOFError, OSError):
            log.warning("the body parser process died while parsing; starting another")
            self._discard()
        try:
            return self._exchange(body)
        except (EOFError, OSError) as exc:
            self._discard()
            from .errors import ServiceError  # here, not above: the parser process imports this module

            raise ServiceError("internal_error", "the body parser process died twice on this body") from exc

    def _exchange(self, body: bytes):
        conn = self._started()
        conn.send_bytes(body)
        return conn.recv()

    def _started(self):
        if self._process is None or not self._process.is_alive():
            if self._process is not None:
                log.warning("the body parser process died (exit code %s); starting another", self._process.exitcode)
            self._discard()
            context = multiprocessing.get_context("spawn")
            ours, theirs = context.Pipe()
            self._process = context.Process(
                target=_serve,
                name="litetopk-body-parser",
                daemon=True,
                args=(theirs, self.validate.__module__, self.validate.__qualname__),
            )
            self._process.start()
            theirs.close()
            self._conn = ours
        return self._conn

    def _discard(self) -> None:
        process, conn, self._process, self._conn = self._process, self._conn, None, None
        if conn is not None:
            conn.close()
        if process is not None:
            process.terminate()
            process.join(STOP_TIMEOUT_S)


__all__ = ["BodyParser", "PARSER_NICENESS"]
