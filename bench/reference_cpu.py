"""Reference backend on the CPU: dense + top-k against LiteTopK at Q=256 x S=65,536.

The workload of bench/operator.py (one sequence, --rows causal prefill rows ending a raw context
of 4 * --keys tokens, random MXFP4), built on the CPU. Each (method, K) runs in a fresh process
that builds the problem and runs the operator --repeats times; --rounds such processes per
(method, K) take turns. The table reports the fastest call's wall time and CPU time (all
threads), the median wall time, and the peak resident memory of a call above what the process
held before it (Linux VmHWM, reset before each call).
Each process saves its outputs; the parent checks that LiteTopK returns exactly what dense
returns (every output tensor).
Prints a table, writes bench/results/reference-cpu.json (command, versions, machine) and a PNG.

    python3 -m bench.reference_cpu                     # Q=256 x S=65,536, K=512 and 1024
    python3 -m bench.reference_cpu --rows 64 --keys 16384 --topk 512
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time

from bench.common import BENCH_DIR, REPO_ROOT, RESULTS_DIR

FIELDS = ("values", "raw_indices", "physical_indices", "counts", "status")
METHODS = ("dense", "litetopk")


def reset_peak_rss() -> bool:
    """Reset the process's resident-memory high-water mark (Linux: write 5 to clear_refs)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _status_kib(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return float(line.split()[1])
    raise KeyError(field)


def rss_mib() -> float:
    return _status_kib("VmRSS") / 1024.0


def peak_rss_mib() -> float:
    """High-water mark of resident memory since the last reset_peak_rss (VmHWM)."""
    try:
        return _status_kib("VmHWM") / 1024.0
    except (OSError, KeyError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def build(args, topk: int):
    from bench.common.problems import call_args, prefill_problem

    problem = prefill_problem(args.rows, 4 * args.keys, topk, seed=args.seed, device="cpu", spread=args.spread)
    return call_args(problem)


def worker(args) -> dict:
    """One fresh process: one method at one K."""
    import torch

    from litetopk.kernels import dense_topk_prefill, litetopk_prefill

    if args.threads:
        torch.set_num_threads(args.threads)
    pos, kw = build(args, args.topk[0])
    fn = dense_topk_prefill if args.method == "dense" else litetopk_prefill
    walls, cpus, peaks = [], [], []
    for _ in range(args.repeats):
        result = None
        base_rss = rss_mib()
        reset_peak_rss()
        wall0, cpu0 = time.perf_counter(), time.process_time()
        result = fn(*pos, **kw, backend="reference")
        walls.append(time.perf_counter() - wall0)
        cpus.append(time.process_time() - cpu0)
        peaks.append(peak_rss_mib() - base_rss)
    best = min(range(len(walls)), key=walls.__getitem__)
    return {
        "method": args.method,
        "topk": args.topk[0],
        "wall_s": walls[best],
        "cpu_s": cpus[best],
        "wall_median_s": statistics.median(walls),
        "wall_all_s": walls,
        "cpu_all_s": cpus,
        "problem_rss_mib": base_rss,
        "peak_rss_above_problem_mib": max(peaks),
        "mean_window": float((pos[7] - pos[6]).float().mean()),
        "candidates_mean": float(result.candidates.float().mean()),
        "repaired_rows": int(result.repaired.sum()),
        "faulty_rows": int((result.status != 0).sum()),
        "threads": torch.get_num_threads(),
    } | ({"saved": _save(result, args.save)} if args.save else {})


def merge(runs: list[dict]) -> dict:
    """One row of the table from every process of one (K, method): fastest call, median call."""
    walls = [w for r in runs for w in r["wall_all_s"]]
    cpus = [c for r in runs for c in r["cpu_all_s"]]
    best = min(range(len(walls)), key=walls.__getitem__)
    out = dict(runs[0])
    out.update(
        wall_s=walls[best],
        cpu_s=cpus[best],
        wall_median_s=statistics.median(walls),
        cpu_median_s=statistics.median(cpus),
        wall_all_s=walls,
        cpu_all_s=cpus,
        processes=len(runs),
        peak_rss_above_problem_mib=max(r["peak_rss_above_problem_mib"] for r in runs),
    )
    return out


def _save(result, path: str) -> str:
    import torch

    torch.save({name: getattr(result, name) for name in FIELDS}, path)
    return path


def check_identical(topk: int, lite_path: str, dense_path: str) -> dict:
    """LiteTopK equals dense, every output, bit for bit."""
    import torch

    lite, dense = torch.load(lite_path), torch.load(dense_path)
    same = {name: bool(torch.equal(lite[name], dense[name])) for name in FIELDS}
    return {"topk": topk, "identical": all(same.values()), "fields": same}


def run_child(argv: list[str]) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "bench.reference_cpu", *argv], cwd=REPO_ROOT, check=True, capture_output=True, text=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def code_state() -> str:
    """The committed and uncommitted state of the code the benchmark runs (others commit meanwhile)."""

    def git(*argv):
        return subprocess.run(["git", *argv], cwd=BENCH_DIR, capture_output=True, text=True).stdout

    top = str(REPO_ROOT)
    paths = sorted(f"kernels/{f}" for f in os.listdir(os.path.join(top, "kernels")) if f.endswith(".py"))
    paths.append("bench/common/problems.py")  # the reference path: kernels/*.py, not triton/ or flydsl/
    return "".join(git("rev-parse", f"HEAD:{p}") for p in paths) + git(
        "diff", "HEAD", "--", *(f"../{p}" for p in paths)
    )


def versions() -> dict:
    import numpy
    import torch

    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=BENCH_DIR, capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        commit = None
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "litetopk_commit": commit,
        "platform": platform.platform(),
        "processor": platform.processor(),
        "cpu_count": os.cpu_count(),
        "torch_threads_default": torch.get_num_threads(),
    }


def plot(results: list[dict], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = sorted({r["topk"] for r in results})
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(10, 4))
    width = 0.38
    for i, method in enumerate(METHODS):
        rows = [next(r for r in results if r["topk"] == k and r["method"] == method) for k in ks]
        xs = [j + (i - 0.5) * width for j in range(len(ks))]
        bars = ax_t.bar(xs, [r["wall_s"] for r in rows], width, label=method)
        ax_t.bar_label(bars, fmt="%.1f s")
        bars = ax_m.bar(xs, [r["peak_rss_above_problem_mib"] for r in rows], width, label=method)
        ax_m.bar_label(bars, fmt="%.0f")
    for ax, label in ((ax_t, "wall time (s)"), (ax_m, "peak RSS above the problem (MiB)")):
        ax.set_xticks(range(len(ks)), [f"K={k}" for k in ks])
        ax.set_ylabel(label)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--keys", type=int, default=65536, help="compressed keys S (raw context 4 * S)")
    parser.add_argument("--topk", type=int, nargs="+", default=[512, 1024])
    parser.add_argument("--repeats", type=int, default=2, help="calls per process")
    parser.add_argument("--rounds", type=int, default=3, help="fresh processes per (K, method), taking turns")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--spread", type=int, default=1, help="MXFP4 block magnitudes over 2 * spread + 1 binades")
    parser.add_argument("--out", default=str(RESULTS_DIR / "reference-cpu.json"))
    parser.add_argument("--worker", choices=METHODS, help=argparse.SUPPRESS)
    parser.add_argument("--method", choices=METHODS, help=argparse.SUPPRESS)
    parser.add_argument("--save", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        print(json.dumps(worker(args)))
        return

    common = [
        "--rows",
        str(args.rows),
        "--keys",
        str(args.keys),
        "--repeats",
        str(args.repeats),
        "--threads",
        str(args.threads),
        "--seed",
        str(args.seed),
        "--spread",
        str(args.spread),
    ]
    code_before = code_state()
    load_before = os.getloadavg()
    started = time.time()
    calls, checks = {}, []
    with tempfile.TemporaryDirectory() as tmp:
        # rounds of every (K, method) in turn, so that drifting load on a shared machine hits all alike
        for round_ in range(args.rounds):
            for k in args.topk:
                for method in METHODS:
                    save = os.path.join(tmp, f"{method}-{k}.pt") if round_ == 0 else None
                    r = run_child(
                        [
                            *common,
                            "--topk",
                            str(k),
                            "--worker",
                            method,
                            "--method",
                            method,
                            *(["--save", save] if save else []),
                        ]
                    )
                    r.pop("saved", None)
                    calls.setdefault((k, method), []).append(r)
                    print(
                        f"  round {round_} K={k:5d} {method:9s} wall {r['wall_s']:7.1f} s  cpu {r['cpu_s']:7.1f} s  "
                        f"peak RSS +{r['peak_rss_above_problem_mib']:.0f} MiB",
                        file=sys.stderr,
                    )
        for k in args.topk:
            checks.append(check_identical(k, os.path.join(tmp, f"litetopk-{k}.pt"), os.path.join(tmp, f"dense-{k}.pt")))
    results = [merge(runs) for runs in calls.values()]

    header = (
        f"{'K':>5} {'method':9} {'wall s':>8} {'median s':>9} {'cpu s':>8} {'peak RSS +MiB':>14} "
        f"{'candidates/row':>15} {'repaired':>9}"
    )
    print(
        f"\nreference backend, CPU: Q={args.rows} rows x S={args.keys} keys (mean window "
        f"{results[0]['mean_window']:.0f}), {results[0]['threads']} torch threads\n{header}"
    )
    for r in results:
        print(
            f"{r['topk']:5d} {r['method']:9} {r['wall_s']:8.1f} {r['wall_median_s']:9.1f} {r['cpu_s']:8.1f} "
            f"{r['peak_rss_above_problem_mib']:14.0f} {r['candidates_mean']:15.0f} {r['repaired_rows']:9d}"
        )
    for c in checks:
        print(f"K={c['topk']}: litetopk {'==' if c['identical'] else '!='} dense (every output)")
    if code_state() != code_before:
        print("warning: kernels/*.py or bench/common/problems.py changed during the run; rerun for clean numbers")

    record = {
        "benchmark": "reference backend on the CPU, dense vs LiteTopK",
        "command": " ".join([os.path.relpath(sys.executable), *sys.argv]),
        "shape": {
            "rows": args.rows,
            "keys": args.keys,
            "raw_context": 4 * args.keys,
            "topk": args.topk,
            "spread": args.spread,
            "workload": "bench.common.problems.prefill_problem on the CPU (one sequence, causal rows at its end)",
        },
        "repeats": args.repeats,
        "rounds": args.rounds,
        "seed": args.seed,
        "spread": args.spread,
        "versions": versions(),
        "code_changed_during_run": code_state() != code_before,
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "elapsed_s": time.time() - started,
        "results": results,
        "identical": checks,
        "note": "wall_s / cpu_s: the fastest of rounds x repeats calls (rounds fresh processes taking turns; "
        "cpu_s counts every thread); wall_median_s: the median call; "
        "peak_rss_above_problem_mib: the largest per-call rise of resident memory (VmHWM after the call "
        "minus VmRSS before it). The machine is shared: see the load averages.",
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(record, f, indent=2)
    png = os.path.splitext(args.out)[0] + ".png"
    plot(results, png, f"reference backend, CPU ({results[0]['threads']} threads): Q={args.rows} x S={args.keys}")
    print(f"wrote {os.path.relpath(args.out)} and {os.path.relpath(png)}")


if __name__ == "__main__":
    main()
