"""The paged scoring kernel in Gluon (sm_90 only): paged_scoring.py's kernel with explicit layouts.

The math, the modes, the schedule and the scan's shared thresholds are paged_scoring.py's; this kernel
returns the same bits (the same exact integer dot, the same epilogue in the same NVMMA layout, so the
same head-sum order; tests/kernels/test_paged_scoring.py compares the two on a GPU).

What Gluon buys (paged_scoring.py's Triton kernel runs ~540 instructions a 64-key step, ~200 of them
layout conversions of the per-key exponent logic through shared memory, with a barrier each): every
tensor of a step lives where it is used. One thread owns one (key, 32-element group) pair, twice a step
(two keys a thread):
    words   int32 [64, 4, 4]  one 16-byte load: the group's packed E2M1 bytes, for its nonzero test and decode
    scales  int32 [64, 4]     one byte
so the group's nonzero test is in-thread, the key's smallest exponent and spread are two lane
exchanges over the 4 groups of a key, and the shift d of a group is a per-thread value that the E2M1
decode (paged_scoring.E2M1_ASM, 4 bytes an instance) folds into its table. The decoded words are the
wgmma's A operand straight from registers (_register_operand): the loads' layout W3 puts each thread's
keys where the operand's rows are and its group where its K columns are, after a K permutation that the
queries (staged whole, K = 128, once a row group: _stage_queries) share, so the byte split and the layout
change compile to nothing. A step has no operand stores, proxy fence or operand barrier before its one
synchronous MMA (m64nNk128 in 4 instructions, N = 64 x BLOCK_ROWS); kfac and the unsupported flag are
converted to the epilogue's layout, the tile's wide flag is one reduction over the warpgroup. The next
step's page is loaded into registers at the top of a step (its latency overlaps the step), so with
several programs an SM the loads stay in flight; a scan step stores the previous step's candidates, whose
slots (an atomic add each, returning the slot) came back meanwhile.
Measured (bench/probes/paged_variants.py, H100, GPU time of the scoring launches, bit for bit with the
previous kernel, whose decoded operand and per-key flags went through shared memory with a barrier and a
proxy fence a step, the fence compiled to MEMBAR.ALL.CTA): 64 rows x 65,536 keys 350 us (381 before),
32 x 4 rows x 65,536 501 us (539), 1 row x 65,536 22 us (30). Still ~4x its memory floor at 64 rows:
Nsight Compute (on the previous kernel) shows the scan issuing on ~1/3 of the cycles, its warps waiting on
the page loads (long scoreboard) and on the exponent exchanges (short scoreboard), 3 programs an SM.
Wide tiles (a key whose groups span 4-7 binades: a hi operand) and wide query rows take a branch that
builds the hi halves and adds their MMAs (operands.py's Horner form); rare.
Limits: D = 128, 64 heads, BLOCK_ROWS 1 or 2, 4 warps, BLOCK_KEYS = PAGE_SIZE = 64, sm_90 (wgmma); no
interpreter (the Triton kernel is the CI-tested twin).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma

from ..keys import NO_KEY_C, _ordering_keys
from .paged_scoring import E2M1_ASM, _exponents_of_groups, _program_share
from .scoring import SUBNORMAL_UNIT, _histogram_range

GLUON_PAGED_WARPS = 4
# ptxas register caps (maxnreg) by rows a group, so that PROGRAMS_PER_SM programs reside on an SM (65,536
# registers / (cap x 128 threads)); offline sm_90 builds (compile/sm90_paged.py): 168 at one row, 249-255 at two, no
# stack.
GLUON_PAGED_MAX_REGISTERS = {1: 168, 2: 255}
PROGRAMS_PER_SM = {1: 3, 2: 2}
# The kernel's constexpr options as launched (gluon_paged_options). Variants built for a measurement go here
# (bench/probes/paged_variants.py times them against the launched kernel, bit for bit; the GPU tests run each against
# the Triton kernel) and are deleted once measured.
# EXPONENTS_AHEAD (launched; off in the strided launch): a step computes the next page's exponents (pages loaded two
# steps ahead) in one block with this page's decode, and the next page's wide flag after the MMA, so that the scheduler
# interleaves the exponents' lane exchanges with the byte permutes. Measured on an H100 (GPU time of the scoring
# launches, paged-variants-h100-v19.json): 64 x 1 x 65,536 321 -> 311 us, 32 x 4 x 65,536 483 -> 456, one row 17.8 ->
# 16.2.
# Measured on an H100 and deleted: loading pages two steps ahead alone (64 x 65,536 scoring 347 against 337 us); the
# deferred appends won (336, and 320 with the scan's threshold refreshed every 16 tiles instead of 4:
# TritonBackend.paged_refresh); 4 programs an SM at one row a group (128 registers, the exponents in the step, where
# EXPONENTS_AHEAD spills): 64 x 65,536 300 -> 293 us with the one-barrier flag, but one row 15.9 -> 19.4
# (paged-variants-h100-v19b.json).
# Measured on an H100 and deleted (paged-variants-h100-v22.json, bench/JOURNAL.md 22a): the narrow key operand split
# by sign (the positive and the negative codes' magnitudes, a byte permute each, two MMAs against the queries and
# their negation: 34 fewer integer-pipe instructions a step offline, twice the MMA's work): scoring 222.5 against 220.4
# us at 64 x 1 x 65,536, 332.1 against 303.0 at 32 x 4 x 65,536. The step is not bound by the integer pipe's issue
# alone (its latency chains and the MMA's wait).
GLUON_PAGED_OPTIONS = dict(EXPONENTS_AHEAD=True)


def gluon_paged_options(strided: bool) -> dict:
    """The Gluon kernel's own constexpr options for a launch (`strided`: a page a key, the calibration sample, whose
    per-key page addresses leave no registers for a page more in flight: EXPONENTS_AHEAD off): GLUON_PAGED_OPTIONS."""
    return dict(GLUON_PAGED_OPTIONS, EXPONENTS_AHEAD=False) if strided else dict(GLUON_PAGED_OPTIONS)


@gluon.jit
def _add(a, b):
    return a + b


@gluon.jit
def _e2m1_halves(words, shift):
    """(a, b) int32 words of int8x4: paged_scoring.E2M1_ASM on int32 `words` of packed E2M1 bytes (4 bytes
    of one group each) with the group's `shift` (int32, 0..3)."""
    return gl.inline_asm_elementwise(
        E2M1_ASM, "=r,=r,r,r", [words, shift], dtype=(gl.int32, gl.int32), is_pure=True, pack=1
    )


# relu(x) of an int32 x as float32 bits (x < 2^23 where it is used: the subnormal x * 2^-149): x's bits times 1.0,
# saturated. A negative int32 is a negative float or a NaN, both of which saturate to +0; a non-negative one is itself.
# ptxas makes it one FADD.SAT, on the FMA pipe where an integer max would take the integer pipe, which the step's
# decode and exponents keep busy. Measured on an H100 (paged-variants-h100-v22.json, the dense mode's scoring): 64 x 1
# x 65,536 220.4 -> 211.8 us, 32 x 4 x 65,536 303.0 -> 287.4, 128 x 2 x 32,768 305.9 -> 290.0, one row 8.6 -> 8.7.
SAT_RELU_ASM = gl.constexpr("""
{
.reg .f32 t;
mov.b32 t, $1;
mul.sat.f32 t, t, 0f3F800000;
mov.b32 $0, t;
}
""")


@gluon.jit
def _relu_bits(acc):
    """relu of the int32 dot `acc` (|acc| < 2^23) as float32 bits, the subnormal acc * 2^-149 (SAT_RELU_ASM)."""
    relu = gl.inline_asm_elementwise(SAT_RELU_ASM, "=r,r", [acc], dtype=gl.int32, is_pure=True, pack=1)
    return relu.to(gl.float32, bitcast=True)


@gluon.jit
def _load_page(pos, live, tile_page, pages, FORMAT: gl.constexpr):
    """(words int32 [64, 4, 4] in W3: each key's packed E2M1 bytes, one group of 16 a thread; scales int32
    [64, 4] in G; live bool [64]) of the keys at positions `pos` ([64] in G's key slice) of sequence b64.
    Contiguous tiles are one page (logical page `tile_page`: one block-table read; `pos` must be tile_page x PAGE
    + the key's lane 0..63, which the in-page offsets assume without reading `pos`); strided ones read a page a
    key. Keys not `live` or on a page outside the cache read nothing (zeros, scale 127). `pages`: the
    sequence, block table and cache arguments (b64 ... scale_page_stride); FORMAT: the layouts and the cache
    format's constexprs (W3 ... INTERLEAVED, then _load_tile's DENSE), in order."""
    b64, bt_stride, block_table_ptr, num_pages, values_ptr, scales_ptr, value_page_stride, scale_page_stride = pages
    W3, G, PAGE, STRIDED, TOKEN_STRIDE, GROUP_STRIDE, SCALE_OFFSET, SCALE_GROUP_STRIDE, INTERLEAVED, DENSE = FORMAT
    offs_g = gl.arange(0, 4, layout=gl.SliceLayout(0, G))
    offs_word = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, W3)))
    if STRIDED:
        token = pos % PAGE
    else:  # a tile is one page (BLOCK_KEYS = PAGE, page-aligned positions: position_stride 1): the in-page offsets are
        token = gl.arange(0, PAGE, layout=gl.SliceLayout(1, G))  # the same every step (hoisted out of the step loop)
    if INTERLEAVED:  # AITER: token t's scales at (t % 16) * 4 + t // 16 of each group's 64 bytes
        token_scale = (token % 16) * 4 + token // 16
    else:
        token_scale = token * 4
    in_page_w = gl.convert_layout(
        (token * (TOKEN_STRIDE // 4))[:, None] + (offs_g * (GROUP_STRIDE // 4))[None, :], gl.SliceLayout(2, W3)
    )
    in_page_w = gl.max_contiguous(
        gl.multiple_of(in_page_w[:, :, None] + offs_word[None, None, :], [1, 1, 4]), [1, 1, 4]
    )
    in_page_s = token_scale[:, None] + (offs_g * SCALE_GROUP_STRIDE)[None, :]
    if STRIDED:  # a page a key (the calibration sample): 64-bit page addresses per key
        page = gl.load(block_table_ptr + b64 * bt_stride + pos // PAGE, mask=live, other=-1).to(gl.int64)
        live = live & (page >= 0) & (page < num_pages)
        page = gl.where(live, page, 0)
        page_w = gl.convert_layout(page * (value_page_stride // 4), gl.SliceLayout(1, gl.SliceLayout(2, W3)))
        words_at = values_ptr.to(gl.pointer_type(gl.int32), bitcast=True) + page_w[:, None, None] + in_page_w
        scales_at = scales_ptr + (page * scale_page_stride + SCALE_OFFSET)[:, None] + in_page_s
    else:  # one page: its address once, then 32-bit offsets inside it
        page = gl.load(block_table_ptr + b64 * bt_stride + tile_page).to(gl.int64)
        page_ok = (page >= 0) & (page < num_pages)
        live = live & page_ok
        page = gl.where(page_ok, page, 0)
        words_at = (values_ptr + page * value_page_stride).to(gl.pointer_type(gl.int32), bitcast=True) + in_page_w
        scales_at = scales_ptr + page * scale_page_stride + SCALE_OFFSET + in_page_s
    live_g = live[:, None] & (offs_g >= 0)[None, :]
    words = gl.load(words_at, mask=gl.convert_layout(live_g, gl.SliceLayout(2, W3))[:, :, None], other=0)
    scales = gl.load(scales_at, mask=live_g, other=127).to(gl.int32)
    return words, scales, live


@gluon.jit
def _load_tile(
    tile,
    fallback,
    span,
    pages,
    FORMAT: gl.constexpr,
):
    """_load_page of local tile `tile` of the program's row group (its keys at positions (first_tile + tile)
    x 64 + offs_key; DENSE: columns tile x 64 + offs_key, position_stride apart). Past the group's n_local
    tiles nothing is live and the block table is read at local tile `fallback`, one the program scans.
    `span`: (n_local, first_tile, span_lo, span_hi, offs_key, out_width, position_stride) of the program's
    share of the group; `pages` and FORMAT: _load_page's (FORMAT's last entry: DENSE)."""
    n_local, first_tile, span_lo, span_hi, offs_key, out_width, position_stride = span
    DENSE: gl.constexpr = FORMAT[9]
    ok = tile < n_local
    if DENSE:
        column = tile * 64 + offs_key
        pos = column * position_stride
        live = (column < out_width) & (pos >= span_lo) & (pos < span_hi) & ok
    else:
        pos = (first_tile + tile) * 64 + offs_key
        live = (pos >= span_lo) & (pos < span_hi) & ok
    return _load_page(pos, live, gl.where(ok, first_tile + tile, first_tile + fallback), pages, FORMAT)


@gluon.jit
def _key_exponents(words, scales, W3: gl.constexpr, G: gl.constexpr):
    """Per (key, group) in G: (d the group's shift, spread and kfac per key (G's key slice)):
    paged_scoring._exponents_of_groups of the groups' nonzero test (an OR of the group's 4 words)."""
    return _exponents_of_groups(gl.convert_layout((gl.reduce_or(words, 2) & 0x77777777) != 0, G), scales)


@gluon.jit
def _shift_words(d, W3: gl.constexpr):
    """[64, 4] per group (G) -> [64, 4, 4] per word (W3): each thread's own groups, no data moved."""
    d_w = gl.convert_layout(d, gl.SliceLayout(2, W3))
    return gl.broadcast(d_w[:, :, None], gl.full([64, 4, 4], 0, gl.int32, W3))[0]


# The warp's OR of two int32 per thread (a thread's two keys of G's key slice), in both outputs: vote.sync.any.
VOTE_ANY_ASM = gl.constexpr("""
{
.reg .pred p;
.reg .b32 t;
or.b32 t, $2, $3;
setp.ne.b32 p, t, 0;
vote.sync.any.pred p, p, 0xffffffff;
selp.b32 $0, 1, 0, p;
mov.b32 $1, $0;
}
""")


@gluon.jit
def _tile_any(x, flags, parity):
    """Whether any of int32 [64] `x` (G's key slice) is nonzero, in every thread of the warpgroup: each warp's vote
    (VOTE_ANY_ASM) into its slot of `flags` (int32 [2, 4, 16] in shared memory, slot `parity`: a step writes one
    slot while a slower warp may still read the other), one barrier, then every thread reads the four votes. The
    generic reduction (gl.max) took lane exchanges and two barriers; measured on an H100 (paged-variants-h100-v19b.json,
    scoring launches): 64 x 1 x 65,536 312 -> 300 us, 32 x 4 x 65,536 451 -> 432, one row 18.4 -> 15.9."""
    warp_any = gl.inline_asm_elementwise(VOTE_ANY_ASM, "=r,=r,r,r", [x], dtype=gl.int32, is_pure=False, pack=2)
    slot = flags.index(parity)
    slot.store(gl.reshape(warp_any, [4, 16]))
    gl.thread_barrier()
    votes: gl.constexpr = gl.BlockedLayout(
        size_per_thread=[4, 1], threads_per_warp=[1, 32], warps_per_cta=[1, 4], order=[1, 0]
    )
    per_warp = slot.slice(0, 1, dim=1).load(votes)
    return gl.max(gl.max(per_warp, axis=1), axis=0) > 0


@gluon.jit
def _page_flags(d, spread, live, W3: gl.constexpr, wide_flag):
    """From a page's exponents (_key_exponents): (shift int32 [64, 4, 4] in W3, the groups' shifts per word; bad_key
    int32 [64] in G's key slice, a live key whose groups span 8 binades or more; k_wide, any key of the tile spanning
    4 or more: the hi operands' branch, a reduction over the warpgroup: _tile_any(..., *wide_flag))."""
    bad_key = (live & (spread >= 8)).to(gl.int32)
    k_wide = _tile_any((spread >= 4).to(gl.int32), *wide_flag)
    return _shift_words(d, W3), bad_key, k_wide


@gluon.jit
def _page_exponents(words, scales, live, W3: gl.constexpr, G: gl.constexpr, wide_flag):
    """What a step needs of its page before the decode: _page_flags' (shift, bad_key, k_wide) and kfac float32 [64]
    (G's key slice), each key's factor."""
    d, spread, kfac = _key_exponents(words, scales, W3, G)
    shift, bad_key, k_wide = _page_flags(d, spread, live, W3, wide_flag)
    return shift, bad_key, kfac, k_wide


@gluon.jit
def _register_operand(half_a, half_b, DOT: gl.constexpr):
    """int8 [64, 128] in the wgmma A-operand layout DOT of the decoded halves (int32 [64, 4, 4]: key, group g,
    word j; 4 int8 a word) of _e2m1_halves: element (key, 4 q + e), q = 16 h + 4 j + g, is byte e of
    word j of group g of half h (half_a: h = 0). With the loads' layout (W3: a thread's words are one
    (key, group), keys placed as DOT's rows) the byte split and the conversion compile to nothing (offline
    SASS): the decoded words feed the MMA from registers."""
    w = gl.reshape(gl.permute(gl.join(half_a, half_b), (0, 3, 2, 1)), [64, 32])
    split = gl.join(gl.join(w.to(gl.int8), (w >> 8).to(gl.int8)), gl.join((w >> 16).to(gl.int8), (w >> 24).to(gl.int8)))
    return gl.convert_layout(gl.reshape(gl.permute(split, (0, 1, 3, 2)), [64, 128]), DOT)


@gluon.jit
def _store_candidates(buf_ptr, rows_f, capacity, slots, keys, passing):
    """The scan's appends: keys [64, 2] (the flat layout's one element a thread) of the passing keys into their
    rows' candidate buffers at the slots their atomic adds returned (slots past capacity are dropped: the
    certificate sees the count)."""
    gl.store(buf_ptr + rows_f[None, :] * capacity + slots, keys, mask=passing & (slots < capacity))


@gluon.jit
def _group_rows(
    group, group_row_ptr, group_count_ptr, starts_ptr, ends_ptr, BLOCK_ROWS: gl.constexpr, layout: gl.constexpr
):
    """(rows int64, row_ok, starts, ends) [BLOCK_ROWS] of row group `group` in `layout`."""
    first = gl.load(group_row_ptr + group)
    count = gl.load(group_count_ptr + group)
    lanes = gl.arange(0, BLOCK_ROWS, layout=layout)
    row_ok = lanes < count
    rows = gl.where(row_ok, first + lanes, 0).to(gl.int64)
    starts = gl.load(starts_ptr + rows, mask=row_ok, other=0)
    ends = gl.load(ends_ptr + rows, mask=row_ok, other=0)
    return rows, row_ok, starts, ends


@gluon.jit
def _query_row(row, query_row_ptr, INDIRECT: gl.constexpr):
    """paged_scoring._query_row."""
    if INDIRECT:
        return gl.load(query_row_ptr + row)
    else:
        return row


@gluon.jit
def _stage_queries(
    group,
    group_row_ptr,
    group_count_ptr,
    q_ptr,
    query_row_ptr,
    q_smem,
    N: gl.constexpr,
    BLOCK_ROWS: gl.constexpr,
    H: gl.constexpr,
    D: gl.constexpr,
    layout: gl.constexpr,
    INDIRECT: gl.constexpr,
):
    """Store the group's queries (row n = head n // BLOCK_ROWS of row lane n % BLOCK_ROWS; lanes past the
    group's count read zeros) of operand q_ptr (q_lo or q_hi) into q_smem [N, 128] in the key operand's
    K order: column 4 q + e, q = 16 h + 4 j + g, holds dimension 32 g + 8 j + 4 h + e (_register_operand)."""
    first = gl.load(group_row_ptr + group)
    count = gl.load(group_count_ptr + group)
    offs_n = gl.arange(0, N, layout=gl.SliceLayout(1, layout))
    n_ok = (offs_n % BLOCK_ROWS) < count
    n_rows = _query_row((first + gl.where(n_ok, offs_n % BLOCK_ROWS, 0)).to(gl.int64), query_row_ptr, INDIRECT)
    vec = n_rows.to(gl.int64) * H + offs_n // BLOCK_ROWS
    k = gl.arange(0, 128, layout=gl.SliceLayout(0, layout))
    dim = 32 * ((k // 4) % 4) + 8 * ((k // 16) % 4) + 4 * (k // 64) + k % 4
    q_smem.store(gl.load(q_ptr + vec[:, None] * D + dim[None, :], mask=n_ok[:, None], other=0))


@gluon.jit
def score_fp4_paged_gluon_kernel(
    values_ptr,
    scales_ptr,
    value_page_stride,
    scale_page_stride,
    num_pages,
    block_table_ptr,
    bt_stride,
    rtb_ptr,
    q_lo_ptr,
    q_hi_ptr,
    wq_ptr,
    rowfac_ptr,
    q_wide_ptr,
    query_row_ptr,
    groups_ptr,
    group_row_ptr,
    group_count_ptr,
    group_span_ptr,
    tile_offset_ptr,
    starts_ptr,
    ends_ptr,
    out_ptr,
    out_width,
    position_stride,
    thr_keys_ptr,
    ceil_keys_ptr,
    hist_ptr,
    buf_ptr,
    capacity,
    appended_ptr,
    raised_ptr,
    nonfinite_ptr,
    unsupported_ptr,
    num_programs,
    TOPK: gl.constexpr,
    BLOCK_ROWS: gl.constexpr,
    DENSE: gl.constexpr,
    STRIDED: gl.constexpr,
    REFRESH: gl.constexpr,
    NB: gl.constexpr,
    H: gl.constexpr,
    D: gl.constexpr,
    PAGE: gl.constexpr,
    TOKEN_STRIDE: gl.constexpr,
    GROUP_STRIDE: gl.constexpr,
    SCALE_OFFSET: gl.constexpr,
    SCALE_GROUP_STRIDE: gl.constexpr,
    INTERLEAVED: gl.constexpr,
    USE_ASM: gl.constexpr,
    INDIRECT: gl.constexpr,
    HAS_CEILINGS: gl.constexpr,
    EXPONENTS_AHEAD: gl.constexpr,
    num_warps: gl.constexpr,
):
    """paged_scoring.score_fp4_paged_kernel's arguments and outputs (USE_ASM: always the PTX decode);
    EXPONENTS_AHEAD: a step computes the next page's exponents (GLUON_PAGED_OPTIONS)."""
    gl.static_assert(num_warps == 4, "one warpgroup")
    gl.static_assert((BLOCK_ROWS == 1) | (BLOCK_ROWS == 2), "groups of 1 or 2 rows")
    BK: gl.constexpr = 64
    N: gl.constexpr = BLOCK_ROWS * H
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, N, 32])
    # one thread = one (key, group): keys on 8 lanes x 4 warps (two keys a thread), groups on 4 lanes
    # key k: lanes / 4 its bits 0-2, a register bit 3, warps bits 4-5 (the A operand's rows)
    W3: gl.constexpr = gl.DistributedLinearLayout(
        reg_bases=[[0, 0, 1], [0, 0, 2], [8, 0, 0]],
        lane_bases=[[0, 1, 0], [0, 2, 0], [1, 0, 0], [2, 0, 0], [4, 0, 0]],
        warp_bases=[[16, 0, 0], [32, 0, 0]],
        block_bases=[],
        shape=[BK, 4, 4],
    )
    G: gl.constexpr = gl.DistributedLinearLayout(
        reg_bases=[[8, 0]],
        lane_bases=[[0, 1], [0, 2], [1, 0], [2, 0], [4, 0]],
        warp_bases=[[16, 0], [32, 0]],
        block_bases=[],
        shape=[BK, 4],
    )
    DOT: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=4)
    KEY: gl.constexpr = gl.SliceLayout(1, G)
    ld: gl.constexpr = gl.BlockedLayout(
        size_per_thread=[1, 16], threads_per_warp=[8, 4], warps_per_cta=[num_warps, 1], order=[1, 0]
    )
    tile: gl.constexpr = gl.sum(gl.reshape(gl.zeros([BK, N], gl.float32, mma), [BK, H, BLOCK_ROWS]), axis=1).type.layout
    key_of_tile: gl.constexpr = gl.SliceLayout(1, tile)
    row_of_tile: gl.constexpr = gl.SliceLayout(0, tile)
    # a [64, 2] tile with each element in one lane only (lane bit 0: the row, lane bit 1: key + 8)
    flat: gl.constexpr = gl.DistributedLinearLayout(
        reg_bases=[],
        lane_bases=[[0, 1], [8, 0], [1, 0], [2, 0], [4, 0]],
        warp_bases=[[16, 0], [32, 0]],
        block_bases=[],
        shape=[BK, 2],
    )
    row_of_flat: gl.constexpr = gl.SliceLayout(0, flat)
    hist_layout: gl.constexpr = gl.BlockedLayout(
        size_per_thread=[1, 1], threads_per_warp=[1, 32], warps_per_cta=[num_warps, 1], order=[1, 0]
    )
    row_of_hist: gl.constexpr = gl.SliceLayout(1, hist_layout)
    # the queries whole (K = 128, the key operand's K order: _stage_queries), and their hi part (wide rows)
    q_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([N, 128], gl.int8)
    qa = gl.allocate_shared_memory(gl.int8, [N, 128], q_layout)
    qa_hi = gl.allocate_shared_memory(gl.int8, [N, 128], q_layout)
    # the tile's wide flag: each warp's vote, two slots (_tile_any)
    flags = gl.allocate_shared_memory(gl.int32, [2, 4, 16], gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0]))

    t, t_end, group, group_tiles = _program_share(
        gl.program_id(0), num_programs, groups_ptr, tile_offset_ptr, out_width, BK, DENSE
    )
    offs_key = gl.arange(0, BK, layout=KEY)
    offs_tk = gl.arange(0, BK, layout=key_of_tile)
    offs_fk = gl.arange(0, BK, layout=gl.SliceLayout(1, flat))
    offs_n = gl.arange(0, N, layout=gl.SliceLayout(0, mma))
    offs_bin = gl.arange(0, NB, layout=gl.SliceLayout(0, hist_layout))
    while t < t_end:
        first_row = gl.load(group_row_ptr + group)
        count = gl.load(group_count_ptr + group)
        b64 = gl.load(rtb_ptr + first_row).to(gl.int64)
        span_lo = gl.load(group_span_ptr + 2 * group)
        span_hi = gl.load(group_span_ptr + 2 * group + 1)
        if DENSE:
            group_first = group * group_tiles
            stop = gl.minimum(t_end, group_first + group_tiles)
            first_tile = 0
        else:
            group_first = gl.load(tile_offset_ptr + group)
            stop = gl.minimum(t_end, gl.load(tile_offset_ptr + group + 1))
            first_tile = span_lo // BK
        rows, row_ok, starts, ends = _group_rows(
            group, group_row_ptr, group_count_ptr, starts_ptr, ends_ptr, BLOCK_ROWS, row_of_tile
        )
        rowfac = gl.load(rowfac_ptr + _query_row(rows, query_row_ptr, INDIRECT), mask=row_ok, other=0.0)
        n_ok = (offs_n % BLOCK_ROWS) < count
        n_rows = _query_row((first_row + gl.where(n_ok, offs_n % BLOCK_ROWS, 0)).to(gl.int64), query_row_ptr, INDIRECT)
        wq = gl.load(wq_ptr + n_rows.to(gl.int64) * H + offs_n // BLOCK_ROWS, mask=n_ok, other=0.0)
        # the scan's rows: two lanes (a second, masked one at BLOCK_ROWS = 1), as the flat layout holds them
        h_rows, h_ok, _, _ = _group_rows(group, group_row_ptr, group_count_ptr, starts_ptr, ends_ptr, 2, row_of_hist)
        q_wide = (
            gl.max(
                gl.load(q_wide_ptr + _query_row(h_rows, query_row_ptr, INDIRECT), mask=h_ok, other=0).to(gl.int32),
                axis=0,
            )
            != 0
        )
        gl.thread_barrier()  # the previous group's last MMA has read the query operands
        _stage_queries(
            group,
            group_row_ptr,
            group_count_ptr,
            q_lo_ptr,
            query_row_ptr,
            qa,
            N,
            BLOCK_ROWS,
            H,
            D,
            ld,
            INDIRECT,
        )
        if q_wide:
            _stage_queries(
                group,
                group_row_ptr,
                group_count_ptr,
                q_hi_ptr,
                query_row_ptr,
                qa_hi,
                N,
                BLOCK_ROWS,
                H,
                D,
                ld,
                INDIRECT,
            )
        fence_async_shared()  # the queries' stores before the MMAs read them
        gl.thread_barrier()
        if DENSE:
            probe = gl.zeros([BK, BLOCK_ROWS], gl.float32, tile)
            bad_rows = gl.zeros([BK, BLOCK_ROWS], gl.int32, tile)
        else:
            rows_f, ok_f, starts_f, ends_f = _group_rows(
                group, group_row_ptr, group_count_ptr, starts_ptr, ends_ptr, 2, row_of_flat
            )
            # thresholds and histogram ranges from the calibration's keys (paged_scoring.py), raised to what
            # the row's other programs published
            thr_h, hist_lo_h, hist_width_h = _histogram_range(
                gl.load(thr_keys_ptr + h_rows, mask=h_ok, other=NO_KEY_C),
                gl.load(ceil_keys_ptr + h_rows, mask=h_ok & HAS_CEILINGS, other=NO_KEY_C),
                NB,
                HAS_CEILINGS,
            )
            thr_h = gl.maximum(thr_h, gl.load(raised_ptr + h_rows, mask=h_ok, other=float("-inf"), volatile=True))
            thr = gl.convert_layout(thr_h, row_of_flat)
            _, hist_lo, hist_width = _histogram_range(
                gl.load(thr_keys_ptr + rows_f, mask=ok_f, other=NO_KEY_C),
                gl.load(ceil_keys_ptr + rows_f, mask=ok_f & HAS_CEILINGS, other=NO_KEY_C),
                NB,
                HAS_CEILINGS,
            )
            hist_inv = gl.where(hist_width > 0, 1.0 / gl.where(hist_width > 0, hist_width, 1.0), 0.0)
            probe = gl.zeros([BK, 2], gl.float32, flat)
            bad_rows = gl.zeros([BK, 2], gl.int32, flat)
        first_local = t - group_first
        n_local = stop - group_first
        pages = (
            b64,
            bt_stride,
            block_table_ptr,
            num_pages,
            values_ptr,
            scales_ptr,
            value_page_stride,
            scale_page_stride,
        )
        span = (n_local, first_tile, span_lo, span_hi, offs_key, out_width, position_stride)
        tile_format: gl.constexpr = (
            W3,
            G,
            PAGE,
            STRIDED,
            TOKEN_STRIDE,
            GROUP_STRIDE,
            SCALE_OFFSET,
            SCALE_GROUP_STRIDE,
            INTERLEAVED,
            DENSE,
        )
        # the first step's page, then each step loads the next one at its top
        words, scales, live = _load_tile(
            first_local,
            first_local,
            span,
            pages,
            tile_format,
        )
        if EXPONENTS_AHEAD:  # the second page, and the first page's exponents
            words_1, scales_1, live_1 = _load_tile(
                first_local + 1,
                first_local,
                span,
                pages,
                tile_format,
            )
            shift, bad_key, kfac, k_wide = _page_exponents(words, scales, live, W3, G, (flags, first_local % 2))
        # the previous step's candidates (keys, slots, which to store): a step stores them once their slots are back
        pending_keys = gl.zeros([BK, 2], gl.int64, flat)
        pending_slots = gl.zeros([BK, 2], gl.int32, flat)
        pending = pending_slots != 0
        for tile_index in range(first_local, n_local):
            words_n, scales_n, live_n = _load_tile(
                tile_index + 1 + EXPONENTS_AHEAD,
                tile_index,
                span,
                pages,
                tile_format,
            )
            if EXPONENTS_AHEAD:
                # this page's narrow decode (its shifts came a step ago) and the next page's exponents in one block, two
                # independent chains for the scheduler to interleave; the next page's warpgroup reduction after the MMA
                half_a, half_b = _e2m1_halves(words, shift)
                d_1, spread_1, kfac_1 = _key_exponents(words_1, scales_1, W3, G)
            else:
                shift, bad_key, kfac, k_wide = _page_exponents(words, scales, live, W3, G, (flags, tile_index % 2))
            # no shared memory a step: the decoded words are the MMA's A operand (_register_operand)
            if k_wide | q_wide:  # rare: hi operands (operands.py's lo + 16 hi)
                in_lo = shift <= 3
                in_hi = (shift >= 4) & (shift <= 7)
                lo_a, lo_b = _e2m1_halves(gl.where(in_lo, words, 0), gl.minimum(shift, 3))
                hi_a, hi_b = _e2m1_halves(gl.where(in_hi, words, 0), gl.minimum(gl.maximum(shift - 4, 0), 3))
                op_lo = _register_operand(lo_a, lo_b, DOT)
                op_hi = _register_operand(hi_a, hi_b, DOT)
                acc = gl.zeros([BK, N], gl.int32, mma)
                if q_wide:
                    acc = warpgroup_mma(op_hi, qa_hi.permute((1, 0)), acc)
                acc = warpgroup_mma(op_hi, qa.permute((1, 0)), acc * 16)
                if q_wide:
                    acc = warpgroup_mma(op_lo, qa_hi.permute((1, 0)), acc)
                acc = warpgroup_mma(op_lo, qa.permute((1, 0)), acc * 16)
                relu_sub = gl.maximum(acc.to(gl.float32), 0.0) * SUBNORMAL_UNIT
            else:
                if not EXPONENTS_AHEAD:
                    half_a, half_b = _e2m1_halves(words, shift)
                # one synchronous MMA (K = 128): a wait cannot keep int8 register operands alive
                acc = warpgroup_mma(
                    _register_operand(half_a, half_b, DOT),
                    qa.permute((1, 0)),
                    gl.zeros([BK, N], gl.int32, mma),
                    use_acc=False,
                )
                relu_sub = _relu_bits(acc)
            terms = relu_sub * wq[None, :]
            scores = gl.sum(gl.reshape(terms, [BK, H, BLOCK_ROWS]), axis=1)
            kfac_t = gl.convert_layout(kfac, key_of_tile)
            scores = scores * rowfac[None, :] * kfac_t[:, None]
            if DENSE:
                column_t = tile_index * BK + offs_tk
                pos_t = column_t * position_stride
                in_window = (pos_t[:, None] >= starts[None, :]) & (pos_t[:, None] < ends[None, :]) & row_ok[None, :]
                probe += gl.where(in_window, scores, 0.0) * 0.0
                bad_t = gl.convert_layout(bad_key, key_of_tile)
                bad_rows |= (bad_t[:, None] != 0).to(gl.int32) & in_window.to(gl.int32)
                gl.store(
                    out_ptr + rows[None, :] * out_width + column_t[:, None],
                    gl.where(in_window, scores, float("-inf")),
                    mask=(column_t < out_width)[:, None] & row_ok[None, :],
                )
            else:
                # One element a thread (the flat layout picks, in each lane, one of the four it holds): no
                # replicated atomics. At BLOCK_ROWS = 1 the second column is a masked copy of the first.
                if BLOCK_ROWS == 1:
                    scores = gl.reshape(gl.join(scores, scores), [BK, 2])
                scores = gl.convert_layout(scores, flat)
                pos_f = (first_tile + tile_index) * BK + offs_fk
                in_window = (pos_f[:, None] >= starts_f[None, :]) & (pos_f[:, None] < ends_f[None, :]) & ok_f[None, :]
                probe += gl.where(in_window, scores, 0.0) * 0.0
                bad_f = gl.convert_layout(bad_key, gl.SliceLayout(1, flat))
                bad_rows |= (bad_f[:, None] != 0).to(gl.int32) & in_window.to(gl.int32)
                windowed = gl.where(in_window, scores, float("nan"))
                passing = windowed >= thr[None, :]
                one = gl.full([BK, 2], 1, gl.int32, flat)
                # the previous step's appends (their slots came back while this step ran), then this step's slots:
                # the atomic's round trip to L2 overlaps a step instead of stalling the warpgroup before its MMA
                _store_candidates(buf_ptr, rows_f, capacity, pending_slots, pending_keys, pending)
                pending_slots = gl.atomic_add(
                    appended_ptr + rows_f[None, :] + 0 * pos_f[:, None], one, mask=passing, sem="relaxed"
                )
                pending_keys = _ordering_keys(windowed, pos_f[:, None])
                pending = passing
                bin_of = ((windowed - hist_lo[None, :]) * hist_inv[None, :]).to(gl.int32)
                bin_of = gl.minimum(gl.maximum(bin_of, 0), NB - 1)
                gl.atomic_add(
                    hist_ptr + rows_f[None, :] * NB + bin_of, one, mask=passing & (hist_inv[None, :] > 0), sem="relaxed"
                )
                if ((tile_index + 1 - first_local) % REFRESH == 0) | (tile_index + 1 == n_local):
                    gl.thread_barrier()
                    thr_h = gl.maximum(thr_h, gl.load(raised_ptr + h_rows, mask=h_ok, other=0.0, volatile=True))
                    hist = gl.load(
                        hist_ptr + h_rows[:, None] * NB + offs_bin[None, :], mask=h_ok[:, None], other=0, volatile=True
                    )
                    at_or_above = gl.associative_scan(hist, 1, _add, reverse=True)
                    best_bin = gl.max(gl.where(at_or_above >= TOPK, offs_bin[None, :], -1), axis=1)
                    edge = hist_lo_h + (best_bin - 1).to(gl.float32) * hist_width_h
                    thr_h = gl.where((best_bin >= 1) & (hist_width_h > 0), gl.maximum(thr_h, edge), thr_h)
                    gl.atomic_max(raised_ptr + h_rows, thr_h, mask=h_ok, sem="relaxed")
                    thr = gl.convert_layout(thr_h, row_of_flat)
            if EXPONENTS_AHEAD:
                shift, bad_key, k_wide = _page_flags(d_1, spread_1, live_1, W3, (flags, (tile_index + 1) % 2))
                kfac = kfac_1
                words = words_1
                words_1 = words_n
                scales_1 = scales_n
                live_1 = live_n
            else:
                words = words_n
                scales = scales_n
                live = live_n
        if not DENSE:  # the group's last step's candidates
            _store_candidates(buf_ptr, rows_f, capacity, pending_slots, pending_keys, pending)
        nonfinite = gl.sum(probe, axis=0)
        bad = gl.max(bad_rows, axis=0) != 0
        one = gl.full(nonfinite.shape, 1, gl.int8, nonfinite.type.layout)
        if DENSE:  # (the row's programs only ever store 1: no atomics)
            gl.store(nonfinite_ptr + rows, one, mask=row_ok & (nonfinite != nonfinite))
            gl.store(unsupported_ptr + rows, one, mask=row_ok & bad)
        else:
            gl.store(nonfinite_ptr + rows_f, one, mask=ok_f & (nonfinite != nonfinite))
            gl.store(unsupported_ptr + rows_f, one, mask=ok_f & bad)
        t = stop
        group += 1
