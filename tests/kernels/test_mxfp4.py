"""MXFP4 codec (docs/contract.md §1, §7) against `ml_dtypes.float4_e2m1fn`, byte for byte.

`ref_quantize_mxfp4` / `ref_dequantize_mxfp4` below are written from the contract with numpy and
ml_dtypes only: scale = the smallest power of two 2^e with amax <= 6 * 2^e (amax clamped to
>= 6 * 2^-127), codes = float4_e2m1fn(x / 2^e) (round to nearest even), element 2i in the low
nibble, scale byte e + 127.

ml_dtypes converts float64 to float4_e2m1fn through float32 (0.75 - 2^-30 becomes 0.75, then
ties to 1.0), so it is a correct round-to-nearest-even oracle only for x / scale on the float32
grid. The reference checks that every value it hands to ml_dtypes is on that grid (or far below
the smallest midpoint); float64 values between float32 neighbours near a midpoint are tested
against a literal table instead (`test_encode_rounds_float64_once`).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

from litetopk.kernels import InputError, dequantize_mxfp4, quantize_mxfp4

F4 = ml_dtypes.float4_e2m1fn
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
LARGEST_SCALE_BYTE = 254  # 255 is NaN in UE8M0


def ref_scale_exponent(amax: np.ndarray) -> np.ndarray:
    """Smallest integer e with amax <= 6 * 2^e (amax already clamped)."""
    e = np.ceil(np.log2(amax / 6.0)).astype(np.int64)
    e += (6.0 * np.exp2(e.astype(np.float64)) < amax).astype(np.int64)
    e -= (6.0 * np.exp2(e.astype(np.float64) - 1.0) >= amax).astype(np.int64)
    return e


def ref_quantize_mxfp4(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    groups = x.astype(np.float64).reshape(*x.shape[:-1], -1, 32)
    amax = np.maximum(np.abs(groups).max(axis=-1), 6.0 * 2.0**-127)
    e = ref_scale_exponent(amax)
    scaled = groups / np.exp2(e.astype(np.float64))[..., None]  # exact: power-of-two scale
    on_f32_grid = (scaled.astype(np.float32).astype(np.float64) == scaled) | (np.abs(scaled) < 2.0**-100)
    assert on_f32_grid.all(), "ref_quantize_mxfp4 only takes values ml_dtypes rounds exactly"
    codes = scaled.astype(F4).view(np.uint8)
    codes = codes.reshape(*x.shape[:-1], -1)
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return packed.astype(np.uint8), (e + 127).astype(np.uint8)


def ref_dequantize_mxfp4(packed: np.ndarray, scales: np.ndarray) -> np.ndarray:
    codes = np.stack([packed & 0xF, packed >> 4], axis=-1).reshape(*packed.shape[:-1], -1)
    values = codes.astype(np.uint8).view(F4).astype(np.float64)
    factor = np.where(scales == 255, np.nan, np.exp2(scales.astype(np.float64) - 127.0))
    return (values.reshape(*scales.shape, 32) * factor[..., None]).reshape(values.shape)


def assert_bytes_equal(got: tuple[torch.Tensor, torch.Tensor], want: tuple[np.ndarray, np.ndarray], case: str):
    packed, scales = (t.numpy() for t in got)
    bad_scale = np.argwhere(scales != want[1])
    bad_packed = np.argwhere(packed != want[0])
    assert bad_scale.size == 0, (
        f"{case}: scale bytes differ from ml_dtypes at {bad_scale[:5].tolist()}: "
        f"got {scales[tuple(bad_scale[0])]}, want {want[1][tuple(bad_scale[0])]}"
    )
    assert bad_packed.size == 0, (
        f"{case}: packed bytes differ from ml_dtypes at {bad_packed[:5].tolist()}: "
        f"got {packed[tuple(bad_packed[0])]:#04x}, want {want[0][tuple(bad_packed[0])]:#04x}"
    )


# ---- decoding ----------------------------------------------------------------------------------


def all_bytes_at_every_scale() -> tuple[np.ndarray, np.ndarray]:
    """packed [256 scale bytes, 256] (every byte value) and scales [256, 16]."""
    packed = np.tile(np.arange(256, dtype=np.uint8), (256, 1))
    scales = np.repeat(np.arange(256, dtype=np.uint8)[:, None], 16, axis=1)
    return packed, scales


def test_decode_every_code_at_every_scale_byte_float64():
    packed, scales = all_bytes_at_every_scale()
    got = dequantize_mxfp4(torch.from_numpy(packed), torch.from_numpy(scales), torch.float64).numpy()
    want = ref_dequantize_mxfp4(packed, scales)
    finite = scales[:, :1].repeat(512, axis=1) != 255
    assert np.array_equal(got[finite], want[finite]), "float64 decode differs from ml_dtypes * 2^(s-127)"
    assert np.array_equal(np.signbit(got[finite]), np.signbit(want[finite])), "signed zeros differ"
    assert np.isnan(got[~finite]).all(), "scale byte 255 (NaN in UE8M0) must decode to NaN"


def test_decode_every_code_at_every_scale_byte_float32():
    packed, scales = all_bytes_at_every_scale()
    got = dequantize_mxfp4(torch.from_numpy(packed), torch.from_numpy(scales)).numpy()
    assert got.dtype == np.float32
    with np.errstate(over="ignore"):
        want = ref_dequantize_mxfp4(packed, scales).astype(np.float32)  # beyond float32: inf
    assert np.array_equal(got, want, equal_nan=True), "float32 decode differs from float64 decode rounded"


def test_all_16_codes_decode_to_e2m1_values():
    codes = np.arange(16, dtype=np.uint8)
    packed = (codes[0::2] | (codes[1::2] << 4)).astype(np.uint8)
    packed = np.concatenate([packed, packed])[None, :]  # 32 elements: every code twice
    got = dequantize_mxfp4(torch.from_numpy(packed), torch.tensor([[127]], dtype=torch.uint8), torch.float64)
    want = np.array(E2M1_MAGNITUDES + tuple(-v for v in E2M1_MAGNITUDES))
    assert got[0, :16].tolist() == want.tolist()
    assert np.signbit(got[0, 8].item()), "code 8 is -0.0"
    assert got[0, :16].tolist() == codes.view(F4).astype(np.float64).tolist()


def test_nibble_order_low_first():
    # element 0 = 1.0 (code 2) in the low nibble, element 1 = -6.0 (code 15) in the high nibble
    x = torch.zeros(32)
    x[0], x[1] = 1.0, -6.0
    packed, scales = quantize_mxfp4(x)
    assert packed[0].item() == 0xF2
    assert scales.tolist() == [127]


def test_scale_groups_in_order():
    # four groups with amax 6 * 2^g for g = -3, 0, 5, 1: scale bytes in the same order
    x = torch.zeros(128, dtype=torch.float64)
    for group, g in enumerate((-3, 0, 5, 1)):
        x[group * 32 + 7] = 6.0 * 2.0**g
    assert quantize_mxfp4(x)[1].tolist() == [124, 127, 132, 128]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_decode_rejects_bad_arguments(dtype):
    with pytest.raises(InputError):
        dequantize_mxfp4(torch.zeros(16, dtype=dtype), torch.zeros(1, dtype=torch.uint8))
    with pytest.raises(InputError, match="same"):
        dequantize_mxfp4(torch.zeros(16, dtype=torch.uint8), torch.zeros(2, dtype=torch.uint8))


# ---- encoding ----------------------------------------------------------------------------------


def test_encode_every_scale_byte():
    """Row s holds every E2M1 value times 2^(s-127) (and 6 * 2^(s-127), so the scale is s)."""
    s = np.arange(LARGEST_SCALE_BYTE + 1)
    codes = np.tile(np.arange(32) % 16, (s.size, 1)).astype(np.uint8)
    codes[:, 31] = 7  # +6: the group's amax
    values = codes.view(F4).astype(np.float64) * np.exp2(s - 127.0)[:, None]
    packed, scales = quantize_mxfp4(torch.from_numpy(values))
    bad = np.nonzero(scales.numpy()[:, 0] != s)[0]
    assert bad.size == 0, f"scale bytes {bad[:8].tolist()} come back as {scales.numpy()[bad[:8], 0].tolist()}"
    assert_bytes_equal((packed, scales), ref_quantize_mxfp4(values), "every scale byte")
    want_packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    assert np.array_equal(packed.numpy(), want_packed), "codes of exactly representable values"


@pytest.mark.parametrize(
    "dtype, lo, hi",
    [
        (torch.float64, -300, 127),  # every scale byte, and groups far below the smallest scale
        (torch.float32, -149, 125),  # float32 subnormals to near float32 max
        (torch.bfloat16, -133, 125),
        (torch.float16, -24, 12),
    ],
    ids=["float64", "float32", "bfloat16", "float16"],
)
def test_encode_random_values_over_many_magnitudes(seed, dtype, lo, hi):
    gen = np.random.default_rng(seed)
    groups = 4096
    exponent = gen.integers(lo, hi + 1, size=(groups, 1))
    spread = gen.integers(0, 12, size=(groups, 1))  # magnitudes inside a group span up to 12 binades
    mantissa = gen.standard_normal((groups, 32)).astype(np.float32).astype(np.float64)  # see module doc
    x = mantissa * np.exp2(exponent - gen.integers(0, spread + 1, size=(groups, 32)))
    x[gen.random((groups, 32)) < 0.05] = 0.0
    x[gen.random((groups, 32)) < 0.05] = -0.0
    xt = torch.from_numpy(x).to(dtype)
    assert torch.isfinite(xt).all()
    case = f"{dtype}, exponents [{lo}, {hi}], seed {seed}"
    assert_bytes_equal(quantize_mxfp4(xt), ref_quantize_mxfp4(xt.double().numpy()), case)


def test_encode_signed_zeros():
    x = torch.zeros(4, 32)
    x[1] = -0.0
    x[2, 0::2] = -0.0
    x[3, 5] = -(2.0**-140)  # rounds to -0 at the smallest scale
    packed, scales = quantize_mxfp4(x)
    assert scales.flatten().tolist() == [0, 0, 0, 0], "all-zero groups take the clamped scale 2^-127"
    assert (packed[0] == 0x00).all() and (packed[1] == 0x88).all() and (packed[2] == 0x08).all()
    assert packed[3, 2].item() == 0x80 and (packed[3, :2] == 0).all() and (packed[3, 3:] == 0).all()
    assert_bytes_equal((packed, scales), ref_quantize_mxfp4(x.double().numpy()), "signed zeros")
    decoded = dequantize_mxfp4(packed, scales, torch.float64)
    assert torch.equal(torch.signbit(decoded), torch.signbit(x.double()) & (decoded == 0)), "zero signs survive decode"


# Midpoints between consecutive E2M1 magnitudes and where round-to-nearest-even sends them.
MIDPOINTS = [(0.25, 0.0), (0.75, 1.0), (1.25, 1.0), (1.75, 2.0), (2.5, 2.0), (3.5, 4.0), (5.0, 4.0)]


@pytest.mark.parametrize("scale_byte", [0, 1, 60, 126, 127, 128, 200, 254])
def test_encode_rounding_midpoints(scale_byte):
    scale = 2.0 ** (scale_byte - 127)
    mids = np.array([m for m, _ in MIDPOINTS])
    # each midpoint exactly, one float32 ulp below and above, for both signs; amax 6 * scale
    f32 = mids.astype(np.float32)
    vals = np.concatenate([mids, np.nextafter(f32, np.float32(0)), np.nextafter(f32, np.float32(7))]).astype(np.float64)
    vals = np.concatenate([vals, -vals])
    group = np.zeros((2, 32))
    group.reshape(-1)[: vals.size] = vals
    group[:, 31] = 6.0
    x = group * scale
    packed, scales = quantize_mxfp4(torch.from_numpy(x))
    assert_bytes_equal((packed, scales), ref_quantize_mxfp4(x), f"midpoints at scale byte {scale_byte}")
    decoded = dequantize_mxfp4(packed, scales, torch.float64).numpy().reshape(-1)[: len(MIDPOINTS)] / scale
    assert decoded.tolist() == [even for _, even in MIDPOINTS], "exact midpoints round to the even code"


@pytest.mark.parametrize("ulp_exponent", [-52, -40, -30, -25])
def test_encode_rounds_float64_once(ulp_exponent):
    """A float64 value just off a midpoint rounds to its nearest E2M1 value (no double rounding
    through float32, unlike ml_dtypes' float64 conversion)."""
    mids = np.array([m for m, _ in MIDPOINTS])
    lower = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0)
    upper = (0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
    delta = mids * 2.0**ulp_exponent
    x = np.zeros((2, 32))
    x[0, :7], x[0, 7:14] = mids - delta, mids + delta
    x[1, :7], x[1, 7:14] = -(mids - delta), -(mids + delta)
    x[:, 31] = 6.0
    packed, scales = quantize_mxfp4(torch.from_numpy(x))
    decoded = dequantize_mxfp4(packed, scales, torch.float64).numpy()
    assert decoded[0, :7].tolist() == list(lower), f"just below midpoints, delta 2^{ulp_exponent} relative"
    assert decoded[0, 7:14].tolist() == list(upper), f"just above midpoints, delta 2^{ulp_exponent} relative"
    assert decoded[1, :14].tolist() == [-v for v in lower + upper], "negative values mirror"


def test_encode_is_exact_for_representable_values(seed):
    """x / scale is exact: values that are E2M1 times the group scale come back unchanged, even in
    float32 subnormals and at the largest scale."""
    gen = np.random.default_rng(seed)
    codes = gen.integers(0, 16, size=(512, 32)).astype(np.uint8)
    codes[:, gen.integers(0, 32)] = 7 | (gen.integers(0, 2) << 3)  # amax 6 pins the scale
    s = gen.integers(0, 255, size=(512, 1))
    x = codes.view(F4).astype(np.float64) * np.exp2(s - 127.0)
    packed, scales = quantize_mxfp4(torch.from_numpy(x))
    assert np.array_equal(scales.numpy(), s.astype(np.uint8)), f"seed {seed}"
    assert np.array_equal(packed.numpy(), codes[:, 0::2] | (codes[:, 1::2] << 4)), f"seed {seed}"
    # float32 inputs at the bottom of the range: 2^-149 .. 6 * 2^-127
    tiny = torch.from_numpy(codes[:64].view(F4).astype(np.float64) * 2.0**-127).float()
    assert_bytes_equal(quantize_mxfp4(tiny), ref_quantize_mxfp4(tiny.double().numpy()), f"float32 tiny, seed {seed}")
    assert torch.equal(dequantize_mxfp4(*quantize_mxfp4(tiny)), tiny)


def test_round_trip(seed):
    gen = np.random.default_rng(seed)
    x = torch.from_numpy(gen.standard_normal((3, 64, 128)) * np.exp2(gen.integers(-20, 20, size=(3, 64, 1))))
    packed, scales = quantize_mxfp4(x)
    assert packed.shape == (3, 64, 64) and scales.shape == (3, 64, 4)
    assert packed.dtype == scales.dtype == torch.uint8
    assert packed.is_contiguous() and scales.is_contiguous()
    once = dequantize_mxfp4(packed, scales, torch.float64)
    twice = dequantize_mxfp4(*quantize_mxfp4(once), torch.float64)
    assert torch.equal(once, twice), f"decode(encode(decode(encode(x)))) must equal decode(encode(x)); seed {seed}"
    # every decoded value is within half an E2M1 step of x: |x - q| <= scale (the step at 4..6 is 2)
    step = torch.exp2(scales.double() - 127).repeat_interleave(32, dim=-1)
    assert ((once - x).abs() <= step).all(), f"seed {seed}"


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_encode_rejects_nonfinite(bad, dtype):
    x = torch.ones(2, 64, dtype=dtype)
    x[1, 40] = bad
    with pytest.raises(ValueError, match="NaN or inf") as info:
        quantize_mxfp4(x)
    assert isinstance(info.value, InputError)


def test_encode_rejects_values_beyond_the_largest_scale():
    """6 * 2^127 is the largest MXFP4 magnitude; a larger float64 value has no scale byte (255 is
    NaN and a wrapped byte would be garbage), so it is an error, not a silent wrong code."""
    at_limit = torch.full((32,), 6.0 * 2.0**127, dtype=torch.float64)
    assert quantize_mxfp4(at_limit)[1].item() == LARGEST_SCALE_BYTE
    for value in (6.0 * 2.0**127 * 1.01, 1e300):
        with pytest.raises(InputError, match="largest"):
            quantize_mxfp4(torch.full((32,), value, dtype=torch.float64))


@pytest.mark.parametrize(
    "x, why",
    [
        (torch.ones(2, 48), "last dimension"),
        (torch.tensor(1.0), "last dimension"),
        (torch.ones(2, 32, dtype=torch.int32), "floating-point"),
    ],
    ids=["not-multiple-of-32", "scalar", "integer"],
)
def test_encode_rejects_bad_tensors(x, why):
    with pytest.raises(InputError, match=why):
        quantize_mxfp4(x)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_codec_on_gpu_matches_cpu(seed):
    rng = np.random.default_rng(seed)
    x = torch.from_numpy(rng.standard_normal((64, 128)) * np.exp2(rng.integers(-30, 30, size=(64, 1))))
    cpu = quantize_mxfp4(x)
    gpu = quantize_mxfp4(x.cuda())
    assert torch.equal(gpu[0].cpu(), cpu[0]) and torch.equal(gpu[1].cpu(), cpu[1])
    assert torch.equal(dequantize_mxfp4(*gpu).cpu(), dequantize_mxfp4(*cpu))
