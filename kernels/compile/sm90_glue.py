"""Compile the pipeline's glue kernels (row checks, operand decode, schedule, the paged mode's split
schedule, prologue and faults, scan outputs, certificate, repair and its subset operands, the
calibration's order statistics, the dense path's tie settlement, radix selector and assembly) for
sm_90 without a GPU, as the pipeline launches them: CI runs them under the
interpreter only, which accepts code that the compiler refuses (loop-carried types, tuple loops);
this build catches that.

Layer: public face (compile/, an offline tool; imports the stages' and triton/'s kernels).

    python -m litetopk.kernels.compile.sm90_glue OUT_DIR
writes OUT_DIR/<kernel>.{cubin,ptx,ttgir,sass} and OUT_DIR/summary.json (REG, STACK, SHARED per
kernel, as cuobjdump reports them). Argument types: pointers int32 and scalars int32 unless listed in TYPES.
"""

from __future__ import annotations

import json
import os
import sys

from .. import assembly, calibration, certify, dense_selection, repair, row_checks
from ..triton import operands, paged, scan_outputs, schedule, split_schedule, subset
from .sm90 import compile_sm90, resource_usage

_KEYS = dict(
    KEY_VB=64, PAGE=64, TOKEN_STRIDE=64, GROUP_STRIDE=16, SCALE_OFFSET=4096, SCALE_GROUP_STRIDE=1, INTERLEAVED=False
)
_SCHEDULE = dict(BLOCK_ROWS=2, LANES=2)
#: kernel -> (constexpr arguments, argument types that are not int32 pointers / int32 scalars)
KERNELS = {
    row_checks.row_checks_kernel: (
        dict(
            INVALID_ROW=1,
            INVALID_PAGE=2,
            NONFINITE=4,
            SLOT_OVERFLOW=8,
            H=64,
            PAGE=64,
            BLOCK_PAGES=row_checks.BLOCK_PAGES,
            FIRST_UNMAPPABLE=2**25,
            ZEROED=4,
            BLOCK_ROWS=row_checks.BLOCK_ROWS,
        ),
        dict(weights_ptr="*fp32"),
    ),
    operands.decode_kernel: (
        dict(_KEYS, KEYS=True, QUERIES=True, WEIGHTS=True, QUERY_VB=64),
        dict(
            values_ptr="*u8",
            scales_ptr="*u8",
            value_page_stride="i64",
            scale_page_stride="i64",
            k_lo_ptr="*i16",
            k_hi_ptr="*i16",
            k_flags_ptr="*i8",
            kfac_ptr="*fp32",
            tile_wide_ptr="*i8",
            q_ptr="*u8",
            qs_ptr="*u8",
            q_lo_ptr="*i16",
            q_hi_ptr="*i16",
            q_flags_ptr="*i8",
            w_ptr="*fp32",
            wq_ptr="*fp32",
            rowfac_ptr="*fp32",
            range_ptr="*i8",
            weight_scale="fp32",
            q_wide_ptr="*i8",
            q_unsupported_ptr="*i8",
        ),
    ),
    operands.unsupported_rows_kernel: (
        dict(BLOCK=256, STATUS=True),
        dict(key_flags_ptr="*i8", q_unsupported_ptr="*i8", nonfinite_ptr="*i8"),
    ),
    schedule.schedule_rank_kernel: (
        dict(BLOCK_ROWS=2, BLOCK=schedule.RANK_BLOCK, TILE=schedule.RANK_TILE, SCAN=schedule.SCAN, FAST_PATHS=True),
        dict(first_at_ptr="*i8"),
    ),
    schedule.schedule_programs_kernel: (
        dict(_SCHEDULE, BLOCK=schedule.BLOCK, FLAGS=schedule.FLAGS),
        dict(first_at_ptr="*i8", q_wide_ptr="*i8", prog_q_wide_ptr="*i8"),
    ),
    schedule.schedule_order_kernel: (
        dict(
            _SCHEDULE,
            BLOCK=schedule.RANK_BLOCK,
            TILE=schedule.RANK_TILE,
            SCAN=schedule.SCAN,
            WIDE=operands.FLAG_WIDE,
            FAST_PATHS=True,
        ),
        dict(prog_q_wide_ptr="*i8", out_q_wide_ptr="*i8"),
    ),
    repair.repair_slots_kernel: (
        dict(TOPK=512, CAPACITY=3, BLOCK=repair.BLOCK),
        dict(
            overflow_ptr="*i8",
            top_ptr="*i64",
            q_ptr="*u8",
            qs_ptr="*u8",
            w_ptr="*fp32",
            chosen_ptr="*i64",
            picked_ptr="*i64",
            safe_ptr="*i64",
            sub_q_ptr="*u8",
            sub_qs_ptr="*u8",
            sub_w_ptr="*fp32",
        ),
    ),
    subset.subset_operands_kernel: (
        dict(_SCHEDULE, WIDE=operands.FLAG_WIDE),
        dict(
            parent_rows_ptr="*i64",
            q_lo_ptr="*i8",
            q_hi_ptr="*i8",
            wq_ptr="*fp32",
            rowfac_ptr="*fp32",
            q_wide_ptr="*i8",
            q_unsupported_ptr="*i8",
            sub_lo_ptr="*i8",
            sub_hi_ptr="*i8",
            sub_wq_ptr="*fp32",
            sub_rowfac_ptr="*fp32",
            sub_wide_ptr="*i8",
            sub_unsupported_ptr="*i8",
            prog_wide_ptr="*i8",
        ),
    ),
    repair.repair_scatter_kernel: (
        dict(TOPK=512, SELECTOR_FAILURE=32),
        dict(chosen_ptr="*i64", sub_top_ptr="*i64", appended_ptr="*i64", nonfinite_ptr="*i8", top_ptr="*i64"),
    ),
    scan_outputs.finish_scan_kernel: (
        dict(BLOCK=scan_outputs.BLOCK, HAS_THRESHOLDS=True),
        dict(
            thresholds_ptr="*i64",
            thr_ptr="*fp32",
            raised_ptr="*fp32",
            nonfinite_ptr="*i8",
            final_ptr="*i64",
            appended64_ptr="*i64",
            nonfinite_out_ptr="*i8",
        ),
    ),
    certify.certificate_kernel: (
        dict(TOPK=512, OVERFLOW=1, UNDERFILLED=2, BLOCK=certify.BLOCK),
        dict(appended_ptr="*i64", kept_ptr="*i64", overflow_ptr="*i8"),
    ),
    dense_selection.settle_ties_kernel: (
        dict(TOPK=512, LANES=512, BLOCK=dense_selection.BLOCK),
        dict(scores_ptr="*fp32", values_ptr="*fp32", keys_ptr="*i64"),
    ),
    dense_selection.radix_floor_kernel: (
        dict(
            GROUPS=512,
            BLOCK=dense_selection.RADIX_BLOCK,
            STAGES=dense_selection.RADIX_CONFIG["stages"],
            HISTOGRAMS=True,
        ),
        dict(scores_ptr="*fp32", counts_ptr="*i64"),
    ),
    dense_selection.radix_count_kernel: (
        dict(
            TOPK=512,
            GROUPS=512,
            BLOCK=dense_selection.RADIX_BLOCK,
            AGGREGATE=True,
            SECOND=True,
            STAGES=dense_selection.RADIX_CONFIG["stages"],
        ),
        dict(scores_ptr="*fp32"),
    ),
    dense_selection.radix_collect_kernel: (
        dict(
            TOPK=512,
            GROUPS=512,
            CAP=2048,
            BLOCK=dense_selection.RADIX_BLOCK,
            STAGES=dense_selection.RADIX_CONFIG["stages"],
            WARP_SLOTS=dense_selection.RADIX_CONFIG["warp_slots"],
            AGGREGATE=True,
        ),
        dict(scores_ptr="*fp32", sure_ptr="*i64", boundary_ptr="*i64", counts_ptr="*i64"),
    ),
    dense_selection.radix_finish_kernel: (
        dict(TOPK=1024, CAP=2048, SMALL=256, BY_RANK=False),
        dict(scores_ptr="*fp32", sure_ptr="*i64", boundary_ptr="*i64", counts_ptr="*i64", out_ptr="*i64"),
    ),
    dense_selection.radix_threshold_kernel: (dict(TOPK=512, GROUPS=1024, STAGES=dense_selection.THRESHOLD_STAGES), {}),
    dense_selection.radix_candidates_kernel: (
        dict(
            CAP=1024,
            BLOCK=dense_selection.RADIX_BLOCK,
            STAGES=dense_selection.RADIX_CONFIG["stages"],
            WARP_SLOTS=dense_selection.RADIX_CONFIG["warp_slots"],
            AGGREGATE=True,
        ),
        dict(scores_ptr="*fp32", list_ptr="*i64", counts_ptr="*i64"),
    ),
    dense_selection.radix_finish_candidates_kernel: (
        dict(TOPK=1024, CAP=2048, BY_RANK=False),
        dict(scores_ptr="*fp32", list_ptr="*i64", counts_ptr="*i64", out_ptr="*i64"),
    ),
    assembly.assemble_result_kernel: (  # the dense path's form: nothing repaired, candidates the windows
        dict(TOPK=512, PAGE=64, INVALID_PAGE=2, SLOT_OVERFLOW=8, REPAIRS=False, WINDOWS=True),
        dict(keys_ptr="*i64", values_ptr="*fp32"),
    ),
    split_schedule.split_schedule_kernel: (
        dict(BLOCK_ROWS=2, BLOCK=split_schedule.BLOCK, KEYS=64, NB=32),
        dict(faults_ptr="*i8", raised_ptr="*fp32"),
    ),
    paged.paged_prologue_kernel: (
        dict(WEIGHTS=True, BLOCK_ROWS=1, BLOCK=split_schedule.BLOCK, KEYS=64, NB=32, QUERY_VB=64),
        dict(
            q_ptr="*u8",
            qs_ptr="*u8",
            q_lo_ptr="*i16",
            q_hi_ptr="*i16",
            q_flags_ptr="*i8",
            w_ptr="*fp32",
            wq_ptr="*fp32",
            rowfac_ptr="*fp32",
            range_ptr="*i8",
            weight_scale="fp32",
            q_wide_ptr="*i8",
            q_unsupported_ptr="*i8",
            faults_ptr="*i8",
            raised_ptr="*fp32",
        ),
    ),
    paged.paged_faults_kernel: (
        dict(BLOCK=256),
        dict(nonfinite_ptr="*i8", unsupported_ptr="*i8", q_unsupported_ptr="*i8"),
    ),
    calibration.calibration_order_kernel: (
        dict(ROWS=16, LANES=128, BAND=512, KEYS=True),
        dict(scores_ptr="*fp32", out_ptr="*i64", offset="fp32"),
    ),
}


#: kernels launched with other than 4 warps
NUM_WARPS = {
    dense_selection.radix_floor_kernel: dense_selection.RADIX_CONFIG["warps"],
    dense_selection.radix_count_kernel: dense_selection.RADIX_CONFIG["warps"],
    dense_selection.radix_collect_kernel: dense_selection.RADIX_CONFIG["warps"],
    dense_selection.radix_finish_kernel: dense_selection.RADIX_CONFIG["warps"],
    dense_selection.radix_threshold_kernel: dense_selection.RADIX_CONFIG["warps"],
    dense_selection.radix_candidates_kernel: dense_selection.RADIX_CONFIG["warps"],
    dense_selection.radix_finish_candidates_kernel: dense_selection.RADIX_CONFIG["warps"],
}


#: builds of a form under measurement, by name: (kernel, its constants' changes over KERNELS'), while it lasts
MEASURED = {
    "radix_collect_kernel_warp_slots": (dense_selection.radix_collect_kernel, dict(WARP_SLOTS=True)),
    "radix_floor_kernel_candidates": (dense_selection.radix_floor_kernel, dict(GROUPS=1024, HISTOGRAMS=False)),
    "radix_candidates_kernel_warp_slots": (dense_selection.radix_candidates_kernel, dict(WARP_SLOTS=True)),
}


def argument_types(kernel, constants: dict, types: dict) -> dict:
    """Every non-constexpr argument's type: `types`, else int32 pointer (*_ptr) or int32 scalar."""
    return {
        name: types.get(name, "*i32" if name.endswith("_ptr") else "i32")
        for name in kernel.arg_names
        if name not in constants
    }


def main(out_dir: str) -> int:
    if out_dir.startswith("-"):  # (an option given as the folder: `--help` once made a folder of that name)
        print(f"usage: python -m litetopk.kernels.compile.sm90_glue OUT_DIR (got {out_dir!r})", file=sys.stderr)
        return 2
    os.makedirs(out_dir, exist_ok=True)
    summary = {}
    builds = [(kernel.fn.__name__, kernel, constants, types) for kernel, (constants, types) in KERNELS.items()]
    for name, (kernel, changes) in MEASURED.items():
        constants, types = KERNELS[kernel]
        builds.append((name, kernel, dict(constants, **changes), types))
    for name, kernel, constants, types in builds:
        path = os.path.join(out_dir, name)
        options = dict(num_warps=NUM_WARPS.get(kernel, 4))
        compile_sm90(kernel, argument_types(kernel, constants, types), constants, options, path)
        summary[name] = resource_usage(path)
    with open(os.path.join(out_dir, "summary.json"), "w") as fh:
        json.dump(summary, fh, indent=1)
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
