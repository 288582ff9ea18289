"""Where the host time of one warm litetopk_prefill call goes (torch.profiler, CPU + CUDA): the ops
and ranges with the most self CPU time, and the number of launches, in all and by pipeline stage (the
innermost `litetopk.<stage>` profiler range around each launch). Prints a table, writes JSON.

    python -m bench.probes.host_time --out DIR                  # on a CUDA device
    TRITON_INTERPRET=1 python -m bench.probes.host_time --cpu    # launches only, on the CPU

--runner times the phases of a warm LiteTopKGraphs call instead (kernels/graphs.py: host checks,
staging copies, graph replay, result copies; medians of 50 calls, the device idle between calls) and
profiles one call's host ops: $OUT/host-time-runner-h200.json.

--cprofile runs 30 warm calls of the eager operator and of LiteTopKGraphs (inputs copied in, and
in place: written into its input_buffers) under cProfile (no torch
profiler: Python's own cost per function, tottime and cumulative) and one profiled call of each for its
device gaps (timing.gpu_activity: every gap with the activities before and after it):
$OUT/host-cprofile-h200.txt and $OUT/host-cprofile-h200.json.

--glue times the host glue alone, without a GPU: the Triton stages' code path on the CPU
(devices.runs_triton_stages made to answer True) with every kernel launch replaced by a no-op, at the
full shape, on a workspace (--no-workspace: from the allocator). The call never reads device data on
the host (no sync), so the Python it runs does not depend on what the kernels would have written: the
median host ms is the pipeline's own Python and torch view / allocation ops, without Triton's launcher
(on a GPU that adds ~30-50 us a launch) and measured on this machine's CPU, not the GPU host's. Writes
$OUT/host-glue-cpu.json (median, launches and buffers a call, the cProfile top functions).

--cpu counts without a GPU what the CUDA path would launch: the Triton stages run under Triton's
interpreter (devices.runs_triton_stages is made to answer True for the call), each interpreted
kernel launch counts one, and so does each torch op called outside a kernel that would run a device
kernel (an op other than a view or an allocation, or one that calls such an op). torch ops that
launch several kernels on CUDA (a sort) count one, so the CUDA count is a little higher.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections import Counter

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from bench.common.problems import prefill_problem
from litetopk.kernels import LiteTopKTuning, litetopk_prefill

#: torch ops that launch no device kernel (views and allocations).
NO_KERNEL_OPS = frozenset(
    f"aten::{name}"
    for name in (
        "empty",
        "empty_like",
        "empty_strided",
        "view",
        "_unsafe_view",
        "reshape",
        "as_strided",
        "slice",
        "select",
        "unbind",
        "unsqueeze",
        "squeeze",
        "expand",
        "t",
        "transpose",
        "permute",
        "narrow",
        "alias",
        "detach",
        "lift_fresh",
        "contiguous",
        "resize_",
        "set_",
        "to",
        "_reshape_alias",
        "split",
        "chunk",
        "view_as",
        "expand_as",
        "flatten",
        "unflatten",
        "diagonal",
        "result_type",
        "is_nonzero",
        "_local_scalar_dense",
        "item",
        "numpy_T",
    )
)
CUDA_LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC")
TRITON_RANGE = "triton:"


def _stage_of(event) -> str:
    """The innermost litetopk.* range around a profiler event ('(outside)' where there is none)."""
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("litetopk."):
            return parent.name
        parent = parent.cpu_parent
    return "(outside)"


def _launches_kernel(event) -> bool:
    if event.name.startswith(TRITON_RANGE):
        return True
    if any(_launches_kernel(child) for child in event.cpu_children):
        return True
    return event.name.startswith("aten::") and event.name not in NO_KERNEL_OPS


def _is_top_level_op(event) -> bool:
    if not (event.name.startswith("aten::") or event.name.startswith(TRITON_RANGE)):
        return False
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("aten::") or parent.name.startswith(TRITON_RANGE):
            return False
        parent = parent.cpu_parent
    return True


def launches_by_stage(events, on_cpu: bool) -> Counter:
    """Kernel launches per pipeline stage of a profiled call (module docstring)."""
    if on_cpu:
        picked = [e for e in events if _is_top_level_op(e) and _launches_kernel(e)]
    else:
        picked = [e for e in events if e.name in CUDA_LAUNCHES]
    return Counter(_stage_of(e) for e in picked)


@contextlib.contextmanager
def triton_stages_on_cpu():
    """Run the Triton twins of every stage on the CPU (interpreter), each launch in a profiler range
    'triton:<kernel>' (a probe's patch, undone on exit)."""
    from triton.runtime.interpreter import InterpretedFunction

    if os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("--cpu needs TRITON_INTERPRET=1 in the environment (set before triton is imported)")
    patched = [
        (m, m.runs_triton_stages)
        for name, m in list(sys.modules.items())
        if name.startswith("litetopk.kernels") and hasattr(m, "runs_triton_stages")
    ]
    run = InterpretedFunction.run

    def counted_run(self, *args, **kwargs):
        with record_function(TRITON_RANGE + self.fn.__name__):
            return run(self, *args, **kwargs)

    InterpretedFunction.run = counted_run
    for module, _ in patched:
        module.runs_triton_stages = lambda device: True
    try:
        yield
    finally:
        InterpretedFunction.run = run
        for module, original in patched:
            module.runs_triton_stages = original


def count_launches_cpu(
    rows: int = 4, keys: int = 2048, topk: int = 512, seed: int = 3, calibration: str = "sample"
) -> Counter:
    """Launches per stage of one LiteTopK call on the CPU with the Triton stages (module docstring),
    calibrated from a sample of keys // 4 (the production path's stages) by a calibration stage or
    in the scan (`calibration`, LiteTopKTuning); the counts do not depend on the sizes (the grids do),
    as long as the candidate buffer is shorter than the window bound (else no repair is launched: here
    a buffer of 2 K keys, under the keys' bound)."""
    problem = prefill_problem(rows, keys * 4, topk, seed, device="cpu")
    k = problem.pop("topk")
    tuning = LiteTopKTuning(sample_size=keys // 4, calibration=calibration, capacity_factor=2)
    call = lambda: litetopk_prefill(**problem, topk=k, max_seq_len=keys, backend="triton", tuning=tuning)  # noqa: E731
    with triton_stages_on_cpu():
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            call()
    return launches_by_stage(prof.events(), on_cpu=True)


def glue_host_ms(
    rows: int, keys: int, topk: int, workspace: bool = True, reps: int = 30, calibration: str = "sample"
) -> dict:
    """Host ms of the LiteTopK call's glue with launches as no-ops (module docstring, --glue), with
    LiteTopKTuning(calibration=calibration)."""
    import cProfile
    import io
    import pstats

    from triton.runtime.interpreter import InterpretedFunction

    from litetopk.kernels import allocate_workspace
    from litetopk.kernels.scratch import Scratch

    problem = prefill_problem(rows, keys * 4, topk, 3, device="cpu")
    k = problem.pop("topk")
    tuning = LiteTopKTuning(calibration=calibration)
    counts = Counter()
    carve = Scratch.empty

    this_call = dict(t0=0.0, launches=0, scan=None)  # the call being timed; scan: (ms, launches) before the scan

    def no_launch(self, *args, **kwargs):
        if this_call["scan"] is None and self.fn.__name__ == "score_fp4_kernel" and kwargs.get("DENSE") is False:
            this_call["scan"] = (
                (time.perf_counter() - this_call["t0"]) * 1e3,
                counts["launches"] - this_call["launches"],
            )
        counts["launches"] += 1

    def counted_carve(self, shape, dtype):
        counts["buffers"] += 1
        return carve(self, shape, dtype)

    with triton_stages_on_cpu():
        InterpretedFunction.run, Scratch.empty = no_launch, counted_carve  # undone by triton_stages_on_cpu / below
        try:
            ws = allocate_workspace(rows, keys, k, device="cpu", backend="triton", tuning=tuning) if workspace else None

            def call(ws=ws, k=k, keys=keys):
                return litetopk_prefill(
                    **problem, topk=k, max_seq_len=keys, backend="triton", workspace=ws, tuning=tuning
                )

            for _ in range(3):
                call()
            counts.clear()
            host, scan_started = [], []  # per call: its ms; (ms, launches) before the scan's first launch
            for _ in range(reps):
                this_call.update(t0=time.perf_counter(), launches=counts["launches"], scan=None)
                call()
                host.append((time.perf_counter() - this_call["t0"]) * 1e3)
                # a call without a scan (no rows): all of it counts as before one
                scan_started.append(this_call["scan"] or (host[-1], counts["launches"] - this_call["launches"]))
            per_call = {name: n / reps for name, n in counts.items()}
            profiler = cProfile.Profile()
            profiler.enable()
            for _ in range(reps):
                call()
            profiler.disable()
        finally:
            Scratch.empty = carve
    buffer = io.StringIO()
    pstats.Stats(profiler, stream=buffer).strip_dirs().sort_stats("tottime").print_stats(15)
    return dict(
        rows=rows,
        keys=keys,
        topk=topk,
        workspace=workspace,
        calibration=calibration,
        host_ms=sorted(host)[reps // 2],
        # the part of it before the scan's first launch, and the launches before that
        to_scan_ms=sorted(ms for ms, _ in scan_started)[reps // 2],
        launches_before_scan=scan_started[0][1],
        **per_call,
        cprofile_top=buffer.getvalue(),
    )


def _print_stages(counts: Counter) -> None:
    print(f"launches {sum(counts.values())}")
    for stage, n in sorted(counts.items(), key=lambda item: -item[1]):
        print(f"  {stage:<28} {n:5d}")


def runner_phases(rows: int, keys: int, topk: int, reps: int = 50) -> dict:
    """Host ms by phase of a warm LiteTopKGraphs call (module docstring), and its top host ops."""
    from litetopk.kernels import LiteTopKGraphs
    from litetopk.kernels.validation import check_prefill

    problem = prefill_problem(rows, keys * 4, topk, 3)
    problem.pop("topk")
    graphs = LiteTopKGraphs(rows, keys, topk, device="cuda")
    call = lambda: graphs(**problem, topk=topk, max_seq_len=keys)  # noqa: E731
    call()
    call()
    (captured,) = graphs._graphs.values()
    inputs = {name: problem[name] for name in captured.staged}
    phases = {name: [] for name in ("call", "check_prefill", "staging copies", "replay", "publish")}
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        call()
        phases["call"].append(time.perf_counter() - t0)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        check_prefill(**problem, topk=topk, max_seq_len=keys)
        t1 = time.perf_counter()
        captured.stage(inputs)
        t2 = time.perf_counter()
        captured.replay()
        t3 = time.perf_counter()
        graphs._publish(captured, None)
        t4 = time.perf_counter()
        for name, (a, b) in (
            ("check_prefill", (t0, t1)),
            ("staging copies", (t1, t2)),
            ("replay", (t2, t3)),
            ("publish", (t3, t4)),
        ):
            phases[name].append(b - a)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        call()
    top = [
        dict(name=e.key, calls=e.count, self_cpu_us=e.self_cpu_time_total)
        for e in sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:20]
    ]
    return dict(
        rows=rows, keys=keys, topk=topk, phases_ms={k: sorted(v)[len(v) // 2] * 1e3 for k, v in phases.items()}, top=top
    )


def _pstats_text(profiler, sort: str, limit: int) -> str:
    import io
    import pstats

    buffer = io.StringIO()
    pstats.Stats(profiler, stream=buffer).strip_dirs().sort_stats(sort).print_stats(limit)
    return buffer.getvalue()


def cprofile_calls(rows: int, keys: int, topk: int, out_dir: str, reps: int = 30) -> dict:
    """cProfile of `reps` warm eager calls and runner calls, and every device gap of one call of each
    (module docstring)."""
    import cProfile

    from bench.common.timing import gpu_activity
    from litetopk.kernels import LiteTopKGraphs

    problem = prefill_problem(rows, keys * 4, topk, 3)
    problem.pop("topk")
    graphs = LiteTopKGraphs(rows, keys, topk, device="cuda")
    views = graphs.input_buffers(
        rows, tuple(problem["block_table"].shape), topk=topk, weights_dtype=problem["weights"].dtype
    )
    for name, view in views.items():
        view.copy_(problem[name])
    calls = dict(
        eager=lambda: litetopk_prefill(**problem, topk=topk, max_seq_len=keys),
        runner=lambda: graphs(**problem, topk=topk, max_seq_len=keys),
        runner_in_place=lambda: graphs(**{**problem, **views}, topk=topk, max_seq_len=keys),
    )
    report, text = dict(rows=rows, keys=keys, topk=topk, reps=reps), []
    for name, call in calls.items():
        for _ in range(3):
            call()
        torch.cuda.synchronize()
        plain = []
        for _ in range(reps):
            t0 = time.perf_counter()
            call()
            plain.append(time.perf_counter() - t0)
            torch.cuda.synchronize()
        profiler = cProfile.Profile()
        host = []
        for _ in range(reps):
            t0 = time.perf_counter()
            profiler.enable()
            call()
            profiler.disable()
            host.append(time.perf_counter() - t0)
            torch.cuda.synchronize()
        activity = gpu_activity(call, top=80)
        report[name] = dict(
            host_ms=sorted(plain)[reps // 2] * 1e3, host_ms_profiled=sorted(host)[reps // 2] * 1e3, activity=activity
        )
        text.append(
            f"==== {name}: median host ms {report[name]['host_ms']:.3f} (under cProfile "
            f"{report[name]['host_ms_profiled']:.3f}); "
            f"{activity['activities']} device activities, {activity['gap_count']} gaps, "
            f"span {activity['span_ms']:.3f} busy {activity['busy_ms']:.3f} ms"
        )
        text += [f"  gap {g['gap_us']:8.1f} us  {g['before']}  ->  {g['after']}" for g in activity["gaps"]]
        text.append(_pstats_text(profiler, "tottime", 45))
        text.append(_pstats_text(profiler, "cumulative", 70))
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "host-cprofile-h200.txt"), "w") as fh:
        fh.write("\n".join(text))
    with open(os.path.join(out_dir, "host-cprofile-h200.json"), "w") as fh:
        json.dump(dict(command="python -m bench.probes.host_time --cprofile", **report), fh, indent=1)
    return report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "bench/results"))
    parser.add_argument("--rows", type=int, default=8192)
    parser.add_argument("--keys", type=int, default=65536)
    parser.add_argument("--topk", type=int, default=512)
    parser.add_argument("--cpu", action="store_true", help="count launches on the CPU (module docstring); no JSON")
    parser.add_argument("--runner", action="store_true", help="phases of a LiteTopKGraphs call (module docstring)")
    parser.add_argument("--cprofile", action="store_true", help="cProfile + device gaps (module docstring)")
    parser.add_argument(
        "--glue",
        action="store_true",
        help="host glue without a GPU, launches as no-ops (module docstring); needs TRITON_INTERPRET=1",
    )
    parser.add_argument("--no-workspace", action="store_true", help="--glue: buffers from the allocator")
    parser.add_argument(
        "--calibration",
        choices=("sample", "scan"),
        default="sample",
        help="--glue / --cpu: LiteTopKTuning(calibration=...): a calibration stage, or the scan's own",
    )
    args = parser.parse_args(argv)
    if args.cprofile:
        report = cprofile_calls(args.rows, args.keys, args.topk, args.out)
        for name in ("eager", "runner", "runner_in_place"):
            print(
                f"{name}: host ms {report[name]['host_ms']:.3f} (cProfile {report[name]['host_ms_profiled']:.3f}), "
                f"gaps {report[name]['activity']['gap_count']}"
            )
        return 0
    if args.runner:
        report = dict(
            command="python -m bench.probes.host_time --runner",
            results=[runner_phases(args.rows, args.keys, k) for k in (512, 1024)],
        )
        for r in report["results"]:
            print(f"K={r['topk']}: " + ", ".join(f"{k} {v:.3f} ms" for k, v in r["phases_ms"].items()))
            for t in r["top"][:12]:
                print(f"    {t['name'][:50]:<50} x{t['calls']:<4} self {t['self_cpu_us']:8.1f} us")
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "host-time-runner-h200.json"), "w") as fh:
            json.dump(report, fh, indent=1)
        return 0
    if args.glue:
        report = dict(
            command="TRITON_INTERPRET=1 python -m bench.probes.host_time --glue"
            + (" --no-workspace" if args.no_workspace else "")
            + f" --calibration {args.calibration}",
            **glue_host_ms(
                args.rows, args.keys, args.topk, workspace=not args.no_workspace, calibration=args.calibration
            ),
        )
        print(
            f"glue host ms {report['host_ms']:.3f} ({report['launches']:.0f} launches as no-ops, "
            f"{report['buffers']:.0f} buffers a call, workspace {report['workspace']}); before the scan "
            f"{report['to_scan_ms']:.3f} ms, {report['launches_before_scan']} launches"
        )
        print(report["cprofile_top"])
        os.makedirs(args.out, exist_ok=True)
        suffix = ("" if args.calibration == "sample" else f"-{args.calibration}") + (
            "-no-workspace" if args.no_workspace else ""
        )
        with open(os.path.join(args.out, f"host-glue-cpu{suffix}.json"), "w") as fh:
            json.dump(report, fh, indent=1)
        return 0
    if args.cpu:
        _print_stages(count_launches_cpu(topk=args.topk, calibration=args.calibration))
        return 0
    problem = prefill_problem(args.rows, args.keys * 4, args.topk, 3)
    topk = problem.pop("topk")
    call = lambda: litetopk_prefill(**problem, topk=topk, max_seq_len=args.keys)  # noqa: E731
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    call()
    host = (time.perf_counter() - t0) * 1e3
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    rows = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    top = [
        dict(
            name=e.key,
            calls=e.count,
            self_cpu_ms=e.self_cpu_time_total / 1e3,
            cpu_ms=e.cpu_time_total / 1e3,
            cuda_ms=e.device_time_total / 1e3,
        )
        for e in rows[:40]
    ]
    ranges = [
        dict(name=e.key, cpu_ms=e.cpu_time_total / 1e3, cuda_ms=e.device_time_total / 1e3)
        for e in prof.key_averages()
        if e.key.startswith("litetopk.")
    ]
    by_stage = launches_by_stage(prof.events(), on_cpu=False)
    launches = sum(by_stage.values())
    print(f"host ms (unprofiled) {host:.2f}")
    _print_stages(by_stage)
    for r in ranges:
        print(f"  range {r['name']:<28} cpu {r['cpu_ms']:8.3f} ms  cuda {r['cuda_ms']:8.3f} ms")
    for r in top:
        print(f"  {r['name'][:60]:<60} x{r['calls']:<5} self cpu {r['self_cpu_ms']:8.3f} ms")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "host-time-h200.json"), "w") as fh:
        json.dump(
            dict(
                command="python -m bench.probes.host_time",
                host_ms=host,
                launches=launches,
                launches_by_stage=dict(by_stage),
                ranges=ranges,
                top=top,
            ),
            fh,
            indent=1,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
