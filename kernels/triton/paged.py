"""The Triton backend's paged mode: decode-shaped calls scored straight from the FP4 cache over a split
schedule (paged_scoring.py, split_schedule.py), behind TritonBackend's ScoringBackend methods.

When. A call whose rows are at most PAGED_ROWS_PER_SEQUENCE times its sequences (block-table rows) is
decode-shaped (next_n = 1-4 rows a request, MTP): each key is read by few programs, so it is scored from
its page (no int8 copy of the keys) and the key tiles are split over every SM. Other calls (a prefill
chunk: thousands of rows over few sequences, each key read by every 2-row program of its causal window)
keep the prefill mode (decode.py's int8 keys read from L2, schedule.py). The choice is made from the
problem's shapes alone (no host round trip), once per problem; the problem's subsets (the repair's
rescan) keep their parent's mode and group size, so that every score of a call, its calibration sample,
its scan, its repair and its dense scores, comes from one kernel and one head-sum order (LiteTopK equals
dense bit for bit).

Group size. BLOCK_ROWS = 1 where every sequence holds at most one row on average (next_n = 1: N = 64
MMA columns, one row), else 2 (N = 128; next_n = 3-4 make two groups a request, each reading the keys:
those shapes are bound by the tensor cores, not by the bytes).

Per call (launches): the queries' decode (operands.py) and the split schedule in one launch
(paged_prologue_kernel), then the
pipeline's stages; each scoring launch is one launch over a fixed grid (paged_programs: programs an SM by
the kernel's registers), so a call can be captured in a CUDA graph.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace

import torch
import triton
import triton.language as tl

from ..cache_layout import PAGE_SIZE, KVCache
from ..devices import runs_triton_stages
from ..status import RowStatus
from .operands import VECTORS_PER_PROGRAM, _decode_query_block, _query_side, prepare_queries_fp4_triton
from .paged_scoring import score_fp4_paged_kernel
from .paged_scoring_gluon import (
    GLUON_PAGED_MAX_REGISTERS,
    GLUON_PAGED_WARPS,
    gluon_paged_options,
    score_fp4_paged_gluon_kernel,
)
from .paged_scoring_gluon import PROGRAMS_PER_SM as GLUON_PROGRAMS_PER_SM
from .scoring import HEAD_DIM, HEADS, NUM_BINS
from .split_schedule import SplitSchedule, _split_schedule, build_split_schedule, split_schedule_launch

PAGED_ROWS_PER_SEQUENCE = 4
PAGED_MODES = ("auto", "never", "always")
INTERPRETED_PROGRAMS = 3  # the grid under TRITON_INTERPRET=1: several programs share each row group's tiles
# Key tiles between the paged scan's threshold raises (several programs a row share one threshold): 16 against 4
# on an H100 (bench/probes/paged_variants.py, GPU busy of one eager call, bit for bit): 64 x 65,536 scoring 336 -> 320
# us, 32 x 4 x 65,536 490 -> 473, one row even. TritonBackend.paged_refresh starts from it.
PAGED_REFRESH = 16
STATUS_NONFINITE_C = tl.constexpr(int(RowStatus.NONFINITE))
STATUS_UNSUPPORTED_C = tl.constexpr(int(RowStatus.UNSUPPORTED))


def paged_block_rows(rows: int, batch: int, mode: str = "auto") -> int:
    """The paged mode's group size for a call of `rows` rows over `batch` block-table rows (module
    docstring), or 0: prefill mode. `mode` (TritonBackend(paged=...)): "auto" decides by the shapes,
    "never" and "always" force a mode (tests and benchmarks compare the two on the same call)."""
    if rows == 0 or mode == "never" or (mode == "auto" and rows > PAGED_ROWS_PER_SEQUENCE * batch):
        return 0
    return 1 if rows <= batch else 2


@functools.lru_cache(maxsize=None)
def _multiprocessors(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def paged_programs(device: torch.device, block_rows: int, gluon: bool) -> int:
    """The paged kernel's grid on `device`: as many programs an SM as its registers let reside (the Gluon
    kernel's caps, paged_scoring_gluon.py: 3 at one row a group, 2 at two; the Triton kernel, 160-250
    registers: 2), INTERPRETED_PROGRAMS on the CPU (the interpreter). Every program resides at once: a
    program's share of the tiles is 1 / programs of the call's, so a second wave would double the time."""
    if device.type != "cuda":
        return INTERPRETED_PROGRAMS
    per_sm = GLUON_PROGRAMS_PER_SM[block_rows] if gluon else 2
    return per_sm * _multiprocessors(device.index if device.index is not None else torch.cuda.current_device())


def cache_in_words(cache: KVCache) -> bool:
    """Whether every page of `cache` starts on 16 bytes (its values' data pointer and page stride are
    multiples of 16): what the Gluon paged kernel's 16-byte word loads need (the contract admits any
    stride >= PAGE_BYTES and any offset; other caches are read by the Triton kernel, byte by byte)."""
    return cache.values.data_ptr() % 16 == 0 and cache.value_page_stride % 16 == 0


@dataclass
class PagedOperands:
    """What the paged kernel reads besides the cache: the rows' decoded queries (operands.py's
    prepare_queries_fp4_triton), the split schedule, the grid; `faults` is the fault-word set
    [2, rows] of the last full scoring launch (scan or dense scores: scoring_faults reads it)."""

    q_lo: torch.Tensor  # int8 [rows, 64, 128]
    q_hi: torch.Tensor  # int8 [rows, 64, 128]
    wq: torch.Tensor  # float32 [rows, 64]
    rowfac: torch.Tensor  # float32 [rows]
    q_wide: torch.Tensor  # bool [rows]
    q_unsupported: torch.Tensor  # bool [rows]
    schedule: SplitSchedule
    programs: int
    use_asm: bool  # the E2M1 decode in PTX (compiled CUDA), else its tl twin (the interpreter)
    gluon: bool  # score with the Gluon kernel (paged_scoring_gluon.py), else the Triton one
    query_rows: torch.Tensor | None = None  # int64 [rows]: a subset's rows in its parent's operands (above)
    faults: torch.Tensor | None = field(default=None)
    scanned: bool = False  # the schedule's scan state has served a scan (a second one resets it first)

    @property
    def queries(self) -> tuple[torch.Tensor, ...]:
        return self.q_lo, self.q_hi, self.wq, self.rowfac, self.q_wide


@triton.jit
def paged_prologue_kernel(
    query_programs,
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
    q_unsupported_ptr,  # operands.py's query side
    rtb_ptr,
    s_starts_ptr,
    s_ends_ptr,
    rows,
    groups_ptr,
    group_row_ptr,
    group_count_ptr,
    group_span_ptr,
    tile_offset_ptr,
    faults_ptr,
    fault_words,
    appended_ptr,
    hist_ptr,
    raised_ptr,  # split_schedule.py's
    WEIGHTS: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK: tl.constexpr,
    KEYS: tl.constexpr,
    NB: tl.constexpr,
    QUERY_VB: tl.constexpr = VECTORS_PER_PROGRAM,
):
    """The paged mode's first launch after the row checks: program 0 builds the split schedule (its one
    long program first in the grid), programs 1..query_programs decode one query row each."""
    pid = tl.program_id(0)
    if pid == 0:
        _split_schedule(
            rtb_ptr,
            s_starts_ptr,
            s_ends_ptr,
            rows,
            groups_ptr,
            group_row_ptr,
            group_count_ptr,
            group_span_ptr,
            tile_offset_ptr,
            faults_ptr,
            fault_words,
            appended_ptr,
            hist_ptr,
            raised_ptr,
            BLOCK_ROWS,
            BLOCK,
            KEYS,
            NB,
        )
    else:
        _decode_query_block(
            pid - 1,
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


def paged_operands(problem, block_rows: int, *, use_asm: bool, gluon: bool, num_bins: int) -> PagedOperands:
    """Decode the queries of `problem` (a PrefillProblem) and build its split schedule (with the scan's
    state for `num_bins` histogram bins): one launch where devices.runs_triton_stages says so
    (paged_prologue_kernel), the queries' decode and the schedule's torch twin elsewhere."""
    scratch = problem.scratch
    windows = (problem.starts, problem.ends)
    # the flag summary's query words (operands.py) are zeroed by the row checks' launch (problem.zeroed)
    if runs_triton_stages(problem.device):
        decoded, queries = _query_side(
            problem.q_fp4, problem.q_scale, problem.weights, windows, problem.zeroed[1:3], problem.weight_scale, scratch
        )
        schedule, schedule_args, constants = split_schedule_launch(
            problem.row_to_batch, problem.starts, problem.ends, block_rows, num_bins, scratch
        )
        paged_prologue_kernel[(queries.programs + 1,)](
            queries.programs, *queries.args, *schedule_args, **queries.constants, **constants, num_warps=4
        )
    else:
        decoded = prepare_queries_fp4_triton(
            problem.q_fp4,
            problem.q_scale,
            problem.weights,
            windows,
            summary=problem.zeroed[1:3],
            weight_scale=problem.weight_scale,
            scratch=scratch,
        )
        schedule = build_split_schedule(
            problem.row_to_batch, problem.starts, problem.ends, block_rows, num_bins, scratch
        )
    q_lo, q_hi, _, _, wq, rowfac, _, q_wide, q_unsupported = decoded
    return PagedOperands(
        q_lo,
        q_hi,
        wq,
        rowfac,
        q_wide,
        q_unsupported,
        schedule,
        paged_programs(problem.device, block_rows, gluon),
        use_asm,
        gluon,
    )


def paged_subset_operands(sub, parent: PagedOperands) -> PagedOperands:
    """The operands of a subset of a paged problem (the repair's rows, sub.parent_rows into the parent's):
    the parent's queries, read through sub.parent_rows (query_rows: nothing gathered), and a split schedule
    of its own with the parent's group size (one launch)."""
    schedule = build_split_schedule(
        sub.row_to_batch, sub.starts, sub.ends, parent.schedule.block_rows, parent.schedule.hist.shape[1], sub.scratch
    )
    return replace(parent, schedule=schedule, query_rows=sub.parent_rows, faults=None, scanned=False)


def paged_launch_options(
    cache: KVCache,
    *,
    topk: int,
    block_rows: int,
    dense: bool,
    strided: bool,
    use_asm: bool,
    indirect: bool = False,
    has_ceilings: bool = False,
    refresh: int = PAGED_REFRESH,
    num_bins: int = NUM_BINS,
) -> dict:
    """The constexpr arguments of one score_fp4_paged_kernel variant, as launched (shared with the
    offline compile check, so CI compiles what the GPU runs)."""
    return dict(
        TOPK=topk,
        BLOCK_ROWS=block_rows,
        DENSE=dense,
        STRIDED=strided,
        REFRESH=refresh,
        NB=num_bins,
        H=HEADS,
        D=HEAD_DIM,
        PAGE=PAGE_SIZE,
        TOKEN_STRIDE=cache.value_token_stride,
        GROUP_STRIDE=cache.value_group_stride,
        SCALE_OFFSET=cache.scale_offset,
        SCALE_GROUP_STRIDE=cache.scale_group_stride,
        INTERLEAVED=cache.interleaved_scales,
        USE_ASM=use_asm,
        INDIRECT=indirect,
        HAS_CEILINGS=has_ceilings,
    )


def launch_paged_scoring(
    cache: KVCache,
    block_table: torch.Tensor,
    row_to_batch: torch.Tensor,
    queries: tuple,
    schedule: SplitSchedule,
    starts: torch.Tensor,
    ends: torch.Tensor,
    *,
    topk: int,
    programs: int,
    fault_set: int,
    use_asm: bool,
    gluon: bool = False,
    num_warps: int = 4,
    out: torch.Tensor | None = None,
    stride: int = 1,
    thresholds: torch.Tensor | None = None,
    ceilings: torch.Tensor | None = None,
    buffer: torch.Tensor | None = None,
    capacity: int = 0,
    refresh: int = PAGED_REFRESH,
    num_bins: int = NUM_BINS,
    query_rows: torch.Tensor | None = None,
) -> None:
    """Launch score_fp4_paged_kernel (its Gluon twin with `gluon`: paged_scoring_gluon.py, sm_90 compiled,
    the same bits) over `programs` programs: dense (`out` float32 [rows, width], column c = position
    c * stride), or scan (`out` None): every key >= its row's threshold key (`thresholds` int64 [rows],
    contiguous; histogram ranged up to `ceilings` where given) appended to `buffer` int64 [rows, capacity]
    through the schedule's shared state (schedule.appended / hist / raised: set up by its launch, for one
    scan). `queries`: (q_lo, q_hi, wq, rowfac, q_wide) of operands.prepare_queries_fp4_triton, and
    `query_rows` (int64 [rows], optional) the operand row each row reads (a subset's parent rows). The
    launch sets the flags of schedule.faults[fault_set] (zeroed by the schedule's launch)."""
    q_lo, q_hi, wq, rowfac, q_wide = queries
    dense = out is not None
    unused = schedule.tile_offset  # never read in the other mode
    faults = schedule.faults[fault_set]
    args = (
        cache.values,
        cache.scales,
        cache.value_page_stride,
        cache.scale_page_stride,
        cache.num_pages,
        block_table,
        block_table.stride(0),
        row_to_batch,
        q_lo,
        q_hi,
        wq,
        rowfac,
        q_wide.view(torch.int8),
        query_rows if query_rows is not None else unused,
        schedule.groups,
        schedule.group_row,
        schedule.group_count,
        schedule.group_span,
        schedule.tile_offset,
        starts,
        ends,
        out if dense else rowfac,
        out.shape[1] if dense else 0,
        stride,
        thresholds if not dense else unused,
        ceilings if ceilings is not None else unused,
        schedule.hist,
        buffer if buffer is not None else unused,
        capacity,
        schedule.appended,
        schedule.raised,
        faults[0],
        faults[1],
        programs,
    )
    if starts.shape[0]:
        constants = paged_launch_options(
            cache,
            topk=topk,
            block_rows=schedule.block_rows,
            dense=dense,
            strided=stride != 1,
            use_asm=use_asm,
            indirect=query_rows is not None,
            has_ceilings=ceilings is not None,
            refresh=refresh,
            num_bins=num_bins,
        )
        if gluon:
            score_fp4_paged_gluon_kernel[(programs,)](
                *args,
                **constants,
                **gluon_paged_options(stride != 1),
                num_warps=GLUON_PAGED_WARPS,
                maxnreg=GLUON_PAGED_MAX_REGISTERS[schedule.block_rows],
            )
        else:
            score_fp4_paged_kernel[(programs,)](*args, **constants, num_warps=num_warps)


@triton.jit
def paged_faults_kernel(
    status_ptr,
    nonfinite_ptr,
    unsupported_ptr,
    q_unsupported_ptr,
    starts_ptr,
    ends_ptr,
    out_ptr,
    rows,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < rows
    live = tl.load(ends_ptr + offs, mask=mask, other=0) > tl.load(starts_ptr + offs, mask=mask, other=0)
    unsupported = (tl.load(unsupported_ptr + offs, mask=mask, other=0) != 0) | (
        tl.load(q_unsupported_ptr + offs, mask=mask, other=0) != 0
    )
    status = tl.load(status_ptr + offs, mask=mask, other=0)
    status |= tl.where(tl.load(nonfinite_ptr + offs, mask=mask, other=0) != 0, STATUS_NONFINITE_C, 0)
    status |= tl.where(live & unsupported, STATUS_UNSUPPORTED_C, 0)
    tl.store(out_ptr + offs, status, mask=mask)


def reset_scan_state(ops: PagedOperands) -> None:
    """The schedule's scan state as its launch set it up (counts zeroed, raised -inf), before a second scan
    of the same problem (probes that time repeated scans; the pipeline scans a problem once): three torch
    launches, only then."""
    if ops.scanned:
        ops.schedule.appended.zero_()
        ops.schedule.hist.zero_()
        ops.schedule.raised.fill_(float("-inf"))
    ops.scanned = True


def paged_scoring_faults(problem, ops: PagedOperands, nonfinite: torch.Tensor) -> torch.Tensor:
    """int32 [rows]: problem.row_status | NONFINITE where bool `nonfinite` | UNSUPPORTED where a live row's
    query is unsupported or its window held an unsupported key (the last scoring launch's fault words):
    one launch where devices.runs_triton_stages says so, torch ops elsewhere."""
    unsupported_keys = ops.faults[1]
    q_unsupported = ops.q_unsupported if ops.query_rows is None else ops.q_unsupported[ops.query_rows]
    if runs_triton_stages(problem.device):
        rows = problem.num_rows
        out = problem.scratch.empty(rows, torch.int32)
        if rows:
            block = 256
            paged_faults_kernel[(triton.cdiv(rows, block),)](
                problem.row_status,
                nonfinite.view(torch.int8),
                unsupported_keys,
                q_unsupported.view(torch.int8),
                problem.starts,
                problem.ends,
                out,
                rows,
                BLOCK=block,
            )
        return out
    live = problem.ends > problem.starts
    status = torch.where(nonfinite, problem.row_status | int(RowStatus.NONFINITE), problem.row_status)
    unsupported = live & ((unsupported_keys != 0) | q_unsupported)
    return torch.where(unsupported, status | int(RowStatus.UNSUPPORTED), status)


def paged_unsupported_rows(problem, ops: PagedOperands) -> torch.Tensor:
    """bool [rows]: live rows whose query is unsupported or whose window held an unsupported key in the last
    full scoring launch (ScoringBackend.unsupported_rows in paged mode; the keys are read only by scoring:
    before any, a ValueError)."""
    if ops.faults is None:
        raise ValueError("the paged mode knows a row's unsupported keys after scoring it (scan or dense scores)")
    live = problem.ends > problem.starts
    q_unsupported = ops.q_unsupported if ops.query_rows is None else ops.q_unsupported[ops.query_rows]
    return live & ((ops.faults[1] != 0) | q_unsupported)


__all__ = [
    "PAGED_MODES",
    "PAGED_REFRESH",
    "PAGED_ROWS_PER_SEQUENCE",
    "PagedOperands",
    "cache_in_words",
    "launch_paged_scoring",
    "paged_block_rows",
    "reset_scan_state",
    "paged_launch_options",
    "paged_operands",
    "paged_programs",
    "paged_scoring_faults",
    "paged_subset_operands",
    "paged_unsupported_rows",
]
