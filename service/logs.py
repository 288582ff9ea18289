"""Logging, configured once for the service's loggers (`litetopk.*`) and uvicorn's.

`logging_config(level)` is the dictConfig uvicorn applies at start (`uvicorn.Config(log_config=...)`):
one stderr handler, one format (time, level, logger name, message) for every logger; the access
log is on only at level debug. The service says two things at INFO: where it listens (backend,
device, TCP address, Unix socket) and "ready" once the warm-up has run.
"""

from __future__ import annotations

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def logging_config(level: str) -> dict:
    """The dictConfig of the service's and uvicorn's loggers at `level` ('info', 'debug', ...)."""
    level = level.upper()
    handler = {"class": "logging.StreamHandler", "formatter": "plain", "stream": "ext://sys.stderr"}
    logger = {"handlers": ["stderr"], "level": level, "propagate": False}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"plain": {"format": LOG_FORMAT}},
        "handlers": {"stderr": handler},
        "loggers": {
            "litetopk": logger,
            "uvicorn": logger,
            "uvicorn.error": {"level": level},
            "uvicorn.access": {**logger, "level": "DEBUG" if level == "DEBUG" else "WARNING"},
        },
    }


class OncePerInterval:
    """A warning logged at most once per `interval_s` (a resource shortage that may recur thousands of
    times a second); the next one says how many were left out."""

    def __init__(self, logger, interval_s: float):
        self.logger, self.interval_s = logger, interval_s
        self._last, self._left_out = -float("inf"), 0

    def warning(self, message: str, *args) -> None:
        import time

        now = time.monotonic()
        if now - self._last < self.interval_s:
            self._left_out += 1
            return
        more = f" ({self._left_out} more in the last {self.interval_s:g} s)" if self._left_out else ""
        self.logger.warning(message + more, *args)
        self._last, self._left_out = now, 0


__all__ = ["LOG_FORMAT", "OncePerInterval", "logging_config"]
