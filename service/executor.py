"""The device worker: one thread runs the queued jobs on the pinned device, on its own stream.

    event loop ── submit(fn) ──> bounded queue ──> worker thread: with device, stream: fn()
                 <── asyncio.Future (set from the worker with call_soon_threadsafe) ──┘
    a transport thread ── run_if_idle(fn, *args): the device idle ──> fn(*args) on that thread, on the same
                          device and stream, under the same device lock (no hand-off)
                       ── submit_threaded(fn, settle): busy ──> the queue; settle(outcome) on the worker

One job at a time, in order: every job runs under the device lock, and `run_if_idle` runs a job
only when nothing is queued or running (else the caller queues it behind the others), so a
request never overtakes one queued before it. The IPC channel's threads use it (service/ipc.py):
a request that finds the device idle is served on the thread that read it, without two thread
hops (~50-110 us a request on a loaded 2-core host, bench/NOTES-service.md). Fault injection
(FAULT_DELAY_S, FAULT_GATE_FILE) sends every job through the queue, where the tests hold it.

The worker also holds the device's one operator (service/operator.py: workspace, graph runner,
result buffer): built once at start, after the warm-up, on the worker thread (`build_operator`),
sized from the service's limits (max rows, max keys, max sequences, every supported K), and used
by every call (`operator_for`): under the device lock, so never two calls on it at once.

Device and stream are per thread in torch (and CUDA), so a thread that runs jobs makes the device
and the worker's stream its current ones once, at its first job (`_enter_device`), not with two
context managers a job (each a query and a set of the current device or stream: tens of
microseconds a request on a slow host). The stream a thread made current is kept per thread, for any
executor (`_CURRENT`). What such a thread launches between jobs runs on that stream too; a thread that
has run no job yet (a registration before a connection's first call) still has the default stream:
torch's CUDA IPC open enqueues its wait on the exporter's event there, which orders nothing on the
worker's stream (a client's data must be ready when it registers or calls).

The event loop never blocks on the device: it only enqueues (a full queue raises `overloaded`,
answered 429 with Retry-After) and awaits the future. A job whose future was cancelled (the
request timed out while queued), or that its transport thread cancelled, is skipped. `close()`
stops admissions (`shutting_down`) and lets the worker finish everything already queued, then
stops the thread; `fail_queued` answers every job still queued (the end of the grace period:
`shutting_down`).

Batching: queued requests naming the same cache are NOT merged into one launch, on purpose.
Measured in-process on the CPU reference backend (bench/service.py, `batching_probe`): one
merged call of 2 x 8 decode rows took ~43 ms against ~54 ms for two calls, so merging would be
faster there. But a merged call is a different problem to the operator: LiteTopK calibrates with
a sample stride taken from the problem's longest window (kernels/pipeline.py `calibrate`), so a
request's `candidates` and `repaired` (and its capacity events) would depend on which other
requests happened to share its launch, and reruns would stop being bit-identical; the merged
rows' faults, timeouts and device errors would also be shared. Merging becomes safe once the
operator calibrates per row (or takes per-request strides): then merge requests with equal
(cache region, block-table width, topk, weight_scale, repair, weights dtype), concatenating rows
and offsetting row_to_batch. On the GPU a prefill request alone fills the device.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import queue
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable

import torch

from .errors import ServiceError
from .metrics import ServiceMetrics
from .operator import DeviceOperator, WorkspaceLimits

log = logging.getLogger("litetopk.service")
_CURRENT = threading.local()  # `stream`: the stream this thread last made current (DeviceExecutor._enter_device)


Outcome = tuple[bool, Any]  # (True, value) or (False, the exception raised)


@dataclass(eq=False)
class Job:
    """A queued call: `settle(outcome)` hands its outcome back (on the worker thread, or from
    `fail_queued`); `cancelled` (set by whoever stopped waiting for it) makes the worker skip it."""

    fn: Callable[[], Any]
    settle: Callable[[Outcome], None]
    cancelled: bool = False


_STOP = object()
GATE_POLL_S = 0.01


class _JobQueue:
    """The bounded FIFO of jobs, its worker woken through an eventfd: the wake-up is a write made
    without the GIL, so the worker can take the GIL and run at once. A Condition's notify (queue.Queue)
    wakes it while the GIL is still held: on a loaded 2-core host the worker then preempts the event
    loop, finds the GIL taken, and both switch back and forth before the job starts (~10 us more a
    hand-off at the median, ~1.5 ms more at the 99th percentile, bench/NOTES-service.md)."""

    def __init__(self, maxsize: int):
        self.maxsize = maxsize
        self._items: collections.deque = collections.deque()
        self._lock = threading.Lock()
        self._ready = os.eventfd(0, os.EFD_CLOEXEC)  # counts puts not yet seen by `get`
        weakref.finalize(self, os.close, self._ready)  # closed with the queue: no put can come after

    def qsize(self) -> int:
        return len(self._items)

    def put_nowait(self, item, *, bounded: bool = True) -> None:
        """Append `item` (queue.Full when `bounded` and `maxsize` items wait already) and wake the worker."""
        with self._lock:
            if bounded and len(self._items) >= self.maxsize:
                raise queue.Full
            self._items.append(item)
        os.eventfd_write(self._ready, 1)

    def get_nowait(self):
        with self._lock:
            if not self._items:
                raise queue.Empty
            return self._items.popleft()

    def get(self):
        """The oldest item, waiting (without the GIL) until there is one."""
        while True:
            with self._lock:
                if self._items:
                    return self._items.popleft()
            os.eventfd_read(self._ready)


class DeviceExecutor:
    """Single worker thread pinned to `device` (see the module docstring)."""

    def __init__(
        self,
        device: torch.device,
        queue_size: int,
        metrics: ServiceMetrics,
        retry_after_s: int = 1,
        fault_delay_s: float = 0.0,
        fault_gate_file: str = "",
    ):
        self.device = device
        self.fault_delay_s = fault_delay_s
        self.fault_gate_file = fault_gate_file
        self.metrics = metrics
        self.retry_after_s = retry_after_s
        self._queue = _JobQueue(queue_size)
        self._closed = False
        self._device_lock = threading.Lock()  # held by whoever runs a job (the worker, or run_if_idle)
        self._count_lock = threading.Lock()
        self._busy = 0  # jobs queued or running on the worker (run_if_idle runs nothing while any are)
        self._inline = not (fault_delay_s or fault_gate_file)
        self._on_cpu = device.type == "cpu"  # no device context, no stream
        self._thread = threading.Thread(target=self._work, name=f"litetopk-device-{device}", daemon=True)
        self.stream = None
        self.operator: DeviceOperator | None = None  # build_operator(); used by the jobs on the worker
        self.limits: WorkspaceLimits | None = None
        self._gated = 0  # a job taken but held by the fault-injection gate (counted as queued)
        metrics.queue_depth.set_function(lambda: self._queue.qsize() + self._gated)

    def build_operator(
        self, limits: WorkspaceLimits, backend: str, tuning=None, *, graphs: bool = True, max_graphs: int = 16
    ) -> DeviceOperator:
        """Build the device's operator (service/operator.py: workspace, graph runner, result buffer) for
        `limits`; call it on the worker thread, from a job, once."""
        if threading.current_thread() is not self._thread:
            raise RuntimeError("build_operator runs on the device worker thread (submit it as a job)")
        self.operator = DeviceOperator(self.device, limits, backend, tuning, graphs=graphs, max_graphs=max_graphs)
        self.limits = limits
        return self.operator

    def operator_for(self, rows: int, batch: int) -> DeviceOperator:
        """The operator for a call of `rows` query rows over `batch` sequences: ServiceError
        `invalid_input` beyond the limits, `not_ready` before build_operator."""
        if self.operator is None or self.limits is None:
            raise ServiceError("not_ready", "the device workspace is not allocated yet (warm-up running or failed)")
        limits = self.limits
        if rows <= limits.max_rows and batch <= limits.max_batch:
            return self.operator
        for what, count, limit, setting in (
            ("query rows", rows, limits.max_rows, "MAX_ROWS"),
            ("sequences (block_table rows)", batch, limits.max_batch, "MAX_BATCH"),
        ):
            if count > limit:
                raise ServiceError(
                    "invalid_input",
                    f"{count} {what}: this service serves at most {limit} a request "
                    f"(LITETOPK_{setting}); split the request",
                )
        return self.operator

    def start(self) -> None:
        self._thread.start()

    def submit(self, fn: Callable[[], Any]) -> asyncio.Future:
        """Queue `fn` for the worker; the returned future gets its value or exception."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        job = Job(fn, lambda outcome: loop.call_soon_threadsafe(_settle, future, outcome))
        future.add_done_callback(lambda f: setattr(job, "cancelled", True) if f.cancelled() else None)
        self._enqueue(job)
        return future

    def submit_threaded(self, fn: Callable[[], Any], settle: Callable[[Outcome], None]) -> Job:
        """Queue `fn` for the worker from any thread; `settle(outcome)` is called on the worker thread
        (or by `fail_queued`), once, unless the job was cancelled before it ran."""
        job = Job(fn, settle)
        self._enqueue(job)
        return job

    def run_if_idle(self, fn: Callable[..., Any], *args) -> Outcome | None:
        """Run `fn(*args)` on the calling thread, in the device's context and under the device lock, when
        the device is idle (nothing queued or running); its outcome, or None when busy (queue it then)."""
        if self._closed:
            self._refuse_if_closed()
        if not self._inline or not self._device_lock.acquire(blocking=False):
            return None
        try:
            if self._busy or (not self._on_cpu and self.stream is None):
                return None
            return self._run(fn, *args)
        finally:
            self._device_lock.release()

    def _refuse_if_closed(self) -> None:
        if self._closed:
            raise ServiceError(
                "shutting_down",
                "the service is shutting down; retry on its successor",
                headers={"Retry-After": str(self.retry_after_s)},
            )

    def _enqueue(self, job: Job) -> None:
        self._refuse_if_closed()
        with self._count_lock:
            self._busy += 1
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            self._done_with_one()
            raise ServiceError(
                "overloaded",
                f"{self._queue.maxsize} requests are already waiting for the device",
                headers={"Retry-After": str(self.retry_after_s)},
                retry_after=self.retry_after_s,
            ) from None

    def _done_with_one(self) -> None:
        with self._count_lock:
            self._busy -= 1

    async def run(self, fn: Callable[[], Any], timeout: float) -> Any:
        """Submit `fn` and await it for at most `timeout` seconds (then `timeout`, the job dropped)."""
        future = self.submit(fn)
        try:
            return await asyncio.wait_for(future, timeout)
        except asyncio.TimeoutError:
            raise ServiceError("timeout", f"no answer within {timeout} s (queue wait + device time)") from None

    def stop_admissions(self) -> None:
        """Refuse new jobs (`shutting_down`) from now on; queued and running jobs go on."""
        self._closed = True

    def fail_queued(self, error: BaseException) -> int:
        """Answer every job still waiting in the queue with `error` (they never run); returns how many."""
        failed = 0
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is _STOP:
                self._queue.put_nowait(job, bounded=False)  # the worker still stops after the running job
                break
            self._done_with_one()
            if job.cancelled:
                continue
            job.cancelled = True
            job.settle((False, error))
            failed += 1
        return failed

    async def close(self, timeout: float) -> None:
        """Refuse new jobs, finish the queued ones, stop the worker (waits at most `timeout` s)."""
        self._closed = True
        self._queue.put_nowait(_STOP, bounded=False)
        await asyncio.to_thread(self._thread.join, timeout)
        if self._thread.is_alive():
            log.warning("the device worker did not finish its queue within %.1f s", timeout)

    # -- worker thread -----------------------------------------------------------------------------

    def _enter_device(self) -> None:
        """Make the device and its stream this thread's current ones (once a thread: both are per thread)."""
        if getattr(_CURRENT, "stream", None) is not self.stream:
            torch.cuda.set_device(self.device)
            torch.cuda.set_stream(self.stream)
            _CURRENT.stream = self.stream

    def _run(self, fn: Callable[..., Any], *args) -> Outcome:
        """fn(*args) on the device and its stream, the stream synchronized after; the caller holds the
        device lock."""
        started = time.perf_counter()
        try:
            if self._on_cpu:
                value = fn(*args)
            else:
                self._enter_device()
                value = fn(*args)
                self.stream.synchronize()
            outcome = (True, value)
        except BaseException as exc:  # handed to the request, mapped by errors.py
            outcome = (False, exc)
        self.metrics.device_seconds.observe(time.perf_counter() - started)
        return outcome

    def _work(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
            self.stream = torch.cuda.Stream(self.device)
            self._enter_device()
        while True:
            job = self._queue.get()
            if self.fault_gate_file and not os.path.exists(self.fault_gate_file):
                self._gated = 1  # fault injection: the job still counts as queued until the test opens the gate
                while not os.path.exists(self.fault_gate_file):
                    time.sleep(GATE_POLL_S)
                self._gated = 0
            if job is _STOP:
                return
            if job.cancelled:
                self._done_with_one()
                continue
            if self.fault_delay_s:
                time.sleep(self.fault_delay_s)  # fault injection for tests of queueing (0 in production)
            with self._device_lock:
                outcome = self._run(job.fn)
            self._done_with_one()
            try:
                job.settle(outcome)
            except RuntimeError:  # the event loop is closed: nobody waits for this answer any more
                log.warning("dropped the answer of a job whose event loop has closed")
            except Exception:  # a transport's settle must not stop the worker
                log.exception("a job's answer could not be handed back")


def _settle(future: asyncio.Future, outcome: tuple[bool, Any]) -> None:
    if future.done():  # cancelled by a timeout meanwhile
        return
    ok, value = outcome
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)


__all__ = ["DeviceExecutor", "Job", "Outcome", "WorkspaceLimits"]
