"""Timing helpers of the device probes: CUDA-event medians, a JSON report written as it grows, and
one profiled call (torch.profiler table and chrome trace)."""

from __future__ import annotations

import json
import os

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
    spans = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                   if e.device_type == DeviceType.CUDA and not e.is_user_annotation  # annotations are ranges, not work
                   and e.time_range.end > e.time_range.start)
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
    heaviest = sorted(by_name.items(), key=lambda item: -item[1])[:2 * top]
    return dict(span_ms=(hi - spans[0][0]) / 1e3, busy_ms=busy / 1e3, gaps=gaps[:top], gap_count=len(gaps),
                activities=len(spans), heaviest_us=dict(heaviest))


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
