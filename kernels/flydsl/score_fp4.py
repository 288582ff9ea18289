"""Fused MXFP4 scoring + candidate filter for gfx950 (MI350X / MI355X), written in FlyDSL 0.4.2.

Layer: backends (flydsl/; FlyDSLBackend launches it, compile/gfx950.py builds it offline).

STATUS: compiled for gfx950 in CI (COMPILE_ONLY=1, ARCH=gfx950, final ISA inspected); it has
not been executed on a gfx950 device by this project. `tests/kernels/test_flydsl_gfx950.py`
runs it against the reference on an MI355X (see README, "gfx950 backend (FlyDSL)").

Math (docs/contract.md §1), per query row i and sampled position j = m * stride of its window:
    dot[h]      = q[i, h, :] . k[j, :]                    one scaled FP4 MFMA per 16 heads
    t[h]        = fl32(w[i, h] * relu(dot[h]))            relu(x) = (x < 0 ? 0 : x), NaN kept
    acc         = 0;  for h = 0 .. 63:  acc = fl32(acc + t[h])      (the reference's order)
    score[i, j] = fl32(acc * fl32(weight_scale))
The head sum runs in exactly the reference backend's float32 order (h ascending, one rounding
per product and per addition; no fused multiply-add: the ISA test checks that the kernel has
no v_fma/v_fmac instruction). Lane group G (lanes 16G .. 16G+15) of a wave holds heads
16G .. 16G+15 of 16 keys; the running sum is handed from group G-1 to group G by a lane
shuffle, so group 3 ends with the whole sum of 64 heads, added in order.

Precision bound. v_mfma_scale_f32_16x16x128_f8f6f4 with cbsz = blgp = 4 (E2M1 x E2M1) and one
UE8M0 scale per 32-element block of each operand forms every product exactly (two E2M1 values
are multiples of 0.5 up to 6, so a product is a multiple of 0.25 up to 36) and sums each block
of 32 exactly (|sum| <= 1152, i.e. < 2^13 quarter units). The four block sums, each times its
power of two 2^(sq_g + sk_g - 254), are accumulated in float32. That accumulation is exact, so
the dot equals the reference's exact float64 dot rounded once to float32 (it is exact there
too), whenever the exponents sq_g + sk_g of the four blocks span at most 9 binades: every partial
sum is then an integer multiple of the smallest block unit below 2^(13 + 9 + 2) = 2^24. MXFP4
data of real activations spans a few binades; beyond 9 the dot may differ from the reference
by float32 rounding of the block partials (a few ulp of the largest block), and the head sum is
otherwise bit-identical. A dot whose magnitude exceeds float32 (scale exponents near 2^127)
becomes inf (the row is flagged NONFINITE) where the reference rounds a finite float64 to inf
too. Denormal block results (scales near 2^-127) may be flushed by the hardware.

MFMA operand layout (16x16x128, wave64; AMD CDNA4 ISA guide): lane l supplies row (A) or
column (B) l % 16 and K elements [32 * (l // 16), +32) as 16 bytes (4 dwords) of packed E2M1,
with its block's scale in bits [7:0] of its scale register; the result lane l holds
D[4 * (l // 16) + r][l % 16], r = 0..3. MFMA g (g = 0..3) maps A row 4G + r to head
16G + 4g + r, so the result lane of group G holds heads 16G + 4g + r: its 16 heads in order.

Tiling: one wave (64 lanes) per query row, WAVES_PER_BLOCK rows per workgroup; the query row
(64 heads x 16 bytes per lane, 4 scale words) and its 16 weights stay in registers. grid.y
splits the sampled positions into chunks of TILES_PER_CHUNK tiles of KEYS_PER_TILE keys; a
tile gathers 16 keys through the block table: position j of sequence b is token t = j % 64 of
page p = block_table[b, j // 64], and lane l (key l % 16 of the tile, group G = l // 16) loads
that key's 16 value bytes of group G as 4 words and its scale byte of group G.

Cache formats (docs/cache-layouts.md), read in place; CACHE_FORMAT is a compile-time constant
(one binary per (SCAN, CACHE_FORMAT)), the page strides are launch arguments; key_addressing.py
holds the address arithmetic (the host tests evaluate the same functions):
    "litetopk"  one tensor, pages value_page_stride bytes apart (any multiple of 4 >= 4352):
                value word p * value_page_words + t * 16 + G * 4, scale byte
                p * scale_page_stride + 4096 + t * 4 + G (scale_page_stride = value_page_stride)
    "aiter"     kv_cache [pages, 1, 4, 64, 16] and kv_scale [pages, 1, 4, 64], each with its own
                page stride: value word p * value_page_words + G * 256 + t * 4, scale byte
                p * scale_page_stride + G * 64 + (t % 16) * 4 + t // 16
Every page x stride product and every address is int64.

Epilogue, SCAN = False (dense): score[i, j] is stored to out[i * out_cols + j] (the host fills
-inf); SCAN = True (fused filter): key = ordered_bits(score) * 2^32 + (2^32 - 1 - j)
(keys.make_keys); a finite key >= the row's current threshold takes a slot by a 64-bit
atomic add on the row counter, is written when slot < capacity, and counts one in the row's
histogram of HIST_BINS bins over ordered score bits: bin = clamp((ord - base) >> shift, 0, 63),
base = the row's input threshold score bits and shift = HIST_SHIFT (or base = -2^31 and shift
= HIST_SHIFT_OPEN for a row without threshold). After each chunk the wave takes the suffix sums
of the histogram; if bins >= b hold at least K appended keys, at least K keys of the window
have score bits >= base + (b << shift), so the threshold is raised (atomic max, only ever up)
to (base + (b << shift)) * 2^32, which is <= the row's true K-th best key. A NaN/inf score of
the window sets the row's nonfinite flag. Positions are j = m * stride (m integer), so the
calibration sample uses the same kernel.

Limits: H = 64, D = 128 (docs/contract.md §1); rows < 2^31 / 64; positions < 2^31; pages and every
address int64; the value pages 4-byte aligned (start and stride; key_addressing.cache_operands
raises InputError otherwise), scale pages at any byte stride. The kernel assumes validated input
(validation.py): windows inside the block table and live pages inside the cache.
"""

from __future__ import annotations

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl._mlir.extras import types as T
from flydsl.expr import gpu, rocdl
from flydsl.expr import llvm as fxllvm
from flydsl.expr.enum import AtomicOrdering
from flydsl.expr.typing import Vector

from ..cache_layout import NUM_HEADS, PAGE_SIZE, VALUE_BYTES
from .key_addressing import KEY_ADDRESSING, key_scale_byte, key_value_word

HEAD_WORDS = VALUE_BYTES // 4  # 64 bytes of packed E2M1 per head vector, as int32 words
WAVE = 64
KEYS_PER_TILE = 16
TILES_PER_CHUNK = 16
KEYS_PER_CHUNK = KEYS_PER_TILE * TILES_PER_CHUNK
WAVES_PER_BLOCK = 4
HIST_BINS = 64
HIST_SHIFT = 18  # bins of 2^18 ulps (1/32 of a binade) above a calibrated threshold
HIST_SHIFT_OPEN = 26  # 64 bins over the whole int32 range of ordered bits (no threshold)
E2M1_FORMAT = 4  # cbsz / blgp code of FP4 E2M1 in the scaled MFMA
LOW32 = 0xFFFFFFFF
INT32_MIN = -(2**31)


def _load(ptr, dtype, count=None):
    return fxllvm.generic_load(ptr, dtype=dtype, count=count)


def _load_relaxed(ptr, dtype):
    """An atomic (monotonic) load: re-read on every use, never hoisted out of the tile loop."""
    return fxllvm.generic_load(ptr, dtype=dtype, memory_order=AtomicOrdering.Monotonic, syncscope="agent")


@flyc.kernel
def score_fp4_flydsl_kernel(
    q_words: fx.Tensor,  # int32 [rows * 64 * 16]: q_fp4 viewed as words
    q_scale_words: fx.Tensor,  # int32 [rows * 64]: the 4 scale bytes of a head vector
    kv_value_words: fx.Tensor,  # int32: the cache's value bytes as words (key_addressing.cache_operands)
    kv_scale_bytes: fx.Tensor,  # uint8: the cache's scale bytes (key_addressing.cache_operands)
    block_table: fx.Tensor,  # int32 [batch * max_pages]
    weights: fx.Tensor,  # float32 [rows * 64]
    row_to_batch: fx.Tensor,  # int32 [rows]
    starts: fx.Tensor,  # int32 [rows]
    ends: fx.Tensor,  # int32 [rows]
    out: fx.Tensor,  # dense: float32 [rows * out_cols]; scan: int64 keys [rows * capacity]
    thresholds_in: fx.Tensor,  # int64 [rows] (scan; unread in dense mode)
    thresholds: fx.Tensor,  # int64 [rows], starts equal to thresholds_in, only raised (scan)
    appended: fx.Tensor,  # int64 [rows] (scan)
    histogram: fx.Tensor,  # int32 [rows * 64] (scan)
    nonfinite: fx.Tensor,  # int32 [rows]
    num_rows: fx.Int32,
    max_pages: fx.Int32,
    value_page_words: fx.Int64,  # value page stride / 4
    scale_page_stride: fx.Int64,  # scale page stride, bytes
    out_cols: fx.Int64,  # dense: columns of out; scan: capacity
    stride: fx.Int32,
    topk: fx.Int32,
    weight_scale: fx.Float32,
    SCAN: fx.Constexpr[bool],
    CACHE_FORMAT: fx.Constexpr[str],  # "litetopk" or "aiter" (key_addressing.KEY_ADDRESSING)
):
    tid = gpu.thread_idx.x
    lane = tid % WAVE
    row = gpu.block_idx.x * WAVES_PER_BLOCK + tid // WAVE
    row_ok = row < num_rows
    row_c = row_ok.select(row, 0)
    row64 = fx.Int64(row_c)
    key_lane = lane % KEYS_PER_TILE  # the key (B column) of this lane in a tile
    group = lane // KEYS_PER_TILE  # K block of the operands; head group of the result
    group64 = fx.Int64(group)
    addressing = KEY_ADDRESSING[CACHE_FORMAT]

    # The query row stays in registers: operand and scale of MFMA g for this lane.
    a_head_base = (key_lane // 4) * 16 + (key_lane % 4)  # + 4 g: head of A row (lane % 16)
    q_ops = []
    q_scales = []
    for g in fx.range_constexpr(4):
        head = fx.Int64(a_head_base + 4 * g)
        word = (row64 * NUM_HEADS + head) * HEAD_WORDS + fx.Int64(group) * 4
        q_ops.append(_load(fx.get_iter(q_words) + word, fx.Int32, 4))
        sword = _load(fx.get_iter(q_scale_words) + (row64 * NUM_HEADS + head), fx.Int32)
        q_scales.append((sword >> (group * 8)) & 0xFF)
    w_regs = []
    for k in fx.range_constexpr(16):  # heads 16 G + k, k = 4 g + r
        w_regs.append(_load(fx.get_iter(weights) + (row64 * NUM_HEADS + fx.Int64(group * 16 + k)), fx.Float32))

    start = _load(fx.get_iter(starts) + row64, fx.Int32)
    end = _load(fx.get_iter(ends) + row64, fx.Int32)
    end = row_ok.select(end, start)
    batch64 = fx.Int64(_load(fx.get_iter(row_to_batch) + row64, fx.Int32))
    m_first = (start + stride - 1) // stride  # sampled positions j = m * stride in [start, end)
    m_end = (end + stride - 1) // stride
    chunk_lo = gpu.block_idx.y * KEYS_PER_CHUNK
    m_lo = fx.max(m_first, chunk_lo)
    m_hi = fx.min(m_end, chunk_lo + KEYS_PER_CHUNK)
    num_tiles = fx.max((m_hi - m_lo + KEYS_PER_TILE - 1) // KEYS_PER_TILE, 0)

    if fx.const_expr(SCAN):
        threshold_in = _load(fx.get_iter(thresholds_in) + row64, fx.Int64)
        open_row = threshold_in == fx.Int64(-(2**63))
        hist_base = open_row.select(fx.Int64(INT32_MIN), threshold_in >> 32)
        hist_shift = open_row.select(fx.Int64(HIST_SHIFT_OPEN), fx.Int64(HIST_SHIFT))

    for t in range(num_tiles):
        m = m_lo + t * KEYS_PER_TILE + key_lane
        valid = m < m_hi
        pos = valid.select(m, m_lo) * stride  # invalid lanes re-read a valid key
        pos64 = fx.Int64(pos)
        page = fx.Int64(
            _load(fx.get_iter(block_table) + (batch64 * fx.Int64(max_pages) + pos64 // PAGE_SIZE), fx.Int32)
        )
        token = pos64 % PAGE_SIZE
        value_word = key_value_word(addressing, page, token, group64, value_page_words)
        k_op = _load(fx.get_iter(kv_value_words) + value_word, fx.Int32, 4)
        scale_byte = key_scale_byte(addressing, page, token, group64, scale_page_stride)
        k_scale = fx.Int32(_load(fx.get_iter(kv_scale_bytes) + scale_byte, fx.Int8)) & 0xFF

        # t[h] = w[h] * relu(dot[h]) for this lane's 16 heads 16 G + 4 g + r, in head order.
        terms = []
        for g in fx.range_constexpr(4):
            zero = Vector.filled(4, 0.0, fx.Float32)
            dots = rocdl.mfma_scale_f32_16x16x128_f8f6f4(
                T.vector(4, T.f32()),
                [q_ops[g], k_op, zero, E2M1_FORMAT, E2M1_FORMAT, 0, q_scales[g], 0, k_scale],
            )
            dots = Vector(dots, (4,), fx.Float32)
            for r in fx.range_constexpr(4):
                d = dots[r]
                relu = (d < 0.0).select(fx.Float32(0.0), d)
                terms.append(w_regs[4 * g + r] * relu)
        # Running head sum, handed from lane group G - 1 to G (heads in ascending order).
        acc = fx.Float32(0.0)
        for g_owner in fx.range_constexpr(4):
            if fx.const_expr(g_owner > 0):
                acc = fx.Float32(gpu.shuffle_idx(acc, key_lane + (g_owner - 1) * KEYS_PER_TILE, WAVE))
            for k in fx.range_constexpr(16):
                acc = acc + terms[k]
        score = acc * weight_scale

        owner = group == 3  # lanes 48..63 hold the whole sum of their key
        finite = (score - score) == 0.0  # false for NaN and +-inf
        if owner & valid & ~finite:
            fxllvm.generic_store(fx.get_iter(nonfinite) + row64, fx.Int32(1))
        if fx.const_expr(not SCAN):
            if owner & valid:
                # column m = pos / stride
                fxllvm.generic_store(fx.get_iter(out) + (row64 * out_cols + fx.Int64(m)), score)
        if fx.const_expr(SCAN):
            plus = (score == 0.0).select(fx.Float32(0.0), score)  # -0.0 ties +0.0
            bits = plus.bitcast(fx.Int32)
            ordered = fx.Int64((bits < 0).select(bits ^ 0x7FFFFFFF, bits))
            key = ordered * (2**32) + (fx.Int64(LOW32) - pos64)
            current = _load_relaxed(fx.get_iter(thresholds) + row64, fx.Int64)
            if owner & valid & finite & (key >= current):
                taken = fxllvm.atomic_add(fx.get_iter(appended) + row64, fx.Int64(1), syncscope="agent")
                if taken < out_cols:
                    fxllvm.generic_store(fx.get_iter(out) + (row64 * out_cols + taken), key)
                hist_bin = fx.min(fx.max((ordered - hist_base) >> hist_shift, fx.Int64(0)), fx.Int64(HIST_BINS - 1))
                fxllvm.atomic_add(
                    fx.get_iter(histogram) + (row64 * HIST_BINS + hist_bin), fx.Int32(1), syncscope="agent"
                )

    if fx.const_expr(SCAN):
        if num_tiles > 0:
            # Suffix sums over the bins (lane b holds bin b), then the highest bin whose
            # suffix holds at least K appended keys.
            suffix = fx.Int32(_load_relaxed(fx.get_iter(histogram) + (row64 * HIST_BINS + fx.Int64(lane)), fx.Int32))
            for step in fx.range_constexpr(6):
                dist = 1 << step
                other = fx.Int32(gpu.shuffle_down(suffix, dist, WAVE))
                suffix = (lane + dist < WAVE).select(suffix + other, suffix)
            best = (suffix >= topk).select(lane, -1)
            for step in fx.range_constexpr(6):
                best = fx.max(best, fx.Int32(gpu.shuffle_xor(best, 1 << step, WAVE)))
            if (lane == 0) & (best > 0):
                raised = (hist_base + (fx.Int64(best) << hist_shift)) * (2**32)
                fxllvm.atomic_max(fx.get_iter(thresholds) + row64, raised, syncscope="agent")


@flyc.jit
def score_fp4_flydsl(
    q_words: fx.Tensor,
    q_scale_words: fx.Tensor,
    kv_value_words: fx.Tensor,
    kv_scale_bytes: fx.Tensor,
    block_table: fx.Tensor,
    weights: fx.Tensor,
    row_to_batch: fx.Tensor,
    starts: fx.Tensor,
    ends: fx.Tensor,
    out: fx.Tensor,
    thresholds_in: fx.Tensor,
    thresholds: fx.Tensor,
    appended: fx.Tensor,
    histogram: fx.Tensor,
    nonfinite: fx.Tensor,
    num_rows: fx.Int32,
    max_pages: fx.Int32,
    value_page_words: fx.Int64,
    scale_page_stride: fx.Int64,
    out_cols: fx.Int64,
    stride: fx.Int32,
    topk: fx.Int32,
    weight_scale: fx.Float32,
    grid_x: fx.Int32,
    grid_y: fx.Int32,
    SCAN: fx.Constexpr[bool],
    CACHE_FORMAT: fx.Constexpr[str],
    stream: fx.Stream = fx.Stream(None),
):
    """Launcher: grid (ceil(rows / WAVES_PER_BLOCK), chunks of sampled positions), 256 threads;
    one binary per (SCAN, CACHE_FORMAT). The cache operands and page strides come from
    key_addressing.cache_operands."""
    score_fp4_flydsl_kernel(
        q_words,
        q_scale_words,
        kv_value_words,
        kv_scale_bytes,
        block_table,
        weights,
        row_to_batch,
        starts,
        ends,
        out,
        thresholds_in,
        thresholds,
        appended,
        histogram,
        nonfinite,
        num_rows,
        max_pages,
        value_page_words,
        scale_page_stride,
        out_cols,
        stride,
        topk,
        weight_scale,
        SCAN,
        CACHE_FORMAT,
    ).launch(grid=(grid_x, grid_y, 1), block=(WAVE * WAVES_PER_BLOCK, 1, 1), stream=stream)
