"""TritonBackend: the H200 path (operands.py + scoring.py behind the ScoringBackend interface).

Layer: backends (triton/; the operator's registry loads it). It imports the backend interface, the
types and the utilities below it, and its own modules: operands.py, schedule.py, scoring.py,
scoring_gluon.py, scan_outputs.py, subset.py; never a stage.

Per call the backend decodes the live keys and the queries once into exact int8 operands
(operands.py; cached for the calls of one problem: calibration, scan and repair, whose subset reuses
the keys), builds a schedule of programs on the device (schedule.py: BLOCK_ROWS rows of one sequence
each, the longest windows first, a fixed grid from shapes), and launches a scoring kernel in dense
or scan mode on the current stream. Nothing is read back on the host. The glue between the kernels
is Triton kernels too (operands.py's bookkeeping, schedule.py, subset.py's subset operands,
scan_outputs.py's scan outputs) where devices.runs_triton_stages says so, their torch twins
elsewhere: a LiteTopK call is 24 launches, 20 with a self-calibrating scan (bench.probes.host_time
--cpu counts them). Buffers come from problem.scratch (scratch.py). Runs on an NVIDIA CUDA device,
or on CPU tensors under TRITON_INTERPRET=1 (how CI tests the kernels).

Two scoring kernels compute the same bits (the same integer scheme, float32 order and layouts):
score_fp4_gluon_kernel (scoring_gluon.py: sm_90 only, <= 128 registers so 4 programs share an SM)
and score_fp4_kernel (scoring.py: any CUDA GPU and the interpreter). `scoring_kernel="auto"` takes
the Gluon kernel on an sm_90 device with the default tile (BLOCK_ROWS 2, 64 keys, 4 warps), the
Triton kernel otherwise; the choice is made once per backend and device, so calibration, scan,
repair and dense scores of one problem come from one kernel. Asking for "gluon" where it cannot
run raises; nothing falls back.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch

from ..backend import MAX_SAMPLE_STRIDE, CandidateScan, ScoringBackend
from ..devices import is_cuda, runs_triton_stages
from ..errors import BackendUnavailableError
from ..problem import ZEROED_WORDS, PrefillProblem
from ..profiling import stage_range
from .operands import (
    FLAG_UNSUPPORTED,
    decode_operands_triton,
    scoring_faults_triton,
    unsupported_rows_triton,
)
from .paged import (
    PAGED_MODES,
    PAGED_REFRESH,
    PAGED_ROWS_PER_SEQUENCE,
    PagedOperands,
    cache_in_words,
    launch_paged_scoring,
    paged_block_rows,
    paged_operands,
    paged_scoring_faults,
    paged_subset_operands,
    paged_unsupported_rows,
    reset_scan_state,
)
from .paged_scoring import FAULT_DENSE, FAULT_SAMPLE, FAULT_SCAN
from .scan_outputs import finish_scan
from .schedule import Schedule, build_schedule
from .scoring import HEAD_DIM, HEADS, NUM_BINS, prepare_scan_triton, scan_buffers, score_fp4_kernel
from .scoring_gluon import (
    GLUON_BLOCK_KEYS,
    GLUON_BLOCK_ROWS,
    GLUON_MAX_REGISTERS,
    GLUON_NUM_WARPS,
    NUM_BUFFERS,
    score_fp4_gluon_kernel,
)
from .subset import subset_operands

SCORING_KERNELS = ("auto", "gluon", "triton")


def interpreting() -> bool:
    """True when Triton kernels run in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def is_sm90(device: torch.device) -> bool:
    """True for a compiled (not interpreted) CUDA device of compute capability 9.0 (H100, H200)."""
    return (
        is_cuda(device)
        and not interpreting()
        and _capability(device.index if device.index is not None else torch.cuda.current_device()) == (9, 0)
    )


@functools.lru_cache(maxsize=None)
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def gluon_launch_options(
    *,
    topk: int,
    DENSE: bool,
    STRIDED: bool,
    ANY_WIDE: bool = False,
    refresh: int = 16,
    num_bins: int = NUM_BINS,
    defer_appends: bool = True,
    SELF_CALIBRATE: bool = False,
) -> tuple[dict, dict]:
    """(constexpr arguments, compiler options) of one score_fp4_gluon_kernel variant, as launched
    (shared with compile/sm90.py's offline check, so CI compiles what the H200 runs)."""
    constants = dict(
        TOPK=topk,
        BLOCK_KEYS=GLUON_BLOCK_KEYS,
        BLOCK_ROWS=GLUON_BLOCK_ROWS,
        DENSE=DENSE,
        STRIDED=STRIDED,
        ANY_WIDE=ANY_WIDE,
        REFRESH=refresh,
        H=HEADS,
        D=HEAD_DIM,
        NB=num_bins,
        NUM_BUFFERS=NUM_BUFFERS,
        DEFER_APPENDS=defer_appends,
        SELF_CALIBRATE=SELF_CALIBRATE,
    )
    return constants, dict(num_warps=GLUON_NUM_WARPS, maxnreg=GLUON_MAX_REGISTERS)


@dataclass(frozen=True)
class KeyOperands:
    """Decoded, exact int8 key operands of one problem (operands.py), shared by its subsets."""

    k_lo: torch.Tensor  # int8 [B, s_pad, 128]
    k_hi: torch.Tensor  # int8 [B, s_pad, 128]
    kfac: torch.Tensor  # float32 [B, s_pad]
    s_pad: int
    tile_wide: torch.Tensor  # int8 [B, s_pad / BLOCK_KEYS]: the key tile holds a wide key
    batch_wide: torch.Tensor  # int8 [B, 4]: byte 0 of int32 word b: sequence b holds a wide key (strided scans)
    flags_of_keys: torch.Tensor  # int8 [B, s_pad]: each key's decode flags
    flags: torch.Tensor  # int32 [2]: OR of the key flags, OR of the live query flags (operands.py)


@dataclass(frozen=True)
class Operands:
    """What one launch of the scoring kernel reads: the keys, the rows' decoded queries, the schedule."""

    keys: KeyOperands
    q_lo: torch.Tensor  # int8 [rows, 64, 128]
    q_hi: torch.Tensor
    wq: torch.Tensor  # float32 [rows, 64]: w' * 2^shift (operands.prepare_queries_fp4_triton)
    rowfac: torch.Tensor  # float32 [rows]: 2^(149 - shift) * weight_scale (exact: a power of two times it)
    q_wide: torch.Tensor  # bool [rows]: a live row with a head vector that needs a hi operand
    q_unsupported: torch.Tensor  # bool [rows]: a query vector or the head weights cannot be scored exactly
    gluon: bool  # score with score_fp4_gluon_kernel (else score_fp4_kernel); see the module docstring
    schedule: Schedule  # schedule.py: the programs, with the narrow and the wide variant's rows and spans


class TritonBackend(ScoringBackend):
    """Exact int8 tensor-core scoring with the fused LiteTopK filter; see scoring.py."""

    name = "triton"

    def __init__(
        self,
        block_rows: int = GLUON_BLOCK_ROWS,
        block_keys: int = GLUON_BLOCK_KEYS,
        num_warps: int = GLUON_NUM_WARPS,
        num_stages: int = 3,
        refresh: int = 16,
        num_bins: int = NUM_BINS,
        max_registers: int | None = None,
        scoring_kernel: str = "auto",
        paged: str = "auto",
    ):
        if scoring_kernel not in SCORING_KERNELS:
            raise ValueError(f"scoring_kernel={scoring_kernel!r} is not one of {SCORING_KERNELS}")
        if paged not in PAGED_MODES:
            raise ValueError(f"paged={paged!r} is not one of {PAGED_MODES}")
        self.paged = paged  # paged.py: "auto" decides by the call's shapes; "never" / "always" force a mode
        self._options = dict(
            block_rows=block_rows,
            block_keys=block_keys,
            num_warps=num_warps,
            num_stages=num_stages,
            refresh=refresh,
            num_bins=num_bins,
            max_registers=max_registers,
            scoring_kernel=scoring_kernel,
        )
        gluon_tile = (block_rows, block_keys, num_warps) == (GLUON_BLOCK_ROWS, GLUON_BLOCK_KEYS, GLUON_NUM_WARPS)
        if scoring_kernel == "gluon" and not gluon_tile:
            raise ValueError(
                f"the gluon scoring kernel has one tile: block_rows={GLUON_BLOCK_ROWS}, "
                f"block_keys={GLUON_BLOCK_KEYS}, num_warps={GLUON_NUM_WARPS}"
            )
        self.scoring_kernel = scoring_kernel
        self._gluon_tile = gluon_tile
        self.block_rows = block_rows
        self.block_keys = block_keys
        self.num_warps = num_warps
        self.num_stages = num_stages
        self.refresh = refresh  # key steps between threshold raises in the scan
        self.num_bins = num_bins  # bins of the scan's threshold histogram (a power of two)
        self.max_registers = max_registers  # the Triton kernel's ptxas register cap (None: the compiler's choice)
        self.paged_refresh = PAGED_REFRESH  # key tiles between threshold raises in the paged scan (paged.py)
        self._prepared: tuple[PrefillProblem, Operands] | None = None

    def check_device(self, device: torch.device) -> None:
        if is_cuda(device):
            return
        if device.type == "cpu" and interpreting():
            return
        raise BackendUnavailableError(
            f"the triton backend runs on an NVIDIA CUDA device (got {device}); CPU tensors only "
            "under TRITON_INTERPRET=1 (tests). Use backend='reference' on the CPU."
        )

    # -- operands and schedule -------------------------------------------------------------
    def operands(self, problem: PrefillProblem) -> Operands:
        """Decode the live keys and the queries of `problem` (cached for the same problem; a subset
        of it (PrefillProblem.subset) reuses its keys and gathers its queries). All on the device:
        the wide-vector decision is a device flag that picks which kernel variant scores (both are
        launched, the other does no work), unsupported vectors become per-row flags."""
        if self._prepared is not None and self._prepared[0] is problem:
            return self._prepared[1]
        if problem.parent is not None:
            parent = self.operands(problem.parent)
            if isinstance(parent, PagedOperands):
                with stage_range("litetopk.schedule"):
                    ops = paged_subset_operands(problem, parent)
            else:
                ops = self._subset_operands(problem, parent)
        elif block_rows := paged_block_rows(problem.num_rows, problem.block_table.shape[0], self.paged):
            with stage_range("litetopk.decode"):
                gluon, use_asm = self._paged_kernel(problem)
                ops = paged_operands(problem, block_rows, use_asm=use_asm, gluon=gluon, num_bins=self.num_bins)
        else:
            with stage_range("litetopk.decode"):
                ops = self._decode(problem)
        self._prepared = (problem, ops)
        return ops

    def _decode(self, problem: PrefillProblem) -> Operands:
        batch = problem.block_table.shape[0]
        scratch = problem.scratch
        s_pad = max(-(-problem.max_end // self.block_keys) * self.block_keys, self.block_keys)
        # The keys any row reads, and zeroed words from the row checks' launch (problem.py): the flag
        # summary (OR of the key flags, of the query flags, weights refused: operands.py) and batch_wide.
        summary, batch_wide = problem.zeroed[:ZEROED_WORDS], problem.zeroed[ZEROED_WORDS:]
        key_outputs, query_outputs = decode_operands_triton(
            problem.cache,
            problem.block_table,
            problem.sequence_ends,
            s_pad,
            summary,
            batch_wide,
            problem.q_fp4,
            problem.q_scale,
            problem.weights,
            (problem.starts, problem.ends),
            problem.weight_scale,
            block_keys=self.block_keys,
            scratch=scratch,
        )
        k_lo, k_hi, _, k_flags, kfac, tile_wide, batch_wide = key_outputs
        q_lo, q_hi, _, _, wq, rowfac, _, q_wide, q_unsupported = query_outputs
        keys = KeyOperands(
            k_lo,
            k_hi,
            kfac,
            s_pad,
            tile_wide=tile_wide,
            batch_wide=batch_wide.view(torch.int8).view(batch, 4),
            flags_of_keys=k_flags,
            flags=summary[0:2],
        )
        return self._with_schedule(problem, keys, q_lo, q_hi, wq, rowfac, q_wide, q_unsupported)

    def _subset_operands(self, problem: PrefillProblem, parent: Operands) -> Operands:
        """The operands of a subset (the repair's rows: one row a program, scanned only), gathered from
        its parent's (subset.py)."""
        with stage_range("litetopk.schedule"):
            q_lo, q_hi, wq, rowfac, q_wide, q_unsupported, schedule = subset_operands(problem, parent, self.block_rows)
        return Operands(
            parent.keys,
            q_lo,
            q_hi,
            wq,
            rowfac,
            q_wide,
            q_unsupported,
            gluon=self._use_gluon(problem.device),
            schedule=schedule,
        )

    def _with_schedule(self, problem, keys, q_lo, q_hi, wq, rowfac, q_wide, q_unsupported) -> Operands:
        with stage_range("litetopk.schedule"):
            schedule = build_schedule(
                problem.row_to_batch,
                problem.starts,
                problem.ends,
                problem.block_table.shape[0],
                self.block_rows,
                q_wide,
                keys.flags,
                problem.scratch,
            )
        return Operands(
            keys,
            q_lo,
            q_hi,
            wq,
            rowfac,
            q_wide,
            q_unsupported,
            gluon=self._use_gluon(problem.device),
            schedule=schedule,
        )

    def sizing_calls(self, max_rows: int, max_batch: int) -> list[tuple[ScoringBackend, int, int]]:
        """ScoringBackend.sizing_calls: with paged="auto", the largest call of each mode: paged at
        min(max_rows, PAGED_ROWS_PER_SEQUENCE x max_batch) rows over max_batch sequences, prefill at
        max_rows rows over the most sequences that still make a prefill-shaped call (every buffer of a mode
        grows with its rows and sequences)."""
        if self.paged != "auto":
            return [(self, max_rows, max_batch)]
        calls = []
        if paged_rows := min(max_rows, PAGED_ROWS_PER_SEQUENCE * max_batch):
            calls.append((TritonBackend(**self._options, paged="always"), paged_rows, max_batch))
        if max_rows > PAGED_ROWS_PER_SEQUENCE:
            prefill_batch = min(max_batch, (max_rows - 1) // PAGED_ROWS_PER_SEQUENCE)
            calls.append((TritonBackend(**self._options, paged="never"), max_rows, prefill_batch))
        return calls or [(self, max_rows, max_batch)]

    def buffers_hold_windows(self, problem: PrefillProblem) -> bool:
        """ScoringBackend.buffers_hold_windows: in the paged mode (at most 4 rows a sequence)."""
        return isinstance(self.operands(problem), PagedOperands)

    def calibration_for(self, problem: PrefillProblem, requested: str) -> str:
        """ScoringBackend.calibration_for: "scan" is the prefill mode's self-calibrating scan; the paged mode
        (paged.py: several programs a row, no program sees a row's recent keys first) calibrates from the
        sample stage."""
        if requested == "scan" and isinstance(self.operands(problem), PagedOperands):
            return "sample"
        return requested

    def unsupported_rows(self, problem: PrefillProblem) -> torch.Tensor:
        """bool [rows]: live rows holding (or whose window holds) a vector whose nonzero blocks span more
        than 7 binades of scale, or whose head weights are outside the scoring epilogue's range
        (operands.py); they get RowStatus.UNSUPPORTED (backend='reference' scores them). Computed when
        asked (after the scan is enqueued: off the path to the first scoring launch)."""
        ops = self.operands(problem)
        if isinstance(ops, PagedOperands):
            return paged_unsupported_rows(problem, ops)
        if runs_triton_stages(problem.device):
            return unsupported_rows_triton(
                ops.keys.flags_of_keys,
                ops.keys.flags,
                problem.row_to_batch,
                problem.starts,
                problem.ends,
                ops.q_unsupported,
                problem.scratch,
            )
        unsupported_keys = ((ops.keys.flags_of_keys & FLAG_UNSUPPORTED) != 0).to(torch.int32)
        prefix = torch.nn.functional.pad(unsupported_keys.cumsum(dim=1), (1, 0))
        b = problem.row_to_batch.long()
        k_unsupported = (prefix[b, problem.ends.long()] - prefix[b, problem.starts.long()]) > 0
        return (problem.ends > problem.starts) & (ops.q_unsupported | k_unsupported)

    def scoring_faults(self, problem: PrefillProblem, nonfinite: torch.Tensor) -> torch.Tensor:
        """ScoringBackend.scoring_faults in one launch (operands.scoring_faults_triton) where the Triton
        stages run."""
        ops = self.operands(problem)
        if isinstance(ops, PagedOperands):
            return paged_scoring_faults(problem, ops, nonfinite)
        if not runs_triton_stages(problem.device):
            return super().scoring_faults(problem, nonfinite)
        return scoring_faults_triton(
            ops.keys.flags_of_keys,
            ops.keys.flags,
            problem.row_to_batch,
            problem.starts,
            problem.ends,
            ops.q_unsupported,
            problem.row_status,
            nonfinite,
            problem.scratch,
        )

    def _use_gluon(self, device: torch.device) -> bool:
        """Whether this problem's scores come from the Gluon kernel (module docstring)."""
        if self.scoring_kernel == "triton":
            return False
        if self.scoring_kernel == "auto":
            return self._gluon_tile and is_sm90(device)
        if not is_sm90(device):
            raise BackendUnavailableError(
                f"scoring_kernel='gluon' runs on a compiled sm_90 CUDA device (got {device}"
                f"{', interpreted' if interpreting() else ''}); use scoring_kernel='auto' or 'triton'"
            )
        return True

    def _paged_kernel(self, problem: PrefillProblem) -> tuple[bool, bool]:
        """(gluon, use_asm) of a paged problem: the Gluon paged kernel on a compiled sm_90 device where the
        cache's pages start on 16 bytes (it reads them as 16-byte words; paged.cache_in_words), else the
        Triton one (byte loads: any page stride and offset); the PTX E2M1 decode only on sm_90 (where the
        Triton kernel's decode operand layout is the one it was checked in, 4 bytes of a group an instance),
        its tl twin elsewhere. scoring_kernel="gluon" where it cannot run raises; nothing falls back."""
        sm90 = is_sm90(problem.device)
        words = cache_in_words(problem.cache)
        if self.scoring_kernel == "gluon":
            self._use_gluon(problem.device)  # raises off sm_90
            if not words:
                raise BackendUnavailableError(
                    "the Gluon paged kernel reads the cache in 16-byte words: its pages must start on 16 bytes "
                    f"(data pointer {problem.cache.values.data_ptr()} and page stride "
                    f"{problem.cache.value_page_stride} bytes); use scoring_kernel='auto' or 'triton'"
                )
        return self.scoring_kernel != "triton" and sm90 and words, sm90

    # -- launches --------------------------------------------------------------------------
    def _launch(
        self,
        problem,
        ops,
        *,
        dense,
        out=None,
        out_width=0,
        stride=1,
        thresholds=None,
        hist_lo=None,
        hist_width=None,
        hist=None,
        buffer=None,
        capacity=0,
        appended=None,
        thr_out=None,
        nonfinite=None,
        sample_tiles=0,
    ):
        """Launch the narrow and the wide variant of the scoring kernel over the schedule's fixed grid;
        the device flag in ops.schedule.variants leaves one of them without work (Operands)."""
        schedule = ops.schedule
        if schedule.programs == 0:
            return
        unused64 = problem.scratch.empty(1, torch.int64)
        unused32 = problem.scratch.empty(1, torch.float32)
        keys = ops.keys
        tile_wide = keys.tile_wide if stride == 1 else keys.batch_wide
        grid = (schedule.programs,)
        for any_wide, (variant_rows, span) in zip((False, True), schedule.variants):
            args = (
                keys.k_lo,
                keys.k_hi,
                keys.kfac,
                tile_wide,
                tile_wide.shape[1],
                ops.q_lo,
                ops.q_hi,
                ops.wq,
                ops.rowfac,
                variant_rows,
                schedule.batch,
                span,
                schedule.q_wide,
                problem.starts,
                problem.ends,
                keys.s_pad,
                out if out is not None else unused32,
                out_width,
                problem.max_end,
                stride,
                thresholds if thresholds is not None else unused32,
                hist_lo if hist_lo is not None else unused32,
                hist_width if hist_width is not None else unused32,
                hist if hist is not None else unused64,
                buffer if buffer is not None else unused64,
                capacity,
                appended if appended is not None else unused64,
                thr_out if thr_out is not None else unused32,
                nonfinite,
                sample_tiles,
                MAX_SAMPLE_STRIDE,
            )
            if ops.gluon:
                constants, options = gluon_launch_options(
                    topk=problem.topk,
                    DENSE=dense,
                    STRIDED=stride != 1,
                    ANY_WIDE=any_wide,
                    refresh=self.refresh,
                    num_bins=self.num_bins,
                    SELF_CALIBRATE=sample_tiles > 0,
                )
                score_fp4_gluon_kernel[grid](*args, **constants, **options)
                continue
            score_fp4_kernel[grid](
                *args,
                TOPK=problem.topk,
                BLOCK_KEYS=self.block_keys,
                BLOCK_ROWS=self.block_rows,
                DENSE=dense,
                STRIDED=stride != 1,
                ANY_WIDE=any_wide,
                SELF_CALIBRATE=sample_tiles > 0,
                REFRESH=self.refresh,
                NB=self.num_bins,
                num_warps=self.num_warps,
                num_stages=self.num_stages,
                **({} if self.max_registers is None else {"maxnreg": self.max_registers}),
            )

    def score_dense(self, problem: PrefillProblem, stride: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        ops = self.operands(problem)
        width = -(-problem.max_end // stride)
        if isinstance(ops, PagedOperands):  # every row of a group is written across all columns
            out = problem.scratch.empty((problem.num_rows, width), torch.float32)
            fault_set = FAULT_SAMPLE if stride != 1 else FAULT_DENSE
            launch_paged_scoring(
                problem.cache,
                problem.block_table,
                problem.row_to_batch,
                ops.queries,
                ops.schedule,
                problem.starts,
                problem.ends,
                topk=problem.topk,
                programs=ops.programs,
                fault_set=fault_set,
                use_asm=ops.use_asm,
                gluon=ops.gluon,
                out=out,
                stride=stride,
                query_rows=ops.query_rows,
            )
            faults = ops.schedule.faults[fault_set]
            if stride == 1:
                ops.faults = faults
            return out, faults[0].view(torch.bool)  # (0 or 1)
        # every row is a lane of a program with work (schedule.py), which writes all of its columns
        # and its nonfinite flag
        out = problem.scratch.empty((problem.num_rows, width), torch.float32)
        nonfinite = problem.scratch.empty(problem.num_rows, torch.int8)
        self._launch(problem, ops, dense=True, out=out, out_width=width, stride=stride, nonfinite=nonfinite)
        return out, nonfinite.view(torch.bool)  # the kernel writes 0 or 1

    def scan_candidates(
        self,
        problem: PrefillProblem,
        thresholds: torch.Tensor | None,
        capacity: int,
        ceilings: torch.Tensor | None = None,
        sample_size: int = 0,
    ) -> CandidateScan:
        sample_tiles = -(-sample_size // self.block_keys)  # > 0: the scan calibrates itself (scan_calibration.py)
        if not sample_tiles and thresholds is None:
            raise ValueError("a scan without thresholds calibrates itself: give sample_size > 0")
        if sample_tiles and (thresholds is not None or ceilings is not None):
            # (phase A must append every key and count none: a histogram there would count the
            # sampled keys twice, once more at the compaction, and could raise a threshold too far)
            raise ValueError("a self-calibrating scan (sample_size > 0) takes no thresholds and no ceilings")
        ops = self.operands(problem)
        if sample_tiles and isinstance(ops, PagedOperands):
            raise ValueError("the paged mode has no self-calibrating scan (calibration_for gives 'sample')")
        rows = problem.num_rows
        buffer = problem.scratch.empty((rows, capacity), torch.int64)  # read only below the appended count
        if isinstance(ops, PagedOperands):  # its state is the schedule's (set up by its launch: none here)
            reset_scan_state(ops)
            schedule = ops.schedule
            launch_paged_scoring(
                problem.cache,
                problem.block_table,
                problem.row_to_batch,
                ops.queries,
                schedule,
                problem.starts,
                problem.ends,
                topk=problem.topk,
                programs=ops.programs,
                fault_set=FAULT_SCAN,
                use_asm=ops.use_asm,
                gluon=ops.gluon,
                thresholds=thresholds.contiguous(),
                ceilings=ceilings.contiguous() if ceilings is not None else None,
                buffer=buffer,
                capacity=capacity,
                refresh=self.paged_refresh,
                num_bins=self.num_bins,
                query_rows=ops.query_rows,
            )
            ops.faults = schedule.faults[FAULT_SCAN]
            scan = dict(raised=schedule.raised, appended=schedule.appended, nonfinite=ops.faults[0])
        else:
            # The kernel compares scores with the threshold's score (a superset of the keys >= it). A
            # self-calibrating scan sets up its rows itself: no launch before it.
            if sample_tiles:
                scan = scan_buffers(rows, self.num_bins, problem.scratch, self_calibrating=True)
            else:
                scan = prepare_scan_triton(thresholds, ceilings, self.num_bins, problem.scratch)
            self._launch(
                problem,
                ops,
                dense=False,
                thresholds=scan.get("thr"),
                hist_lo=scan.get("hist_lo"),
                hist_width=scan.get("hist_width"),
                hist=scan["hist"],
                buffer=buffer,
                capacity=capacity,
                appended=scan["appended"],
                thr_out=scan["raised"],
                nonfinite=scan["nonfinite"],
                sample_tiles=sample_tiles,
            )
        final, appended, nonfinite = finish_scan(thresholds, scan, problem.scratch)
        return CandidateScan(keys=buffer, appended=appended, thresholds=final, nonfinite=nonfinite)
