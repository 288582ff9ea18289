"""Timing helpers of the benchmarks and device probes: CUDA-event medians, the GPU time of single calls with a
cold L2 and no launch gaps (CallTimer), the wall time of calls of several functions in blocks
(wall_seconds_in_blocks), a JSON report written as it grows, and one profiled call (torch.profiler table and
chrome trace)."""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable

import torch


def cuda_ms(fn, reps: int = 5, warm: int = 2) -> float:
    """Median milliseconds of `reps` calls of fn timed with CUDA events, after `warm` calls."""
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def wall_seconds_in_blocks(
    calls: dict[str, Callable[[], object]],
    iters: int,
    warm: int,
    block: int,
    before: Callable[[], object] | None = None,
) -> dict[str, list[float]]:
    """Per name of `calls`: the wall seconds of `iters` timed calls, after `warm` untimed ones. Each function's calls
    come in blocks of `block` in a row, the functions taking turns block by block: drifting load hits all alike, and
    (unlike turns call by call) a call does not follow another function's, whose tail work (another process's GPU
    work, a server's bookkeeping after its answer) would land in it; a block's first call still does. `before`, when
    given, runs before each call, outside its time (a pause between calls)."""
    if block < 1 or iters < 1 or warm < 0:
        raise ValueError(f"block={block}, iters={iters}, warm={warm}: block and iters >= 1, warm >= 0")
    seconds = {name: [] for name in calls}
    for first in range(0, iters + warm, block):
        for name, fn in calls.items():
            for i in range(first, min(first + block, iters + warm)):
                if before is not None:
                    before()
                start = time.perf_counter()
                fn()
                elapsed = time.perf_counter() - start
                if i >= warm:
                    seconds[name].append(elapsed)
    return seconds


class CallTimer:
    """Times single calls of several functions, interleaved round by round (drift hits them alike).

    On a CUDA device each timed call is what the GPU spends on it, L2 cold, launch gaps excluded:
    1. the L2 is flushed by reading a buffer of max(256 MiB, 4 x L2) bytes (a read, so no dirty lines
       are written back during the call): every input, the keys above all, comes from HBM, as in a
       decode step whose previous layer streamed other bytes (instead of rotating copies of the inputs,
       which small decode caches would need by the hundred to exceed the L2);
    2. a spin kernel (torch.cuda._sleep) holds the GPU while the host enqueues the call (1.5 x the
       function's median host time in the warm-up rounds, raised up to 4x by a rep that outlasts it):
       the CUDA events around the call then time the device work back to back, not the host's Python
       (a call that waits for the device inside also times the host's work after the wait);
    3. CUDA events right around the call.
    A rep whose host time exceeded its spin is counted in `host_bound_reps` (its time may hold gaps).
    On the CPU it is the wall time of the call (perf_counter), nothing flushed.
    """

    def __init__(self, device):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.flush_bytes = 0
        self.cycles_per_us = 0.0
        if self.cuda:
            props = torch.cuda.get_device_properties(self.device)
            l2 = int(getattr(props, "L2_cache_size", 0) or 50 << 20)
            self.flush_bytes = max(256 << 20, 4 * l2)
            self._flush = torch.zeros(self.flush_bytes // 4, dtype=torch.float32, device=self.device)
            self.cycles_per_us = self._spin_rate()

    def _spin_rate(self) -> float:
        """GPU clock cycles of torch.cuda._sleep per microsecond (timed once, after a warm-up spin)."""
        rate = 0.0
        for cycles in (100_000, 2_000_000, 2_000_000):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(cycles)
            end.record()
            torch.cuda.synchronize(self.device)
            rate = cycles / (start.elapsed_time(end) * 1e3)
        return rate

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def measure(self, calls: dict[str, Callable[[], object]], reps: int, warm: int = 1) -> dict[str, dict]:
        """Per name of `calls`: median_us, min_us, max_us, reps_us (each timed call), host_us (median
        wall time from the call to its return, the device still busy), spin_us (the last spin before a
        call), host_bound_reps. `warm` (>= 1) untimed rounds first, whose host times set the spins."""
        if reps < 1 or warm < 1:
            raise ValueError(f"reps={reps}, warm={warm}: both must be >= 1")
        host = {name: [] for name in calls}
        for _ in range(warm):
            for name, fn in calls.items():
                self.sync()
                t0 = time.perf_counter()
                fn()
                host[name].append((time.perf_counter() - t0) * 1e6)
        self.sync()
        # 1.5 x the median warm host time; a rep that outlasts its spin raises it, to at most 4x (a call that
        # waits for the device inside would otherwise see its spin in its own host time and grow it forever)
        base = {name: 1.5 * statistics.median(times) + 20.0 for name, times in host.items()}
        spin = dict(base)
        timed = {name: [] for name in calls}
        bound = dict.fromkeys(calls, 0)
        host = {name: [] for name in calls}
        for _ in range(reps):
            events = {}
            for name, fn in calls.items():
                if self.cuda:
                    self._flush.sum()
                    torch.cuda._sleep(int(spin[name] * self.cycles_per_us))
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                t0 = time.perf_counter()
                fn()
                wall = (time.perf_counter() - t0) * 1e6
                host[name].append(wall)
                if self.cuda:
                    end.record()
                    events[name] = (start, end)
                    if wall > spin[name]:
                        bound[name] += 1
                        spin[name] = min(max(spin[name], 1.5 * wall + 20.0), 4 * base[name])
                else:
                    timed[name].append(wall)
            self.sync()
            for name, (start, end) in events.items():
                timed[name].append(start.elapsed_time(end) * 1e3)
        return {
            name: dict(
                median_us=statistics.median(times),
                min_us=min(times),
                max_us=max(times),
                reps_us=times,
                host_us=statistics.median(host[name]),
                spin_us=spin[name] if self.cuda else 0.0,
                host_bound_reps=bound[name],
            )
            for name, times in timed.items()
        }


def gpu_activity(fn, top: int = 6) -> dict:
    """One profiled call of fn on the GPU (torch.profiler's trace, CUPTI): span_ms from its first device
    activity's start to its last one's end, busy_ms the union of the activities' intervals (kernels and
    copies; overlaps counted once, nothing double counted), the `top` longest gaps between them
    (gap_us, the activity before and the one after), the number of activities, and the 2 x `top`
    activities with the most device time (heaviest_us, by name)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    spans = sorted(
        (e.time_range.start, e.time_range.end, e.name)
        for e in prof.events()
        if e.device_type == DeviceType.CUDA
        and not e.is_user_annotation  # annotations are ranges, not work
        and e.time_range.end > e.time_range.start
    )
    if not spans:
        return dict(span_ms=0.0, busy_ms=0.0, gaps=[], gap_count=0, activities=0, heaviest_us={})
    busy, gaps = 0.0, []
    lo, hi, last = spans[0]
    for start, end, name in spans[1:]:
        if start > hi:
            busy += hi - lo
            gaps.append(dict(gap_us=start - hi, before=last[:60], after=name[:60]))
            lo = start
        if end >= hi:
            hi, last = end, name
    busy += hi - lo
    gaps.sort(key=lambda g: -g["gap_us"])
    by_name: dict[str, float] = {}
    for start, end, name in spans:
        by_name[name[:60]] = by_name.get(name[:60], 0.0) + end - start
    heaviest = sorted(by_name.items(), key=lambda item: -item[1])[: 2 * top]
    return dict(
        span_ms=(hi - spans[0][0]) / 1e3,
        busy_ms=busy / 1e3,
        gaps=gaps[:top],
        gap_count=len(gaps),
        activities=len(spans),
        heaviest_us=dict(heaviest),
    )


def json_logger(path: str, report: dict):
    """log(key, value): report[key] = value, printed, and the whole report rewritten to `path` (so a
    call cut short still leaves what it measured)."""

    def log(key, value):
        report[key] = value
        print(key, value, flush=True)
        with open(path, "w") as f:
            json.dump(report, f, indent=1, default=str)

    return log


def profile_call(fn, out_dir: str, name: str) -> None:
    """Profile one call of fn after two warm-up calls: writes out_dir/name-profile.txt (ops by CPU
    time, then by CUDA time) and out_dir/name-trace.json (chrome trace)."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    with open(os.path.join(out_dir, f"{name}-profile.txt"), "w") as f:
        f.write(prof.key_averages().table(sort_by="cpu_time_total", row_limit=40))
        f.write("\n\n" + prof.key_averages().table(sort_by="cuda_time_total", row_limit=25))
    prof.export_chrome_trace(os.path.join(out_dir, f"{name}-trace.json"))
