"""TritonBackend: the H200 path (decode.py + scoring.py behind the ScoringBackend interface).

Per call the backend decodes the live keys and the queries once into exact int8 operands
(decode.py; cached for the calls of one problem: calibration, scan and repair), builds a
schedule of programs (BLOCK_ROWS rows of one sequence each, the longest windows first), and
launches a scoring kernel in dense or scan mode on the current stream. Runs on an NVIDIA CUDA
device, or on CPU tensors under TRITON_INTERPRET=1 (how CI tests the kernels).

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

import numpy as np
import torch

from ..backend import CandidateScan, ScoringBackend
from ..devices import is_cuda
from ..errors import BackendUnavailableError, InputError
from ..selection import NO_KEY, score_floor_keys
from ..validation import PrefillProblem
from .decode import (
    FLAG_UNSUPPORTED, FLAG_WIDE, MAX_WEIGHT_EXPONENT, MIN_SCALED_EXPONENT, decode_keys_fp4_triton,
    prepare_queries_fp4_triton,
)
from .scoring import HEAD_DIM, HEADS, NUM_BINS, prepare_scan_triton, score_fp4_kernel
from .scoring_gluon import (
    GLUON_BLOCK_KEYS, GLUON_BLOCK_ROWS, GLUON_MAX_REGISTERS, GLUON_NUM_WARPS, NUM_BUFFERS, score_fp4_gluon_kernel,
)
from .selection import (
    assemble_result_triton, calibration_keys_triton, kth_largest_scores_triton, select_topk_candidates_triton,
)


SCORING_KERNELS = ("auto", "gluon", "triton")


def interpreting() -> bool:
    """True when Triton kernels run in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def is_sm90(device: torch.device) -> bool:
    """True for a compiled (not interpreted) CUDA device of compute capability 9.0 (H100, H200)."""
    return (is_cuda(device) and not interpreting()
            and _capability(device.index if device.index is not None else torch.cuda.current_device()) == (9, 0))


@functools.lru_cache(maxsize=None)
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def gluon_launch_options(*, topk: int, DENSE: bool, STRIDED: bool, ANY_WIDE: bool = False, refresh: int = 16,
                         num_bins: int = NUM_BINS, defer_appends: bool = True) -> tuple[dict, dict]:
    """(constexpr arguments, compiler options) of one score_fp4_gluon_kernel variant, as launched
    (shared with compile_sm90.py's offline check, so CI compiles what the H200 runs)."""
    constants = dict(TOPK=topk, BLOCK_KEYS=GLUON_BLOCK_KEYS, BLOCK_ROWS=GLUON_BLOCK_ROWS, DENSE=DENSE,
                     STRIDED=STRIDED, ANY_WIDE=ANY_WIDE, REFRESH=refresh, H=HEADS, D=HEAD_DIM, NB=num_bins,
                     NUM_BUFFERS=NUM_BUFFERS, DEFER_APPENDS=defer_appends)
    return constants, dict(num_warps=GLUON_NUM_WARPS, maxnreg=GLUON_MAX_REGISTERS)


@dataclass(frozen=True)
class Operands:
    """Decoded, exact int8 operands of one problem (decode.py)."""

    k_lo: torch.Tensor
    k_hi: torch.Tensor
    kfac: torch.Tensor
    q_lo: torch.Tensor
    q_hi: torch.Tensor
    wq: torch.Tensor  # float32 [rows, 64]: w' * 2^shift (decode.prepare_queries_fp4_triton)
    rowfac: torch.Tensor  # float32 [rows]: 2^(149 - shift) * weight_scale (exact: a power of two times it)
    s_pad: int
    any_wide: bool  # some live vector needs a hi operand: compile the kernel with the wide branches
    gluon: bool  # score with score_fp4_gluon_kernel (else score_fp4_kernel); see the module docstring
    tile_wide: torch.Tensor  # int8 [B, s_pad / BLOCK_KEYS]: the key tile holds a wide key
    batch_wide: torch.Tensor  # int8 [B, 1]: the sequence holds a wide key (for strided scans)
    prog_q_wide: torch.Tensor  # int8 [programs]: a row of the program holds a wide query vector
    schedule: tuple[torch.Tensor, torch.Tensor, torch.Tensor]


class TritonBackend(ScoringBackend):
    """Exact int8 tensor-core scoring with the fused LiteTopK filter; see scoring.py."""

    name = "triton"

    def __init__(self, block_rows: int = GLUON_BLOCK_ROWS, block_keys: int = GLUON_BLOCK_KEYS,
                 num_warps: int = GLUON_NUM_WARPS, num_stages: int = 3, refresh: int = 16, num_bins: int = NUM_BINS,
                 max_registers: int | None = None, scoring_kernel: str = "auto"):
        if scoring_kernel not in SCORING_KERNELS:
            raise ValueError(f"scoring_kernel={scoring_kernel!r} is not one of {SCORING_KERNELS}")
        gluon_tile = (block_rows, block_keys, num_warps) == (GLUON_BLOCK_ROWS, GLUON_BLOCK_KEYS, GLUON_NUM_WARPS)
        if scoring_kernel == "gluon" and not gluon_tile:
            raise ValueError(f"the gluon scoring kernel has one tile: block_rows={GLUON_BLOCK_ROWS}, "
                             f"block_keys={GLUON_BLOCK_KEYS}, num_warps={GLUON_NUM_WARPS}")
        self.scoring_kernel = scoring_kernel
        self._gluon_tile = gluon_tile
        self.block_rows = block_rows
        self.block_keys = block_keys
        self.num_warps = num_warps
        self.num_stages = num_stages
        self.refresh = refresh  # key steps between threshold raises in the scan
        self.num_bins = num_bins  # bins of the scan's threshold histogram (a power of two)
        self.max_registers = max_registers  # the Triton kernel's ptxas register cap (None: the compiler's choice)
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
        """Decode the live keys and the queries of `problem` (cached for the same problem)."""
        if self._prepared is not None and self._prepared[0] is problem:
            return self._prepared[1]
        batch = problem.block_table.shape[0]
        dev = problem.device
        need = torch.zeros(batch, dtype=torch.int32, device=dev)
        need.scatter_reduce_(0, problem.row_to_batch.long(), problem.ends, reduce="amax")
        s_pad = max(-(-problem.max_end // self.block_keys) * self.block_keys, self.block_keys)
        # summary: [0] = OR of the key flags, [1] = OR of the query flags (every row), [2] = a live
        # row's head weights out of range. One host sync reads it; the exact per-row and per-key
        # checks below run only when it shows a wide or unsupported vector.
        summary = torch.zeros(3, dtype=torch.int32, device=dev)
        k_lo, k_hi, _, k_flags, kfac = decode_keys_fp4_triton(problem.cache, problem.block_table, need, s_pad,
                                                              summary[0:1])
        live_rows = problem.ends > problem.starts
        q_lo, q_hi, _, q_flags, wq, rowfac, refused = prepare_queries_fp4_triton(
            problem.q_fp4, problem.q_scale, problem.weights, live_rows, summary[1:3])
        schedule = self.schedule(problem)  # host work while the decode kernels run
        key_summary, query_summary, weights_out_of_range = summary.tolist()
        if weights_out_of_range:
            rows = torch.nonzero(refused).flatten()[:8].tolist()
            raise InputError(
                f"the triton backend needs each row's nonzero head weights times query scales below "
                f"2^{MAX_WEIGHT_EXPONENT} and within 2^{127 - MIN_SCALED_EXPONENT - 1} of each other; query rows "
                f"{rows} are not. Use backend='reference' for such data."
            )
        if (key_summary | query_summary) & FLAG_UNSUPPORTED:
            bad_q = ((q_flags.to(torch.int32) & FLAG_UNSUPPORTED) != 0).any(dim=1) & live_rows
            bad_k = (k_flags.to(torch.int32) & FLAG_UNSUPPORTED) != 0
            if bool(bad_q.any()) or bool(bad_k.any()):
                rows = torch.nonzero(bad_q).flatten()[:8].tolist()
                keys = torch.nonzero(bad_k)[:8].tolist()
                raise InputError(
                    "the triton backend scores MXFP4 vectors whose nonzero 32-element blocks span at most 7 "
                    f"binades of scale; query rows {rows} and (sequence, position) keys {keys} span more. "
                    "Use backend='reference' for such data."
                )
        programs = schedule[0].shape[0]
        any_wide = bool((key_summary | query_summary) & FLAG_WIDE)
        if any_wide:
            key_wide = (k_flags.to(torch.int32) & FLAG_WIDE) != 0
            tile_wide = key_wide.view(batch, -1, self.block_keys).any(dim=2)
            wide_q = ((q_flags.to(torch.int32) & FLAG_WIDE) != 0).any(dim=1) & live_rows
            prog_rows = schedule[0].long()
            prog_q_wide = torch.where(prog_rows >= 0, wide_q[prog_rows.clamp_min(0)], False).any(dim=1)
            batch_wide = tile_wide.any(dim=1, keepdim=True)
            tile_wide, batch_wide, prog_q_wide = (t.to(torch.int8).contiguous() for t in (tile_wide, batch_wide, prog_q_wide))
        else:  # read by no kernel variant (ANY_WIDE false): allocated, never written or read
            tile_wide = torch.empty(batch, s_pad // self.block_keys, dtype=torch.int8, device=dev)
            batch_wide = torch.empty(batch, 1, dtype=torch.int8, device=dev)
            prog_q_wide = torch.empty(programs, dtype=torch.int8, device=dev)
        if problem.weight_scale != 1.0:
            rowfac = rowfac * problem.weight_scale
        ops = Operands(k_lo, k_hi, kfac, q_lo, q_hi, wq.contiguous(), rowfac.contiguous(), s_pad,
                       any_wide=any_wide, gluon=self._use_gluon(dev), tile_wide=tile_wide, batch_wide=batch_wide,
                       prog_q_wide=prog_q_wide, schedule=schedule)
        self._prepared = (problem, ops)
        return ops

    def _use_gluon(self, device: torch.device) -> bool:
        """Whether this problem's scores come from the Gluon kernel (module docstring)."""
        if self.scoring_kernel == "triton":
            return False
        if self.scoring_kernel == "auto":
            return self._gluon_tile and is_sm90(device)
        if not is_sm90(device):
            raise BackendUnavailableError(
                f"scoring_kernel='gluon' runs on a compiled sm_90 CUDA device (got {device}"
                f"{', interpreted' if interpreting() else ''}); use scoring_kernel='auto' or 'triton'")
        return True

    def schedule(self, problem: PrefillProblem) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(rows int32 [programs, BLOCK_ROWS] with -1 padding, batch int32 [programs], span int32
        [programs, 2] = (min start, max end) of the program's rows): the rows of every program
        belong to one sequence, lanes fill from the first; programs with the most keys to scan
        come first. Built on the host from the validated row metadata (problem.host_rows), then
        copied to the device at once (from pinned memory, asynchronously, on a CUDA device)."""
        block = self.block_rows
        rtb, starts, ends = problem.host_rows  # int32
        order = np.flatnonzero(ends > starts)  # the live rows, by sequence then start (below)
        key = (rtb[order].astype(np.int64) << 32) | starts[order]  # both >= 0 and < 2^31
        if not (key[1:] >= key[:-1]).all():  # usually sorted already
            order = order[np.argsort(key, kind="stable")]
        batch_of = rtb[order]
        n = order.size
        if n == 0 or batch_of[0] == batch_of[-1]:  # one sequence: consecutive rows fill the lanes
            slot = slice(0, n)
            count = -(-n // block)
        else:  # each sequence starts a program: slot = program * block + lane
            index = np.arange(n)
            opens = np.ones(n, dtype=bool)
            np.not_equal(batch_of[1:], batch_of[:-1], out=opens[1:])
            lane = (index - np.maximum.accumulate(np.where(opens, index, 0))) % block
            opens = lane == 0
            slot = (np.cumsum(opens) - 1) * block + lane
            count = int(opens.sum())
        prog_rows = np.full(count * block, -1, dtype=np.int32)
        prog_rows[slot] = order
        lane_ends = np.zeros(count * block, dtype=np.int32)
        lane_ends[slot] = ends[order]
        prog_rows = prog_rows.reshape(count, block)
        first_rows = prog_rows[:, 0]  # lanes fill from the first, which has the program's smallest start
        span = np.empty((count, 2), dtype=np.int32)
        span[:, 0] = starts[first_rows]
        span[:, 1] = lane_ends[0::block]
        for lane_index in range(1, block):
            np.maximum(span[:, 1], lane_ends[lane_index::block], out=span[:, 1])
        work = span[:, 1] - span[:, 0]
        if (work[1:] <= work[:-1]).all():  # the longest span first
            by_work = slice(None)
        elif (work[1:] >= work[:-1]).all():  # causal prefill: the windows grow with the row
            by_work = slice(None, None, -1)
        else:
            by_work = np.argsort(-work, kind="stable")
        flat = np.concatenate([prog_rows[by_work].ravel(), rtb[first_rows[by_work]], span[by_work].ravel()])
        packed = torch.from_numpy(flat)
        if problem.device.type == "cuda":  # pinned: the copy neither waits for the stream nor blocks the host
            packed = packed.pin_memory().to(problem.device, non_blocking=True)
        return (packed[:count * block].view(count, block), packed[count * block:count * (block + 1)],
                packed[count * (block + 1):].view(count, 2))

    # -- launches --------------------------------------------------------------------------
    def _launch(self, problem, ops, *, dense, out=None, out_width=0, stride=1, thresholds=None, hist_lo=None,
                hist_width=None, hist=None, buffer=None, capacity=0, appended=None, thr_out=None,
                nonfinite=None):
        prog_rows, prog_batch, prog_span = ops.schedule
        if prog_rows.shape[0] == 0:
            return
        dev = problem.device
        unused64 = torch.empty(1, dtype=torch.int64, device=dev)
        unused32 = torch.empty(1, dtype=torch.float32, device=dev)
        tile_wide = ops.tile_wide if stride == 1 else ops.batch_wide
        args = (
            ops.k_lo, ops.k_hi, ops.kfac, tile_wide, tile_wide.shape[1], ops.q_lo, ops.q_hi, ops.wq, ops.rowfac,
            prog_rows, prog_batch, prog_span, ops.prog_q_wide, problem.starts, problem.ends,
            ops.s_pad,
            out if out is not None else unused32, out_width, problem.max_end, stride,
            thresholds if thresholds is not None else unused32,
            hist_lo if hist_lo is not None else unused32,
            hist_width if hist_width is not None else unused32,
            hist if hist is not None else unused64,
            buffer if buffer is not None else unused64, capacity,
            appended if appended is not None else unused64,
            thr_out if thr_out is not None else unused32,
            nonfinite,
        )
        grid = (prog_rows.shape[0],)
        if ops.gluon:
            constants, options = gluon_launch_options(topk=problem.topk, DENSE=dense, STRIDED=stride != 1,
                                                      ANY_WIDE=ops.any_wide, refresh=self.refresh,
                                                      num_bins=self.num_bins)
            score_fp4_gluon_kernel[grid](*args, **constants, **options)
            return
        score_fp4_kernel[grid](
            *args,
            TOPK=problem.topk, BLOCK_KEYS=self.block_keys, BLOCK_ROWS=self.block_rows, DENSE=dense,
            STRIDED=stride != 1, ANY_WIDE=ops.any_wide,
            REFRESH=self.refresh, NB=self.num_bins, num_warps=self.num_warps, num_stages=self.num_stages,
            **({} if self.max_registers is None else {"maxnreg": self.max_registers}),
        )

    def score_dense(self, problem: PrefillProblem, stride: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        ops = self.operands(problem)
        width = -(-problem.max_end // stride)
        out = torch.empty(problem.num_rows, width, dtype=torch.float32, device=problem.device)
        if problem.empty_rows:  # rows of no program: their columns are all outside the window
            out.masked_fill_((problem.ends <= problem.starts)[:, None], float("-inf"))
        nonfinite = torch.zeros(problem.num_rows, dtype=torch.int8, device=problem.device)
        self._launch(problem, ops, dense=True, out=out, out_width=width, stride=stride, nonfinite=nonfinite)
        return out, nonfinite.bool()

    def scan_candidates(self, problem: PrefillProblem, thresholds: torch.Tensor, capacity: int,
                        ceilings: torch.Tensor | None = None) -> CandidateScan:
        ops = self.operands(problem)
        rows = problem.num_rows
        dev = problem.device
        # The kernel compares scores with the threshold's score (a superset of the keys >= it).
        scan = prepare_scan_triton(thresholds, ceilings, self.num_bins)
        buffer = torch.full((rows, capacity), NO_KEY, dtype=torch.int64, device=dev)
        self._launch(problem, ops, dense=False, thresholds=scan["thr"], hist_lo=scan["hist_lo"],
                     hist_width=scan["hist_width"], hist=scan["hist"], buffer=buffer, capacity=capacity,
                     appended=scan["appended"], thr_out=scan["raised"], nonfinite=scan["nonfinite"])
        raised = scan["raised"]
        final = torch.maximum(thresholds, torch.where(raised > scan["thr"], score_floor_keys(raised), NO_KEY))
        return CandidateScan(keys=buffer, appended=scan["appended"].long(), thresholds=final,
                             nonfinite=scan["nonfinite"].bool())

    def assemble_result(self, top_keys, row_to_batch, block_table, status, repaired, candidates):
        """By selection.py's one-kernel assembly."""
        return assemble_result_triton(top_keys, row_to_batch, block_table, status, repaired, candidates)

    def kth_largest_scores(self, scores: torch.Tensor, ranks: tuple[int, int]) -> torch.Tensor:
        """By selection.py's bisection kernel (no sort)."""
        return kth_largest_scores_triton(scores, ranks)

    def calibration_keys(self, sample: torch.Tensor, k: int, ceiling_rank: int,
                         offset: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
        """By the same bisection kernel, which also forms the keys (one launch, no small ops)."""
        return calibration_keys_triton(sample, k, ceiling_rank, offset)

    def select_candidates(self, scan: CandidateScan, k: int) -> torch.Tensor:
        """The buffer's top-k by selection.py's kernel (compacted above the scan's final threshold)."""
        kept = scan.appended.clamp(max=scan.keys.shape[1])
        return select_topk_candidates_triton(scan.keys, kept, scan.thresholds, k)
