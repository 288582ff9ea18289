"""Compile the scoring kernels for sm_90 without a GPU and read back what ptxas made of them.

Layer: public face (compile/, an offline tool; imports triton/'s scoring kernels and launch options).

Triton's wheel carries ptxas and cuobjdump, so any machine can build the H200's cubin: CI uses this
to check the Gluon scoring kernel (which has no interpreter) compiles for sm_90 as the backend
launches it, within its register budget and with the tensor-core instructions it is written for;
bench/probes/sass_offline.py uses it to read instruction mixes.

    python -m litetopk.kernels.compile.sm90 OUT_DIR
writes OUT_DIR/<variant>.{cubin,ptx,ttgir,sass} for the Gluon kernel's dense, strided and scan
variants and OUT_DIR/summary.json: per variant its registers, stack bytes, shared bytes and the
opcode counts of its innermost wgmma loop.
"""

from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
# Argument types of score_fp4_kernel and score_fp4_gluon_kernel (the same signature).
SCORE_TYPES = dict(
    k_lo_ptr="*i8",
    k_hi_ptr="*i8",
    kfac_ptr="*fp32",
    tile_wide_ptr="*i8",
    tile_cols="i32",
    q_lo_ptr="*i8",
    q_hi_ptr="*i8",
    wq_ptr="*fp32",
    rowfac_ptr="*fp32",
    prog_rows_ptr="*i32",
    prog_batch_ptr="*i32",
    prog_span_ptr="*i32",
    prog_q_wide_ptr="*i8",
    starts_ptr="*i32",
    ends_ptr="*i32",
    s_pad="i32",
    out_ptr="*fp32",
    out_width="i32",
    max_pos="i32",
    position_stride="i32",
    thr_ptr="*fp32",
    hist_lo_ptr="*fp32",
    hist_width_ptr="*fp32",
    hist_ptr="*i32",
    buf_ptr="*i64",
    capacity="i32",
    appended_ptr="*i32",
    thr_out_ptr="*fp32",
    nonfinite_ptr="*i8",
    sample_tiles="i32",
    sample_stride="i32",
)


def build_sm90(kernel, types: dict, constants: dict, options: dict, source=ASTSource):
    """triton.compile of `kernel` for sm_90 with `constants` and compiler `options` (num_warps,
    maxnreg, ...); pointer arguments are declared 16-byte aligned, as the launcher's tensors are."""
    if "num_warps" in kernel.arg_names:  # a Gluon kernel's layouts read it as a constexpr argument
        constants = dict(constants, num_warps=options["num_warps"])
    signature = {name: types.get(name, "constexpr") for name in kernel.arg_names}
    attrs = {(kernel.arg_names.index(n),): [["tt.divisibility", 16]] for n, t in types.items() if t.startswith("*")}
    return triton.compile(
        source(kernel, signature, constants, attrs), target=GPUTarget("cuda", 90, 32), options=options
    )


def compile_sm90(kernel, types: dict, constants: dict, options: dict, path: str, source=ASTSource) -> str:
    """build_sm90, written to path.{cubin,ptx,ttgir,sass} (and path.shared: the dynamic shared
    memory of its launches); returns the SASS text."""
    compiled = build_sm90(kernel, types, constants, options, source)
    with open(path + ".cubin", "wb") as f:
        f.write(compiled.asm["cubin"])
    with open(path + ".shared", "w") as f:  # the launch's dynamic shared memory, bytes (resource_usage reads it)
        f.write(str(compiled.metadata.shared))
    for ext in ("ptx", "ttgir"):
        with open(f"{path}.{ext}", "w") as f:
            f.write(compiled.asm[ext])
    sass = subprocess.run(
        [os.path.join(BIN, "cuobjdump"), "--dump-sass", path + ".cubin"], capture_output=True, text=True, check=True
    ).stdout
    with open(path + ".sass", "w") as f:
        f.write(sass)
    return sass


def resource_usage(path: str) -> dict[str, int]:
    """{"REG", "STACK", "SHARED"} of path.cubin's kernel, as cuobjdump reports them, and
    "DYNAMIC_SHARED": the dynamic shared memory its launches ask for (bytes)."""
    usage = subprocess.run(
        [os.path.join(BIN, "cuobjdump"), "--dump-resource-usage", path + ".cubin"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    found = {k: int(v) for k, v in re.findall(r"(REG|STACK|SHARED):(\d+)", usage)}
    with open(path + ".shared") as f:
        return dict(found, DYNAMIC_SHARED=int(f.read()))


def mma_loops(sass: str) -> list[list[str]]:
    """The instructions ("address opcode operands") of every backward-branch loop that holds a GMMA,
    in code order (a loop nested in another is listed, and so is the outer one)."""
    lines = [line for line in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]{4}\*/", line)]
    address = [int(re.match(r"\s+/\*([0-9a-f]+)\*/", line).group(1), 16) for line in lines]
    loops = []
    for line, at in zip(lines, address):
        target = re.search(r"BRA (?:!?U?P[T0-9]+, )?(0x[0-9a-f]+)", line)
        if target and int(target.group(1), 16) < at:
            body = [x for x, a in zip(lines, address) if int(target.group(1), 16) <= a <= at]
            if any("GMMA" in x for x in body):
                loops.append([re.sub(r"^\s+/\*([0-9a-f]+)\*/\s+", r"\1 ", x).split(";")[0] for x in body])
    return loops


def innermost_mma_loop(sass: str) -> list[str]:
    """The instructions ("address opcode operands") of the smallest backward-branch loop that holds a GMMA."""
    return min(mma_loops(sass), key=len, default=[])


def operand_writes_in_flight(loop: list[str]) -> list[str]:
    """The instructions of `loop` (mma_loops' form) that write a register of an in-flight wgmma's A operand: from an
    IGMMA whose A operand is in registers (its second operand, R<n>: R<n>..R<n+3>) to the next wait for every group
    (WARPGROUP.DEPBAR.LE gsb0, 0x0; a wait that leaves groups in flight keeps them all live), any other instruction
    whose destination register (its first register operand after any predicate destinations: SHFL's and ATOMG's
    `PT, R5, ...`) is one of them. PTX leaves that undefined (the operand is read while the MMA runs), so an
    asynchronous chain of register-operand MMAs must find none."""
    found, live = [], set()
    for line in loop:
        words = line.replace(",", " ").split()[1:]
        if words and words[0].startswith("@"):
            words = words[1:]
        if not words:
            continue
        op = words[0]
        if op.startswith("WARPGROUP.DEPBAR"):
            if words[-1] == "0x0":
                live.clear()
        elif op.startswith(("IGMMA", "HGMMA", "QGMMA")):
            a = re.fullmatch(r"R(\d+)", words[2]) if len(words) > 2 else None
            if a:
                live.update(range(int(a.group(1)), int(a.group(1)) + 4))
        elif live:
            operands = words[1:]
            while operands and re.fullmatch(r"!?U?P(T|\d+)", operands[0]):
                operands = operands[1:]
            d = re.fullmatch(r"R(\d+)", operands[0]) if operands else None
            if d and int(d.group(1)) in live:
                found.append(line)
    return found


def register_operand_mmas(loop: list[str]) -> int:
    """The IGMMA / HGMMA / QGMMA instructions of `loop` whose A operand is in registers (operand_writes_in_flight
    watches them)."""
    return sum(1 for line in loop if re.search(r"\b[IHQ]GMMA\S*\s+R\d+,\s*R\d+,", line))


def opcode_mix(loop: list[str]) -> collections.Counter:
    """Opcode counts (without modifiers or predicates) of `loop`."""
    mix = collections.Counter()
    for line in loop:
        words = line.split()[1:]
        op = words[1] if words and words[0].startswith("@") else (words[0] if words else "")
        mix[op.split(".")[0]] += 1
    return mix


GLUON_VARIANTS = {
    "dense": dict(DENSE=True, STRIDED=False),
    "strided": dict(DENSE=True, STRIDED=True),
    "scan": dict(DENSE=False, STRIDED=False),
    "dense_wide": dict(DENSE=True, STRIDED=False, ANY_WIDE=True),
    "strided_wide": dict(DENSE=True, STRIDED=True, ANY_WIDE=True),
    "scan_wide": dict(DENSE=False, STRIDED=False, ANY_WIDE=True),
    "scan_calibrating": dict(DENSE=False, STRIDED=False, SELF_CALIBRATE=True),
    "scan_wide_calibrating": dict(DENSE=False, STRIDED=False, ANY_WIDE=True, SELF_CALIBRATE=True),
}


def compile_gluon_scoring(out_dir: str, topk: int = 512) -> dict[str, dict]:
    """Compile every variant of the Gluon scoring kernel as TritonBackend launches it; return (and
    write to out_dir/summary.json) each variant's resources and loop opcode counts."""
    from triton.experimental.gluon._runtime import GluonASTSource

    from ..triton.backend import gluon_launch_options
    from ..triton.scoring_gluon import score_fp4_gluon_kernel

    os.makedirs(out_dir, exist_ok=True)
    summary = {}
    for name, mode in GLUON_VARIANTS.items():
        constants, options = gluon_launch_options(topk=topk, **mode)
        path = os.path.join(out_dir, name)
        sass = compile_sm90(score_fp4_gluon_kernel, SCORE_TYPES, constants, options, path, source=GluonASTSource)
        loop = innermost_mma_loop(sass)
        summary[name] = dict(
            resource_usage(path),
            loop_instructions=len(loop),
            loop_opcodes=opcode_mix(loop),
            mma_loop_instructions=[len(body) for body in mma_loops(sass)],
            wgmma=sorted({w for line in loop for w in line.split() if w.startswith("IGMMA")}),
        )
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    return summary


if __name__ == "__main__":
    for variant, info in compile_gluon_scoring(sys.argv[1] if len(sys.argv) > 1 else "/tmp/litetopk-sm90").items():
        print(variant, {k: v for k, v in info.items() if k != "loop_opcodes"})
