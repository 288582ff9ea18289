"""Device probe (H200): the self-calibrating scan (LiteTopKTuning(calibration="scan"): no calibration
stage, the scan takes its thresholds from its own most recent tiles) against the default (calibration="sample":
a strided sample scored and ordered by a separate stage), in one process.

Per (keys, K, spread) in {65,536, 196,608} x {512, 1024} x {0, 1}: the benchmark's problem
(bench.common.problems: Q = 8192 causal rows ending one sequence, seed 11). Checked outside the timing:
each mode's result equals dense_topk_prefill's bit for bit (values, raw and physical indices, counts,
status) and no row was repaired (a repair is a capacity event: the sample was too loose). Timed with
CUDA events, alternating the two modes (WARM warm-up calls each, then the median of PAIRS pairs): the
operator call, and its calibrate + scan stages alone (`stages`: calibrate() + scan_candidates() for
"sample", scan_candidates(sample_size=...) for "scan"). `candidates`: the mean and max of the rows'
kept keys (the selection's input; the buffer holds 8 x K). Prints a table, writes DIR/self-calibration.json
(the command in it) and DIR/self-calibration.png.

    python -m bench.probes.self_calibration_probe --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

from bench.common.problems import call_args, prefill_problem
from litetopk.kernels import LiteTopKTuning, dense_topk_prefill, litetopk_prefill, registry
from litetopk.kernels.calibration import calibrate
from litetopk.kernels.triton import TritonBackend
from litetopk.kernels.validation import validate_prefill

ROWS = 8192
KEYS = (65536, 196608)
TOPKS = (512, 1024)
SPREADS = (0, 1)
MODES = ("sample", "scan")
WARM, PAIRS = 5, 15
FIELDS = ("values", "raw_indices", "physical_indices", "counts", "status")


def alternating_ms(calls: dict, warm: int = WARM, pairs: int = PAIRS) -> dict:
    """{name: median ms} of the zero-argument callables in `calls`, timed in alternation with CUDA
    events after `warm` warm-up calls of each (on a machine without CUDA, wall time: the CPU smoke run)."""
    cuda = torch.cuda.is_available()
    for fn in calls.values():
        for _ in range(warm):
            fn()
    if cuda:
        torch.cuda.synchronize()
    times = {name: [] for name in calls}
    for _ in range(pairs):
        for name, fn in calls.items():
            if not cuda:
                t0 = time.perf_counter()
                fn()
                times[name].append((time.perf_counter() - t0) * 1e3)
                continue
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times[name].append(start.elapsed_time(end))
    return {name: sorted(t)[len(t) // 2] for name, t in times.items()}


def stage_calls(args_, kw, tunings: dict) -> dict:
    """{mode: callable} of the calibrate + scan stages alone, on one validated problem."""
    problem = validate_prefill(*args_, **kw)
    backend = TritonBackend(paged="never")  # the prefill mode's scan (module docstring)
    backend.operands(problem)  # decode and schedule once: both modes reuse them
    calls = {}
    for mode, tuning in tunings.items():
        capacity = tuning.capacity(problem.topk)
        if mode == "scan":  # no thresholds: the scan's own sample sets them
            calls[mode] = lambda c=capacity, t=tuning: backend.scan_candidates(
                problem, None, c, sample_size=t.sample_size
            )
        else:

            def sample_then_scan(c=capacity, t=tuning):
                thresholds, ceilings = calibrate(problem, backend, t.sample_size)
                return backend.scan_candidates(problem, thresholds, c, ceilings=ceilings)

            calls[mode] = sample_then_scan
    return calls


def draw(report: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = report["cases"]
    labels = [f"{c['keys'] // 1024}K keys\nK={c['k']} s{c['spread']}" for c in cases]
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(cases)), 4))
    width = 0.38
    for i, mode in enumerate(MODES):
        ax.bar(
            [x + (i - 0.5) * width for x in range(len(cases))],
            [c["call_ms"][mode] for c in cases],
            width,
            label=f"calibration={mode!r}",
        )
    ax.set_xticks(range(len(cases)), labels, fontsize=8)
    ax.set_ylabel("LiteTopK call, ms (median)")
    ax.set_title(f"calibration='scan' vs 'sample', {report['device']}, Q={report['rows']}", fontsize=10)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None):
    """The probe (module docstring). The self-calibrating scan is the prefill mode's (the paged mode calibrates
    from the sample): the operator's calls take it whatever their shapes (a smoke run's few rows would be
    decode-shaped), the registry restored afterwards."""
    with registry.backend_instance("triton", TritonBackend(paged="never")):
        return _main(argv)


def _main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for self-calibration.json and .png")
    parser.add_argument("--keys", type=int, nargs="+", default=list(KEYS))
    parser.add_argument("--spread", type=int, nargs="+", default=list(SPREADS))
    parser.add_argument("--topk", type=int, nargs="+", default=list(TOPKS))
    parser.add_argument("--rows", type=int, default=ROWS)
    parser.add_argument("--warm", type=int, default=WARM)
    parser.add_argument("--pairs", type=int, default=PAIRS)
    parser.add_argument(
        "--sample-size",
        type=int,
        default=LiteTopKTuning().sample_size,
        help="LiteTopKTuning.sample_size of both modes (the CPU smoke run uses a small one)",
    )
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: a smoke run under TRITON_INTERPRET=1 (tests)
    os.makedirs(args.out, exist_ok=True)
    tunings = {mode: LiteTopKTuning(calibration=mode, sample_size=args.sample_size) for mode in MODES}
    report = {
        "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu (interpreter)",
        "rows": args.rows,
        "warm": args.warm,
        "pairs": args.pairs,
        "command": "python -m bench.probes.self_calibration_probe " + " ".join(sys.argv[1:] if argv is None else argv),
        "cases": [],
    }
    print(
        f"{'keys':>7} {'K':>5} {'s':>2} | {'call sample':>11} {'call scan':>9} | {'stages sample':>13} "
        f"{'stages scan':>11} | {'cand sample':>13} {'cand scan':>13} | exact repaired"
    )
    for keys in args.keys:
        for k in args.topk:
            for spread in args.spread:
                args_, kw = call_args(prefill_problem(args.rows, keys * 4, k, seed=11, device=device, spread=spread))
                dense = dense_topk_prefill(*args_, **kw, backend="triton")
                results = {
                    mode: litetopk_prefill(*args_, **kw, backend="triton", tuning=t) for mode, t in tunings.items()
                }
                exact = {
                    mode: all(torch.equal(getattr(r, f), getattr(dense, f)) for f in FIELDS)
                    for mode, r in results.items()
                }
                repaired = {mode: int(r.repaired.sum()) for mode, r in results.items()}
                candidates = {
                    mode: [float(r.candidates.float().mean()), int(r.candidates.max())] for mode, r in results.items()
                }
                calls = alternating_ms(
                    {
                        mode: (lambda t=t: litetopk_prefill(*args_, **kw, backend="triton", tuning=t))  # noqa: F821 (its `del` at the loop's end)
                        for mode, t in tunings.items()
                    },
                    args.warm,
                    args.pairs,
                )
                stages = alternating_ms(stage_calls(args_, kw, tunings), args.warm, args.pairs)
                case = dict(
                    keys=keys,
                    k=k,
                    spread=spread,
                    call_ms=calls,
                    stages_ms=stages,
                    exact=exact,
                    repaired=repaired,
                    candidates=candidates,
                )
                report["cases"].append(case)
                with open(os.path.join(args.out, "self-calibration.json"), "w") as f:
                    json.dump(report, f, indent=1)
                print(
                    f"{keys:>7} {k:>5} {spread:>2} | {calls['sample']:>11.3f} {calls['scan']:>9.3f} | "
                    f"{stages['sample']:>13.3f} {stages['scan']:>11.3f} | "
                    f"{candidates['sample'][0]:>7.0f}/{candidates['sample'][1]:<5} "
                    f"{candidates['scan'][0]:>7.0f}/{candidates['scan'][1]:<5} | "
                    f"{exact['sample'] and exact['scan']} {repaired['sample']}/{repaired['scan']}",
                    flush=True,
                )
                del dense, results, args_, kw
                if device == "cuda":
                    torch.cuda.empty_cache()
    draw(report, os.path.join(args.out, "self-calibration.png"))


if __name__ == "__main__":
    main()
