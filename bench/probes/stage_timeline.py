"""Where one LiteTopK call's time goes, stage by stage, from a torch.profiler trace.

The pipeline marks its stages with `torch.profiler.record_function("litetopk.<stage>")` (row_checks,
decode, schedule, calibrate, scan, certify, repair, select, assemble). This probe profiles REPS calls,
each inside a `bench.call` range, and reads the exported chrome trace: for every stage its host start
and host time (ms from the call's start), the GPU window of its kernels, copies and memsets (each
joined to its host launch by Kineto's correlation id; it belongs to the innermost stage range around
that launch) and their busy time; for the call, the GPU busy time and the GPU idle time inside its
GPU window. Medians over the calls. Nothing is patched: a stage the pipeline
does not mark does not appear, and a trace with no `litetopk.` range at all is an error.

    source bench/device/gpu_env.sh && OUT=/tmp TAG=new python3 -m bench.probes.stage_timeline   # H200
    python3 -m bench.probes.stage_timeline --trace /tmp/stage-trace-new.json                  # re-read a trace
Writes $OUT/stage-timeline-<tag>.json (the tables) and $OUT/stage-trace-<tag>-k<K>-raw<N>.json (the traces).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

PREFIX = "litetopk."
CALL = "bench.call"


def _spans(events: list[dict], category: str, name: str | None = None, prefix: str | None = None) -> list[dict]:
    picked = [
        e
        for e in events
        if e.get("ph") == "X"
        and e.get("cat") == category
        and (name is None or e.get("name") == name)
        and (prefix is None or e.get("name", "").startswith(prefix))
    ]
    return sorted(picked, key=lambda e: e["ts"])


def _inside(span: dict, start: float, end: float) -> bool:
    return start <= span["ts"] and span["ts"] + span.get("dur", 0) <= end + 1e-3


def _busy_us(kernels: list[dict], start: float, end: float) -> float:
    """Microseconds of [start, end) covered by at least one kernel (the union of their intervals;
    `kernels` sorted by start)."""
    busy, edge = 0.0, start
    for k in kernels:
        a, b = max(k["ts"], edge), min(k["ts"] + k.get("dur", 0), end)
        if b > a:
            busy += b - a
            edge = b
    return busy


def _device_activities(events: list[dict]) -> list[tuple[dict, dict]]:
    """(device activity, its host launch) pairs, sorted by the activity's start: kernels, copies and
    memsets joined to the runtime / driver call that launched them by Kineto's correlation id."""
    launches = {
        e["args"]["correlation"]: e
        for e in events
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    }
    device = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    pairs = [(e, launches.get(e.get("args", {}).get("correlation"))) for e in device]
    return sorted(((e, launch) for e, launch in pairs if launch is not None), key=lambda pair: pair[0]["ts"])


def call_stages(trace: dict) -> list[dict]:
    """Per `bench.call` range of a chrome trace: {"call": {...}, "stages": {name: {...}}}, times in ms
    from the call's host start (ValueError when the trace holds no call or no `litetopk.` range). A
    device activity belongs to the innermost `litetopk.` range around its launch on the host."""
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    host_calls = _spans(events, "user_annotation", name=CALL)
    ranges = _spans(events, "user_annotation", prefix=PREFIX)
    activities = _device_activities(events)
    if not host_calls:
        raise ValueError(f"no '{CALL}' range in the trace")
    calls = []
    for i, call in enumerate(host_calls):
        t0, t1 = call["ts"], call["ts"] + call["dur"]
        stages: dict[str, dict] = {}
        inside = [span for span in ranges if _inside(span, t0, t1)]
        for span in inside:
            row = stages.setdefault(
                span["name"][len(PREFIX) :], {"host_start": (span["ts"] - t0) / 1e3, "host_ms": 0.0, "calls": 0}
            )
            row["host_ms"] += span["dur"] / 1e3
            row["calls"] += 1
        if not stages:
            raise ValueError(
                f"call {i}: no '{PREFIX}<stage>' range inside it: does this commit's pipeline mark its stages?"
            )
        mine = [(e, launch) for e, launch in activities if t0 <= launch["ts"] <= t1]
        by_stage: dict[str, list[dict]] = {}
        for e, launch in mine:
            around = [
                s for s in inside if s.get("tid") == launch.get("tid") and _inside(launch, s["ts"], s["ts"] + s["dur"])
            ]
            if around:
                by_stage.setdefault(min(around, key=lambda s: s["dur"])["name"][len(PREFIX) :], []).append(e)
        for name, kernels in by_stage.items():
            row = stages[name]
            row["gpu_start"] = (kernels[0]["ts"] - t0) / 1e3
            row["gpu_end"] = (max(k["ts"] + k.get("dur", 0) for k in kernels) - t0) / 1e3
            row["gpu_busy_ms"] = _busy_us(kernels, kernels[0]["ts"], float("inf")) / 1e3
            row["launches"] = len(kernels)
        summary = {"host_ms": (t1 - t0) / 1e3}
        if mine:  # a trace without device activity (a CPU run) has no GPU window
            kernels = [e for e, _ in mine]
            g0, g1 = kernels[0]["ts"], max(k["ts"] + k.get("dur", 0) for k in kernels)
            busy = _busy_us(kernels, g0, g1) / 1e3
            summary.update(
                gpu_start=(g0 - t0) / 1e3,
                gpu_end=(g1 - t0) / 1e3,
                gpu_busy_ms=busy,
                gpu_idle_ms=(g1 - g0) / 1e3 - busy,
                launches=len(kernels),
            )
        calls.append({"call": summary, "stages": stages})
    return calls


def median_table(calls: list[dict]) -> dict:
    """The median of every number over the calls (a stage missing from some calls: over those it is in)."""
    table = {"call": {k: statistics.median(c["call"][k] for c in calls) for k in calls[0]["call"]}, "stages": {}}
    names = {name for c in calls for name in c["stages"]}
    for name in names:
        rows = [c["stages"][name] for c in calls if name in c["stages"]]
        keys = {k for r in rows for k in r}
        table["stages"][name] = {k: statistics.median(r[k] for r in rows if k in r) for k in sorted(keys)}
    return table


def print_table(title: str, table: dict) -> None:
    call = table["call"]
    gpu = (
        f"GPU {call['gpu_start']:.3f} -> {call['gpu_end']:.3f} (busy {call['gpu_busy_ms']:.3f}, "
        f"idle {call['gpu_idle_ms']:.3f})"
        if "gpu_start" in call
        else "no GPU activity"
    )
    print(f"\n{title}: call host {call['host_ms']:.3f} ms, {gpu}; ms from the call's start")
    for name, row in sorted(table["stages"].items(), key=lambda item: item[1]["host_start"]):
        gpu = (
            f"gpu {row['gpu_start']:7.3f} -> {row['gpu_end']:7.3f} busy {row['gpu_busy_ms']:6.3f}"
            if "gpu_start" in row
            else "gpu -"
        )
        print(f"  {name:12s} host {row['host_start']:7.3f} +{row['host_ms']:6.3f}   {gpu}")


def profile_calls(topk: int, raw: int, reps: int, trace_path: str, calibration: str = "sample") -> dict:
    """Profile `reps` LiteTopK calls at Q = 8192 rows (after 3 unprofiled ones) into trace_path, with
    LiteTopKTuning(calibration=calibration)."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from bench.common.problems import call_args, prefill_problem
    from litetopk.kernels import LiteTopKTuning, litetopk_prefill

    args, kw = call_args(prefill_problem(8192, raw, topk, seed=7))
    kw = dict(kw, backend="triton", tuning=LiteTopKTuning(calibration=calibration))
    for _ in range(3):
        litetopk_prefill(*args, **kw)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            with record_function(CALL):
                litetopk_prefill(*args, **kw)
            torch.cuda.synchronize()
    prof.export_chrome_trace(trace_path)
    with open(trace_path) as f:
        return json.load(f)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", help="read this chrome trace instead of profiling (no device needed)")
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    parser.add_argument("--tag", default=os.environ.get("TAG", "new"))
    parser.add_argument("--reps", type=int, default=int(os.environ.get("REPS", "7")))
    parser.add_argument(
        "--calibration",
        choices=("sample", "scan"),
        default=os.environ.get("CALIBRATION", "sample"),
        help="LiteTopKTuning(calibration=...) of the profiled calls",
    )
    args = parser.parse_args()
    report: dict = {"tag": args.tag, "reps": args.reps, "calibration": args.calibration}
    if args.trace:
        with open(args.trace) as f:
            report["trace"] = median_table(call_stages(json.load(f)))
        print_table(args.trace, report["trace"])
    else:
        import torch

        report["device"] = torch.cuda.get_device_name(0)
        for topk, raw in ((512, 262144), (1024, 262144), (512, 786432)):
            trace_path = os.path.join(args.out, f"stage-trace-{args.tag}-k{topk}-raw{raw}.json")
            trace = profile_calls(topk, raw, args.reps, trace_path, args.calibration)
            report[f"k{topk}_raw{raw}"] = table = median_table(call_stages(trace))
            print_table(f"{args.tag} K={topk} raw={raw}", table)
    with open(os.path.join(args.out, f"stage-timeline-{args.tag}.json"), "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
