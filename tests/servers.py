"""The live-service fixtures of the tests: one helper starts a service process for tests and
benchmarks alike (bench/common/service_process.py: readiness asked of the service, authenticated
in every mode, stopped on every failure); here its pytest fixtures.
"""

from __future__ import annotations

import tempfile
import time

import pytest

from bench.common.service_process import ServiceProcess


def start_service(**settings) -> tuple[ServiceProcess, tempfile.TemporaryDirectory]:
    # A short private directory: Unix socket paths are limited to ~107 bytes.
    directory = tempfile.TemporaryDirectory(prefix="ltk-", dir="/tmp")
    try:
        return ServiceProcess(directory.name, **settings), directory
    except BaseException:
        directory.cleanup()
        raise


@pytest.fixture(scope="session")
def service():
    """One default service (reference backend on the CPU) shared by a test session (per xdist worker)."""
    process, directory = start_service()
    yield process
    process.stop()
    directory.cleanup()


def wait_until(predicate, timeout: float = 20.0, interval: float = 0.05):
    """Poll `predicate` until it returns a truthy value (returned) or `timeout` passes (AssertionError):
    for state another process changes (a service's region table), with a deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(interval)


__all__ = ["ServiceProcess", "service", "start_service", "wait_until"]
