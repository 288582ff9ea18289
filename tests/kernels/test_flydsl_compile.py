"""The gfx950 FlyDSL backend where no gfx950 device exists: every kernel variant (dense and scan,
each for our cache format and AITER's) compiles for gfx950 (COMPILE_ONLY=1, ARCH=gfx950) and its
final ISA has the scaled FP4 MFMA, no scratch and no fused multiply-add, and its LLVM IR does every
page x stride product and address in 64 bits; `backend="flydsl"` off gfx950 raises
BackendUnavailableError saying what it needs.

The toolchain (LLVM 19's ld.lld behind .venv/rocm) comes from `make toolchain`; without it these
tests FAIL (they are the only check this backend gets on CI).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from litetopk.kernels import BackendUnavailableError, dense_topk_prefill, litetopk_prefill
from litetopk.kernels.cache_layout import CACHE_FORMATS
from litetopk.kernels.compile.gfx950 import variant_name
from litetopk.kernels.flydsl import compiled_configurations
from litetopk.kernels.operator import get_backend
from tests.problems import make_problem

TOOLCHAIN_LLD = Path(sys.prefix) / "rocm" / "llvm" / "bin" / "ld.lld"
VARIANTS = tuple(variant_name(config) for config in compiled_configurations())


def test_every_epilogue_is_compiled_for_every_cache_format():
    expected = {f"{epilogue}-{cache_format}" for epilogue in ("dense", "scan") for cache_format in CACHE_FORMATS}
    assert set(VARIANTS) == expected and len(VARIANTS) == len(expected), f"compiled variants {VARIANTS}"


@pytest.fixture(scope="module")
def dump(tmp_path_factory) -> Path:
    """The dump folder of one compile-only build of every variant, in a fresh process."""
    if not (TOOLCHAIN_LLD.exists() and os.access(TOOLCHAIN_LLD, os.X_OK)):
        pytest.fail(
            f"the FlyDSL gfx950 toolchain is missing: {TOOLCHAIN_LLD} (a link to LLVM 19's ld.lld) "
            "does not exist or is not executable; run `make toolchain` (installs lld-19 and the link)"
        )
    folder = tmp_path_factory.mktemp("flydsl_isa")
    done = subprocess.run(
        [sys.executable, "-m", "litetopk.kernels.compile.gfx950", str(folder)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"compile-only build failed:\n{done.stdout}\n{done.stderr}"
    return folder


def _stage(dump: Path, suffix: str) -> dict[str, str]:
    """The text of each variant's one dumped file ending in `suffix`."""
    texts = {}
    for variant in VARIANTS:
        found = sorted((dump / variant).glob(f"*/*{suffix}"))
        assert len(found) == 1, f"variant {variant}: expected one *{suffix} file, got {found}"
        texts[variant] = found[0].read_text()
    return texts


@pytest.fixture(scope="module")
def isa(dump) -> dict[str, str]:
    """Final gfx950 ISA text of each kernel variant."""
    return _stage(dump, "_final_isa.s")


@pytest.fixture(scope="module")
def llvm_ir(dump) -> dict[str, str]:
    """LLVM IR of each kernel variant, as FlyDSL hands it to the AMDGPU backend."""
    return _stage(dump, "_llvm_ir.ll")


def _metadata(text: str, name: str) -> int:
    match = re.search(rf"^\s*\.?{name}:\s+(\d+)", text, re.MULTILINE)
    assert match, f"no {name} in the ISA metadata"
    return int(match.group(1))


@pytest.mark.parametrize("variant", VARIANTS)
def test_isa_targets_gfx950(isa, variant):
    assert re.search(r'\.amdgcn_target "amdgcn-amd-amdhsa-[a-z]*-gfx950"', isa[variant]), (
        f"{variant}: ISA is not for gfx950"
    )


@pytest.mark.parametrize("variant", VARIANTS)
def test_isa_has_scaled_fp4_mfma(isa, variant):
    mfma = re.findall(r"^\s*v_mfma_scale_f32_16x16x128_f8f6f4\s.*$", isa[variant], re.MULTILINE)
    assert len(mfma) == 4, f"{variant}: expected 4 scaled MFMAs (64 heads / 16) per key tile, got {mfma}"
    for line in mfma:
        assert "cbsz:4" in line and "blgp:4" in line, f"{variant}: MFMA is not E2M1 x E2M1: {line}"


@pytest.mark.parametrize("variant", VARIANTS)
def test_isa_has_no_scratch_or_spills(isa, variant):
    text = isa[variant]
    assert _metadata(text, "private_segment_fixed_size") == 0, f"{variant}: uses scratch memory"
    assert _metadata(text, "vgpr_spill_count") == 0, f"{variant}: spills VGPRs"
    assert _metadata(text, "sgpr_spill_count") == 0, f"{variant}: spills SGPRs"
    assert not re.search(r"^\s*scratch_(load|store)", text, re.MULTILINE), f"{variant}: scratch access"
    assert _metadata(text, "vgpr_count") <= 128, f"{variant}: more VGPRs than 4 waves per SIMD allow"


@pytest.mark.parametrize("variant", VARIANTS)
def test_isa_reads_key_values_as_words_and_one_scale_byte(isa, variant):
    """Per lane and key, in either cache format (kernels/flydsl/key_addressing.py): the one byte
    load is the scale of the lane's group; the 16 value bytes are word loads, never split into
    byte or short loads."""
    text = isa[variant]
    byte_loads = re.findall(r"^\s*global_load_(?:u|s)(?:byte|short)\S*", text, re.MULTILINE)
    assert [b.strip() for b in byte_loads] == ["global_load_ubyte"], (
        f"{variant}: expected exactly one sub-word load (the scale byte), got {byte_loads}"
    )


@pytest.mark.parametrize("variant", VARIANTS)
def test_isa_head_sum_has_no_fused_multiply_add(isa, variant):
    """The documented float32 order rounds every product and sum: no FMA may be formed."""
    fused = re.findall(r"^\s*v_(pk_)?fmac?_f32\S*", isa[variant], re.MULTILINE)
    assert not fused, f"{variant}: fused multiply-add changes the head-sum rounding: {fused}"


@pytest.mark.parametrize("cache_format", CACHE_FORMATS)
def test_isa_scan_appends_with_64bit_atomics(isa, cache_format):
    text = isa[f"scan-{cache_format}"]
    assert re.search(r"^\s*global_atomic_add_x2\s", text, re.MULTILINE), "no 64-bit atomic add on the row counter"
    assert re.search(r"^\s*global_atomic_smax_x2\s", text, re.MULTILINE), "no 64-bit atomic max raising the threshold"
    assert re.search(r"^\s*global_store_dwordx2\s", text, re.MULTILINE), "no 64-bit key store to the buffer"


@pytest.mark.parametrize("cache_format", CACHE_FORMATS)
def test_isa_dense_stores_scores_without_atomics(isa, cache_format):
    assert not re.search(r"^\s*global_atomic", isa[f"dense-{cache_format}"], re.MULTILINE), (
        f"dense-{cache_format}: the dense variant needs no atomics"
    )


def _kernel_parameters(ir: str) -> list[tuple[str, str]]:
    """(type, name) of each parameter of the kernel's LLVM definition, in order."""
    header = re.search(r"^define amdgpu_kernel void @score_fp4_flydsl_kernel\w*\((.*)\)[^(]*\{$", ir, re.MULTILINE)
    assert header, "no kernel definition in the LLVM IR"
    return re.findall(r"(ptr addrspace\(1\)|<\{ <\{ i32 \}> \}>|i32|i64|float) (%\d+)", header.group(1))


@pytest.mark.parametrize("variant", VARIANTS)
def test_llvm_ir_page_times_stride_and_every_address_are_64_bit(llvm_ir, variant):
    """docs/contract.md §2: every address is int64, and the page id read from the block table is
    widened to int64 before it multiplies either page stride (the kernel's first two int64 scalar
    arguments, value_page_words and scale_page_stride)."""
    ir = llvm_ir[variant]
    narrow = re.findall(r"getelementptr [^,]+, ptr addrspace\(1\) %\d+, (?!i64 )\S+ \S+", ir)
    assert not narrow, f"{variant}: addresses indexed with less than 64 bits: {narrow[:3]}"
    strides = [name for kind, name in _kernel_parameters(ir) if kind == "i64"][:2]
    assert len(strides) == 2, f"{variant}: expected the two int64 page-stride arguments"
    widened = set(re.findall(r"^\s*(%\d+) = sext i32 %\d+ to i64$", ir, re.MULTILINE))
    for stride in strides:
        products = re.findall(rf"^\s*%\d+ = mul i64 (%\d+), {stride}$", ir, re.MULTILINE)
        assert products and set(products) <= widened, (
            f"{variant}: page stride {stride} is not multiplied in int64 by a widened page id: {products}"
        )


def _instructions(text: str) -> list[str]:
    """The instruction lines of an ISA listing (no directives, labels or comments)."""
    return [line.split(";")[0].strip() for line in text.splitlines() if re.match(r"^\s+[a-z]", line)]


@pytest.mark.parametrize("epilogue", ["dense", "scan"])
def test_isa_differs_between_cache_formats(isa, epilogue):
    """The format is a compile-time constant: each format's binary has its own addressing."""
    ours, aiter = _instructions(isa[f"{epilogue}-litetopk"]), _instructions(isa[f"{epilogue}-aiter"])
    assert ours and ours != aiter, f"{epilogue}: the two cache formats compiled to the same instructions"


@pytest.mark.parametrize("device", ["cpu"])
def test_flydsl_backend_unavailable_names_what_is_needed(device):
    with pytest.raises(BackendUnavailableError, match=r"gfx950.*flydsl|flydsl.*gfx950") as info:
        get_backend("flydsl", torch.device(device))
    assert "MI355X" in str(info.value), f"message should name the device: {info.value}"


@pytest.mark.parametrize("entry", [litetopk_prefill, dense_topk_prefill], ids=["litetopk", "dense"])
def test_operator_backend_flydsl_on_cpu_raises(entry):
    p = make_problem(7, seq_lens=[200], rows_per_seq=2, topk=512)
    with pytest.raises(BackendUnavailableError, match="gfx950"):
        entry(*p.args(), topk=p.topk, backend="flydsl")
