"""The body parser: large request bodies validated in a process of their own, off the event loop.

pydantic holds the GIL while it parses JSON (a 16 MiB /v1/topk body: ~250 ms here), so parsing in
a thread stalls the event loop as much as parsing on it. `BodyParser(validate)` runs
`validate(body)` in one parser process instead; the service's GIL is held only to hand the bytes
over and to unpickle the answer (the caller keeps that small: /v1/topk's schema bounds inline data).

    started   by `start()` when the service starts (the /v1/topk router's lifespan; else on the
              first body), from a thread (spawning is slow), at PARSER_NICENESS from its first
              instruction (this module is torch-free: the process lowers its priority before it
              imports `validate`'s module), SIGINT ignored; `close()` ends it (it also exits
              when the service does);
    died      (killed, out of memory): another is started and the body parsed once more; a body
              on which it dies twice is `internal_error`.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import signal
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Callable

log = logging.getLogger("litetopk.service")

PARSER_NICENESS = 10  # the parser yields the CPU to the service's event loop and device worker


def _start_parser_process() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the service stops it
    os.nice(PARSER_NICENESS)


class BodyParser:
    """`await parser.parse(body)` = `validate(body)` in the parser process (module docstring);
    `validate` must be a module-level function (it is pickled by name)."""

    def __init__(self, validate: Callable[[bytes], object]) -> None:
        self.validate = validate
        self._lock = threading.Lock()
        self._pool: ProcessPoolExecutor | None = None

    async def parse(self, body: bytes):
        try:
            return await self._parse_once(body)
        except BrokenProcessPool:
            log.warning("the body parser process died; starting another")
        try:
            return await self._parse_once(body)
        except BrokenProcessPool as exc:
            from .errors import ServiceError  # here, not above: the parser process imports this module first

            raise ServiceError("internal_error", "the body parser process died twice on this body") from exc

    async def _parse_once(self, body: bytes):
        pool = self._pool_created()
        try:
            future = await asyncio.to_thread(pool.submit, self.validate, body)  # spawns the process when needed
            return await asyncio.wrap_future(future)
        except BrokenProcessPool:
            self._forget(pool)
            raise

    def _pool_created(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                                                 initializer=_start_parser_process)
            return self._pool

    def start(self) -> None:
        """Spawn the parser process now (without waiting for it), so that no request pays for the
        spawn; it imports `validate`'s module with the first body (niced: the event loop does not
        notice), and `close()` need not wait for that import. Blocking: call it from a thread."""
        self._pool_created().submit(os.getpid)

    def close(self) -> None:
        """End the parser process (blocking: call it from a thread); a later body starts another."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def _forget(self, pool: ProcessPoolExecutor) -> None:
        with self._lock:
            if self._pool is pool:
                self._pool = None
        pool.shutdown(wait=False, cancel_futures=True)


__all__ = ["BodyParser", "PARSER_NICENESS"]
