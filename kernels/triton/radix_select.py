"""The candidate top-K by radix select (Triton; sm_90 and the interpreter): select_topk_candidates_radix.

Same contract and answer as selection.select_topk_candidates_triton, bit for bit: per row, the K
largest of the first `kept` ordering keys (kernels.selection.make_keys: distinct int64 whose integer
order is the contract's total order) among those at or above the row's threshold key T (at or below
the row's K-th best kept key; NO_KEY = none), sorted descending, NO_KEY padded.

Math. Let P be the row's passing keys (kept and >= floor = max(T, NO_KEY + 1)), n = |P|, hi the
largest. If n <= K the answer is P. Otherwise the K-th largest key of P is found exactly by a radix
select on u = key - floor in [0, hi - floor] (uint64, order-preserving): DIGIT-bit digits from the
top, the first at the lowest shift s with (hi - floor) >> s < RADIX (no pass is spent on bits that
every passing key shares). Each pass counts the keys of the current bucket per digit (tl.histogram),
takes the highest digit whose count from the top reaches `need` (the rank still wanted), and
narrows to it: need -= keys of higher digits. The loop stops as soon as the K-th key is the
smallest of its bucket (need == count; always so once the bucket is one key or bit 0 is done);
then the bucket's base key separates exactly the K largest: keys >= it are the answer. The order is
total, so there is nothing to break, and the answer (sorted by tl.sort over exactly K keys, not a
top-K over 2 K) is the old kernel's and torch's, bit for bit.

Tiling: one program per row. Pass 1 streams the row's kept keys CHUNK at a time from HBM and
compacts the passing ones (a prefix sum gives each its slot) into a per-row scratch row of SMALL =
2 K keys; the radix passes and the final compaction read that row (L1/L2), or the whole buffer row
where more than SMALL keys pass (no threshold). The radix base is floor = max(T, NO_KEY + 1): one
64-bit compare per key excludes both failing keys and the NO_KEY padding of masked loads, and a key
below a bucket's base wraps to at least the bucket's width, so one shift and compare tests the bucket.
With scan thresholds the passing keys span about one binade of scores: 5-bit digits leave the K-th
key alone in its bucket after 2-3 passes over ~619 / ~1,249 keys. The answer is compacted in input
order into the output row (no other scratch), read back as one [K] tensor and sorted.

Limits: K a power of two (SUPPORTED_TOPK); keys distinct (as make_keys makes them; with equal keys
the compaction keeps the first K at or above the K-th, in input order, before the sort); kept <=
capacity; NO_KEY in the kept prefix counts as padding (it is one in the output too). No host
synchronization and no data-dependent shape: CUDA-graph capturable.

Cost (H200, 8192 rows, bench/radix_select_probe.py; CONFIG below): 0.37 ms at K = 512 (bitonic
top-K of 2 K: 0.66) and 0.86 ms at K = 1024 (1.63) with scan thresholds; 0.63 / 1.27 ms without a
threshold (2.9 / 8.6). Memory is not the bound (pass 1 reads 144 / 288 MB: ~40 / 80 us); the kernel
is instruction- and latency-bound in Triton's generic primitives, read from the offline sm_90 SASS
(compile_sm90): a 1-D int64 block gets one key per thread per register (sizePerThread 1), so each
tl.cumsum is a 5-shuffle warp scan per register (~40 instructions per key in pass 1 and in the
compaction), tl.histogram costs ~50 instructions per key (one ballot per digit bit plus the bin
masks), and tl.sort of K int64 keys is ~4 K instructions per warp (1 warp, K = 512). The goals of
<= 0.15 / 0.3 ms need those three replaced by a layout with several contiguous keys per thread
(ballot + popc ranks, a per-thread sort before the warp merges), which Triton does not expose.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..selection import NO_KEY

# (chunk, num_warps, digit bits) per K: the fastest of bench/radix_select_probe.py's sweep on the H200
# with scan thresholds (8192 rows); other K (tests) take the K = 1024 configuration.
CONFIG = {512: (256, 1, 5), 1024: (512, 2, 5)}
NO_KEY_C = tl.constexpr(NO_KEY)
INT64_MAX_C = tl.constexpr(2**63 - 1)


@triton.jit
def _first_shift(span, RADIX: tl.constexpr):
    """The smallest shift s with (span >> s) < RADIX, span uint64 (binary lifting over 0..63)."""
    t = tl.full([], 0, tl.int32)
    for i in tl.static_range(6):
        step = 32 >> i
        if (span >> (t + step)) >= RADIX:
            t += step
    return tl.where(span >= RADIX, t + 1, 0)


@triton.jit
def select_topk_candidates_radix_kernel(
    keys_ptr, stride_kr,                            # int64 [rows, capacity], unit column stride
    kept_ptr, thr_ptr,                              # int32/int64 [rows]; int64 [rows]
    scratch_ptr,                                    # int64 [rows, SMALL]: the passing keys, compacted
    out_ptr, stride_or, stride_oc,                  # int64 [rows, TOPK]
    TOPK: tl.constexpr, SMALL: tl.constexpr, CHUNK: tl.constexpr, DIGIT: tl.constexpr,
):
    RADIX: tl.constexpr = 1 << DIGIT
    row = tl.program_id(0).to(tl.int64)
    row_keys = keys_ptr + row * stride_kr
    row_small = scratch_ptr + row * SMALL
    row_out = out_ptr + row * stride_or
    kept = tl.load(kept_ptr + row).to(tl.int32)
    # Keys >= floor pass: the row's threshold, raised above NO_KEY (the padding of masked loads).
    floor = tl.maximum(tl.load(thr_ptr + row), NO_KEY_C + 1)
    offs = tl.arange(0, CHUNK)

    # Pass 1 (HBM): compact the passing keys into the scratch row; their count n and largest hi.
    n_pass = 0
    hi_acc = tl.full([CHUNK], NO_KEY_C, tl.int64)
    for start in range(0, kept, CHUNK):
        keys = tl.load(row_keys + start + offs, mask=start + offs < kept, other=NO_KEY_C)
        passing = keys >= floor
        slot = n_pass + tl.cumsum(passing.to(tl.int32), axis=0) - 1
        tl.store(row_small + slot, keys, mask=passing & (slot < SMALL))
        n_pass += tl.sum(passing.to(tl.int32), axis=0)
        hi_acc = tl.maximum(hi_acc, keys)
    hi_key = tl.max(hi_acc, axis=0)
    tl.debug_barrier()  # the scratch row, written above by every thread, is read below
    # The later passes read the scratch row (L1/L2), or the whole row where more than SMALL keys pass.
    fits = n_pass <= SMALL
    src = tl.where(fits, row_small, row_keys)
    src_len = tl.where(fits, n_pass, kept)

    # Radix passes over u = key - floor (uint64, wrapping: order-preserving for keys >= floor): narrow
    # the bucket [base, base + limit << shift) of keys to the one that holds the K-th key.
    span = (hi_key - floor).to(tl.uint64, bitcast=True)
    shift = _first_shift(span, RADIX)
    limit = RADIX                     # digits of the current bucket: [0, limit)
    base = floor                      # the bucket's smallest key
    need = TOPK                       # rank of the K-th key within the bucket
    count = n_pass                    # passing keys in the bucket
    bins = tl.arange(0, RADIX)
    while need < count:  # the K-th key is not yet the smallest of its bucket
        hist = tl.zeros([RADIX], dtype=tl.int32)
        for start in range(0, src_len, CHUNK):
            keys = tl.load(src + start + offs, mask=start + offs < src_len, other=NO_KEY_C)
            # A key below base wraps to at least 2^64 - (base - floor) >= the bucket's width: out.
            digit = (keys - base).to(tl.uint64, bitcast=True) >> shift
            hist += tl.histogram(digit.to(tl.int32), RADIX, mask=(keys >= floor) & (digit < limit))
        from_top = count - tl.cumsum(hist, axis=0) + hist      # keys of this digit or higher
        chosen = tl.max(tl.where(from_top >= need, bins, 0), axis=0)
        need -= tl.sum(tl.where(bins > chosen, hist, 0), axis=0)
        count = tl.sum(tl.where(bins == chosen, hist, 0), axis=0)
        base += (chosen.to(tl.uint64) << shift).to(tl.int64, bitcast=True)
        next_shift = tl.maximum(shift - DIGIT, 0)
        limit = tl.where(shift > 0, 1 << (shift - next_shift), 0)
        count = tl.where(shift > 0, count, need)  # bit 0 done: the bucket is one key value
        shift = next_shift

    # Compaction of the keys >= bound (exactly min(K, n) of them) into the output row, then the sort.
    bound = base  # floor itself where n <= K (no radix pass)
    n_out = 0
    for start in range(0, src_len, CHUNK):
        keys = tl.load(src + start + offs, mask=start + offs < src_len, other=NO_KEY_C)
        chosen_keys = keys >= bound
        slot = n_out + tl.cumsum(chosen_keys.to(tl.int32), axis=0) - 1
        tl.store(row_out + slot * stride_oc, keys, mask=chosen_keys & (slot < TOPK))
        n_out += tl.sum(chosen_keys.to(tl.int32), axis=0)
    tl.debug_barrier()  # the row, written above by every thread, is read back below
    offs_top = tl.arange(0, TOPK)
    top = tl.load(row_out + offs_top * stride_oc, mask=offs_top < n_out, other=NO_KEY_C)
    tl.debug_barrier()  # every thread has read the row before any overwrites it
    tl.store(row_out + offs_top * stride_oc, tl.sort(top, descending=True))


def select_topk_candidates_radix(keys: torch.Tensor, kept: torch.Tensor, thresholds: torch.Tensor, k: int,
                                 out: torch.Tensor | None = None, *, chunk: int | None = None,
                                 digit: int | None = None, num_warps: int | None = None) -> torch.Tensor:
    """int64 [rows, k]: the k largest of the first kept[r] keys of each row of int64 `keys`
    [rows, capacity] (selection.make_keys: distinct), sorted descending, NO_KEY padded; the same
    answer as select_topk_candidates_triton, bit for bit. kept int32/int64 [rows] (<= capacity);
    thresholds int64 [rows] at or below each row's k-th best kept key (NO_KEY: none), as the
    LiteTopK scan's final thresholds are: only keys at or above them are selected. `out` (int64
    [rows, k], any strides, on the keys' device) is written and returned instead of a new tensor.
    k a power of two. No host synchronization: capturable in a CUDA graph. chunk (keys per pass step),
    digit (radix bits per pass) and num_warps override CONFIG[k] (the probe's sweep)."""
    rows = keys.shape[0]
    if k <= 0 or k & (k - 1):
        raise ValueError(f"k={k} must be a power of two (SUPPORTED_TOPK)")
    if out is None:
        out = torch.empty(rows, k, dtype=torch.int64, device=keys.device)
    elif out.shape != (rows, k) or out.dtype != torch.int64 or out.device != keys.device:
        raise ValueError(f"out must be int64 [{rows}, {k}] on {keys.device}; got {out.dtype} "
                         f"{list(out.shape)} on {out.device}")
    if rows == 0:
        return out
    default = CONFIG.get(k, CONFIG[1024])
    chunk, num_warps, digit = chunk or default[0], num_warps or default[1], digit or default[2]
    keys = keys.contiguous()
    small = 2 * k
    scratch = torch.empty(rows, small, dtype=torch.int64, device=keys.device)
    select_topk_candidates_radix_kernel[(rows,)](
        keys, keys.stride(0), kept, thresholds, scratch, out, out.stride(0), out.stride(1),
        TOPK=k, SMALL=small, CHUNK=chunk, DIGIT=digit, num_warps=num_warps,
    )
    return out
