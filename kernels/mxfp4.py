"""MXFP4 codec: E2M1 values, two per byte, with one UE8M0 scale byte per 32 elements.

Layer: formats, at the bottom of `litetopk.kernels` (imports errors only).

Format (docs/contract.md §1):
- element 2i lives in the LOW nibble of byte i, element 2i+1 in the HIGH nibble;
- nibble = sign bit 0x8 | index into E2M1_VALUES = (0, 0.5, 1, 1.5, 2, 3, 4, 6);
- scale byte s means 2^(s - 127); one per 32 consecutive elements, group 0 first.

Quantization (the OCP MX rule used by the DeepSeek-V4 indexer): per group, amax = max |x|
clamped to >= 6 * 2^-127, scale = 2^ceil(log2(amax / 6)), code = round-to-nearest-even of
x / scale onto E2M1 (|x / scale| <= 6 by construction, so nothing saturates). The codes agree
byte for byte with `ml_dtypes.float4_e2m1fn`, signed zeros included (for float64 input off the
float32 grid we round once, exactly; ml_dtypes rounds through float32 there). A group whose
amax exceeds 6 * 2^127 (only possible in float64) has no scale byte and is an error.

Works on any device; quantization runs in float64 so that x / scale is exact.
"""

from __future__ import annotations

import torch

from .errors import InputError

GROUP_SIZE = 32
SCALE_BIAS = 127
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# Midpoints between consecutive magnitudes; a tie rounds to the even code, i.e. up at odd midpoints.
_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_MIN_AMAX = 6.0 * 2.0**-127
_MAX_AMAX = 6.0 * 2.0**127  # largest magnitude with a scale byte (254); 255 is NaN in UE8M0
#: Decoded value of each code 0..15 (code 8 is -0.0, as in ml_dtypes.float4_e2m1fn).
_DECODED = E2M1_VALUES + tuple(-v for v in E2M1_VALUES)


def _check_float_groups(x: torch.Tensor) -> None:
    if not torch.is_floating_point(x):
        raise InputError(f"quantize_mxfp4 needs a floating-point tensor, got {x.dtype}")
    if x.ndim == 0 or x.shape[-1] % GROUP_SIZE != 0:
        raise InputError(f"quantize_mxfp4 needs a last dimension divisible by {GROUP_SIZE}, got shape {tuple(x.shape)}")
    if not bool(torch.isfinite(x).all()):
        raise InputError("quantize_mxfp4 got NaN or inf values; MXFP4 cannot represent them")


def e2m1_codes(v: torch.Tensor) -> torch.Tensor:
    """Round float64 values with |v| <= 6 to E2M1 codes (uint8, 0..15) by round-to-nearest-even."""
    mag = v.abs()
    code = torch.zeros(v.shape, dtype=torch.uint8, device=v.device)
    for i, mid in enumerate(_MIDPOINTS):
        up = (mag > mid) | ((mag == mid) & (i % 2 == 1))
        code += up.to(torch.uint8)
    return code | (torch.signbit(v).to(torch.uint8) << 3)


def quantize_mxfp4(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize `x[..., D]` (D divisible by 32) to MXFP4.

    Returns `(packed uint8[..., D/2], scales uint8[..., D/32])` on x's device. Raises InputError
    for a non-float tensor, a bad last dimension, or any NaN/inf element.
    """
    _check_float_groups(x)
    groups = x.to(torch.float64).reshape(*x.shape[:-1], -1, GROUP_SIZE)
    amax = groups.abs().amax(dim=-1).clamp_min(_MIN_AMAX)
    if bool((amax > _MAX_AMAX).any()):
        raise InputError(
            f"quantize_mxfp4 got a magnitude of {float(amax.max()):.6g}, beyond the largest MXFP4 value "
            f"6 * 2^127 ({_MAX_AMAX:.6g}); no scale byte can represent it"
        )
    mantissa, exponent = torch.frexp(amax / 6.0)  # amax/6 = mantissa * 2^exponent, mantissa in [0.5, 1)
    scale_exp = torch.where(mantissa == 0.5, exponent - 1, exponent)  # ceil(log2(amax / 6))
    scaled = groups / torch.ldexp(torch.ones_like(amax), scale_exp.to(torch.float64)).unsqueeze(-1)
    codes = e2m1_codes(scaled).reshape(*x.shape[:-1], -1)
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    scales = (scale_exp + SCALE_BIAS).to(torch.uint8)
    return packed.contiguous(), scales.contiguous()


def unpack_e2m1_codes(packed: torch.Tensor) -> torch.Tensor:
    """Nibbles of `packed uint8[..., D/2]` as codes uint8[..., D], element 2i from the low nibble."""
    low = packed & 0x0F
    high = packed >> 4
    return torch.stack((low, high), dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def dequantize_mxfp4(packed: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Decode `packed uint8[..., D/2]` with `scales uint8[..., D/32]` to `dtype[..., D]`.

    Exact in float64 for every scale byte; in float32 values beyond its range become inf and
    scale byte 255 (NaN in UE8M0) decodes to NaN in both.
    """
    if packed.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise InputError(f"dequantize_mxfp4 needs uint8 tensors, got {packed.dtype} and {scales.dtype}")
    if packed.shape[:-1] != scales.shape[:-1] or packed.shape[-1] * 2 != scales.shape[-1] * GROUP_SIZE:
        raise InputError(
            f"packed {tuple(packed.shape)} and scales {tuple(scales.shape)} do not describe the same "
            f"vectors (need packed[..., D/2] and scales[..., D/{GROUP_SIZE}])"
        )
    table = torch.tensor(_DECODED, dtype=torch.float64, device=packed.device)
    values = table[unpack_e2m1_codes(packed).long()]
    exponent = scales.to(torch.float64) - SCALE_BIAS
    factor = torch.where(scales == 255, torch.nan, torch.exp2(exponent))
    out = values.reshape(*scales.shape, GROUP_SIZE) * factor.unsqueeze(-1)
    return out.reshape(*packed.shape[:-1], -1).to(dtype)
