"""Device probe (H200): the candidate top-K, radix select (kernels/triton/radix_select.py) against
the bitonic one it replaces (select_topk_candidates_triton), in one process.

Input per K in (512, 1024): 8192 rows of an 8 K-key candidate buffer holding ~2,200 / ~4,400 kept
keys (the scan's counts, bench/NOTES.md v7a): ordering keys (selection.make_keys) of the top
scores of 65,536 normal float32 scores (drawn as the tail quantiles directly) at distinct random
positions, in random order; the threshold per row is the score floor of its (1.21 K)-th best key
(the scan's final thresholds pass ~619 / ~1,249 keys), and, as a second case, none (NO_KEY: every
kept key passes). Every variant's keys are checked bit for bit against the old kernel and torch
(selection.select_topk_keys on the passing prefix) before it is timed; timing: CUDA events,
5 warm-up calls, the median of 30. Prints a table, writes DIR/radix-select-probe.json.

    python -m bench.probes.radix_select_probe --out DIR
"""

from __future__ import annotations

import argparse
import json
import os

import torch

from bench.common.timing import cuda_ms

from litetopk.kernels.selection import NO_KEY, make_keys, score_floor_keys, select_topk_keys
from litetopk.kernels.triton.radix_select import select_topk_candidates_radix
from litetopk.kernels.triton.selection import select_topk_candidates_triton

ROWS = 8192
WINDOW = 65536
KEPT = {512: 2200, 1024: 4400}
PASSING_PER_K = 1.21
WARM, REPS = 5, 30
VARIANTS = [(256, 1, 5), (512, 1, 5), (256, 1, 6), (512, 1, 6), (512, 2, 5), (512, 2, 6), (1024, 4, 6), (512, 2, 8)]


def candidate_buffer(k: int, gen: torch.Generator):
    """(keys [ROWS, 8 k], kept [ROWS] int32, thresholds [ROWS]): see the module docstring."""
    capacity = 8 * k
    kept = (KEPT[k] + torch.randint(-k // 4, k // 4 + 1, (ROWS,), generator=gen, device="cuda")).int()
    # The kept[r] best of WINDOW normal scores: quantiles above 1 - kept/WINDOW, in random order.
    tail = torch.rand(ROWS, capacity, generator=gen, device="cuda", dtype=torch.float64) * (kept[:, None] / WINDOW)
    scores = torch.special.ndtri(1.0 - tail).float()  # float64 quantiles: finite
    positions = torch.argsort(torch.rand(ROWS, capacity, generator=gen, device="cuda"), dim=1) * 8
    positions += torch.randint(0, 8, (ROWS, capacity), generator=gen, device="cuda")
    keys = make_keys(scores, positions)
    live = torch.arange(capacity, device="cuda")[None, :] < kept[:, None]
    ranked = torch.sort(torch.where(live, keys, NO_KEY), dim=1, descending=True).values
    rank = int(PASSING_PER_K * k)
    scores_at_rank = torch.where(live, scores, float("-inf")).sort(dim=1, descending=True).values[:, rank - 1]
    thresholds = score_floor_keys(scores_at_rank)
    if not bool((thresholds <= ranked[:, k - 1]).all()):
        raise SystemExit("a threshold above its row's K-th key: the input does not meet the contract")
    return keys, kept, thresholds


def torch_top(keys, kept, thresholds, k):
    """selection.select_topk_keys over each row's kept keys at or above its threshold."""
    live = torch.arange(keys.shape[1], device="cuda")[None, :] < kept[:, None]
    return select_topk_keys(torch.where(live & (keys >= thresholds[:, None]), keys, NO_KEY), k)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for radix-select-probe.json")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(15)
    report = {"device": torch.cuda.get_device_name(0), "rows": ROWS, "warm": WARM, "reps": REPS, "cases": []}
    print(f"{'K':>5} {'threshold':>9} {'passing':>8} {'variant':>22} {'ms':>8} {'equal':>5}")
    for k in (512, 1024):
        keys, kept, scan_thresholds = candidate_buffer(k, gen)
        for thr_name, thresholds in (("scan", scan_thresholds), ("none", torch.full_like(scan_thresholds, NO_KEY))):
            want = torch_top(keys, kept, thresholds, k)
            live = torch.arange(keys.shape[1], device="cuda")[None, :] < kept[:, None]
            passing = float((live & (keys >= thresholds[:, None])).sum(1).float().mean())
            case = {"k": k, "threshold": thr_name, "kept_mean": float(kept.float().mean()), "passing_mean": passing,
                    "variants": {}}
            runs = {"bitonic (old)": lambda: select_topk_candidates_triton(keys, kept, thresholds, k)}
            out = torch.empty(ROWS, k, dtype=torch.int64, device="cuda")
            runs["radix (CONFIG)"] = lambda: select_topk_candidates_radix(keys, kept, thresholds, k, out=out)
            for chunk, warps, digit in VARIANTS:
                runs[f"radix c{chunk} w{warps} d{digit}"] = (lambda c=chunk, w=warps, d=digit: select_topk_candidates_radix(
                    keys, kept, thresholds, k, out=out, chunk=c, digit=d, num_warps=w))
            old = select_topk_candidates_triton(keys, kept, thresholds, k)
            for name, fn in runs.items():
                got = fn()
                equal = bool(torch.equal(got, want)) and bool(torch.equal(got, old))
                ms = cuda_ms(fn, reps=REPS, warm=WARM)
                case["variants"][name] = {"ms": ms, "equal": equal}
                print(f"{k:>5} {thr_name:>9} {passing:>8.0f} {name:>22} {ms:>8.4f} {str(equal):>5}", flush=True)
            report["cases"].append(case)
            with open(os.path.join(args.out, "radix-select-probe.json"), "w") as f:
                json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
