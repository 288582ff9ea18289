"""Stage 5, selection: the exact top-K of each row's candidates, in one Triton launch (CUDA) or torch
ops (elsewhere), the same bits (tested). The dense baseline's selection is dense_selection.py.

Layer: stage (certify.py and repair.py run it on the scan's buffer). Reading order: the radix
select's kernel and its helpers, its launcher (select_topk_candidates_radix), the torch twin
(select_candidates_torch), then `select_candidates`, the one line that picks between them
(devices.runs_triton_stages).

The candidate top-K by one bucket pass (Triton; sm_90 and the interpreter): select_topk_candidates_radix.
Same contract and answer as keys.select_topk_keys on each row's passing keys, bit for bit: per
row, the K largest of the first `kept` ordering keys (keys.make_keys: distinct int64 whose integer
order is the contract's total order) among those at or above the row's threshold key T (at or below
the row's K-th best kept key; NO_KEY = none), sorted descending, NO_KEY padded.

Math. Let P be the row's passing keys (kept and >= floor = max(T, NO_KEY + 1)), n = |P|. If n <= K
the answer is P, sorted. Otherwise every key gets a bucket b(key), any function that never decreases
as the key grows: then the buckets above the K-th key's bucket b* hold only answer keys, those below
it none, and only the boundary bucket b* needs ranking. b is geometric in the score distance
d = (key >> 32) - (the score part of P's lowest key), an integer in [0, 2^32): b = 1 + (exponent and
top MANTISSA bits of float32(d)) - those of 1.0, clamped to [0, NBINS = 32 << MANTISSA) (rounding to
nearest never decreases, so b is monotone). Fine next to P's lowest key and coarse far from it, it
needs no pass to learn P's range and leaves few keys in each bucket near the K-th key. One histogram
of b (an atomic add a passing key) gives b*, `above` (the keys in higher buckets) and the rank
`need` = K - above still wanted in b*. Each bucket's counter then becomes its cursor (its first slot
in a descending row), and a classification pass stores every key above b* at its bucket's cursor (an
atomic add that returns the slot) and b*'s keys into BOUNDARY scratch slots; the boundary's `need`
largest (a tl.sort of BOUNDARY keys) fill slots [above, K). The output row is then ordered by bucket,
unordered only inside buckets; where no bucket above b* holds more than WINDOW keys, two rounds of
window sorts finish it (_sort_windows: windows of 2 WINDOW keys, then the same shifted by WINDOW),
else one tl.sort of the K keys. Where more than BOUNDARY keys share b* (heavy score ties; rows with
no threshold), the need-th largest of b* is found exactly by radix narrowing on the bucket's keys
(DIGIT bits a pass, tl.histogram: the previous kernel's loop), the bucket's keys at or above it fill
[above, K), and one tl.sort orders the row. The order is total, so there is nothing to break.
Measured offline on the probe's data (8192-row buffers of the top ~2,200 / ~4,400 of 65,536 normal
scores, scan thresholds passing ~619 / ~1,249 keys; MANTISSA 5 / 6 at K = 512 / 1024): b* holds ~4
keys on average (at most 9), the widest bucket above it ~12 (at most 16), so all or nearly all rows
(97-100 % at K = 1024) take the window sorts; with no threshold every row takes one sort of K.

Tiling: one program per row; every pass reads a [TILE_ROWS, LANES] tile, LANES = 32 x num_warps, so
each thread holds TILE_ROWS keys of one column: a compaction's prefix sum is an in-thread scan plus one
warp scan of the column counts per tile (a 1-D block's tl.cumsum is a 5-shuffle warp scan per
register), and scattered stores and atomics go out as 1-D blocks (a 2-D one gets a layout of its own,
reached through shared memory). Passes:
  1. HBM: the kept keys; passing ones compacted into a scratch row of SMALL = 2 K keys; n; P's lowest
     score part (an int32 minimum).
  2. scratch row (L2): the bucket histogram (NBINS int32 counters per row, zeroed by the program,
     one relaxed CTA-scope atomic add a key), then b*, above, need, the widest bucket above b* and
     the cursors from one prefix sum over the counters (_boundary_bucket).
  3. scratch row: keys above b* to their buckets' slots in the output row, b*'s keys to the
     boundary slots. The output row holds slot s window-major (_window_slot) until the window sorts
     have run, so that their [windows, 2 WINDOW] tiles give each thread a window in registers.
  4. the boundary's sort; the window sorts (then the row stored in slot order) or one sort of K.
Where n <= K, passes 2-4 are skipped and one sort reads the scratch row; where n > SMALL (no
threshold) passes 2-3 read the buffer row instead of the scratch row.

What bounds its time. Bytes: the kept keys once from HBM (8 B a key: 17.6 / 35 KB a row, 144 / 288 MB
at 8192 rows, ~40 / ~80 us at the H200's bandwidth); the scratch row, counters and output row stay in
L2. Instructions are the bound (integer and shuffle pipes issue at most 2 and 1 warp instructions a
clock per SM). SASS compiled offline for sm_90 (compile/sm90.py), per row with scan thresholds, one warp
(CONFIG), in warp instructions, K = 512 / 1024: pass 1 ~1,460 / ~2,930 (162 a 256-key tile: load,
64-bit compare, in-thread scan, slot, address, store, minimum: ~20 a kept key per thread); pass 2
~430 / ~720 for the atomics plus ~700 / ~1,400 for the 1,024 / 2,048 counters; pass 3 ~1,050 /
~1,750; the boundary sort ~360; the window sorts ~2,900 / ~4,300 (1,409 / 2,102 a round; one
tl.sort of K keys is ~4,700 / ~11,200: 45 / 55 compare-exchange stages, across lanes in the 1-D
layout): ~7,200 / ~11,900 in all, against ~12,000 / ~28,000 for the previous kernel (three
tl.histogram passes at ~48 instructions a key, 1-D prefix sums at ~40, one sort of K; K = 1024 in
two warps). Registers (CONFIG, offline sm_90 builds): 128 / 155, so 16 / 13 resident one-warp programs an
SM; `max_registers` caps them (80 at K = 512, and (8, 2, 6) at 96 for K = 1024, build without stack). The
window sorts remain the largest part: Triton's tl.sort does a 64-bit compare and two selects per key and stage.

Limits: K a power of two (SUPPORTED_TOPK); keys distinct (as make_keys makes them; equal keys are
kept up to K); kept <= capacity; NO_KEY in the kept prefix counts as padding (it is one in the output
too). No host synchronization and no data-dependent shape: CUDA-graph capturable.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .devices import runs_triton_stages
from .keys import NO_KEY, NO_KEY_C, select_topk_keys
from .scratch import Scratch

# (keys per thread per tile, num_warps, bucket resolution MANTISSA: 2^MANTISSA buckets per doubling of
# the score distance, 32 << MANTISSA buckets in all) per K; other K (tests) take the K = 1024 one.
# K = 512 from the H200 probe (bench/results/radix-select-probe-h200-v12-partial.txt): 4 keys a thread
# 0.306 ms against 0.386 for 8 (bit-equal); K = 1024 not yet re-measured (the step ran out of time).
CONFIG = {512: (4, 1, 5), 1024: (8, 1, 6)}
# Calls of fewer rows than DECODE_ROWS (a decode step: one program a row leaves SMs idle) take wider programs,
# the same bucket resolution. Measured in the pipeline on an H100 (bench/probes/paged_variants.py, paged mode,
# select kernel time, bit-equal; bench/results/paged-variants-h100-v17b.json): 64 x 1 rows x 65,536 keys
# K = 512 23 us (CONFIG 58, two warps 33); one row 41 (87, 42); 32 x 4 rows K = 1024 47 (115, 69).
DECODE_ROWS = 1024
DECODE_CONFIG = {512: (4, 4, 5), 1024: (8, 4, 6)}
BOUNDARY = 32  # boundary keys ranked by one sort (~4 on average, at most 9 seen); more: narrowing
WINDOW = 16  # the longest unsorted run the two window sorts order; longer: one sort of K
DIGIT = 5  # radix bits per pass of the narrowing loop (_kth_key_of_bucket)
INT64_MAX_C = tl.constexpr(2**63 - 1)
INT32_MAX_C = tl.constexpr(2**31 - 1)


@triton.jit
def _exclusive_slots(flags):
    """(exclusive prefix sums of int32 [TILE_ROWS, LANES] flags in column-major order, their total):
    an in-thread scan down each column plus one warp scan of the column totals."""
    in_column = tl.cumsum(flags, axis=0) - flags
    column_total = tl.sum(flags, axis=0)
    column_start = tl.cumsum(column_total, axis=0) - column_total
    return column_start[None, :] + in_column, tl.sum(column_total, axis=0)


@triton.jit
def _scatter(ptrs, values, mask):
    """tl.store of a [TILE_ROWS, LANES] tile through scattered pointers, as one 1-D block: a 2-D store
    of pointers of unknown contiguity gets a layout of its own, reached through shared memory."""
    n: tl.constexpr = ptrs.numel
    tl.store(tl.reshape(ptrs, [n]), tl.reshape(values, [n]), mask=tl.reshape(mask, [n]))


@triton.jit
def _bucket(keys, low_score, MANTISSA: tl.constexpr, NBINS: tl.constexpr):
    """Bucket (int32 in [0, NBINS), never decreasing as the key grows) of keys whose score part is at
    least low_score: exponent and top MANTISSA bits of float32(score distance), 0 for distance 0."""
    distance = ((keys >> 32) - low_score).to(tl.uint32)
    bits = distance.to(tl.float32).to(tl.int32, bitcast=True)
    bucket = (bits >> (23 - MANTISSA)) - ((127 << MANTISSA) - 1)
    return tl.minimum(tl.maximum(bucket, 0), NBINS - 1)


@triton.jit
def _boundary_bucket(row_hist, n_pass, TOPK: tl.constexpr, NBINS: tl.constexpr, LANES: tl.constexpr):
    """From the row's NBINS bucket counts (n_pass keys in all, more than TOPK): (b*, the bucket of the
    TOPK-th largest key; its count; `above`, the keys in higher buckets; `widest`, the largest count
    above b*). Each counter is overwritten by its bucket's cursor: the keys in higher buckets (its
    first slot in a descending row). Reads the counts 8 x LANES at a time, a column of 8 per thread;
    the maxima and minima are kept per element and reduced once."""
    CHUNK_ROWS: tl.constexpr = 8 if NBINS >= 8 * LANES else NBINS // LANES
    offs = tl.arange(0, CHUNK_ROWS)[:, None] + tl.arange(0, LANES)[None, :] * CHUNK_ROWS
    chosen = tl.full([CHUNK_ROWS, LANES], -1, tl.int32)
    least_reaching = tl.full([CHUNK_ROWS, LANES], INT32_MAX_C, tl.int32)  # fewest keys at or above a bucket, >= TOPK
    above = tl.zeros([CHUNK_ROWS, LANES], dtype=tl.int32)
    widest = tl.zeros([CHUNK_ROWS, LANES], dtype=tl.int32)
    below_chunk = 0
    for start in range(0, NBINS, CHUNK_ROWS * LANES):
        hist = tl.load(row_hist + start + offs, cache_modifier=".cg")  # the atomics' results are in L2
        below, total = _exclusive_slots(hist)
        at_or_above = n_pass - below_chunk - below  # keys in this bucket or higher: never increasing
        reaches = at_or_above >= TOPK
        chosen = tl.maximum(chosen, tl.where(reaches, start + offs, -1))
        least_reaching = tl.minimum(least_reaching, tl.where(reaches, at_or_above, INT32_MAX_C))
        above = tl.maximum(above, tl.where(reaches, 0, at_or_above))
        widest = tl.maximum(widest, tl.where(reaches, 0, hist))
        tl.store(row_hist + start + offs, at_or_above - hist)
        below_chunk += total
    above_all = tl.max(above)
    return tl.max(chosen), tl.min(least_reaching) - above_all, above_all, tl.max(widest)


@triton.jit
def _window_slot(slot, TOPK: tl.constexpr, WINDOW: tl.constexpr):
    """Where the output row holds its slot `slot` until _sort_windows has run: window w = slot // 2W's
    i-th key (i = slot % 2W) at i * (TOPK / 2W) + w. A window's keys are then TOPK / 2W apart, so a
    [windows, 2W] tile of them is contiguous along the windows: the loads give each thread one window
    (or a half) in its registers, and the sort's compare-exchange stages run inside threads."""
    if WINDOW > 0:
        return (slot % (2 * WINDOW)) * (TOPK // (2 * WINDOW)) + slot // (2 * WINDOW)
    else:
        return slot


@triton.jit
def _sort_windows(row_out, stride_oc, TOPK: tl.constexpr, WINDOW: tl.constexpr):
    """Sort descending the TOPK keys of an output row (held at _window_slot) made of runs of at most
    WINDOW unsorted keys (buckets) and sorted runs, every key of a run larger than every key of the
    next: sort the windows [2jW, 2jW + 2W), then the windows [(2j+1)W, (2j+3)W); then store the row
    in slot order. A window sort keeps every run's keys in its slots (runs are ordered), so it sorts
    each run inside it and unsorts none; every run of at most W keys lies inside a window of one of
    the two sets. One tl.sort call site for both rounds (a runtime loop): its straight-line code is
    thousands of instructions."""
    slots = tl.arange(0, TOPK // (2 * WINDOW))[:, None] * (2 * WINDOW) + tl.arange(0, 2 * WINDOW)[None, :]
    for shift in range(0, 2 * WINDOW, WINDOW):
        inside = shift + slots < TOPK  # the last shifted window is half past the row: NO_KEY sorts last
        ptrs = row_out + _window_slot(shift + slots, TOPK, WINDOW) * stride_oc
        keys = tl.load(ptrs, mask=inside, other=NO_KEY_C)
        tl.debug_barrier()  # every thread has read its keys before any overwrites the row
        tl.store(ptrs, tl.sort(keys, dim=1, descending=True), mask=inside)
        tl.debug_barrier()  # the first windows are stored before the shifted ones are read
    offs = tl.arange(0, TOPK)
    keys = tl.load(row_out + _window_slot(offs, TOPK, WINDOW) * stride_oc)
    tl.debug_barrier()
    tl.store(row_out + offs * stride_oc, keys)


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
def _kth_key_of_bucket(
    src,
    src_len,
    floor,
    low_score,
    chosen,
    need,
    count,
    CHUNK: tl.constexpr,
    DIGIT: tl.constexpr,
    MANTISSA: tl.constexpr,
    NBINS: tl.constexpr,
):
    """The need-th largest of the `count` keys of src[:src_len] that pass floor and fall in bucket
    `chosen`: radix narrowing from the top of their range, DIGIT bits a pass, until the need-th key
    is the smallest of its narrowed bucket (then that bucket's base is it)."""
    RADIX: tl.constexpr = 1 << DIGIT
    offs = tl.arange(0, CHUNK)
    lo_acc = tl.full([CHUNK], INT64_MAX_C, tl.int64)
    hi_acc = tl.full([CHUNK], NO_KEY_C, tl.int64)
    for start in range(0, src_len, CHUNK):
        keys = tl.load(src + start + offs, mask=start + offs < src_len, other=NO_KEY_C)
        inside = (keys >= floor) & (_bucket(keys, low_score, MANTISSA, NBINS) == chosen)
        lo_acc = tl.minimum(lo_acc, tl.where(inside, keys, INT64_MAX_C))
        hi_acc = tl.maximum(hi_acc, tl.where(inside, keys, NO_KEY_C))
    base = tl.min(lo_acc, axis=0)  # the narrowed bucket [base, base + limit << shift)
    span = (tl.max(hi_acc, axis=0) - base).to(tl.uint64, bitcast=True)
    shift = _first_shift(span, RADIX)
    limit = RADIX
    bins = tl.arange(0, RADIX)
    while need < count:  # the need-th key is not yet the smallest of its narrowed bucket
        hist = tl.zeros([RADIX], dtype=tl.int32)
        for start in range(0, src_len, CHUNK):
            keys = tl.load(src + start + offs, mask=start + offs < src_len, other=NO_KEY_C)
            # A key below base wraps to at least 2^64 - span > the narrowed bucket's width: out.
            digit = (keys - base).to(tl.uint64, bitcast=True) >> shift
            inside = (keys >= floor) & (_bucket(keys, low_score, MANTISSA, NBINS) == chosen) & (digit < limit)
            hist += tl.histogram(digit.to(tl.int32), RADIX, mask=inside)
        from_top = count - tl.cumsum(hist, axis=0) + hist  # keys of this digit or higher
        digit_star = tl.max(tl.where(from_top >= need, bins, 0), axis=0)
        need -= tl.sum(tl.where(bins > digit_star, hist, 0), axis=0)
        count = tl.sum(tl.where(bins == digit_star, hist, 0), axis=0)
        base += (digit_star.to(tl.uint64) << shift).to(tl.int64, bitcast=True)
        next_shift = tl.maximum(shift - DIGIT, 0)
        limit = tl.where(shift > 0, 1 << (shift - next_shift), 0)
        count = tl.where(shift > 0, count, need)  # bit 0 done: the bucket is one key value
        shift = next_shift
    return base


@triton.jit
def select_topk_candidates_radix_kernel(
    keys_ptr,
    stride_kr,  # int64 [rows, capacity], unit column stride
    kept_ptr,
    thr_ptr,  # int32/int64 [rows]; int64 [rows]
    small_ptr,  # int64 [rows, SMALL + BOUNDARY]: passing, then boundary keys
    hist_ptr,  # int32 [rows, NBINS]: bucket counters
    out_ptr,
    stride_or,
    stride_oc,  # int64 [rows, TOPK]
    TOPK: tl.constexpr,
    SMALL: tl.constexpr,
    BOUNDARY: tl.constexpr,
    TILE_ROWS: tl.constexpr,
    LANES: tl.constexpr,
    MANTISSA: tl.constexpr,
    NBINS: tl.constexpr,
    DIGIT: tl.constexpr,
    WINDOW: tl.constexpr,
):
    CHUNK: tl.constexpr = TILE_ROWS * LANES
    row = tl.program_id(0).to(tl.int64)
    row_keys = keys_ptr + row * stride_kr
    row_small = small_ptr + row * (SMALL + BOUNDARY)
    row_boundary = row_small + SMALL
    row_hist = hist_ptr + row * NBINS
    row_out = out_ptr + row * stride_or
    kept = tl.load(kept_ptr + row).to(tl.int32)
    # Keys >= floor pass: the row's threshold, raised above NO_KEY (the padding of masked loads).
    floor = tl.maximum(tl.load(thr_ptr + row), NO_KEY_C + 1)
    offs = tl.arange(0, TILE_ROWS)[:, None] * LANES + tl.arange(0, LANES)[None, :]

    # Pass 1 (HBM): compact the passing keys into the scratch row; their count and lowest score part.
    n_pass = 0
    low_acc = tl.full([TILE_ROWS, LANES], INT32_MAX_C, tl.int32)
    for start in range(0, kept, CHUNK):
        live = start + offs < kept
        keys = tl.load(row_keys + start + offs, mask=live)
        passing = live & (keys >= floor)
        slot, total = _exclusive_slots(passing.to(tl.int32))
        # Slots wrap at SMALL: where more keys pass, the scratch row is not read.
        _scatter(row_small + ((n_pass + slot) & (SMALL - 1)), keys, passing)
        low_acc = tl.minimum(low_acc, tl.where(passing, (keys >> 32).to(tl.int32), INT32_MAX_C))
        n_pass += total
    low_score = tl.min(low_acc).to(tl.int64)
    tl.debug_barrier()  # the scratch row, written above by every thread, is read below

    offs_top = tl.arange(0, TOPK)
    windowed = n_pass < 0
    if n_pass > TOPK:
        # Later passes read the scratch row (L2), or the whole buffer row where more than SMALL keys pass.
        fits = n_pass <= SMALL
        src = tl.where(fits, row_small, row_keys)
        src_len = tl.where(fits, n_pass, kept)
        # Pass 2: the bucket histogram, then the boundary bucket b* (the K-th key's).
        tl.store(row_hist + tl.arange(0, NBINS), tl.zeros([NBINS], dtype=tl.int32))
        tl.debug_barrier()  # zeroed before any thread counts
        for start in range(0, src_len, CHUNK):
            live = start + offs < src_len
            keys = tl.load(src + start + offs, mask=live)
            # Unmasked (a masked atomic is a branch a key): keys outside add 0 to a bucket in range.
            counter = tl.reshape(row_hist + _bucket(keys, low_score, MANTISSA, NBINS), [CHUNK])  # as _scatter
            counted = tl.reshape((live & (keys >= floor)).to(tl.int32), [CHUNK])
            tl.atomic_add(counter, counted, sem="relaxed", scope="cta")
        tl.debug_barrier()  # every count is in
        chosen, count, above, widest = _boundary_bucket(row_hist, n_pass, TOPK, NBINS, LANES)
        need = TOPK - above
        tl.debug_barrier()  # the cursors are in before any thread takes a slot

        # Pass 3: keys above b* into the output row, bucket by bucket (a cursor atomic each: the row is
        # sorted up to the order inside buckets); b*'s keys into the boundary slots.
        n_boundary = 0
        for start in range(0, src_len, CHUNK):
            live = start + offs < src_len
            keys = tl.load(src + start + offs, mask=live)
            bucket = _bucket(keys, low_score, MANTISSA, NBINS)
            passing = live & (keys >= floor)
            is_above = passing & (bucket > chosen)
            is_boundary = passing & (bucket == chosen)
            # Unmasked, as in pass 2: the other keys add 0 (and read a cursor they do not use).
            slot_a = tl.atomic_add(
                tl.reshape(row_hist + bucket, [CHUNK]),
                tl.reshape(is_above.to(tl.int32), [CHUNK]),
                sem="relaxed",
                scope="cta",
            )
            tl.store(
                row_out + _window_slot(slot_a, TOPK, WINDOW) * stride_oc,
                tl.reshape(keys, [CHUNK]),
                mask=tl.reshape(is_above, [CHUNK]),
            )
            slot_b, total = _exclusive_slots(is_boundary.to(tl.int32))
            # Slots wrap at BOUNDARY: where more keys are in b*, the boundary slots are not read.
            _scatter(row_boundary + ((n_boundary + slot_b) & (BOUNDARY - 1)), keys, is_boundary)
            n_boundary += total
        tl.debug_barrier()  # the boundary slots, written above by every thread, are read below

        # Pass 4: the boundary's need largest, sorted, after the above keys.
        if count <= BOUNDARY:
            offs_b = tl.arange(0, BOUNDARY)
            ranked = tl.sort(tl.load(row_boundary + offs_b, mask=offs_b < count, other=NO_KEY_C), descending=True)
            tl.store(row_out + _window_slot(above + offs_b, TOPK, WINDOW) * stride_oc, ranked, mask=offs_b < need)
        else:
            bound = _kth_key_of_bucket(
                src, src_len, floor, low_score, chosen, need, count, CHUNK, DIGIT, MANTISSA, NBINS
            )
            n_taken = 0
            for start in range(0, src_len, CHUNK):
                live = start + offs < src_len
                keys = tl.load(src + start + offs, mask=live)
                taken = live & (keys >= floor) & (keys >= bound) & (_bucket(keys, low_score, MANTISSA, NBINS) == chosen)
                slot, total = _exclusive_slots(taken.to(tl.int32))
                _scatter(
                    row_out + _window_slot(above + n_taken + slot, TOPK, WINDOW) * stride_oc,
                    keys,
                    taken & (n_taken + slot < need),
                )
                n_taken += total
        tl.debug_barrier()  # the output row, written above by every thread, is read back below
        if WINDOW > 0:
            windowed = (widest <= WINDOW) & (count <= BOUNDARY)  # the boundary run is sorted, the others short
            if windowed:
                _sort_windows(row_out, stride_oc, TOPK, WINDOW)
    # Otherwise one sort of the K keys: the output row's, or the scratch row's n <= K (one call site:
    # a tl.sort of K keys is thousands of instructions of straight-line code).
    if not windowed:
        unsorted = n_pass > TOPK
        top_ptr = tl.where(unsorted, row_out, row_small)
        top_stride = tl.where(unsorted, stride_oc, 1)
        top = tl.load(top_ptr + offs_top * top_stride, mask=offs_top < n_pass, other=NO_KEY_C)
        tl.debug_barrier()  # every thread has read its keys before any overwrites the output row
        tl.store(row_out + offs_top * stride_oc, tl.sort(top, descending=True))


def select_topk_candidates_radix(
    keys: torch.Tensor,
    kept: torch.Tensor,
    thresholds: torch.Tensor,
    k: int,
    out: torch.Tensor | None = None,
    *,
    scratch: Scratch | None = None,
    tile_rows: int | None = None,
    num_warps: int | None = None,
    mantissa: int | None = None,
    boundary: int = BOUNDARY,
    window: int = WINDOW,
    max_registers: int | None = None,
) -> torch.Tensor:
    """int64 [rows, k]: the k largest of the first kept[r] keys of each row of int64 `keys`
    [rows, capacity] (keys.make_keys: distinct), sorted descending, NO_KEY padded; the same
    answer as keys.select_topk_keys on the passing keys, bit for bit. kept int32/int64 [rows]
    (<= capacity); thresholds int64 [rows] at or below each row's k-th best kept key (NO_KEY: none),
    as the LiteTopK scan's final thresholds are: only keys at or above them are selected. `out` (int64
    [rows, k], any strides, on the keys' device) is written and returned instead of a new tensor; the
    intermediate buffers (rows x (2k + boundary) int64 and rows x 32 << mantissa int32) come from
    `scratch` (a scratch.Scratch; the allocator where None). k a power of two. No host
    synchronization: capturable in a CUDA graph. tile_rows (keys per thread per tile), num_warps,
    mantissa (bucket resolution; the defaults: launch_config), boundary (keys one sort ranks) and window (the
    longest bucket the window sorts order; 0: always one sort of k), powers of two, and max_registers
    (ptxas's register cap, Triton's maxnreg: more resident warps an SM, or spills) override the defaults
    (the probe's sweep)."""
    rows = keys.shape[0]
    if k <= 0 or k & (k - 1):
        raise ValueError(f"k={k} must be a power of two (SUPPORTED_TOPK)")
    scratch = Scratch(keys.device) if scratch is None else scratch
    if out is None:
        out = scratch.empty((rows, k), torch.int64)
    elif out.shape != (rows, k) or out.dtype != torch.int64 or out.device != keys.device:
        raise ValueError(
            f"out must be int64 [{rows}, {k}] on {keys.device}; got {out.dtype} {list(out.shape)} on {out.device}"
        )
    if rows == 0:
        return out
    default = launch_config(k, rows)
    tile_rows, num_warps, mantissa = tile_rows or default[0], num_warps or default[1], mantissa or default[2]
    lanes = 32 * num_warps
    nbins = max(32 << mantissa, lanes)
    small = scratch.empty((rows, 2 * k + boundary), torch.int64)
    hist = scratch.empty((rows, nbins), torch.int32)
    keys = keys.contiguous()
    select_topk_candidates_radix_kernel[(rows,)](
        keys,
        keys.stride(0),
        kept,
        thresholds,
        small,
        hist,
        out,
        out.stride(0),
        out.stride(1),
        TOPK=k,
        SMALL=2 * k,
        BOUNDARY=boundary,
        TILE_ROWS=tile_rows,
        LANES=lanes,
        MANTISSA=mantissa,
        NBINS=nbins,
        DIGIT=DIGIT,
        WINDOW=min(window, k // 2),
        num_warps=num_warps,
        **({} if max_registers is None else {"maxnreg": max_registers}),
    )
    return out


def launch_config(k: int, rows: int) -> tuple[int, int, int]:
    """(keys per thread per tile, num_warps, bucket resolution) of select_topk_candidates_radix for `rows`
    rows at K = k: DECODE_CONFIG below DECODE_ROWS rows, else CONFIG (other K take K = 1024's)."""
    table = DECODE_CONFIG if rows < DECODE_ROWS else CONFIG
    return table.get(k, table[1024])


def select_candidates_torch(keys: torch.Tensor, kept: torch.Tensor, k: int) -> torch.Tensor:
    """select_candidates in torch ops (any device): keys.select_topk_keys of each row's kept prefix
    (it needs no thresholds)."""
    kept_slots = torch.arange(keys.shape[1], device=keys.device)[None, :] < kept[:, None]
    return select_topk_keys(torch.where(kept_slots, keys, NO_KEY), k)


def select_candidates(
    keys: torch.Tensor, kept: torch.Tensor, thresholds: torch.Tensor, k: int, scratch: Scratch | None = None
) -> torch.Tensor:
    """int64 [rows, k]: the k largest of the first kept[r] keys of each row of the scan's buffer
    `keys` [rows, capacity] (whatever lies after them is not read), sorted descending, NO_KEY padded.
    `thresholds` are at or below the k-th best key of every row whose scan certifies (other rows are
    repaired or publish nothing); the Triton twin (select_topk_candidates_radix: a radix select above
    the threshold, then a sort of K keys) uses them, the torch twin needs none. Runs the Triton twin
    where devices.runs_triton_stages says so, its buffers from `scratch` (the problem's; None: the
    allocator)."""
    if runs_triton_stages(keys.device):
        return select_topk_candidates_radix(keys, kept, thresholds, k, scratch=scratch)
    return select_candidates_torch(keys, kept, k)
