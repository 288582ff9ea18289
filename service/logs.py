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
        "loggers": {"litetopk": logger, "uvicorn": logger, "uvicorn.error": {"level": level},
                    "uvicorn.access": {**logger, "level": "DEBUG" if level == "DEBUG" else "WARNING"}},
    }


__all__ = ["LOG_FORMAT", "logging_config"]
