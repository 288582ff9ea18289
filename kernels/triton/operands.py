"""MXFP4 -> exact int8 operands for tensor-core scoring (Triton, sm_90 and the interpreter).

Layer: backends (triton/; the Triton backend's own operand preparation: backend.py calls it, the
schedule and the scoring kernels read its flags). Imports the formats and utilities only.

Math. An MXFP4 vector of 128 elements is sum-exact as
    x[e] = c[e] / 2 * 2^(s[g] - 127),   c = 2 * E2M1 value, an integer in -12..12, g = e // 32.
Let m = the smallest scale byte of the vector's nonzero groups and d[g] = s[g] - m >= 0. Then
    x[e] = 2^(m - 128) * (c[e] << d[g]),
and c << d fits int8 while d <= 3 (12 * 8 = 96). Groups with 4 <= d <= 7 go to a second int8
operand as c << (d - 4), weighted 16:   x = 2^(m - 128) * (lo + 16 * hi).
So q.k = 2^(mq + mk - 256) * int_dot, with int_dot an exact int32 sum of at most four int8 dots
(|int_dot| < 2^29). Vectors whose nonzero groups span more than 7 binades are flagged
UNSUPPORTED (the Triton backend refuses them; MXFP4 data of real activations spans a few).

Outputs per vector: lo, hi int8 [128]; exponent int32 m (127 for an all-zero vector); flags int8:
    WIDE = 1 (hi is nonzero), UNSUPPORTED = 2 (spread > 7), NAN_SCALE = 4 (a scale byte is 255).
Keys are read in place through the block table from a cache in either format (cache_layout.py:
value byte (t, g, b) at page * value_page_stride + t * TOKEN_STRIDE + g * GROUP_STRIDE + b, scale
(t, g) at page * scale_page_stride + SCALE_OFFSET + token_offset(t) + g * SCALE_GROUP_STRIDE, page
products in int64); positions >= `need[b]` or on an invalid page decode to zero. Queries are read
in place. Tiling: VB vectors per program, 128 elements each; for keys VB = BLOCK_KEYS of the scoring
kernels, so that one program decodes one key tile.

The decode kernels also write the bookkeeping the schedule and the scan read, so that none of it is a
torch op on the host path; a call decodes in one launch. Its inputs from the row checks' launch
(row_checks.py, problem.py): need[b] = sequence_ends[b] (the keys any row of sequence b reads) and zeroed
words for the flag summary (summary[0] key flags, [1] query flags, [2] refused weights) and batch_wide.
    decode_kernel            the keys (_decode_key_tile, one key tile a program) and the queries
                             (_decode_query_block, one query row a program) side by side in one grid
                             (decode_operands_triton; each side alone: decode_keys_fp4_triton,
                             prepare_queries_fp4_triton). A key tile also writes tile_wide[b, tile] (a
                             key of the tile is wide) and batch_wide[b] |= it; a query row q_wide (a live
                             row with a wide head vector), q_unsupported (a head vector of spread > 7, or
                             head weights refused), rowfac * weight_scale
    unsupported_rows_kernel  TritonBackend.unsupported_rows (reads a row's window only when the key
                             summary holds FLAG_UNSUPPORTED), or with it the row's scoring-fault status
                             bits (TritonBackend.scoring_faults: NONFINITE and UNSUPPORTED in one launch)
Their torch definitions (any / OR over the per-vector flags) are what the tests compare them with.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..cache_layout import PAGE_SIZE, KVCache
from ..scratch import Scratch
from ..status import RowStatus

FLAG_WIDE = 1
FLAG_UNSUPPORTED = 2
FLAG_NAN_SCALE = 4
FLAG_NAN_SCALE_C = tl.constexpr(FLAG_NAN_SCALE)
FLAG_WIDE_C = tl.constexpr(FLAG_WIDE)
FLAG_UNSUPPORTED_C = tl.constexpr(FLAG_UNSUPPORTED)
STATUS_NONFINITE_C = tl.constexpr(int(RowStatus.NONFINITE))
STATUS_UNSUPPORTED_C = tl.constexpr(int(RowStatus.UNSUPPORTED))
#: Head-weight range of the scoring epilogue (scoring.py): every nonzero scaled weight |wq| is
#: >= 2^MIN_SCALED_EXPONENT, and |w * 2^(q_exp - 129)| stays below 2^MAX_WEIGHT_EXPONENT.
MIN_SCALED_EXPONENT = 23
MAX_WEIGHT_EXPONENT = 100
MIN_SCALED_EXPONENT_C = tl.constexpr(MIN_SCALED_EXPONENT)
MAX_WEIGHT_EXPONENT_C = tl.constexpr(MAX_WEIGHT_EXPONENT)
VECTORS_PER_PROGRAM = 64


@triton.jit
def _e2m1_times_two(nibble):
    """Signed integer 2 * E2M1 value (-12..12) of int32 nibbles."""
    mag = nibble & 7
    val = tl.where(mag < 2, mag, (2 + (mag & 1)) << tl.maximum((mag >> 1) - 1, 0))
    return tl.where((nibble & 8) != 0, -val, val)


@triton.jit
def _decode_vectors(
    packed_ptr,
    scale_ptr,
    packed_off,
    scale_off,
    live,
    lo_ptr,
    hi_ptr,
    exp_ptr,
    flags_ptr,
    out_vec,
    VB: tl.constexpr,
    GROUP_STRIDE: tl.constexpr = 16,
    SCALE_STRIDE: tl.constexpr = 1,
):
    """Decode VB vectors whose bytes start at packed_off / scale_off (int64 [VB]) into row out_vec;
    group g's 16 packed bytes lie at packed_off + g * GROUP_STRIDE, its scale at
    scale_off + g * SCALE_STRIDE (16 and 1: one contiguous 64-byte vector and 4 scale bytes).

    Works on the 64 packed bytes of each vector as they are (byte b holds elements 2b and 2b+1 of
    block b // 16) and writes each pair as one int16 (little-endian: element 2b first), so every
    load and store is a plain contiguous row."""
    offs_b = tl.arange(0, 64)
    block = offs_b // 16
    offs_in = block * GROUP_STRIDE + offs_b % 16
    packed = tl.load(packed_ptr + packed_off[:, None] + offs_in[None, :], mask=live[:, None], other=0).to(tl.int32)
    even = _e2m1_times_two(packed & 0xF)
    odd = _e2m1_times_two(packed >> 4)
    s0 = tl.load(scale_ptr + scale_off, mask=live, other=127).to(tl.int32)
    s1 = tl.load(scale_ptr + scale_off + SCALE_STRIDE, mask=live, other=127).to(tl.int32)
    s2 = tl.load(scale_ptr + scale_off + 2 * SCALE_STRIDE, mask=live, other=127).to(tl.int32)
    s3 = tl.load(scale_ptr + scale_off + 3 * SCALE_STRIDE, mask=live, other=127).to(tl.int32)
    nonzero = ((packed & 0x77) != 0).to(tl.int32)  # a nonzero magnitude in this byte
    # Blocks that set the common exponent: nonzero ones with a finite scale (255 is NaN, flagged).
    z0 = (tl.max(tl.where(block == 0, nonzero, 0), axis=1) > 0) & (s0 != 255)
    z1 = (tl.max(tl.where(block == 1, nonzero, 0), axis=1) > 0) & (s1 != 255)
    z2 = (tl.max(tl.where(block == 2, nonzero, 0), axis=1) > 0) & (s2 != 255)
    z3 = (tl.max(tl.where(block == 3, nonzero, 0), axis=1) > 0) & (s3 != 255)
    m = tl.minimum(
        tl.minimum(tl.where(z0, s0, 255), tl.where(z1, s1, 255)),
        tl.minimum(tl.where(z2, s2, 255), tl.where(z3, s3, 255)),
    )
    m = tl.where(z0 | z1 | z2 | z3, m, 127)
    d0 = tl.where(z0, s0 - m, 0)
    d1 = tl.where(z1, s1 - m, 0)
    d2 = tl.where(z2, s2 - m, 0)
    d3 = tl.where(z3, s3 - m, 0)
    spread = tl.maximum(tl.maximum(d0, d1), tl.maximum(d2, d3))
    d = tl.where(
        block[None, :] == 0,
        d0[:, None],
        tl.where(block[None, :] == 1, d1[:, None], tl.where(block[None, :] == 2, d2[:, None], d3[:, None])),
    )  # [VB, 64]
    low_shift = tl.minimum(d, 3)
    high_shift = tl.minimum(tl.maximum(d - 4, 0), 3)
    in_lo = d <= 3
    in_hi = (d >= 4) & (d <= 7)
    lo = (tl.where(in_lo, even << low_shift, 0) & 0xFF) | (tl.where(in_lo, odd << low_shift, 0) << 8)
    hi = (tl.where(in_hi, even << high_shift, 0) & 0xFF) | (tl.where(in_hi, odd << high_shift, 0) << 8)
    nan_scale = (s0 == 255) | (s1 == 255) | (s2 == 255) | (s3 == 255)
    flags = (spread >= 4).to(tl.int32) * 1 + (spread >= 8).to(tl.int32) * 2 + nan_scale.to(tl.int32) * 4
    out_off = out_vec.to(tl.int64)[:, None] * 64 + offs_b[None, :]  # int16 pairs: 64 per vector
    tl.store(lo_ptr + out_off, lo.to(tl.int16))
    tl.store(hi_ptr + out_off, hi.to(tl.int16))
    tl.store(exp_ptr + out_vec, m)
    tl.store(flags_ptr + out_vec, flags.to(tl.int8))
    return m, flags


@triton.jit
def _bit_or(a, b):
    return a | b


@triton.jit
def _summarize_flags(summary_ptr, flags, live):
    """OR the flags of the live vectors into the int32 word at summary_ptr (one atomic per program)."""
    tl.atomic_or(summary_ptr, tl.reduce(tl.where(live, flags, 0), 0, _bit_or), sem="relaxed")


@triton.jit
def _decode_key_tile(
    tile,
    b,
    values_ptr,
    scales_ptr,
    value_page_stride,
    scale_page_stride,
    block_table_ptr,
    bt_stride,
    need_ptr,
    num_pages,
    s_pad,
    lo_ptr,
    hi_ptr,
    exp_ptr,
    flags_ptr,
    kfac_ptr,
    summary_ptr,
    tile_wide_ptr,
    batch_wide_ptr,
    VB: tl.constexpr,
    PAGE: tl.constexpr,
    TOKEN_STRIDE: tl.constexpr,
    GROUP_STRIDE: tl.constexpr,
    SCALE_OFFSET: tl.constexpr,
    SCALE_GROUP_STRIDE: tl.constexpr,
    INTERLEAVED: tl.constexpr,
):
    """Decode key tile `tile` (positions [tile * VB, tile * VB + VB)) of sequence b."""
    pos = tile * VB + tl.arange(0, VB)
    need = tl.load(need_ptr + b)
    page = tl.load(block_table_ptr + b.to(tl.int64) * bt_stride + pos // PAGE, mask=pos < need, other=-1).to(tl.int64)
    live = (pos < need) & (page >= 0) & (page < num_pages)
    page = tl.where(live, page, 0)
    token = (pos % PAGE).to(tl.int64)
    packed_off = page * value_page_stride.to(tl.int64) + token * TOKEN_STRIDE
    if INTERLEAVED:  # AITER: token t's scales at (t % 16) * 4 + t // 16 of each group's 64 bytes
        token_scale = (token % 16) * 4 + token // 16
    else:
        token_scale = token * 4
    scale_off = page * scale_page_stride.to(tl.int64) + SCALE_OFFSET + token_scale
    out_vec = b.to(tl.int64) * s_pad + pos
    m, flags = _decode_vectors(
        values_ptr,
        scales_ptr,
        packed_off,
        scale_off,
        live,
        lo_ptr,
        hi_ptr,
        exp_ptr,
        flags_ptr,
        out_vec,
        VB,
        GROUP_STRIDE,
        SCALE_GROUP_STRIDE,
    )
    # The key's factor 2^(m - 127) as float32 bits (2^-127 is the subnormal 2^22 * 2^-149), NaN for a NaN scale.
    kfac_bits = tl.where(m >= 1, m << 23, 4194304)
    kfac_bits = tl.where((flags & FLAG_NAN_SCALE_C) != 0, 0x7FC00000, kfac_bits)
    tl.store(kfac_ptr + out_vec, kfac_bits.to(tl.float32, bitcast=True))
    _summarize_flags(summary_ptr, flags, live)
    # This tile's VB positions are one key tile of the scoring kernels (VB = BLOCK_KEYS).
    tile_wide = tl.max(((flags & FLAG_WIDE_C) != 0).to(tl.int32), axis=0)  # positions not read decode to 0
    tl.store(tile_wide_ptr + b.to(tl.int64) * (s_pad // VB) + tile, tile_wide.to(tl.int8))
    tl.atomic_or(batch_wide_ptr + b, tile_wide, sem="relaxed")


@triton.jit
def _pow2(e):
    """2^e as float32 for int32 e in [-126, 127] (exact; built from the exponent bits)."""
    return ((e + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _scale_head_weights(w, m):
    """(wq [HEADS], rowfac, out_of_range) of one query row: module docstring of scoring.py."""
    bits = w.to(tl.int32, bitcast=True)
    field = (bits >> 23) & 0xFF
    counted = (field != 255) & (w != 0.0)  # finite and nonzero
    subnormal = (field == 0) & (w != 0.0)
    normalized = (tl.where(subnormal, w * 18446744073709551616.0, w).to(tl.int32, bitcast=True) >> 23) & 0xFF
    exponent = normalized - 126 - tl.where(subnormal, 64, 0) + m - 129  # |w * 2^(m - 129)| < 2^exponent
    top = tl.max(tl.where(counted, exponent, -(2**30)), axis=0)
    any_counted = top > -(2**30)
    shift = tl.where(any_counted, 127 - top, 149)  # a row of zero weights: rowfac 1
    scaled = exponent + shift
    out_of_range = (tl.max((counted & (scaled < MIN_SCALED_EXPONENT_C + 1)).to(tl.int32), axis=0) > 0) | (
        top > MAX_WEIGHT_EXPONENT_C
    )
    total = m - 129 + shift  # wq = w * 2^total, applied in three exact steps of at most 2^127
    first = tl.minimum(tl.maximum(total, -126), 127)
    second = tl.minimum(tl.maximum(total - first, -126), 127)
    wq = w * _pow2(first) * _pow2(second) * _pow2(tl.minimum(tl.maximum(total - first - second, -126), 127))
    rowfac = _pow2(tl.minimum(tl.maximum(149 - shift, -126), 127))
    return wq, rowfac, out_of_range


@triton.jit
def _decode_query_block(
    block,
    q_ptr,
    qs_ptr,
    num_vectors,
    lo_ptr,
    hi_ptr,
    exp_ptr,
    flags_ptr,
    summary_ptr,
    w_ptr,
    starts_ptr,
    ends_ptr,
    wq_ptr,
    rowfac_ptr,
    range_ptr,
    weight_scale,
    q_wide_ptr,
    q_unsupported_ptr,
    VB: tl.constexpr,
    WEIGHTS: tl.constexpr,
):
    """Decode query vectors [block * VB, block * VB + VB); with WEIGHTS (VB = 64 heads) also query row
    `block`'s head weights and row flags."""
    vec = block * VB + tl.arange(0, VB)
    live = vec < num_vectors
    vec = tl.where(live, vec, num_vectors)  # the output has one spare row for masked lanes
    m, flags = _decode_vectors(
        q_ptr, qs_ptr, vec.to(tl.int64) * 64, vec.to(tl.int64) * 4, live, lo_ptr, hi_ptr, exp_ptr, flags_ptr, vec, VB
    )
    _summarize_flags(summary_ptr, flags, live)
    if WEIGHTS:  # VB = 64 heads: this block is exactly one query row
        row = block
        row_ok = row * VB < num_vectors  # false only in the one program of an empty batch
        offs_h = tl.arange(0, VB)
        w = tl.load(w_ptr + row.to(tl.int64) * VB + offs_h, mask=row_ok, other=0.0)
        wq, rowfac, out_of_range = _scale_head_weights(w, m)
        wq = tl.where((flags & FLAG_NAN_SCALE_C) != 0, float("nan"), wq)
        tl.store(wq_ptr + row.to(tl.int64) * VB + offs_h, wq, mask=row_ok)
        tl.store(rowfac_ptr + row, rowfac * weight_scale, mask=row_ok)
        live_row = tl.load(ends_ptr + row, mask=row_ok, other=0) > tl.load(starts_ptr + row, mask=row_ok, other=0)
        refused = out_of_range & live_row
        tl.store(range_ptr + row, refused.to(tl.int8), mask=row_ok)
        tl.atomic_or(summary_ptr + 1, refused.to(tl.int32), sem="relaxed")
        wide = tl.max(((flags & FLAG_WIDE_C) != 0).to(tl.int32), axis=0) > 0
        unsupported = tl.max(((flags & FLAG_UNSUPPORTED_C) != 0).to(tl.int32), axis=0) > 0
        tl.store(q_wide_ptr + row, (wide & live_row).to(tl.int8), mask=row_ok)
        tl.store(q_unsupported_ptr + row, (unsupported | refused).to(tl.int8), mask=row_ok)


@triton.jit
def decode_kernel(
    key_programs,  # programs [0, key_programs) decode keys, the rest queries
    values_ptr,
    scales_ptr,
    value_page_stride,
    scale_page_stride,
    block_table_ptr,
    bt_stride,
    need_ptr,
    num_pages,
    s_pad,
    k_lo_ptr,
    k_hi_ptr,
    k_exp_ptr,
    k_flags_ptr,
    kfac_ptr,
    k_summary_ptr,
    tile_wide_ptr,
    batch_wide_ptr,
    q_ptr,
    qs_ptr,
    num_vectors,
    q_lo_ptr,
    q_hi_ptr,
    q_exp_ptr,
    q_flags_ptr,
    q_summary_ptr,
    w_ptr,
    starts_ptr,
    ends_ptr,
    wq_ptr,
    rowfac_ptr,
    range_ptr,
    weight_scale,
    q_wide_ptr,
    q_unsupported_ptr,
    KEYS: tl.constexpr,
    QUERIES: tl.constexpr,
    KEY_VB: tl.constexpr = VECTORS_PER_PROGRAM,
    PAGE: tl.constexpr = 64,
    TOKEN_STRIDE: tl.constexpr = 64,
    GROUP_STRIDE: tl.constexpr = 16,
    SCALE_OFFSET: tl.constexpr = 0,
    SCALE_GROUP_STRIDE: tl.constexpr = 1,
    INTERLEAVED: tl.constexpr = False,
    WEIGHTS: tl.constexpr = False,
    QUERY_VB: tl.constexpr = VECTORS_PER_PROGRAM,
):
    """Keys and queries in one launch: key tile t of sequence b in program b * (s_pad / KEY_VB) + t
    (_decode_key_tile), query block j in program key_programs + j (_decode_query_block). A side whose
    flag (KEYS, QUERIES) is false has no programs; its arguments are placeholders, never read."""
    pid = tl.program_id(0)
    if pid < key_programs:
        if KEYS:
            tiles = s_pad // KEY_VB
            _decode_key_tile(
                pid % tiles,
                pid // tiles,
                values_ptr,
                scales_ptr,
                value_page_stride,
                scale_page_stride,
                block_table_ptr,
                bt_stride,
                need_ptr,
                num_pages,
                s_pad,
                k_lo_ptr,
                k_hi_ptr,
                k_exp_ptr,
                k_flags_ptr,
                kfac_ptr,
                k_summary_ptr,
                tile_wide_ptr,
                batch_wide_ptr,
                KEY_VB,
                PAGE,
                TOKEN_STRIDE,
                GROUP_STRIDE,
                SCALE_OFFSET,
                SCALE_GROUP_STRIDE,
                INTERLEAVED,
            )
    else:
        if QUERIES:
            _decode_query_block(
                pid - key_programs,
                q_ptr,
                qs_ptr,
                num_vectors,
                q_lo_ptr,
                q_hi_ptr,
                q_exp_ptr,
                q_flags_ptr,
                q_summary_ptr,
                w_ptr,
                starts_ptr,
                ends_ptr,
                wq_ptr,
                rowfac_ptr,
                range_ptr,
                weight_scale,
                q_wide_ptr,
                q_unsupported_ptr,
                QUERY_VB,
                WEIGHTS,
            )


@dataclass(frozen=True)
class _Side:
    """One side (keys or queries) of a decode_kernel launch: its arguments, constexprs and programs."""

    args: tuple
    constants: dict
    programs: int


_KEY_ARGUMENTS = 17  # decode_kernel's key arguments (values_ptr .. batch_wide_ptr)
_QUERY_ARGUMENTS = 17  # its query arguments (q_ptr .. q_unsupported_ptr)


def _launch_decode(keys: _Side | None, queries: _Side | None) -> None:
    """One decode_kernel launch over the sides given (at least one)."""
    placeholder = (keys or queries).args[0]  # the absent side's arguments: never read
    key_args = keys.args if keys else (placeholder,) * _KEY_ARGUMENTS
    query_args = queries.args if queries else (placeholder,) * _QUERY_ARGUMENTS
    assert len(key_args) == _KEY_ARGUMENTS and len(query_args) == _QUERY_ARGUMENTS
    key_programs = keys.programs if keys else 0
    programs = key_programs + (queries.programs if queries else 0)
    if programs:
        decode_kernel[(programs,)](
            key_programs,
            *key_args,
            *query_args,
            KEYS=keys is not None,
            QUERIES=queries is not None,
            **(keys.constants if keys else {}),
            **(queries.constants if queries else {}),
        )


def _key_side(
    cache: KVCache,
    block_table: torch.Tensor,
    need: torch.Tensor,
    s_pad: int,
    summary: torch.Tensor | None,
    batch_wide: torch.Tensor | None,
    block_keys: int,
    scratch: Scratch,
) -> tuple[tuple, _Side]:
    """(decode_keys_fp4_triton's outputs, the launch's key side)."""
    batch = block_table.shape[0]
    lo = scratch.empty((batch, s_pad, 128), torch.int8)
    hi = scratch.empty((batch, s_pad, 128), torch.int8)
    exp = scratch.empty((batch, s_pad), torch.int32)
    flags = scratch.empty((batch, s_pad), torch.int8)
    kfac = scratch.empty((batch, s_pad), torch.float32)
    tile_wide = scratch.empty((batch, s_pad // block_keys), torch.int8)
    summary = summary if summary is not None else scratch.zeros(1, torch.int32)
    batch_wide = batch_wide if batch_wide is not None else scratch.zeros(batch, torch.int32)
    args = (
        cache.values,
        cache.scales,
        cache.value_page_stride,
        cache.scale_page_stride,
        block_table,
        block_table.stride(0),
        need,
        cache.num_pages,
        s_pad,
        lo.view(torch.int16),
        hi.view(torch.int16),
        exp,
        flags,
        kfac,
        summary,
        tile_wide,
        batch_wide,
    )
    constants = dict(
        KEY_VB=block_keys,
        PAGE=PAGE_SIZE,
        TOKEN_STRIDE=cache.value_token_stride,
        GROUP_STRIDE=cache.value_group_stride,
        SCALE_OFFSET=cache.scale_offset,
        SCALE_GROUP_STRIDE=cache.scale_group_stride,
        INTERLEAVED=cache.interleaved_scales,
    )
    return (lo, hi, exp, flags, kfac, tile_wide, batch_wide), _Side(args, constants, (s_pad // block_keys) * batch)


def _query_side(
    q_fp4: torch.Tensor,
    q_scale: torch.Tensor,
    weights: torch.Tensor | None,
    windows: tuple[torch.Tensor, torch.Tensor] | None,
    summary: torch.Tensor | None,
    weight_scale: float,
    scratch: Scratch,
) -> tuple[tuple, _Side]:
    """(prepare_queries_fp4_triton's outputs, the launch's query side)."""
    if (weights is None) != (windows is None):
        raise ValueError("prepare_queries_fp4_triton takes weights and windows together (the live rows' head weights)")
    rows, heads = q_fp4.shape[:2]
    n = rows * heads
    lo = scratch.empty((n + 1, 128), torch.int8)
    hi = scratch.empty((n + 1, 128), torch.int8)
    exp = scratch.empty(n + 1, torch.int32)
    flags = scratch.empty(n + 1, torch.int8)
    summary = summary if summary is not None else scratch.zeros(2, torch.int32)
    with_weights = weights is not None
    if with_weights:
        wq = scratch.empty((rows, heads), torch.float32)
        rowfac = scratch.empty(rows, torch.float32)
        refused, q_wide, q_unsupported = (scratch.empty(rows, torch.int8) for _ in range(3))
    else:
        wq = rowfac = exp
        refused = q_wide = q_unsupported = flags
    args = (
        q_fp4,
        q_scale,
        n,
        lo.view(torch.int16),
        hi.view(torch.int16),
        exp,
        flags,
        summary,
        weights if with_weights else exp,
        *(windows if with_weights else (exp, exp)),
        wq,
        rowfac,
        refused,
        float(weight_scale),
        q_wide,
        q_unsupported,
    )
    decoded = (
        lo[:n].view(rows, heads, 128),
        hi[:n].view(rows, heads, 128),
        exp[:n].view(rows, heads),
        flags[:n].view(rows, heads),
    )
    if with_weights:
        decoded += (wq, rowfac, refused, q_wide.view(torch.bool), q_unsupported.view(torch.bool))
    return decoded, _Side(args, dict(WEIGHTS=with_weights), triton.cdiv(max(n, 1), VECTORS_PER_PROGRAM))


def decode_keys_fp4_triton(
    cache: KVCache,
    block_table: torch.Tensor,
    need: torch.Tensor,
    s_pad: int,
    summary: torch.Tensor | None = None,
    batch_wide: torch.Tensor | None = None,
    *,
    block_keys: int = VECTORS_PER_PROGRAM,
    scratch: Scratch | None = None,
):
    """Decode positions [0, need[b]) of every sequence b of `cache` (either format, read in place) into
    (lo, hi int8 [B, s_pad, 128], exponent int32 [B, s_pad], flags int8 [B, s_pad], kfac float32
    [B, s_pad] = 2^(exponent - 127) or NaN for a NaN scale, tile_wide int8 [B, s_pad / block_keys]: a
    key tile of the scoring kernels holds a wide key, batch_wide int32 [B]: the sequence does); see the
    module docstring. s_pad is a multiple of block_keys (a power of two >= 16). The flags of the decoded
    vectors are ORed into the int32 `summary[0]` and the tiles' wide bits into `batch_wide`, which must
    be zeroed when given (the row checks' zeroed words)."""
    outputs, keys = _key_side(
        cache, block_table, need, s_pad, summary, batch_wide, block_keys, scratch or Scratch(cache.device)
    )
    _launch_decode(keys, None)
    return outputs


def decode_queries_fp4_triton(q_fp4: torch.Tensor, q_scale: torch.Tensor, summary: torch.Tensor | None = None):
    """Decode q [rows, 64 heads] into (lo, hi int8 [rows, 64, 128], exponent int32 [rows, 64],
    flags int8 [rows, 64]); see the module docstring. The flags of every vector are ORed into the
    int32 `summary[0]` when given."""
    return prepare_queries_fp4_triton(q_fp4, q_scale, summary=summary)[:4]


def prepare_queries_fp4_triton(
    q_fp4: torch.Tensor,
    q_scale: torch.Tensor,
    weights: torch.Tensor | None = None,
    windows: tuple[torch.Tensor, torch.Tensor] | None = None,
    summary: torch.Tensor | None = None,
    weight_scale: float = 1.0,
    scratch: Scratch | None = None,
):
    """decode_queries_fp4_triton's outputs, and with float32 `weights [rows, 64]` and the rows' `windows`
    (starts, ends int32 [rows]; a live row: end > start) also the scoring kernel's head weights and
    row flags: (wq float32 [rows, 64], rowfac float32 [rows] (times weight_scale, in float32),
    refused int8 [rows], q_wide bool [rows], q_unsupported bool [rows]) as scoring.py's docstring
    defines them (NaN where a scale byte is NaN); refused marks the live rows outside the supported
    weight range, and `summary[1]` (int32, when given) gets 1 when there is one; q_wide: a live row
    with a wide head vector; q_unsupported: a row with a head vector of spread > 7, or refused."""
    outputs, queries = _query_side(
        q_fp4, q_scale, weights, windows, summary, weight_scale, scratch or Scratch(q_fp4.device)
    )
    _launch_decode(None, queries)
    return outputs


def decode_operands_triton(
    cache: KVCache,
    block_table: torch.Tensor,
    need: torch.Tensor,
    s_pad: int,
    summary: torch.Tensor,
    batch_wide: torch.Tensor,
    q_fp4: torch.Tensor,
    q_scale: torch.Tensor,
    weights: torch.Tensor,
    windows: tuple[torch.Tensor, torch.Tensor],
    weight_scale: float,
    *,
    block_keys: int,
    scratch: Scratch,
) -> tuple[tuple, tuple]:
    """decode_keys_fp4_triton (summary[0], batch_wide) and prepare_queries_fp4_triton with weights
    (summary[1:3]) in one launch: (the keys' outputs, the queries' outputs), the same bits."""
    key_outputs, keys = _key_side(cache, block_table, need, s_pad, summary[0:1], batch_wide, block_keys, scratch)
    query_outputs, queries = _query_side(q_fp4, q_scale, weights, windows, summary[1:3], weight_scale, scratch)
    _launch_decode(keys, queries)
    return key_outputs, query_outputs


@triton.jit
def unsupported_rows_kernel(
    key_flags_ptr,
    s_pad,
    summary_ptr,
    rtb_ptr,
    starts_ptr,
    ends_ptr,
    q_unsupported_ptr,
    out_ptr,
    status_ptr,
    nonfinite_ptr,
    BLOCK: tl.constexpr,
    STATUS: tl.constexpr,
):
    """unsupported[row] = a live row whose query is unsupported or whose window holds an unsupported key;
    the window is read only when the key summary says some decoded key is unsupported. STATUS: out
    gets int32 status[row] | NONFINITE where nonfinite[row] | UNSUPPORTED where unsupported, instead of
    the int8 flag."""
    row = tl.program_id(0)
    start = tl.load(starts_ptr + row)
    end = tl.load(ends_ptr + row)
    b = tl.load(rtb_ptr + row).to(tl.int64)
    bad_keys = 0
    if (tl.load(summary_ptr) & FLAG_UNSUPPORTED_C) != 0:
        for p0 in range(start, end, BLOCK):
            offs = p0 + tl.arange(0, BLOCK)
            flags = tl.load(key_flags_ptr + b * s_pad + offs, mask=offs < end, other=0).to(tl.int32)
            bad_keys += tl.sum(((flags & FLAG_UNSUPPORTED_C) != 0).to(tl.int32), axis=0)
    bad = (end > start) & ((tl.load(q_unsupported_ptr + row) != 0) | (bad_keys > 0))
    if STATUS:
        status = tl.load(status_ptr + row)
        status |= tl.where(tl.load(nonfinite_ptr + row) != 0, STATUS_NONFINITE_C, 0)
        tl.store(out_ptr + row, status | tl.where(bad, STATUS_UNSUPPORTED_C, 0))
    else:
        tl.store(out_ptr + row, bad.to(tl.int8))


def _unsupported_rows_launch(
    key_flags, summary, row_to_batch, starts, ends, q_unsupported, out, status=None, nonfinite=None
) -> None:
    rows = starts.shape[0]
    if rows:
        with_status = status is not None
        unsupported_rows_kernel[(rows,)](
            key_flags,
            key_flags.shape[1],
            summary,
            row_to_batch,
            starts,
            ends,
            q_unsupported.view(torch.int8),
            out,
            status if with_status else out,
            nonfinite.view(torch.int8) if with_status else out,
            BLOCK=256,
            STATUS=with_status,
        )


def unsupported_rows_triton(
    key_flags: torch.Tensor,
    summary: torch.Tensor,
    row_to_batch: torch.Tensor,
    starts: torch.Tensor,
    ends: torch.Tensor,
    q_unsupported: torch.Tensor,
    scratch: Scratch,
) -> torch.Tensor:
    """bool [rows]: TritonBackend.unsupported_rows in one launch, from the keys' decode flags int8
    [B, s_pad], the decode summary (int32, summary[0]: OR of the key flags) and the rows' q_unsupported."""
    out = scratch.empty(starts.shape[0], torch.int8)
    _unsupported_rows_launch(key_flags, summary, row_to_batch, starts, ends, q_unsupported, out)
    return out.view(torch.bool)


def scoring_faults_triton(
    key_flags: torch.Tensor,
    summary: torch.Tensor,
    row_to_batch: torch.Tensor,
    starts: torch.Tensor,
    ends: torch.Tensor,
    q_unsupported: torch.Tensor,
    status: torch.Tensor,
    nonfinite: torch.Tensor,
    scratch: Scratch,
) -> torch.Tensor:
    """int32 [rows]: `status` | NONFINITE where bool `nonfinite` | UNSUPPORTED where unsupported_rows_triton
    is true, in the same one launch (ScoringBackend.scoring_faults)."""
    out = scratch.empty(starts.shape[0], torch.int32)
    _unsupported_rows_launch(key_flags, summary, row_to_batch, starts, ends, q_unsupported, out, status, nonfinite)
    return out
