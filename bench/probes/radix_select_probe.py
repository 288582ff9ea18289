"""Device probe (H200): the candidate top-K, bucket select (kernels/selection.py) against the
previous radix select (a copy below: select_topk_candidates_radix_v1, three tl.histogram passes and
one sort of K), in one process (the bitonic top-K before both, 0.689 ms at K = 512 on the H200, was
deleted once the bucket select measured faster: radix-select-probe-h200-v12-partial.txt).

Input per K in (512, 1024): 8192 rows of an 8 K-key candidate buffer holding ~2,200 / ~4,400 kept
keys (the scan's counts, bench/NOTES.md v7a): ordering keys (keys.make_keys) of the top
scores of 65,536 normal float32 scores (drawn as the tail quantiles directly) at distinct random
positions, in random order; the threshold per row is the score floor of its (1.21 K)-th best key
(the scan's final thresholds pass ~619 / ~1,249 keys), and, as a second case, none (NO_KEY: every
kept key passes). Variants of the new kernel: its CONFIG, then VARIANTS (tile rows, warps, bucket
resolution, window length; window 0 = always one sort of K). Every variant's keys are checked bit for
bit against torch (keys.select_topk_keys on the passing prefix) before it
is timed; timing: CUDA events, 5 warm-up calls, the median of 30. Prints a table, writes
DIR/radix-select-probe.json.

    python -m bench.probes.radix_select_probe --out DIR
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import triton
import triton.language as tl

from bench.common.timing import cuda_ms
from litetopk.kernels import selection as radix_select
from litetopk.kernels.keys import NO_KEY, make_keys, score_floor_keys, select_topk_keys
from litetopk.kernels.selection import _first_shift, select_topk_candidates_radix

ROWS = 8192
WINDOW = 65536
KEPT = {512: 2200, 1024: 4400}
PASSING_PER_K = 1.21
WARM, REPS = 5, 30
# (tile_rows, num_warps, mantissa, window, max_registers) per K: the new kernel's variants besides its CONFIG.
# Register caps (offline sm_90 builds, compile/sm90.py): CONFIG takes 128 registers at K = 512 (16 one-warp
# programs an SM) and 155 at K = 1024 (13); capped at 80 (K = 512) it has no stack (25 an SM), and
# (8, 2, 6) at K = 1024 takes 128 registers, 96 capped without stack (20 warps an SM). Is the kernel
# latency-bound (more resident warps, faster)?
VARIANTS = {
    512: [(8, 1, 5, 16, None), (8, 2, 5, 16, None), (8, 1, 6, 16, None), (4, 1, 5, 16, 96), (4, 1, 5, 16, 80)],
    1024: [(8, 2, 6, 16, None), (4, 1, 6, 16, None), (8, 1, 7, 16, None), (8, 2, 6, 16, 96), (8, 1, 6, 16, 128)],
}
# A decode step's few rows (--rows 64-256): one program a row leaves most SMs idle; wider programs.
DECODE_VARIANTS = {
    512: [(4, 4, 5, 16, None), (2, 4, 5, 16, None), (4, 8, 5, 16, None), (2, 8, 5, 16, None)],
    1024: [(8, 4, 6, 16, None), (4, 4, 6, 16, None), (4, 8, 6, 16, None), (2, 8, 6, 16, None)],
}
V1_CONFIG = {512: (256, 1, 5), 1024: (512, 2, 5)}  # (chunk, num_warps, digit): the v1 kernel's best
NO_KEY_C = tl.constexpr(NO_KEY)


@triton.jit
def select_topk_candidates_radix_v1_kernel(
    keys_ptr,
    stride_kr,
    kept_ptr,
    thr_ptr,
    scratch_ptr,
    out_ptr,
    stride_or,
    stride_oc,
    TOPK: tl.constexpr,
    SMALL: tl.constexpr,
    CHUNK: tl.constexpr,
    DIGIT: tl.constexpr,
):
    """The previous selection kernel (commit a644944), kept to be timed beside the new one: pass 1
    compacts the passing keys with 1-D prefix sums, radix passes of DIGIT bits (tl.histogram) narrow
    to the K-th key from the top of the passing range, a compaction and one tl.sort of K."""
    RADIX: tl.constexpr = 1 << DIGIT
    row = tl.program_id(0).to(tl.int64)
    row_keys = keys_ptr + row * stride_kr
    row_small = scratch_ptr + row * SMALL
    row_out = out_ptr + row * stride_or
    kept = tl.load(kept_ptr + row).to(tl.int32)
    floor = tl.maximum(tl.load(thr_ptr + row), NO_KEY_C + 1)
    offs = tl.arange(0, CHUNK)
    n_pass = 0
    hi_acc = tl.full([CHUNK], NO_KEY_C, tl.int64)
    for start in range(0, kept, CHUNK):
        keys = tl.load(row_keys + start + offs, mask=start + offs < kept, other=NO_KEY_C)
        passing = keys >= floor
        slot = n_pass + tl.cumsum(passing.to(tl.int32), axis=0) - 1
        tl.store(row_small + slot, keys, mask=passing & (slot < SMALL))
        n_pass += tl.sum(passing.to(tl.int32), axis=0)
        hi_acc = tl.maximum(hi_acc, keys)
    tl.debug_barrier()
    fits = n_pass <= SMALL
    src = tl.where(fits, row_small, row_keys)
    src_len = tl.where(fits, n_pass, kept)
    shift = _first_shift((tl.max(hi_acc, axis=0) - floor).to(tl.uint64, bitcast=True), RADIX)
    limit = RADIX
    base = floor
    need = TOPK
    count = n_pass
    bins = tl.arange(0, RADIX)
    while need < count:
        hist = tl.zeros([RADIX], dtype=tl.int32)
        for start in range(0, src_len, CHUNK):
            keys = tl.load(src + start + offs, mask=start + offs < src_len, other=NO_KEY_C)
            digit = (keys - base).to(tl.uint64, bitcast=True) >> shift
            hist += tl.histogram(digit.to(tl.int32), RADIX, mask=(keys >= floor) & (digit < limit))
        from_top = count - tl.cumsum(hist, axis=0) + hist
        chosen = tl.max(tl.where(from_top >= need, bins, 0), axis=0)
        need -= tl.sum(tl.where(bins > chosen, hist, 0), axis=0)
        count = tl.sum(tl.where(bins == chosen, hist, 0), axis=0)
        base += (chosen.to(tl.uint64) << shift).to(tl.int64, bitcast=True)
        next_shift = tl.maximum(shift - DIGIT, 0)
        limit = tl.where(shift > 0, 1 << (shift - next_shift), 0)
        count = tl.where(shift > 0, count, need)
        shift = next_shift
    n_out = 0
    for start in range(0, src_len, CHUNK):
        keys = tl.load(src + start + offs, mask=start + offs < src_len, other=NO_KEY_C)
        chosen_keys = keys >= base
        slot = n_out + tl.cumsum(chosen_keys.to(tl.int32), axis=0) - 1
        tl.store(row_out + slot * stride_oc, keys, mask=chosen_keys & (slot < TOPK))
        n_out += tl.sum(chosen_keys.to(tl.int32), axis=0)
    tl.debug_barrier()
    offs_top = tl.arange(0, TOPK)
    top = tl.load(row_out + offs_top * stride_oc, mask=offs_top < n_out, other=NO_KEY_C)
    tl.debug_barrier()
    tl.store(row_out + offs_top * stride_oc, tl.sort(top, descending=True))


def select_topk_candidates_radix_v1(keys, kept, thresholds, k, out):
    """The previous kernel's launcher (its CONFIG), writing `out`."""
    chunk, num_warps, digit = V1_CONFIG[k]
    scratch = torch.empty(keys.shape[0], 2 * k, dtype=torch.int64, device=keys.device)
    select_topk_candidates_radix_v1_kernel[(keys.shape[0],)](
        keys,
        keys.stride(0),
        kept,
        thresholds,
        scratch,
        out,
        out.stride(0),
        out.stride(1),
        TOPK=k,
        SMALL=2 * k,
        CHUNK=chunk,
        DIGIT=digit,
        num_warps=num_warps,
    )
    return out


def candidate_buffer(k: int, gen: torch.Generator, rows: int = ROWS, kept_factor: float = 1.0):
    """(keys [rows, capacity], kept [rows] int32, thresholds [rows]): see the module docstring; kept_factor
    scales the kept counts (a decode step of one row keeps ~7x more, its sample being sparser), capacity
    8 k or what they need."""
    capacity = max(8 * k, int(kept_factor * KEPT[k]) + k)
    spread = torch.randint(-k // 4, k // 4 + 1, (rows,), generator=gen, device="cuda")
    kept = (int(kept_factor * KEPT[k]) + spread).int()
    # The kept[r] best of WINDOW normal scores: quantiles above 1 - kept/WINDOW, in random order.
    tail = torch.rand(rows, capacity, generator=gen, device="cuda", dtype=torch.float64) * (kept[:, None] / WINDOW)
    scores = torch.special.ndtri(1.0 - tail).float()  # float64 quantiles: finite
    positions = torch.argsort(torch.rand(rows, capacity, generator=gen, device="cuda"), dim=1) * 8
    positions += torch.randint(0, 8, (rows, capacity), generator=gen, device="cuda")
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
    """keys.select_topk_keys over each row's kept keys at or above its threshold."""
    live = torch.arange(keys.shape[1], device="cuda")[None, :] < kept[:, None]
    return select_topk_keys(torch.where(live & (keys >= thresholds[:, None]), keys, NO_KEY), k)


def path_shares(keys, kept, thresholds, want, k):
    """Fractions of rows by the bucket kernel's path (radix_select's CONFIG bucket resolution, BOUNDARY
    and WINDOW): n <= K passing keys; boundary bucket over BOUNDARY keys (radix narrowing); every bucket
    above the K-th at most WINDOW keys (window sorts); otherwise one sort of K."""
    mantissa = radix_select.CONFIG[k][2]
    nbins = 32 << mantissa
    live = torch.arange(keys.shape[1], device="cuda")[None, :] < kept[:, None]
    passing = live & (keys >= thresholds.clamp(min=NO_KEY + 1)[:, None])
    low = torch.where(passing, keys >> 32, 2**31).min(dim=1, keepdim=True).values

    def bucket(x):
        bits = ((x >> 32) - low).clamp(min=0).to(torch.float32).view(torch.int32)
        return ((bits >> (23 - mantissa)) - ((127 << mantissa) - 1)).clamp(0, nbins - 1).long()

    counts = torch.zeros(keys.shape[0], nbins, dtype=torch.int64, device="cuda")
    counts.scatter_add_(1, bucket(keys), passing.long())
    chosen = bucket(want[:, k - 1 : k])
    boundary = counts.gather(1, chosen)[:, 0]
    above = torch.arange(nbins, device="cuda")[None, :] > chosen
    widest = torch.where(above, counts, 0).max(dim=1).values
    small = passing.sum(1) <= k
    narrowed = ~small & (boundary > radix_select.BOUNDARY)
    windows = ~small & ~narrowed & (widest <= radix_select.WINDOW)

    def share(m):
        return float(m.float().mean())

    return {
        "n<=K": share(small),
        "narrowed": share(narrowed),
        "windows": share(windows),
        "sorted": share(~small & ~narrowed & ~windows),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for radix-select-probe.json")
    parser.add_argument(
        "--rows",
        type=int,
        default=ROWS,
        help="rows of the candidate buffer (8192: a prefill; 64-256: a decode step, where wider "
        "programs are timed too)",
    )
    parser.add_argument(
        "--kept-factor",
        type=float,
        default=1.0,
        help="scale the kept keys a row (7: a one-row decode step's ~15,000 at K = 512)",
    )
    args = parser.parse_args()
    rows = args.rows
    os.makedirs(args.out, exist_ok=True)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(15)
    report = {
        "device": torch.cuda.get_device_name(0),
        "rows": rows,
        "kept_factor": args.kept_factor,
        "warm": WARM,
        "reps": REPS,
        "cases": [],
    }
    print(f"{'K':>5} {'threshold':>9} {'passing':>8} {'variant':>28} {'ms':>8} {'equal':>5}")
    for k in (512, 1024):
        keys, kept, scan_thresholds = candidate_buffer(k, gen, rows, args.kept_factor)
        for thr_name, thresholds in (("scan", scan_thresholds), ("none", torch.full_like(scan_thresholds, NO_KEY))):
            want = torch_top(keys, kept, thresholds, k)
            live = torch.arange(keys.shape[1], device="cuda")[None, :] < kept[:, None]
            passing = float((live & (keys >= thresholds[:, None])).sum(1).float().mean())
            case = {
                "k": k,
                "threshold": thr_name,
                "kept_mean": float(kept.float().mean()),
                "passing_mean": passing,
                "paths": path_shares(keys, kept, thresholds, want, k),
                "variants": {},
            }
            print(f"{k:>5} {thr_name:>9} rows by path: {case['paths']}", flush=True)
            out = torch.empty(rows, k, dtype=torch.int64, device="cuda")
            runs = {
                "radix v1 (previous)": lambda: select_topk_candidates_radix_v1(keys, kept, thresholds, k, out),
                "bucket (CONFIG)": lambda: select_topk_candidates_radix(keys, kept, thresholds, k, out=out),
            }
            for tile_rows, warps, mantissa, window, regs in VARIANTS[k] + (DECODE_VARIANTS[k] if rows <= 1024 else []):
                runs[f"bucket r{tile_rows} w{warps} m{mantissa} win{window}" + (f" reg{regs}" if regs else "")] = (
                    lambda t=tile_rows, w=warps, m=mantissa, n=window, r=regs: select_topk_candidates_radix(
                        keys,
                        kept,
                        thresholds,
                        k,
                        out=out,
                        tile_rows=t,
                        num_warps=w,
                        mantissa=m,
                        window=n,
                        max_registers=r,
                    )
                )
            for name, fn in runs.items():
                out.fill_(7)  # a variant that leaves slots unwritten must not inherit the last one's answer
                got = fn()
                equal = bool(torch.equal(got, want))
                ms = cuda_ms(fn, reps=REPS, warm=WARM)
                case["variants"][name] = {"ms": ms, "equal": equal}
                print(f"{k:>5} {thr_name:>9} {passing:>8.0f} {name:>28} {ms:>8.4f} {str(equal):>5}", flush=True)
            report["cases"].append(case)
            name = "radix-select-probe.json" if rows == ROWS else f"radix-select-probe-rows{rows}.json"
            if args.kept_factor != 1.0:
                name = name.replace(".json", f"-kept{args.kept_factor:g}.json")
            with open(os.path.join(args.out, name), "w") as f:
                json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
