"""Operator benchmark: dense + top-k against LiteTopK, the method of the seed document.

Each point (model, raw context) is the median of --processes fresh processes; each process
builds the problem on the device (random MXFP4, one sequence, --rows causal rows ending the
context), runs --warmup and then --iterations alternating dense / LiteTopK pairs timed with CUDA
events, and checks outside timing that LiteTopK equals the dense path exactly (every output).
Prints a table, writes bench/results/operator-<tag>.json (GPU, versions, command) and a PNG.

    python -m bench.operator --model deepseek-v4-flash --rows 8192 --raw-context 262144
    python -m bench.operator --model all --raw-context 262144 524288 786432 --spread 0 1

Variants: lite (litetopk_prefill), dense_<selector> (dense_topk_prefill), the lean dense baseline
(kernel_only, lean_flashinfer: see lean_dense) and lite_graphs (LiteTopKGraphs: the same call
replayed from the operator's own CUDA graph, what an engine embedding the operator runs).

--spread takes one or more block-scale spreads (bench/common/problems.py): 0 draws every block
scale from one binade, 1 from three (hundreds of wide vectors per problem, closer to real indexer
activations); each spread is its own point, so the table reports both (issue 15 item 4).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

from bench.common import REPO_ROOT, RESULTS_DIR

FP8_PEAK_TFLOPS = 1260.0  # measured on the H200: the scoring floor
FIELDS = ("values", "raw_indices", "physical_indices", "counts", "status")


def scoring_flops(rows: int, mean_window: float) -> float:
    """2 * rows * heads * head_dim * keys: the multiply-adds of the per-head dots."""
    return 2.0 * rows * 64 * 128 * mean_window


def lean_dense(args, pos, kw, topk) -> dict:
    """The lean dense baseline of a serving engine that keeps its decoded cache (issue 15, item 5):
    validation and decoding done once, outside the timing, on a backend instance of its own (so the
    LiteTopK calls in between do not evict its operands). `kernel_only`: the scoring kernel's dense
    launch alone; `lean_flashinfer`: that launch, then FlashInfer's top-k of its score matrix."""
    from litetopk.kernels.operator import get_backend
    from litetopk.kernels.validation import validate_prefill

    problem = validate_prefill(*pos, **kw)
    backend = type(get_backend(args.backend, problem.device))()
    backend.operands(problem)
    variants = {"kernel_only": lambda: backend.score_dense(problem)}
    if "flashinfer" in args.selectors:
        try:
            import flashinfer
        except ImportError:
            return variants
        variants["lean_flashinfer"] = lambda: flashinfer.top_k(backend.score_dense(problem)[0], topk, sorted=True)
    return variants


def worker(args) -> dict:
    """One fresh process: build, warm up, time alternating pairs, check exactness."""
    import torch

    from bench.common.problems import MODELS, call_args, prefill_problem
    from litetopk.kernels import LiteTopKTuning, dense_topk_prefill, litetopk_prefill

    topk = MODELS[args.model]
    problem = prefill_problem(args.rows, args.raw_context[0], topk, seed=args.seed, spread=args.spread[0])
    pos, kw = call_args(problem)
    tuning = LiteTopKTuning(calibration=args.calibration)
    variants = {"lite": lambda: litetopk_prefill(*pos, **kw, backend=args.backend, tuning=tuning)}
    selectors = []
    for selector in args.selectors:
        if selector == "flashinfer":
            try:
                import flashinfer  # noqa: F401
            except ImportError:
                continue
        selectors.append(selector)
        variants[f"dense_{selector}"] = (
            lambda s: lambda: dense_topk_prefill(*pos, **kw, backend=args.backend, selector=s)
        )(selector)
    lean = lean_dense(args, pos, kw, topk) if args.lean else {}
    variants.update(lean)
    if args.graphs:  # the same method replayed from the operator's own CUDA graph (kernels/graphs.py)
        from litetopk.kernels import LiteTopKGraphs

        graphs = LiteTopKGraphs(
            args.rows, pos[3].shape[1] * 64, topk, device=pos[0].device, backend=args.backend, tuning=tuning
        )
        variants["lite_graphs"] = lambda: graphs(*pos, **kw)
    times = {name: [] for name in variants}

    def timed(fn):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = fn()
        stop.record()
        torch.cuda.synchronize()
        return start.elapsed_time(stop), out

    for i in range(args.warmup + args.iterations):
        for name, fn in variants.items():
            ms, _ = timed(fn)
            if i >= args.warmup:
                times[name].append(ms)
    lite = variants["lite"]()
    exact = {}
    for selector in selectors:
        dense = variants[f"dense_{selector}"]()
        exact[selector] = all(torch.equal(getattr(lite, f), getattr(dense, f)) for f in FIELDS)
    if args.graphs:
        graphed = variants["lite_graphs"]()
        exact["lite_graphs"] = all(torch.equal(getattr(lite, f), getattr(graphed, f)) for f in FIELDS)
    if "lean_flashinfer" in lean:  # the same scores, so the same sorted values (ties only reorder positions)
        exact["lean_flashinfer_values"] = torch.equal(lean["lean_flashinfer"]()[0], lite.values)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    variants["lite"]()
    torch.cuda.synchronize()
    lite_workspace = torch.cuda.max_memory_allocated() - base
    torch.cuda.reset_peak_memory_stats()
    variants[f"dense_{selectors[0]}"]()
    torch.cuda.synchronize()
    dense_workspace = torch.cuda.max_memory_allocated() - base
    windows = (problem["ends"] - problem["starts"]).double()
    return {
        "median_ms": {name: statistics.median(v) for name, v in times.items()},
        "exact_vs_dense": exact,
        "selectors_missing": [s for s in args.selectors if s not in selectors],
        "candidates_mean": float(lite.candidates.double().mean()),
        "candidates_max": int(lite.candidates.max()),
        "repaired_rows": int(lite.repaired.sum()),
        "status_nonzero_rows": int((lite.status != 0).sum()),
        "lite_workspace_bytes": int(lite_workspace),
        "dense_workspace_bytes": int(dense_workspace),
        "mean_window": float(windows.mean()),
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
    }


def run_point(args, model: str, raw: int, spread: int) -> dict:
    """Median over fresh processes of one (model, raw context, spread) point."""
    runs = []
    for proc in range(args.processes):
        cmd = [
            sys.executable,
            "-m",
            "bench.operator",
            "--worker",
            "--model",
            model,
            "--rows",
            str(args.rows),
            "--raw-context",
            str(raw),
            "--warmup",
            str(args.warmup),
            "--iterations",
            str(args.iterations),
            "--backend",
            args.backend,
            "--calibration",
            args.calibration,
            "--seed",
            str(args.seed + proc),
            "--spread",
            str(spread),
            "--selectors",
            *args.selectors,
            *(["--lean"] if args.lean else []),
            *(["--graphs"] if args.graphs else ["--no-graphs"]),
        ]
        done = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy(), cwd=REPO_ROOT)
        if done.returncode != 0:
            raise SystemExit(f"worker failed ({' '.join(cmd)}):\n{done.stderr[-4000:]}")
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    names = runs[0]["median_ms"].keys()
    point = {
        "model": model,
        "raw_context": raw,
        "c4_context": raw // 4,
        "rows": args.rows,
        "spread": spread,
        "median_ms": {n: statistics.median(r["median_ms"][n] for r in runs) for n in names},
        "per_process": runs,
    }
    flops = scoring_flops(args.rows, runs[0]["mean_window"])
    point["lite_tflops"] = flops / point["median_ms"]["lite"] / 1e9
    point["fp8_floor_ms"] = flops / FP8_PEAK_TFLOPS / 1e9
    for n in names:
        if n != "lite":
            point[f"speedup_vs_{n}"] = point["median_ms"][n] / point["median_ms"]["lite"]
    point["exact_all_processes"] = all(all(r["exact_vs_dense"].values()) for r in runs)
    return point


def write_json(args, points: list[dict]) -> str:
    """Write the points measured so far to <out>/operator-<tag>.json (after every point: a run cut short
    keeps what it measured); returns the path."""
    models = args.model.split("-")[-1] if args.model != "all" else "flash-pro"
    tag = args.tag or f"{args.backend}-{models}"
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"operator-{tag}.json")
    with open(path, "w") as f:
        json.dump(
            {
                "command": " ".join(sys.argv),
                "host": platform.node(),
                "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "points": points,
            },
            f,
            indent=1,
        )
    return path


def report(args, points: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"LiteTopK vs dense, {args.rows} rows, backend={args.backend} (median of {args.processes} processes)"
    )
    names = list(points[0]["median_ms"].keys())
    for col in [
        "model",
        "C4 keys",
        "spread",
        *[f"{n} ms" for n in names],
        "speedup",
        "TFLOP/s",
        "floor ms",
        "cand mean/max",
        "repaired",
        "exact",
    ]:
        table.add_column(col)
    for p in points:
        r0 = p["per_process"][0]
        speed = " ".join(f"{p[k]:.2f}x" for k in p if k.startswith("speedup_vs_"))
        table.add_row(
            p["model"],
            str(p["c4_context"]),
            str(p["spread"]),
            *[f"{p['median_ms'][n]:.3f}" for n in names],
            speed,
            f"{p['lite_tflops']:.0f}",
            f"{p['fp8_floor_ms']:.2f}",
            f"{r0['candidates_mean']:.0f}/{r0['candidates_max']}",
            str(r0["repaired_rows"]),
            str(p["exact_all_processes"]),
        )
    Console().print(table)
    path = write_json(args, points)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"wrote {path} (matplotlib missing: no plot)")
        return
    fig, axes = plt.subplots(1, len({p["model"] for p in points}), figsize=(12, 4.5), squeeze=False)
    for ax, model in zip(axes[0], sorted({p["model"] for p in points})):
        for spread in sorted({p["spread"] for p in points}):
            pts = [p for p in points if p["model"] == model and p["spread"] == spread]
            xs = [p["c4_context"] for p in pts]
            for n in names:
                ax.plot(
                    xs,
                    [p["median_ms"][n] for p in pts],
                    marker="o",
                    linestyle="-" if spread == 0 else ":",
                    label=f"{n} (spread {spread})",
                )
        ax.plot(xs, [p["fp8_floor_ms"] for p in pts], linestyle="--", color="gray", label="FP8 scoring floor")
        ax.set_title(model)
        ax.set_xlabel("C4 keys (S)")
        ax.set_ylabel("ms (median)")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    png = path.replace(".json", ".png")
    fig.savefig(png, dpi=110)
    print(f"wrote {path} and {png}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="deepseek-v4-flash", choices=["deepseek-v4-flash", "deepseek-v4-pro", "all"])
    parser.add_argument("--rows", type=int, default=8192)
    parser.add_argument("--raw-context", type=int, nargs="+", default=[262144])
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=15)
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--backend", default="triton")
    parser.add_argument(
        "--calibration",
        choices=("sample", "scan"),
        default="sample",
        help="LiteTopKTuning(calibration=...) of lite and lite_graphs: a calibration stage, or the scan's own",
    )
    parser.add_argument("--selectors", nargs="+", default=["torch", "flashinfer"])
    parser.add_argument(
        "--lean",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also time the lean dense baseline: the scoring kernel alone on prepared operands "
        "(kernel_only) and with FlashInfer's top-k (lean_flashinfer, when installed)",
    )
    parser.add_argument(
        "--graphs",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also time LiteTopK replayed from its own per-shape CUDA graph (lite_graphs: "
        "LiteTopKGraphs, inputs staged; checked equal to lite)",
    )
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument(
        "--spread",
        type=int,
        nargs="+",
        default=[0],
        help="block-scale spreads of the random data, one point each (module docstring)",
    )
    parser.add_argument("--out", default=str(RESULTS_DIR))
    parser.add_argument("--tag", default="")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return
    models = ["deepseek-v4-flash", "deepseek-v4-pro"] if args.model == "all" else [args.model]
    points = []
    for m in models:
        for raw in args.raw_context:
            for spread in args.spread:
                print(f"[operator] {m} raw={raw} spread={spread} ({args.processes} processes) ...", flush=True)
                points.append(run_point(args, m, raw, spread))
                write_json(args, points)
    report(args, points)


if __name__ == "__main__":
    main()
