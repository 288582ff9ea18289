"""What an embedding serving engine sees of litetopk_prefill (issue 14): host time, GPU idle time,
eager vs CUDA-graph replay, host syncs, and out= buffers; one process, on a CUDA device.

For each (keys, K): a causal prefill of Q rows (bench.common.problems) and one caller-owned
workspace sized for it (allocate_workspace; its bytes and sizing time are in the JSON), which every
call below runs on, then
- sync check: one eager call under torch.cuda.set_sync_debug_mode("error") (raises on any sync);
- host ms: wall time from the call to its return (no synchronization; the GPU is still busy);
- eager ms: CUDA events around one call (median of reps), graph ms: the same call captured once
  in a CUDA graph with caller-owned `out` buffers and replayed;
- GPU idle ms inside an eager call: eager ms minus the GPU's busy time in the call (the union of its
  kernels' and copies' intervals in torch.profiler's trace: what the call holds the GPU without
  computing, the wait for the first launch included), and gaps ms: the idle time between the call's
  first device activity and its last (the wait for the first launch excluded);
- bit equality: graph replay after new input contents are copied in == an eager call on them;
- the graph runner (LiteTopKGraphs, kernels/graphs.py: the operator replayed from its own per-shape
  graph, inputs staged): its host ms, call ms (CUDA events around the whole call: staging copies,
  replay, result copies), GPU idle ms, no host sync, and its answer == the eager call's, bit for bit;
  in place: the same with the inputs written into the runner's own buffers (input_buffers: no copy in).
Prints a table, writes JSON (with the command) and a PNG to --out.

    python -m bench.embedding --out bench/results --rows 8192 --keys 65536 196608 [--calibration scan]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

from bench.common.problems import prefill_problem
from bench.common.timing import cuda_ms, gpu_activity
from litetopk.kernels import LiteTopKGraphs, LiteTopKTuning, allocate_workspace, litetopk_prefill
from litetopk.kernels.result import RESULT_FIELDS

FIELDS = tuple(RESULT_FIELDS)


def _call(problem, out=None, workspace=None, tuning=None):
    kwargs = {k: v for k, v in problem.items() if k not in ("topk", "max_seq_len")}
    return litetopk_prefill(
        **kwargs, topk=problem["topk"], out=out, max_seq_len=problem["max_seq_len"], workspace=workspace, tuning=tuning
    )


def _activity(fn) -> tuple[float, float, dict]:
    """(GPU busy ms, gaps ms, the trace's summary) of one call (bench.common.timing.gpu_activity): the
    union of its kernels' and copies' intervals, the idle time between its first device activity and
    its last, and the longest gaps with the activities around them."""
    activity = gpu_activity(fn)
    return activity["busy_ms"], activity["span_ms"] - activity["busy_ms"], activity


def _syncs_and_host_ms(call, reps: int) -> tuple[str, float]:
    """("none" or the first sync's message) of one warm call under set_sync_debug_mode("error"), and the
    median host ms from the call to its return over `reps` calls (the device idle before each)."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        call()
        syncs = "none"
    except RuntimeError as exc:
        syncs = f"sync: {str(exc).splitlines()[0][:120]}"
    finally:
        torch.cuda.set_sync_debug_mode(0)
    host = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        call()
        host.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    return syncs, statistics.median(host)


def measure(rows: int, keys: int, topk: int, reps: int, seed: int, tuning: LiteTopKTuning) -> dict:
    problem = prefill_problem(rows, keys * 4, topk, seed)
    problem["max_seq_len"] = keys
    t0 = time.perf_counter()
    workspace = allocate_workspace(rows, keys, topk, device="cuda", tuning=tuning)  # every call below runs on it
    sizing_s = time.perf_counter() - t0
    call = lambda p=problem, out=None: _call(p, out, workspace, tuning)  # noqa: E731
    for _ in range(2):  # compile and warm up
        call()
    syncs, host_ms = _syncs_and_host_ms(call, reps)
    eager = cuda_ms(call, reps=reps, warm=0)
    kernels, gaps, trace = _activity(call)
    # Graph: caller-owned outputs, inputs copied into the captured tensors before each replay.
    out = {name: torch.empty_like(getattr(call(), name)) for name in FIELDS}
    static = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in problem.items()}
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call(static, out)  # warm-up on the side stream, as torch.cuda.graphs asks
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    graph_error = None
    try:
        with torch.cuda.graph(graph):
            call(static, out)
        fresh = prefill_problem(rows, keys * 4, topk, seed + 1)
        for name in ("q_fp4", "q_scale", "kv_cache", "weights"):
            static[name].copy_(fresh[name])
        graph.replay()
        torch.cuda.synchronize()
        fresh["max_seq_len"] = keys
        want = call({**static})
        equal = all(torch.equal(out[n], getattr(want, n)) for n in FIELDS)
        replay = cuda_ms(graph.replay, reps=reps, warm=1)
    except Exception as exc:  # reported in the table and the JSON, never hidden
        graph_error, equal, replay = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}", False, float("nan")
    del graph, static, out
    runner = _runner(problem, rows, keys, topk, reps, workspace, tuning)
    return dict(
        rows=rows,
        keys=keys,
        topk=topk,
        calibration=tuning.calibration,
        syncs=syncs,
        host_ms=host_ms,
        eager_ms=eager,
        kernel_ms=kernels,
        idle_ms=eager - kernels,
        gaps_ms=gaps,
        trace=trace,
        graph_ms=replay,
        graph_equal=equal,
        graph_error=graph_error,
        workspace_bytes=workspace.numel(),
        workspace_sizing_s=sizing_s,
        **runner,
    )


def _runner(problem, rows: int, keys: int, topk: int, reps: int, workspace, tuning: LiteTopKTuning) -> dict:
    """The graph runner's columns (module docstring): runner_* keys (on the same workspace)."""
    t0 = time.perf_counter()
    graphs = LiteTopKGraphs(rows, keys, topk, device="cuda", workspace=workspace, tuning=tuning)
    setup_s = time.perf_counter() - t0
    kwargs = {k: v for k, v in problem.items() if k != "topk"}
    call = lambda: graphs(**kwargs, topk=topk)  # noqa: E731
    t0 = time.perf_counter()
    call()  # runs and captures
    torch.cuda.synchronize()
    capture_s = time.perf_counter() - t0
    syncs, host_ms = _syncs_and_host_ms(call, reps)
    ms = cuda_ms(call, reps=reps, warm=1)
    kernels, gaps, trace = _activity(call)
    fresh = prefill_problem(rows, keys * 4, topk, 99)
    for name in ("q_fp4", "q_scale", "weights"):
        kwargs[name] = fresh[name]  # new inputs at new addresses: the same signature (the cache is kept)
    got, want = call(), _call({**kwargs, "topk": topk}, workspace=graphs.workspace, tuning=tuning)
    equal = all(torch.equal(getattr(got, n), getattr(want, n)) for n in FIELDS)
    # In place: the inputs written into the runner's own staging buffers (input_buffers): no copy in.
    views = graphs.input_buffers(
        rows, tuple(kwargs["block_table"].shape), topk=topk, weights_dtype=kwargs["weights"].dtype
    )
    for name, view in views.items():
        view.copy_(kwargs[name])
    call_in_place = lambda: graphs(**{**kwargs, **views}, topk=topk)  # noqa: E731
    got_in_place = call_in_place()
    in_place_equal = all(torch.equal(getattr(got_in_place, n), getattr(want, n)) for n in FIELDS)
    in_place_syncs, in_place_host = _syncs_and_host_ms(call_in_place, reps)
    in_place_ms = cuda_ms(call_in_place, reps=reps, warm=1)
    in_place_kernels, in_place_gaps, in_place_trace = _activity(call_in_place)
    return dict(
        runner_syncs=syncs,
        runner_host_ms=host_ms,
        runner_ms=ms,
        runner_kernel_ms=kernels,
        runner_idle_ms=ms - kernels,
        runner_gaps_ms=gaps,
        runner_trace=trace,
        runner_equal=equal,
        runner_setup_s=setup_s,
        runner_capture_s=capture_s,
        runner_arena_bytes=graphs.arena_bytes,
        in_place_syncs=in_place_syncs,
        in_place_host_ms=in_place_host,
        in_place_ms=in_place_ms,
        in_place_idle_ms=in_place_ms - in_place_kernels,
        in_place_gaps_ms=in_place_gaps,
        in_place_trace=in_place_trace,
        in_place_equal=in_place_equal,
        runner_stats=dict(graphs.stats),
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "bench/results"))
    parser.add_argument("--rows", type=int, default=8192)
    parser.add_argument("--keys", type=int, nargs="+", default=[65536, 196608])
    parser.add_argument("--topk", type=int, nargs="+", default=[512, 1024])
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--calibration",
        choices=("sample", "scan"),
        default="sample",
        help="LiteTopKTuning(calibration=...) of every call (eager, graph and runner)",
    )
    args = parser.parse_args(argv)
    tuning = LiteTopKTuning(calibration=args.calibration)
    from rich.console import Console
    from rich.table import Table

    results = []
    for keys in args.keys:
        for topk in args.topk:
            print(f"[embedding] rows={args.rows} keys={keys} K={topk} ...", flush=True)
            results.append(measure(args.rows, keys, topk, args.reps, args.seed, tuning))
    table = Table(title=f"litetopk_prefill embedded, calibration={args.calibration} ({torch.cuda.get_device_name()})")
    for col in (
        "keys",
        "K",
        "host syncs",
        "host ms",
        "eager ms",
        "GPU busy ms",
        "idle ms",
        "gaps ms",
        "graph ms",
        "graph == eager",
        "runner syncs",
        "runner host ms",
        "runner ms",
        "runner idle ms",
        "runner gaps ms",
        "runner == eager",
        "in-place host ms",
        "in-place ms",
        "in-place gaps ms",
        "in-place == eager",
    ):
        table.add_column(col)
    for r in results:
        table.add_row(
            str(r["keys"]),
            str(r["topk"]),
            r["syncs"],
            f"{r['host_ms']:.2f}",
            f"{r['eager_ms']:.2f}",
            f"{r['kernel_ms']:.2f}",
            f"{r['idle_ms']:.2f}",
            f"{r['gaps_ms']:.3f}",
            f"{r['graph_ms']:.2f}",
            str(r["graph_equal"]) + (f" ({r['graph_error']})" if r["graph_error"] else ""),
            r["runner_syncs"],
            f"{r['runner_host_ms']:.3f}",
            f"{r['runner_ms']:.2f}",
            f"{r['runner_idle_ms']:.3f}",
            f"{r['runner_gaps_ms']:.3f}",
            str(r["runner_equal"]),
            f"{r['in_place_host_ms']:.3f}",
            f"{r['in_place_ms']:.2f}",
            f"{r['in_place_gaps_ms']:.3f}",
            str(r["in_place_equal"]) + ("" if r["in_place_syncs"] == "none" else f" (sync: {r['in_place_syncs']})"),
        )
    Console(width=280).print(table)
    os.makedirs(args.out, exist_ok=True)
    report = dict(
        command="python -m bench.embedding " + " ".join(sys.argv[1:] if argv is None else argv),
        device=torch.cuda.get_device_name(),
        torch=torch.__version__,
        results=results,
    )
    suffix = "" if args.calibration == "sample" else f"-{args.calibration}"
    with open(os.path.join(args.out, f"embedding-h200{suffix}.json"), "w") as fh:
        json.dump(report, fh, indent=1)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    labels = [f"{r['keys'] // 1024}k K={r['topk']}" for r in results]
    x = range(len(results))
    bars = (
        ("host_ms", "host (call -> return)"),
        ("eager_ms", "eager"),
        ("graph_ms", "graph replay"),
        ("idle_ms", "GPU idle in call"),
        ("runner_host_ms", "runner host"),
        ("runner_ms", "runner call"),
        ("in_place_ms", "runner call, inputs in place"),
    )
    for j, (key, name) in enumerate(bars):
        ax.bar([i - 0.39 + 0.11 * j for i in x], [r[key] for r in results], width=0.11, label=name)
    ax.set_xticks(list(x), labels)
    ax.set_ylabel("ms")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, f"embedding-h200{suffix}.png"), dpi=120)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
