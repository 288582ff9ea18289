"""One device call (H200, < 200 s): where the spread-1 penalty of the Gluon scoring kernel comes from.

Problems that hold wide MXFP4 vectors (block scales over 3 binades: some vectors need the hi
operands) at the production shape (Q = 8192, 65,536 keys). First the checks of old: the Gluon
kernel's ANY_WIDE variant against the Triton kernel (dense scores bit for bit, LiteTopK results
equal). Then the split of the penalty, dense scoring and the scan timed with the schedule's
variants and wide flags forced (backend operands replaced, `forced_operands`):

    case            variant   key tiles wide   query rows wide   scores
    narrow          narrow    -                -                 exact only without wide vectors
    wide_all        ANY_WIDE  as decoded       as decoded        exact (what runs today on spread 1)
    wide_no_keys    ANY_WIDE  none             as decoded        timing only (wide keys scored narrow)
    wide_no_queries ANY_WIDE  as decoded       none              timing only (wide queries scored narrow)
    wide_none       ANY_WIDE  none             none              timing only on spread 1; exact on spread 0

On spread-0 data (no wide vector) `wide_none` is the ANY_WIDE variant's own cost (its code, registers
and per-step flag reads) against `narrow`; on spread-1 data wide_all - wide_no_keys is the wide key
tiles' work, wide_all - wide_no_queries the wide query rows', wide_none - narrow the variant's cost.
Each case says whether its dense scores equal the exact ones ("exact"). Counts: wide programs, wide
key tiles (and the wide tiles a scan program's span crosses, mean), wide keys, wide query rows and
wide heads per wide row. And per compiled Gluon variant its registers, spills, dynamic shared memory
and the programs per SM the driver allows it (cuOccupancyMaxActiveBlocksPerMultiprocessor: the
scan's wide variant used to get 3, the others 4). Prints tables, writes $OUT/gluon-wide.json.
    source bench/device/gpu_env.sh && OUT=/tmp python3 -m bench.probes.gluon_wide_probe
"""

from __future__ import annotations

import contextlib
import dataclasses
import os

import torch

from bench.common.problems import call_args, prefill_problem
from bench.common.timing import cuda_ms, json_logger
from litetopk.kernels import LiteTopKTuning
from litetopk.kernels.calibration import calibrate
from litetopk.kernels.compile.sm90 import GLUON_VARIANTS, SCORE_TYPES, build_sm90
from litetopk.kernels.pipeline import run_litetopk
from litetopk.kernels.triton import TritonBackend
from litetopk.kernels.triton.backend import gluon_launch_options
from litetopk.kernels.triton.operands import FLAG_WIDE, decode_queries_fp4_triton
from litetopk.kernels.triton.scoring_gluon import GLUON_NUM_WARPS, score_fp4_gluon_kernel
from litetopk.kernels.validation import validate_prefill

FIELDS = ("values", "raw_indices", "physical_indices", "counts", "status")
# case -> (variant, wide key tiles kept, wide query rows kept)
CASES = {
    "narrow": ("narrow", False, False),
    "wide_all": ("wide", True, True),
    "wide_no_keys": ("wide", False, True),
    "wide_no_queries": ("wide", True, False),
    "wide_none": ("wide", False, False),
}


def forced_operands(ops, variant: str, keep_keys: bool, keep_queries: bool):
    """ops (TritonBackend.Operands) with every program in `variant` ("narrow" / "wide": the other
    variant gets no rows), and the key tiles' / query programs' wide flags zeroed unless kept."""
    s = ops.schedule
    live, idle = (s.rows, s.span), (torch.full_like(s.rows, -1), torch.zeros_like(s.span))
    keys = ops.keys
    if not keep_keys:
        keys = dataclasses.replace(
            keys, tile_wide=torch.zeros_like(keys.tile_wide), batch_wide=torch.zeros_like(keys.batch_wide)
        )
    schedule = dataclasses.replace(
        s,
        variants=(live, idle) if variant == "narrow" else (idle, live),
        q_wide=s.q_wide if keep_queries else torch.zeros_like(s.q_wide),
    )
    return dataclasses.replace(ops, keys=keys, schedule=schedule)


@contextlib.contextmanager
def operands_of(backend: TritonBackend, problem, ops):
    """Make `backend` score `problem` with `ops` (its per-problem operand cache), restored after."""
    saved = backend._prepared
    backend._prepared = (problem, ops)
    try:
        yield
    finally:
        backend._prepared = saved


def wide_counts(problem, ops) -> dict:
    """What the wide variant has to do on this problem (module docstring)."""
    keys, s = ops.keys, ops.schedule
    tiles = keys.tile_wide.shape[1]
    used = s.span[:, 1] > 0
    # wide tiles inside each used program's scan span [start // 64, ceil(end / 64))
    prefix = torch.nn.functional.pad(keys.tile_wide.long().cumsum(dim=1), (1, 0))
    b = s.batch.long()[used]
    first = (s.span[used, 0] // 64).long()
    last = torch.clamp((s.span[used, 1].long() + 63) // 64, max=tiles)
    crossed = (prefix[b, last] - prefix[b, first]).float()
    q_flags = decode_queries_fp4_triton(problem.q_fp4, problem.q_scale)[3]
    heads = ((q_flags & FLAG_WIDE) != 0).sum(dim=1)[ops.q_wide]
    return dict(
        programs=int(used.sum()),
        wide_programs=int(((s.q_wide != 0) & used).sum()),
        tiles=tiles * keys.tile_wide.shape[0],
        wide_tiles=int((keys.tile_wide != 0).sum()),
        wide_keys=int(((keys.flags_of_keys & FLAG_WIDE) != 0).sum()),
        wide_tiles_per_scan_program=round(float(crossed.mean()), 2) if crossed.numel() else 0.0,
        rows=int(ops.q_wide.numel()),
        wide_rows=int(ops.q_wide.sum()),
        wide_heads_per_wide_row=dict(
            mean=round(float(heads.float().mean()), 3) if heads.numel() else 0.0,
            max=int(heads.max()) if heads.numel() else 0,
        ),
    )


def split_times(problem, backend: TritonBackend, tuning, topk: int) -> dict:
    """Dense and scan ms of every CASES entry, and whether its dense scores are the exact ones."""
    ops = backend.operands(problem)
    exact = backend.score_dense(problem)[0].clone()
    thr, ceil = calibrate(problem, backend, tuning.sample_size)
    out = {}
    for case, (variant, keep_keys, keep_queries) in CASES.items():
        with operands_of(backend, problem, forced_operands(ops, variant, keep_keys, keep_queries)):
            same = torch.equal(backend.score_dense(problem)[0], exact)
            dense = cuda_ms(lambda: backend.score_dense(problem), reps=5, warm=1)
            scan = cuda_ms(
                lambda: backend.scan_candidates(problem, thr, tuning.capacity(topk), ceilings=ceil), reps=5, warm=1
            )
        out[case] = dict(dense_ms=round(dense, 3), scan_ms=round(scan, 3), exact=same)
    del exact
    return out


def occupancy(topk: int = 512) -> dict:
    """Per Gluon variant as the backend launches it: registers, spilled bytes, dynamic shared memory
    and programs per SM (the driver's occupancy answer; an error string where it could not answer)."""
    from cuda.bindings import driver
    from triton.experimental.gluon._runtime import GluonASTSource

    out = {}
    for name, mode in GLUON_VARIANTS.items():
        constants, options = gluon_launch_options(topk=topk, **mode)
        kernel = build_sm90(score_fp4_gluon_kernel, SCORE_TYPES, constants, options, source=GluonASTSource)
        kernel._init_handles()  # loads it (and sets its shared memory limit, as a launch does)
        err, per_sm = driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(
            driver.CUfunction(kernel.function), 32 * GLUON_NUM_WARPS, kernel.metadata.shared
        )
        out[name] = dict(
            registers=kernel.n_regs,
            spilled_bytes=4 * kernel.n_spills,
            dynamic_shared=kernel.metadata.shared,
            programs_per_sm=int(per_sm) if err == driver.CUresult.CUDA_SUCCESS else f"error {err}",
        )
        print(f"{name:14s} {out[name]}", flush=True)
    return out


def print_table(name: str, counts: dict, times: dict) -> None:
    print(f"\n{name}: {counts}")
    base = times["narrow"]
    print(f"{'case':16s} {'dense ms':>9s} {'vs narrow':>9s} {'scan ms':>8s} {'vs narrow':>9s}  exact")
    for case, t in times.items():
        print(
            f"{case:16s} {t['dense_ms']:9.3f} {t['dense_ms'] / base['dense_ms']:9.3f} "
            f"{t['scan_ms']:8.3f} {t['scan_ms'] / base['scan_ms']:9.3f}  {t['exact']}",
            flush=True,
        )


def main() -> None:
    out_dir = os.environ.get("OUT", "/tmp")
    report = {
        "device": torch.cuda.get_device_name(0),
        "note": "cases other than wide_all (and wide_none / narrow on spread 0) score wide vectors narrow: "
        "their times are timing only, their scores wrong ('exact' false)",
    }
    log = json_logger(os.path.join(out_dir, "gluon-wide.json"), report)
    tuning = LiteTopKTuning()
    for topk, spread, twin_check in ((512, 0, False), (512, 1, True), (1024, 1, False)):
        args, kw = call_args(prefill_problem(8192, 262144, topk, seed=11, spread=spread))
        problem = validate_prefill(*args, **kw)
        gluon = TritonBackend(scoring_kernel="gluon")
        res = dict(counts=wide_counts(problem, gluon.operands(problem)))
        if twin_check:  # the ANY_WIDE Gluon variant against the Triton kernel, bit for bit
            triton = TritonBackend(scoring_kernel="triton")
            res["dense_equal_triton"] = torch.equal(gluon.score_dense(problem)[0], triton.score_dense(problem)[0])
            lite = [run_litetopk(problem, b, repair=True, tuning=tuning) for b in (gluon, triton)]
            res["lite_equal_triton"] = all(torch.equal(getattr(lite[0], f), getattr(lite[1], f)) for f in FIELDS)
            del lite
        res["times"] = split_times(problem, gluon, tuning, topk)
        print_table(f"k{topk}_spread{spread}", res["counts"], res["times"])
        log(f"k{topk}_spread{spread}", res)
        del problem, gluon
        torch.cuda.empty_cache()
    log("occupancy", occupancy())  # last: it needs cuda.bindings (cuda-python), which the timings do not


if __name__ == "__main__":
    main()
