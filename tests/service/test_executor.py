"""The device worker in-process: order, errors handed back, timeouts, shutdown that drains."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch

from litetopk.service.errors import ServiceError
from litetopk.service.executor import DeviceExecutor
from litetopk.service.metrics import ServiceMetrics

pytestmark = pytest.mark.asyncio


def make_executor(queue_size=4, delay=0.0) -> DeviceExecutor:
    executor = DeviceExecutor(torch.device("cpu"), queue_size, ServiceMetrics(), retry_after_s=2, fault_delay_s=delay)
    executor.start()
    return executor


async def test_jobs_run_in_order_on_one_thread():
    executor = make_executor()
    seen = []
    results = await asyncio.gather(
        *[executor.run(lambda i=i: seen.append((i, threading.current_thread().name)) or i, 5) for i in range(4)]
    )
    await executor.close(5)
    assert results == [0, 1, 2, 3] and [i for i, _ in seen] == [0, 1, 2, 3]
    assert len({name for _, name in seen}) == 1 and seen[0][1] != threading.current_thread().name


async def test_job_exception_reaches_the_caller():
    executor = make_executor()
    with pytest.raises(ZeroDivisionError):
        await executor.run(lambda: 1 / 0, 5)
    assert await executor.run(lambda: "still alive", 5) == "still alive"
    await executor.close(5)


def held(value, started: threading.Event, gate: threading.Event):
    """A job that says it runs, then waits for `gate` (the test orders events, not time)."""

    def job():
        started.set()
        if not gate.wait(30):
            raise TimeoutError("the test never opened the gate")
        return value

    return job


async def test_full_queue_is_overloaded_with_retry_after():
    executor = make_executor(queue_size=1)
    started, gate = threading.Event(), threading.Event()
    running = executor.submit(held("first", started, gate))
    assert await asyncio.to_thread(started.wait, 30), "the worker took the first job"
    queued = executor.submit(lambda: "second")  # fills the queue
    with pytest.raises(ServiceError) as err:
        executor.submit(lambda: "third")
    assert err.value.code == "overloaded" and err.value.headers["Retry-After"] == "2"
    gate.set()
    assert await running == "first" and await queued == "second"
    await executor.close(5)


async def test_timed_out_job_is_skipped():
    executor = make_executor()
    ran = []
    started, gate = threading.Event(), threading.Event()
    blocker = executor.submit(held(None, started, gate))
    with pytest.raises(ServiceError) as err:
        await executor.run(lambda: ran.append(1), timeout=0.05)  # queued behind the held job until it times out
    assert err.value.code == "timeout"
    gate.set()
    await blocker
    await executor.run(lambda: None, 5)
    assert ran == []
    await executor.close(5)


async def test_queued_jobs_fail_with_the_error_given():
    executor = make_executor()
    started, gate = threading.Event(), threading.Event()
    running = executor.submit(held("ran", started, gate))
    assert await asyncio.to_thread(started.wait, 30)
    queued = [executor.submit(lambda: "never") for _ in range(2)]
    executor.stop_admissions()
    assert executor.fail_queued(ServiceError("shutting_down", "grace period over")) == 2
    gate.set()
    assert await running == "ran"
    for future in queued:
        with pytest.raises(ServiceError) as err:
            await future
        assert err.value.code == "shutting_down"
    await executor.close(5)


async def test_closed_executor_refuses_with_shutting_down():
    executor = make_executor()
    pending = [executor.submit(lambda i=i: i) for i in range(3)]
    await executor.close(5)  # drains what was queued
    assert [await p for p in pending] == [0, 1, 2]
    with pytest.raises(ServiceError) as err:
        executor.submit(lambda: None)
    assert err.value.code == "shutting_down"


async def test_run_if_idle_runs_on_the_calling_thread_only_when_the_device_is_idle():
    """A transport thread's job runs in place when nothing is queued or running; otherwise the caller
    is told to queue it (None), so a request never overtakes one queued before it."""
    executor = make_executor()

    def from_a_thread():
        return threading.current_thread().name, executor.run_if_idle(lambda: threading.current_thread().name)

    caller, outcome = await asyncio.to_thread(from_a_thread)
    assert outcome == (True, caller), "idle: run on the caller's thread"
    started, gate = threading.Event(), threading.Event()
    running = executor.submit(held("held", started, gate))
    assert await asyncio.to_thread(started.wait, 30), "the worker took the job"
    ran = []
    assert await asyncio.to_thread(executor.run_if_idle, lambda: ran.append(1)) is None, "busy: queue it"
    gate.set()
    assert await running == "held" and ran == []
    await executor.close(5)


class Settled:
    """A threaded job's `settle`: what it was given, on which thread, and an event once it was called."""

    def __init__(self):
        self.calls, self.event = [], threading.Event()

    def __call__(self, outcome) -> None:
        self.calls.append((outcome, threading.current_thread().name))
        self.event.set()


async def test_threaded_jobs_are_settled_once_on_the_worker_and_cancelled_ones_skipped():
    executor = make_executor()
    started, gate = threading.Event(), threading.Event()
    running = executor.submit(held(None, started, gate))
    assert await asyncio.to_thread(started.wait, 30)
    answered, dropped = Settled(), Settled()
    executor.submit_threaded(lambda: "queued", answered)
    executor.submit_threaded(lambda: "never", dropped).cancelled = True  # its transport stopped waiting
    gate.set()
    await running
    assert await executor.run(lambda: "after", 5) == "after"  # the worker is past both threaded jobs
    assert answered.calls == [((True, "queued"), executor._thread.name)], "settled once, on the worker thread"
    assert dropped.calls == [], "a cancelled job is neither run nor settled"
    assert await asyncio.to_thread(executor.run_if_idle, lambda: "idle again") == (True, "idle again")
    await executor.close(5)


async def test_queued_threaded_jobs_fail_with_the_error_given():
    executor = make_executor()
    started, gate = threading.Event(), threading.Event()
    running = executor.submit(held(None, started, gate))
    assert await asyncio.to_thread(started.wait, 30)
    queued = Settled()
    executor.submit_threaded(lambda: "never", queued)
    executor.stop_admissions()
    assert executor.fail_queued(ServiceError("shutting_down", "grace period over")) == 1
    [((ok, error), _)] = queued.calls
    assert not ok and error.code == "shutting_down"
    gate.set()
    await running
    await executor.close(5)
