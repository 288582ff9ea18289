"""Fused FP4 scoring straight from the paged cache, over a schedule that splits keys (Triton; the decode
path: sm_90 wgmma, any CUDA GPU, and the interpreter).

Why. A decode-shaped call reads each key once (next_n = 1-4 rows a sequence share it): decoding the whole
cache to int8 first (operands.py's keys, 2 bytes a value written and read back) triples the bytes that
cross HBM, and one program a row group (schedule.py) leaves the SMs idle. Here a program loads a page's
packed E2M1 values and UE8M0 scales (68 bytes a key, read once), builds the exact int8 operand in
registers with the block exponents folded in, and scores it against every row of its group on the tensor
cores; the programs share the key tiles of all groups evenly (split_schedule.py).

Math: operands.py's exact integer scheme, per key vector of 128 elements:
    x[e] = 2^(m - 128) * (lo[e] + 16 hi[e]),   lo[e] = c[e] << d[g] (d <= 3), hi[e] = c[e] << (d[g] - 4) (4 <= d <= 7)
with c = 2 * E2M1 in -12..12, m the smallest scale byte of the nonzero groups, d[g] = s[g] - m. A key
tile whose keys all have d <= 3 (the common case) has no hi operand. The product in the tensor cores
is int8 x int8 -> int32, exact; the epilogue is scoring.py's, the same float32 operations:
    score[i, j] = fl32( fl32( sum_h fl32(wq[i,h] * r) ) * rowfac[i] * kfac[j] ),  r = relu(int_dot) * 2^-149
so the precision bound is scoring.py's (70 * 2^-24 * |weight_scale| * sum_h |w| relu(q.k)); the head sum
runs in this kernel's own order (tl.sum over the MMA layout at BLOCK_ROWS rows a group).

The int8 operand in registers. Each program instance of the E2M1 decode takes 4 packed bytes (8 values,
one scale group: 16-byte aligned groups) and gives two int8x4 words, values 0-3 and 4-7 of the 8 (the
operand's K order is a permutation within each group of 8, applied to the query operand too: the dot is
split in two halves of K = 64, "a" and "b", which sum to the full dot). On the GPU it is 10 integer
instructions for 8 values (E2M1_ASM: two byte permutes a word, the sign as a second permute of the
magnitude table, the shift by d folded into the table); the interpreter runs its twin in tl arithmetic
(_e2m1_halves_tl), the same bits (tests/kernels/test_paged_scoring.py compiles both).

Tiling: BLOCK_KEYS = 64 keys (one page) on the MMA's M side; N = 64 heads x BLOCK_ROWS rows, column
n = head * BLOCK_ROWS + lane. A program walks its share [t0, t1) of the schedule's global key tiles;
where the share crosses groups it loads the next group's queries (two K = 64 halves) and rows.
Modes (one kernel, constexpr): DENSE writes scores float32 [rows, out_width] (column c = position
c * position_stride: STRIDED is the calibration sample), -inf outside each window; every group has the
same ceil(out_width / 64) tiles. Scan (scoring.py's epilogue): a score >= the row's threshold takes a
slot with one relaxed atomic on the row's counter and its ordering key is stored if the slot is below
capacity (the counter keeps counting: the overflow certificate); passing scores are counted in the row's
histogram. Several programs scan one row: the histogram, the counter and the raised threshold `raised`
live in global memory, shared (set up by the schedule's launch: counts zeroed, raised -inf); a program
takes its rows' thresholds and histogram ranges from the calibration's keys itself (scoring's
_histogram_range: no preparing launch); every REFRESH tiles it takes max(its threshold, raised), raises it
from the histogram (scoring._raised_threshold: a lower bound of the row's K-th best from keys any program
counted) and publishes it with an atomic max. Every threshold any program uses is a lower bound of the
row's K-th best, so no true top-K key is dropped and the certificate holds as for one program a row.
Faults (one set of flags a launch, split_schedule.FAULT_SETS; the programs of a row only ever store 1):
a NaN / inf score in a window (probe), a key in a window whose groups span more than 7 binades (UNSUPPORTED).
Limits: D = 128, 64 heads, BLOCK_ROWS 1 or 2, PAGE_SIZE = BLOCK_KEYS = 64.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..cache_layout import PAGE_SIZE
from ..keys import NO_KEY_C, _ordering_keys
from .operands import _e2m1_times_two
from .scoring import SUBNORMAL_UNIT, _histogram_range, _raised_threshold

BLOCK_KEYS = PAGE_SIZE  # a key tile is one page
FAULT_SAMPLE, FAULT_SCAN, FAULT_DENSE = 0, 1, 2  # the launch kinds' sets of fault words (split_schedule.py)

# Two int8x4 words of 8 E2M1 values (one 32-bit word of 4 packed bytes, $2; the group's shift d in the
# low byte of $3, 0..3): $0 = values 0-3, $1 = values 4-7, each 2 * E2M1 << d. prmt's selector nibble
# (bits 0-2: a byte of the table, bit 3: replicate that byte's sign bit) is the E2M1 code itself: the
# magnitude table's bytes are < 128, so a negative code reads 0 from it, and the code with its sign bit
# flipped reads the magnitude of the negative codes only; -n per byte is (0x80808080 - n) ^ 0x80808080
# (n <= 96: no borrow between bytes), ORed with the positive magnitudes.
E2M1_ASM = tl.constexpr("""
{
.reg .b32 sh, t0, t1, w, p, n, k80;
and.b32 sh, $3, 7;
mov.b32 t0, 0x03020100;
mov.b32 t1, 0x0C080604;
shl.b32 t0, t0, sh;
shl.b32 t1, t1, sh;
mov.b32 k80, 0x80808080;
prmt.b32 p, t0, t1, $2;
xor.b32 w, $2, 0x8888;
prmt.b32 n, t0, t1, w;
sub.u32 n, k80, n;
xor.b32 n, n, k80;
or.b32 $0, p, n;
shr.u32 w, $2, 16;
prmt.b32 p, t0, t1, w;
xor.b32 w, w, 0x8888;
prmt.b32 n, t0, t1, w;
sub.u32 n, k80, n;
xor.b32 n, n, k80;
or.b32 $1, p, n;
}
""")


@triton.jit
def _e2m1_halves_asm(packed, shift):
    """(a, b) int8 [BLOCK_KEYS, 64]: the int8 values 2 * E2M1 << shift of packed uint8 [BLOCK_KEYS, 64]
    (shift uint8, the same for the 4 bytes of each word); a[4i + c] is value 8i + c of the key, b[4i + c]
    value 8i + 4 + c (module docstring)."""
    return tl.inline_asm_elementwise(
        E2M1_ASM, "=r,=r,r,r", [packed, shift], dtype=(tl.int8, tl.int8), is_pure=True, pack=4
    )


@triton.jit
def _e2m1_halves_tl(packed, shift, BLOCK_KEYS: tl.constexpr):
    """_e2m1_halves_asm in tl arithmetic (the interpreter's; the same values)."""
    p = packed.to(tl.int32)
    s = shift.to(tl.int32)
    values = tl.join(_e2m1_times_two(p & 0xF) << s, _e2m1_times_two(p >> 4) << s)  # [BK, 64, 2]: value 2 byte + nibble
    values = tl.reshape(values, [BLOCK_KEYS, 16, 2, 2, 2])  # byte 4i + 2 jhi + jlo, nibble: (i, jhi, jlo, nibble)
    a, b = tl.split(tl.permute(values, [0, 1, 3, 4, 2]))  # jhi = 0: values 8i + 0..3; jhi = 1: 8i + 4..7
    return tl.reshape(a, [BLOCK_KEYS, 64]).to(tl.int8), tl.reshape(b, [BLOCK_KEYS, 64]).to(tl.int8)


@triton.jit
def _e2m1_halves(packed, shift, BLOCK_KEYS: tl.constexpr, USE_ASM: tl.constexpr):
    if USE_ASM:
        return _e2m1_halves_asm(packed, shift.to(tl.uint8))
    else:
        return _e2m1_halves_tl(packed, shift, BLOCK_KEYS)


@triton.jit
def _key_exponents(packed, scales, BLOCK_KEYS: tl.constexpr):
    """Per key of a tile (packed uint8 [BK, 64], scales int32 [BK, 4]): _exponents_of_groups of its
    groups' nonzero test (a nonzero magnitude among a group's 16 bytes)."""
    nonzero_bytes = ((packed.to(tl.int32) & 0x77) != 0).to(tl.int32)
    return _exponents_of_groups(tl.max(tl.reshape(nonzero_bytes, [BLOCK_KEYS, 4, 16]), axis=2) > 0, scales)


@triton.jit
def _exponents_of_groups(nonzero, scales):
    """(d int32 [BK, 4] the groups' shifts, spread [BK], kfac float32 [BK] = 2^(m - 127), NaN for a NaN
    scale) of keys whose groups are `nonzero` (bool [BK, 4]) with `scales` (int32 [BK, 4]), as operands.py's
    _decode_vectors computes them: m the smallest scale of the nonzero groups with a finite scale, 127 for
    none. Three reductions over a key's groups (both paged kernels: the Gluon one's groups are 4 lanes)."""
    counted = nonzero & (scales != 255)
    m = tl.min(tl.where(counted, scales, 255), axis=1)  # 255 only where no group counts (a counted one is < 255)
    m = tl.where(m < 255, m, 127)
    d = tl.where(counted, scales - m[:, None], 0)
    spread = tl.max(d, axis=1)
    nan_scale = tl.max((scales == 255).to(tl.int32), axis=1) > 0
    kfac_bits = tl.where(m >= 1, m << 23, 4194304)  # 2^-127 is the subnormal 2^22 * 2^-149
    kfac_bits = tl.where(nan_scale, 0x7FC00000, kfac_bits)
    return d, spread, kfac_bits.to(tl.float32, bitcast=True)


@triton.jit
def _bytes_of_groups(d, BLOCK_KEYS: tl.constexpr):
    """[BK, 4] per group -> [BK, 64] per packed byte (group g: bytes 16g..16g + 15)."""
    return tl.reshape(tl.broadcast_to(d[:, :, None], [BLOCK_KEYS, 4, 16]), [BLOCK_KEYS, 64])


@triton.jit
def _score_keys(
    pos,
    live,
    b64,
    bt_stride,
    block_table_ptr,
    num_pages,
    values_ptr,
    scales_ptr,
    value_page_stride,
    scale_page_stride,
    q_a,
    q_b,
    q_hi_a,
    q_hi_b,
    q_wide,
    wq,
    rowfac,
    BLOCK_KEYS: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    H: tl.constexpr,
    PAGE: tl.constexpr,
    TOKEN_STRIDE: tl.constexpr,
    GROUP_STRIDE: tl.constexpr,
    SCALE_OFFSET: tl.constexpr,
    SCALE_GROUP_STRIDE: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    USE_ASM: tl.constexpr,
):
    """(scores float32 [BK, BLOCK_ROWS], unsupported bool [BK]) of the keys at positions `pos` (int32 [BK])
    of sequence b64 (those not `live` read nothing and score 0)."""
    offs_byte = tl.arange(0, 64)
    offs_group = tl.arange(0, 4)
    page = tl.load(block_table_ptr + b64 * bt_stride + pos // PAGE, mask=live, other=-1).to(tl.int64)
    live = live & (page >= 0) & (page < num_pages)
    page = tl.where(live, page, 0)
    token = (pos % PAGE).to(tl.int64)
    value_at = page * value_page_stride + token * TOKEN_STRIDE
    if GROUP_STRIDE == 16:  # ours: a key's 64 bytes are contiguous
        in_key = offs_byte
    else:  # AITER: 4 groups of 16 contiguous bytes, GROUP_STRIDE apart
        in_key = tl.max_contiguous(tl.multiple_of((offs_byte // 16) * GROUP_STRIDE + offs_byte % 16, 16), 16)
    packed = tl.load(values_ptr + value_at[:, None] + in_key[None, :], mask=live[:, None], other=0)
    if INTERLEAVED:  # AITER: token t's scales at (t % 16) * 4 + t // 16 of each group's 64 bytes
        token_scale = (token % 16) * 4 + token // 16
    else:
        token_scale = token * 4
    scale_at = page * scale_page_stride + SCALE_OFFSET + token_scale
    scales = tl.load(
        scales_ptr + scale_at[:, None] + (offs_group * SCALE_GROUP_STRIDE)[None, :], mask=live[:, None], other=127
    ).to(tl.int32)
    d, spread, kfac = _key_exponents(packed, scales, BLOCK_KEYS)
    d_bytes = _bytes_of_groups(d, BLOCK_KEYS)
    if q_wide | (tl.max(spread, axis=0) >= 4):  # rare: a hi operand on either side (operands.py)
        p_lo = tl.where(d_bytes <= 3, packed, 0)
        p_hi = tl.where((d_bytes >= 4) & (d_bytes <= 7), packed, 0)
        lo_a, lo_b = _e2m1_halves(p_lo, tl.minimum(d_bytes, 3), BLOCK_KEYS, USE_ASM)
        hi_a, hi_b = _e2m1_halves(p_hi, tl.minimum(tl.maximum(d_bytes - 4, 0), 3), BLOCK_KEYS, USE_ASM)
        acc = tl.dot(hi_a, q_hi_a, out_dtype=tl.int32)
        acc = tl.dot(hi_b, q_hi_b, acc, out_dtype=tl.int32) * 16
        acc = tl.dot(hi_a, q_a, acc, out_dtype=tl.int32)
        acc = tl.dot(hi_b, q_b, acc, out_dtype=tl.int32)
        acc = tl.dot(lo_a, q_hi_a, acc, out_dtype=tl.int32)
        acc = tl.dot(lo_b, q_hi_b, acc, out_dtype=tl.int32) * 16
        acc = tl.dot(lo_a, q_a, acc, out_dtype=tl.int32)
        acc = tl.dot(lo_b, q_b, acc, out_dtype=tl.int32)
        relu_sub = tl.maximum(acc.to(tl.float32), 0.0) * SUBNORMAL_UNIT
    else:
        k_a, k_b = _e2m1_halves(packed, d_bytes, BLOCK_KEYS, USE_ASM)
        acc = tl.dot(k_a, q_a, out_dtype=tl.int32)
        acc = tl.dot(k_b, q_b, acc, out_dtype=tl.int32)
        # 0 <= relu(x) < 2^21: its bits read as float32 are relu(x) * 2^-149 exactly (scoring.py)
        relu_sub = tl.maximum(acc, 0).to(tl.float32, bitcast=True)
    terms = relu_sub * wq[None, :]
    scores = tl.sum(tl.reshape(terms, [BLOCK_KEYS, H, BLOCK_ROWS]), axis=1)
    scores = scores * rowfac[None, :] * kfac[:, None]
    return scores, live & (spread >= 8)


@triton.jit
def _query_row(row, query_row_ptr, INDIRECT: tl.constexpr):
    """The row of the query operands (q_lo, q_hi, wq, rowfac, q_wide) that row `row` reads: itself, or with
    INDIRECT query_row[row] (a subset problem's rows read their parent's operands: no gather)."""
    if INDIRECT:
        return tl.load(query_row_ptr + row)
    else:
        return row


@triton.jit
def _group_queries(
    group,
    group_row_ptr,
    group_count_ptr,
    q_lo_ptr,
    q_hi_ptr,
    wq_ptr,
    rowfac_ptr,
    q_wide_ptr,
    query_row_ptr,
    starts_ptr,
    ends_ptr,
    BLOCK_ROWS: tl.constexpr,
    H: tl.constexpr,
    D: tl.constexpr,
    INDIRECT: tl.constexpr,
):
    """Group `group`'s rows and query operands: (rows int64 [BLOCK_ROWS] (0 past its count), row_ok,
    starts, ends, q_a, q_b, q_hi_a, q_hi_b int8 [64, N] (the halves of the K order: module docstring),
    q_wide (a row needs q_hi), wq float32 [N], rowfac float32 [BLOCK_ROWS])."""
    N: tl.constexpr = BLOCK_ROWS * H
    first = tl.load(group_row_ptr + group)
    count = tl.load(group_count_ptr + group)
    lanes = tl.arange(0, BLOCK_ROWS)
    row_ok = lanes < count
    rows = tl.where(row_ok, first + lanes, 0).to(tl.int64)
    q_rows = _query_row(rows, query_row_ptr, INDIRECT).to(tl.int64)
    starts = tl.load(starts_ptr + rows, mask=row_ok, other=0)
    ends = tl.load(ends_ptr + rows, mask=row_ok, other=0)
    rowfac = tl.load(rowfac_ptr + q_rows, mask=row_ok, other=0.0)
    offs_n = tl.arange(0, N)
    n_ok = (offs_n % BLOCK_ROWS) < count
    n_rows = _query_row((first + tl.where(n_ok, offs_n % BLOCK_ROWS, 0)).to(tl.int64), query_row_ptr, INDIRECT)
    n_vec = n_rows.to(tl.int64) * H + offs_n // BLOCK_ROWS
    k = tl.arange(0, 64)
    dim_a = 8 * (k // 4) + k % 4
    at_a = q_lo_ptr + n_vec[None, :] * D + dim_a[:, None]
    q_a = tl.load(at_a, mask=n_ok[None, :], other=0)
    q_b = tl.load(at_a + 4, mask=n_ok[None, :], other=0)
    q_wide = tl.max(tl.load(q_wide_ptr + q_rows, mask=row_ok, other=0).to(tl.int32), axis=0) != 0
    hi_a = q_hi_ptr + n_vec[None, :] * D + dim_a[:, None]
    q_hi_a = tl.load(hi_a, mask=n_ok[None, :] & q_wide, other=0)
    q_hi_b = tl.load(hi_a + 4, mask=n_ok[None, :] & q_wide, other=0)
    wq = tl.load(wq_ptr + n_vec, mask=n_ok, other=0.0)
    return rows, row_ok, starts, ends, q_a, q_b, q_hi_a, q_hi_b, q_wide, wq, rowfac


@triton.jit
def _program_share(pid, num_programs, groups_ptr, tile_offset_ptr, out_width, BK: tl.constexpr, DENSE: tl.constexpr):
    """(t, t_end, group, group_tiles) of program pid: its share [t, t_end) of the schedule's global tiles
    (an equal contiguous part), the group holding tile t, and (dense mode) every group's tiles: the columns'
    (scan mode: 0; the groups' tiles are the schedule's prefix). Both paged kernels start here."""
    groups = tl.load(groups_ptr)
    if DENSE:
        group_tiles = tl.cdiv(out_width, BK)
        total = groups * group_tiles
    else:
        group_tiles = 0
        total = tl.load(tile_offset_ptr + groups)
    share = tl.cdiv(total, num_programs)
    t = pid * share
    t_end = tl.minimum(t + share, total)
    if DENSE:
        group = t // tl.maximum(group_tiles, 1)
    else:
        group = _first_group(t, tile_offset_ptr, groups)
    return t, t_end, group, group_tiles


@triton.jit
def _first_group(t, tile_offset_ptr, groups):
    """The group whose global tiles hold tile t (the last g with tile_offset[g] <= t), by bisection."""
    lo = 0
    hi = groups  # tile_offset[groups] = total > t
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if tl.load(tile_offset_ptr + mid) <= t:
            lo = mid
        else:
            hi = mid
    return lo


@triton.jit
def score_fp4_paged_kernel(
    values_ptr,
    scales_ptr,
    value_page_stride,
    scale_page_stride,
    num_pages,  # the cache (KVCache), in place
    block_table_ptr,
    bt_stride,
    rtb_ptr,  # int32 [B, max_pages]; [rows]
    q_lo_ptr,
    q_hi_ptr,
    wq_ptr,
    rowfac_ptr,
    q_wide_ptr,
    query_row_ptr,  # operands.py's query outputs; INDIRECT
    groups_ptr,
    group_row_ptr,
    group_count_ptr,
    group_span_ptr,
    tile_offset_ptr,  # split_schedule.py
    starts_ptr,
    ends_ptr,  # int32 [rows] windows
    out_ptr,
    out_width,
    position_stride,  # dense: float32 [rows, out_width]
    thr_keys_ptr,
    ceil_keys_ptr,
    hist_ptr,
    buf_ptr,
    capacity,
    appended_ptr,
    raised_ptr,  # scan
    nonfinite_ptr,
    unsupported_ptr,  # int8 [rows] fault flags (set to 1)
    num_programs,
    TOPK: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    DENSE: tl.constexpr,
    STRIDED: tl.constexpr,
    REFRESH: tl.constexpr,
    NB: tl.constexpr,
    H: tl.constexpr,
    D: tl.constexpr,
    PAGE: tl.constexpr,
    TOKEN_STRIDE: tl.constexpr,
    GROUP_STRIDE: tl.constexpr,
    SCALE_OFFSET: tl.constexpr,
    SCALE_GROUP_STRIDE: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    USE_ASM: tl.constexpr,
    INDIRECT: tl.constexpr,
    HAS_CEILINGS: tl.constexpr,
):
    BK: tl.constexpr = 64
    offs_k = tl.arange(0, BK)
    t, t_end, group, group_tiles = _program_share(
        tl.program_id(0), num_programs, groups_ptr, tile_offset_ptr, out_width, BK, DENSE
    )
    while t < t_end:
        rows, row_ok, starts, ends, q_a, q_b, q_hi_a, q_hi_b, q_wide, wq, rowfac = _group_queries(
            group,
            group_row_ptr,
            group_count_ptr,
            q_lo_ptr,
            q_hi_ptr,
            wq_ptr,
            rowfac_ptr,
            q_wide_ptr,
            query_row_ptr,
            starts_ptr,
            ends_ptr,
            BLOCK_ROWS,
            H,
            D,
            INDIRECT,
        )
        b64 = tl.load(rtb_ptr + tl.load(group_row_ptr + group)).to(tl.int64)
        span_lo = tl.load(group_span_ptr + 2 * group)
        span_hi = tl.load(group_span_ptr + 2 * group + 1)
        if DENSE:
            group_first = group * group_tiles
            first_tile = 0
        else:
            group_first = tl.load(tile_offset_ptr + group)
            first_tile = span_lo // BK
        stop = tl.minimum(t_end, group_first + group_tiles if DENSE else tl.load(tile_offset_ptr + group + 1))
        probe = tl.zeros([BK, BLOCK_ROWS], tl.float32)
        bad_keys = tl.zeros([BK, BLOCK_ROWS], tl.int32)
        if not DENSE:
            # the rows' thresholds and histogram ranges from the calibration's keys (prepare_scan_triton's math:
            # no launch of its own), raised to what the row's other programs published
            thr_keys = tl.load(thr_keys_ptr + rows, mask=row_ok, other=NO_KEY_C)
            ceil_keys = tl.load(ceil_keys_ptr + rows, mask=row_ok & HAS_CEILINGS, other=NO_KEY_C)
            thr, hist_lo, hist_width = _histogram_range(thr_keys, ceil_keys, NB, HAS_CEILINGS)
            thr = tl.maximum(thr, tl.load(raised_ptr + rows, mask=row_ok, other=float("-inf"), volatile=True))
            hist_inv = tl.where(hist_width > 0, 1.0 / tl.where(hist_width > 0, hist_width, 1.0), 0.0)
            hist_rows = hist_ptr + rows[:, None] * NB + tl.arange(0, NB)[None, :]
        for chunk in range(t - group_first, stop - group_first, REFRESH):
            for tile in range(chunk, tl.minimum(chunk + REFRESH, stop - group_first)):
                if DENSE:
                    column = tile * BK + offs_k
                    pos = column * position_stride
                    live = (column < out_width) & (pos >= span_lo) & (pos < span_hi)
                else:
                    pos = (first_tile + tile) * BK + offs_k
                    live = (pos >= span_lo) & (pos < span_hi)
                scores, unsupported = _score_keys(
                    pos,
                    live,
                    b64,
                    bt_stride,
                    block_table_ptr,
                    num_pages,
                    values_ptr,
                    scales_ptr,
                    value_page_stride,
                    scale_page_stride,
                    q_a,
                    q_b,
                    q_hi_a,
                    q_hi_b,
                    q_wide,
                    wq,
                    rowfac,
                    BK,
                    BLOCK_ROWS,
                    H,
                    PAGE,
                    TOKEN_STRIDE,
                    GROUP_STRIDE,
                    SCALE_OFFSET,
                    SCALE_GROUP_STRIDE,
                    INTERLEAVED,
                    USE_ASM,
                )
                in_window = (pos[:, None] >= starts[None, :]) & (pos[:, None] < ends[None, :]) & row_ok[None, :]
                probe += tl.where(in_window, scores, 0.0) * 0.0
                bad_keys |= (unsupported[:, None] & in_window).to(tl.int32)
                if DENSE:
                    at = rows[None, :] * out_width + column[:, None]
                    tl.store(
                        out_ptr + at,
                        tl.where(in_window, scores, float("-inf")),
                        mask=(column < out_width)[:, None] & row_ok[None, :],
                    )
                else:
                    windowed = tl.where(in_window, scores, float("nan"))
                    passing = windowed >= thr[None, :]
                    slot = tl.atomic_add(
                        appended_ptr + rows[None, :] + 0 * pos[:, None], 1, mask=passing, sem="relaxed"
                    )
                    tl.store(
                        buf_ptr + rows[None, :] * capacity + slot,
                        _ordering_keys(windowed, pos[:, None]),
                        mask=passing & (slot < capacity),
                    )
                    bin_of = ((windowed - hist_lo[None, :]) * hist_inv[None, :]).to(tl.int32)
                    bin_of = tl.minimum(tl.maximum(bin_of, 0), NB - 1)
                    tl.atomic_add(
                        hist_ptr + rows[None, :] * NB + bin_of,
                        1,
                        mask=passing & (hist_width[None, :] > 0),
                        sem="relaxed",
                    )
            if not DENSE:
                thr = tl.maximum(thr, tl.load(raised_ptr + rows, mask=row_ok, other=0.0, volatile=True))
                thr = _raised_threshold(hist_rows, thr, hist_lo, hist_width, TOPK, NB)
                tl.atomic_max(raised_ptr + rows, thr, mask=row_ok, sem="relaxed")
        nonfinite = tl.sum(probe, axis=0)
        # (the row's programs only ever store 1: no atomics, no lost update)
        one = tl.full([BLOCK_ROWS], 1, tl.int8)
        tl.store(nonfinite_ptr + rows, one, mask=row_ok & (nonfinite != nonfinite))
        tl.store(unsupported_ptr + rows, one, mask=row_ok & (tl.max(bad_keys, axis=0) != 0))
        t = stop
        group += 1
