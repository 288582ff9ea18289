"""MXFP4 -> exact int8 operands for tensor-core scoring (Triton, sm_90 and the interpreter).

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
Keys are read through the block table (positions >= `need[b]` or on an invalid page decode to
zero); queries are read in place. Tiling: VB vectors per program, 128 elements each.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..cache_layout import PAGE_BYTES, PAGE_SIZE, PAGE_VALUE_BYTES

FLAG_WIDE = 1
FLAG_UNSUPPORTED = 2
FLAG_NAN_SCALE = 4
VECTORS_PER_PROGRAM = 32


@triton.jit
def _decode_vectors(packed_ptr, scale_ptr, packed_off, scale_off, live, lo_ptr, hi_ptr, exp_ptr, flags_ptr, out_vec,
                    VB: tl.constexpr):
    """Decode VB vectors whose bytes start at packed_off / scale_off (int64 [VB]) into row out_vec."""
    offs_b = tl.arange(0, 64)
    offs_g = tl.arange(0, 4)
    packed = tl.load(packed_ptr + packed_off[:, None] + offs_b[None, :], mask=live[:, None], other=0).to(tl.int32)
    scales = tl.load(scale_ptr + scale_off[:, None] + offs_g[None, :], mask=live[:, None], other=127).to(tl.int32)
    codes = tl.reshape(tl.join(packed & 0xF, packed >> 4), [VB, 128])  # element 2i = low nibble
    mag = codes & 7
    val = tl.where(mag < 2, mag, (2 + (mag & 1)) << tl.maximum((mag >> 1) - 1, 0))
    val = tl.where((codes & 8) != 0, -val, val)
    # Blocks that set the common exponent: nonzero ones with a finite scale (255 is NaN, flagged).
    group_nonzero = (tl.max(tl.reshape(mag, [VB, 4, 32]), axis=2) > 0) & (scales != 255)  # [VB, 4]
    m = tl.min(tl.where(group_nonzero, scales, 255), axis=1)  # [VB]
    m = tl.where(tl.max(group_nonzero.to(tl.int32), axis=1) > 0, m, 127)
    d = tl.where(group_nonzero, scales - m[:, None], 0)  # [VB, 4]
    spread = tl.max(d, axis=1)
    d_elem = tl.reshape(tl.broadcast_to(d[:, :, None], [VB, 4, 32]), [VB, 128])
    lo = tl.where(d_elem <= 3, val << tl.minimum(d_elem, 3), 0)
    hi = tl.where((d_elem >= 4) & (d_elem <= 7), val << tl.minimum(tl.maximum(d_elem - 4, 0), 3), 0)
    nan_scale = tl.max((scales == 255).to(tl.int32), axis=1) > 0
    flags = (spread >= 4).to(tl.int32) * 1 + (spread >= 8).to(tl.int32) * 2 + nan_scale.to(tl.int32) * 4
    offs_e = tl.arange(0, 128)
    out_off = out_vec.to(tl.int64)[:, None] * 128 + offs_e[None, :]
    tl.store(lo_ptr + out_off, lo.to(tl.int8))
    tl.store(hi_ptr + out_off, hi.to(tl.int8))
    tl.store(exp_ptr + out_vec, m)
    tl.store(flags_ptr + out_vec, flags.to(tl.int8))


@triton.jit
def _decode_keys_kernel(cache_ptr, block_table_ptr, bt_stride, need_ptr, num_pages, s_pad,
                        lo_ptr, hi_ptr, exp_ptr, flags_ptr,
                        VB: tl.constexpr, PAGE: tl.constexpr, PAGE_BYTES_C: tl.constexpr, VALUE_BYTES_C: tl.constexpr):
    b = tl.program_id(1)
    pos = tl.program_id(0) * VB + tl.arange(0, VB)
    need = tl.load(need_ptr + b)
    page = tl.load(block_table_ptr + b.to(tl.int64) * bt_stride + pos // PAGE, mask=pos < need, other=-1).to(tl.int64)
    live = (pos < need) & (page >= 0) & (page < num_pages)
    page = tl.where(live, page, 0)
    base = page * PAGE_BYTES_C
    packed_off = base + (pos % PAGE).to(tl.int64) * 64
    scale_off = base + VALUE_BYTES_C + (pos % PAGE).to(tl.int64) * 4
    out_vec = b.to(tl.int64) * s_pad + pos
    _decode_vectors(cache_ptr, cache_ptr, packed_off, scale_off, live, lo_ptr, hi_ptr, exp_ptr, flags_ptr, out_vec, VB)


@triton.jit
def _decode_queries_kernel(q_ptr, qs_ptr, num_vectors, lo_ptr, hi_ptr, exp_ptr, flags_ptr, VB: tl.constexpr):
    vec = tl.program_id(0) * VB + tl.arange(0, VB)
    live = vec < num_vectors
    vec = tl.where(live, vec, num_vectors)  # the output has one spare row for masked lanes
    _decode_vectors(q_ptr, qs_ptr, vec.to(tl.int64) * 64, vec.to(tl.int64) * 4, live,
                    lo_ptr, hi_ptr, exp_ptr, flags_ptr, vec, VB)


def decode_keys_fp4_triton(kv_cache: torch.Tensor, block_table: torch.Tensor, need: torch.Tensor, s_pad: int):
    """Decode positions [0, need[b]) of every sequence b into (lo, hi int8 [B, s_pad, 128],
    exponent int32 [B, s_pad], flags int8 [B, s_pad]); see the module docstring."""
    batch = block_table.shape[0]
    dev = kv_cache.device
    lo = torch.empty(batch, s_pad, 128, dtype=torch.int8, device=dev)
    hi = torch.empty_like(lo)
    exp = torch.empty(batch, s_pad, dtype=torch.int32, device=dev)
    flags = torch.empty(batch, s_pad, dtype=torch.int8, device=dev)
    grid = (triton.cdiv(s_pad, VECTORS_PER_PROGRAM), batch)
    _decode_keys_kernel[grid](
        kv_cache, block_table, block_table.stride(0), need, kv_cache.shape[0], s_pad, lo, hi, exp, flags,
        VB=VECTORS_PER_PROGRAM, PAGE=PAGE_SIZE, PAGE_BYTES_C=PAGE_BYTES, VALUE_BYTES_C=PAGE_VALUE_BYTES,
    )
    return lo, hi, exp, flags


def decode_queries_fp4_triton(q_fp4: torch.Tensor, q_scale: torch.Tensor):
    """Decode q [rows, 64 heads] into (lo, hi int8 [rows, 64, 128], exponent int32 [rows, 64],
    flags int8 [rows, 64]); see the module docstring."""
    rows, heads = q_fp4.shape[:2]
    n = rows * heads
    dev = q_fp4.device
    lo = torch.empty(n + 1, 128, dtype=torch.int8, device=dev)
    hi = torch.empty_like(lo)
    exp = torch.empty(n + 1, dtype=torch.int32, device=dev)
    flags = torch.empty(n + 1, dtype=torch.int8, device=dev)
    grid = (triton.cdiv(max(n, 1), VECTORS_PER_PROGRAM),)
    _decode_queries_kernel[grid](q_fp4, q_scale, n, lo, hi, exp, flags, VB=VECTORS_PER_PROGRAM)
    return (lo[:n].view(rows, heads, 128), hi[:n].view(rows, heads, 128),
            exp[:n].view(rows, heads), flags[:n].view(rows, heads))
