"""CPU model (no GPU): how many candidates a row's scan keeps under the two calibrations, from the
threshold rules of the kernels replayed in numpy on model scores.

Scores: sum_h w_h relu(q_h . k) with Gaussian q (64 heads x 128), k and w (mixed signs), the
benchmark's data without the MXFP4 rounding (float32). Per row the scan walks 64-key tiles; a key
passes when its score >= the threshold; passing keys are counted in NUM_BINS linear bins and every
REFRESH tiles the threshold rises to one bin below the highest edge with >= K keys at or above
(scoring.py). The two starts:
- "sample" (the calibration stage, calibration.py): every stride-th key of the window, stride =
  min(max_end // sample_size, MAX_SAMPLE_STRIDE); threshold = its K-th best, histogram up to its
  max(1, K / (2 stride))-th best; the scan walks every tile in order.
- "scan" (the self-calibrating scan, scan_calibration._calibrate_in_scan): the last n_sample tiles first
  (scan_calibration._sample_tiles; a causal row's program ends its sample with the row's window), every key kept;
  threshold = the lower end of a BISECTION_STEPS-step
  bisection of their K-th best over [min, max], histogram up to the same bracket of the
  max(1, K n_sample / (2 n_tiles))-th best; the buffer keeps the sampled keys >= the threshold, then
  the tiles before the sample are walked in order.
The candidate buffer holds capacity_factor x K keys (8 K by default): a row over it is a capacity
event (repaired exactly, at a cost). Measured on the H200 for "sample" at 65,536 keys, K = 512:
2,781 candidates a row (scan-tuning-h200-v12.json); the model gives ~2,770.

    python -m bench.probes.candidate_model --out DIR [--rows 6] [--keys 65536 196608 262144]
prints a table and writes DIR/candidate-model.json (the command in it) and DIR/candidate-model.png.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
import torch

from litetopk.kernels.backend import MAX_SAMPLE_STRIDE
from litetopk.kernels.pipeline import LiteTopKTuning
from litetopk.kernels.triton.scan_calibration import BISECTION_STEPS
from litetopk.kernels.triton.scoring import NUM_BINS

TILE = 64
REFRESH = 16  # TritonBackend's default
TOPKS = (512, 1024)


def model_scores(n: int, generator: torch.Generator) -> np.ndarray:
    """float32 [n]: one row's scores against n keys (module docstring)."""
    q = torch.randn(64, 128, generator=generator)
    w = torch.randn(64, generator=generator)
    out = np.empty(n, dtype=np.float32)
    for start in range(0, n, 65536):
        k = torch.randn(min(65536, n - start), 128, generator=generator)
        out[start : start + k.shape[0]] = (torch.relu(k @ q.T) @ w).numpy()
    return out


def walk(
    scores: np.ndarray,
    tiles,
    thr: float,
    lo: float,
    width: float,
    k: int,
    kept: int = 0,
    hist: np.ndarray | None = None,
) -> int:
    """Keys kept after walking `tiles` (tile indices) from threshold `thr` with the histogram
    [lo, lo + NUM_BINS width) (width 0: none); `kept` and `hist` carry what came before."""
    hist = np.zeros(NUM_BINS, np.int64) if hist is None else hist
    for i, t in enumerate(tiles):
        tile = scores[t * TILE : (t + 1) * TILE]
        passing = tile[tile >= thr]
        kept += passing.size
        if width > 0:
            np.add.at(hist, np.clip(((passing - lo) / width).astype(np.int64), 0, NUM_BINS - 1), 1)
        if (i + 1) % REFRESH == 0 and width > 0:
            above = np.cumsum(hist[::-1])[::-1]
            best = int(np.nonzero(above >= k)[0].max()) if (above >= k).any() else -1
            if best >= 1:
                thr = max(thr, lo + (best - 1) * width)
    return kept


def with_sample_stage(scores: np.ndarray, k: int, sample_size: int) -> int:
    """Candidates of a row after the calibration stage's strided sample (module docstring)."""
    stride = min(scores.size // sample_size, MAX_SAMPLE_STRIDE)
    best = np.sort(scores[::stride])[::-1]
    thr, ceiling = float(best[k - 1]), float(best[max(1, k // (2 * stride)) - 1])
    return walk(scores, range(-(-scores.size // TILE)), thr, thr, (ceiling - thr) / NUM_BINS, k)


def with_self_calibration(scores: np.ndarray, k: int, sample_size: int, capacity: int) -> int:
    """Candidates of a row of the self-calibrating scan (module docstring)."""
    n_tiles = -(-scores.size // TILE)
    n_sample = min(
        max(-(-sample_size // TILE), -(-n_tiles // MAX_SAMPLE_STRIDE), -(-2 * k // TILE)), n_tiles, capacity // TILE
    )
    sample = scores[(n_tiles - n_sample) * TILE :]

    def bracket(rank: int) -> float:
        lo, hi = np.float32(sample.min()), np.float32(sample.max())
        for _ in range(int(BISECTION_STEPS)):
            mid = np.float32(lo + (hi - lo) * np.float32(0.5))
            lo, hi = (mid, hi) if (sample >= mid).sum() >= rank else (lo, mid)
        return float(lo)

    thr = bracket(k)
    ceiling = bracket(max(1, k * n_sample // (2 * n_tiles)))
    width = (ceiling - thr) / NUM_BINS
    survivors = sample[sample >= thr]
    hist = np.zeros(NUM_BINS, np.int64)
    np.add.at(hist, np.clip(((survivors - thr) / width).astype(np.int64), 0, NUM_BINS - 1), 1)
    return walk(scores, range(n_tiles - n_sample), thr, thr, width, k, survivors.size, hist)


def draw(report: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = report["cases"]
    fig, ax = plt.subplots(figsize=(7, 4))
    labels = [f"{c['keys'] // 1024}K, K={c['k']}" for c in cases]
    for i, mode in enumerate(("sample", "scan")):
        ax.bar(
            [x + (i - 0.5) * 0.38 for x in range(len(cases))],
            [c[mode]["mean"] for c in cases],
            0.38,
            yerr=[[0] * len(cases), [c[mode]["max"] - c[mode]["mean"] for c in cases]],
            label=f"calibration={mode!r}",
        )
    ax.plot(range(len(cases)), [c["capacity"] for c in cases], "k_", markersize=30, label="buffer (8 K)")
    ax.set_xticks(range(len(cases)), labels, fontsize=8)
    ax.set_ylabel("candidates a row (mean, bar to max)")
    ax.set_title(f"Candidate model, {report['rows']} rows a case", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for candidate-model.json and .png")
    parser.add_argument("--rows", type=int, default=6, help="model rows a case")
    parser.add_argument("--keys", type=int, nargs="+", default=[65536, 196608, 262144])
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    tuning = LiteTopKTuning()
    report = {
        "rows": args.rows,
        "sample_size": tuning.sample_size,
        "refresh": REFRESH,
        "num_bins": NUM_BINS,
        "command": "python -m bench.probes.candidate_model " + " ".join(sys.argv[1:]),
        "cases": [],
    }
    generator = torch.Generator().manual_seed(2)
    print(f"{'keys':>7} {'K':>5} {'buffer':>6} | {'sample: mean':>12} {'max':>5} | {'scan: mean':>10} {'max':>5}")
    for keys in args.keys:
        rows = [model_scores(keys, generator) for _ in range(args.rows)]
        for k in TOPKS:
            capacity = tuning.capacity(k)
            counts = {
                "sample": [with_sample_stage(s, k, tuning.sample_size) for s in rows],
                "scan": [with_self_calibration(s, k, tuning.sample_size, capacity) for s in rows],
            }
            case = {
                "keys": keys,
                "k": k,
                "capacity": capacity,
                **{mode: {"mean": float(np.mean(c)), "max": int(max(c)), "rows": c} for mode, c in counts.items()},
            }
            report["cases"].append(case)
            with open(os.path.join(args.out, "candidate-model.json"), "w") as f:
                json.dump(report, f, indent=1)
            print(
                f"{keys:>7} {k:>5} {capacity:>6} | {case['sample']['mean']:>12.0f} {case['sample']['max']:>5} | "
                f"{case['scan']['mean']:>10.0f} {case['scan']['max']:>5}",
                flush=True,
            )
    draw(report, os.path.join(args.out, "candidate-model.png"))


if __name__ == "__main__":
    main()
