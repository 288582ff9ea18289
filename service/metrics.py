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
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class ServiceMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("litetopk_requests", "Requests answered", ["route", "method", "code"], registry=r)
        self.latency = Histogram(
            "litetopk_request_seconds", "Request latency", ["route"], buckets=LATENCY_BUCKETS, registry=r
        )
        self.queue_depth = Gauge("litetopk_queue_depth", "Requests waiting for the device worker", registry=r)
        self.device_seconds = Histogram(
            "litetopk_device_seconds", "Device-worker time per top-k request", buckets=LATENCY_BUCKETS, registry=r
        )
        self.rows = Counter("litetopk_rows", "Query rows answered", registry=r)
        self.candidates = Counter("litetopk_candidates", "Candidate keys appended by the fast path", registry=r)
        self.repairs = Counter("litetopk_repairs", "Rows repaired after a capacity event", registry=r)
        self.regions = Gauge("litetopk_regions", "Live regions", ["kind"], registry=r)
        self.regions_retired = Counter("litetopk_regions_retired", "Regions retired", ["reason"], registry=r)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


__all__ = ["ServiceMetrics"]
