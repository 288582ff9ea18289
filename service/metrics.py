"""Prometheus metrics of one service instance (its own registry, served at /metrics).

litetopk_requests_total{route,method,code}   requests answered ("ok" or the problem code)
litetopk_request_seconds{route}              latency from first byte in to response out
litetopk_queue_depth                         requests waiting for the device worker
litetopk_device_seconds                      worker time per top-k request (kernels + sync)
litetopk_rows_total                          query rows answered
litetopk_candidates_total                    keys the fast path appended (TopKResult.candidates)
litetopk_repairs_total                       rows repaired after a capacity event
litetopk_regions{kind}                       live regions
litetopk_regions_retired_total{reason}       regions retired (unregistered, owner_died, ...)

The request path's counters and histograms (the first two, and device time, rows, candidates,
repairs) are `ThreadCounter` / `ThreadHistogram`: each thread adds into numbers of its own, without
a lock, and /metrics sums them (the numbers of threads that have ended folded into one). A top-k
request updates five of them; through prometheus_client's locked values they cost ~10 us of an IPC
request on a loaded 2-core host (bench/NOTES-service.md). Their exposition is prometheus_client's
(the same names, labels, buckets), without the `_created` samples.
"""

from __future__ import annotations

import bisect
import threading

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class _PerThread:
    """`size` numbers each thread adds to in a list of its own (only that thread writes it: no lock);
    `totals()` sums every thread's list, folding those of threads that have ended into one."""

    __slots__ = ("_size", "_local", "_lock", "_live", "_ended")

    def __init__(self, size: int):
        self._size = size
        self._local = threading.local()
        self._lock = threading.Lock()
        self._live: list[tuple[threading.Thread, list]] = []
        self._ended = [0] * size

    def _new(self) -> list:
        numbers = self._local.numbers = [0] * self._size
        with self._lock:
            self._live.append((threading.current_thread(), numbers))
        return numbers

    def totals(self) -> list:
        with self._lock:
            live = []
            for thread, numbers in self._live:
                if thread.is_alive():
                    live.append((thread, numbers))
                else:  # it writes no more: its numbers join the ended threads' for good
                    self._ended = [a + b for a, b in zip(self._ended, numbers)]
            self._live = live
            totals = list(self._ended)
            for _, numbers in live:
                totals = [a + b for a, b in zip(totals, numbers)]
        return totals


class _CounterChild(_PerThread):
    __slots__ = ()

    def __init__(self):
        super().__init__(1)

    def inc(self, amount: float = 1) -> None:
        numbers = getattr(self._local, "numbers", None) or self._new()
        numbers[0] += amount


class _HistogramChild(_PerThread):
    __slots__ = ("_bounds",)

    def __init__(self, bounds: tuple):
        super().__init__(len(bounds) + 2)  # a count per bucket (+Inf last), then the sum
        self._bounds = bounds

    def observe(self, amount: float) -> None:
        numbers = getattr(self._local, "numbers", None) or self._new()
        numbers[bisect.bisect_left(self._bounds, amount)] += 1  # the first bucket whose bound >= amount
        numbers[-1] += amount


class _Family:
    """Children by label values (`labels(*values)`), or the one child of a family without labels."""

    def __init__(self, name: str, documentation: str, labelnames=()):
        self.name, self.documentation, self.labelnames = name, documentation, tuple(labelnames)
        self._children: dict[tuple, _PerThread] = {}
        self._lock = threading.Lock()

    def labels(self, *values: str):
        child = self._children.get(values)
        if child is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name} takes labels {self.labelnames}, got {values}")
            with self._lock:
                child = self._children.setdefault(values, self._child())
        return child

    def _child(self) -> _PerThread:
        raise NotImplementedError

    def _items(self) -> list[tuple[list[str], list]]:
        return [(list(values), child.totals()) for values, child in list(self._children.items())]


class ThreadCounter(_Family):
    """A counter the request path adds to without a lock (module docstring); `name` without `_total`."""

    def __init__(self, name: str, documentation: str, labelnames=()):
        super().__init__(name, documentation, labelnames)
        if not self.labelnames:
            self.inc = self.labels().inc  # a counter without labels is its one child

    def _child(self) -> _CounterChild:
        return _CounterChild()

    def inc(self, amount: float = 1) -> None:
        raise ValueError(f"{self.name} has labels {self.labelnames}: inc through labels(...)")

    def collect(self):
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, totals in self._items():
            family.add_metric(values, totals[0])
        yield family


class ThreadHistogram(_Family):
    """A histogram the request path adds to without a lock (module docstring)."""

    def __init__(self, name: str, documentation: str, labelnames=(), buckets=LATENCY_BUCKETS):
        self.bounds = tuple(float(b) for b in buckets)
        super().__init__(name, documentation, labelnames)
        if not self.labelnames:
            self.observe = self.labels().observe  # a histogram without labels is its one child

    def _child(self) -> _HistogramChild:
        return _HistogramChild(self.bounds)

    def observe(self, amount: float) -> None:
        raise ValueError(f"{self.name} has labels {self.labelnames}: observe through labels(...)")

    def collect(self):
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        names = [floatToGoString(b) for b in self.bounds] + ["+Inf"]
        for values, totals in self._items():
            counts, cumulative = [], 0
            for name, count in zip(names, totals[:-1]):
                cumulative += count
                counts.append((name, cumulative))
            family.add_metric(values, counts, totals[-1])
        yield family


class ServiceMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = ThreadCounter("litetopk_requests", "Requests answered", ["route", "method", "code"])
        self.latency = ThreadHistogram("litetopk_request_seconds", "Request latency", ["route"])
        self.queue_depth = Gauge("litetopk_queue_depth", "Requests waiting for the device worker", registry=r)
        self.device_seconds = ThreadHistogram("litetopk_device_seconds", "Device-worker time per top-k request")
        self.rows = ThreadCounter("litetopk_rows", "Query rows answered")
        self.candidates = ThreadCounter("litetopk_candidates", "Candidate keys appended by the fast path")
        self.repairs = ThreadCounter("litetopk_repairs", "Rows repaired after a capacity event")
        for family in (self.requests, self.latency, self.device_seconds, self.rows, self.candidates, self.repairs):
            r.register(family)
        self.regions = Gauge("litetopk_regions", "Live regions", ["kind"], registry=r)
        self.regions_retired = Counter("litetopk_regions_retired", "Regions retired", ["reason"], registry=r)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


__all__ = ["LATENCY_BUCKETS", "ServiceMetrics", "ThreadCounter", "ThreadHistogram"]
