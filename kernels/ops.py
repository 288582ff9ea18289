"""The operator as torch.library custom ops, so that a compiled model calls it without a graph break.

Layer: public face, under operator.py (litetopk_prefill and dense_topk_prefill, the Python API over
these ops: `out=` as a dict, the tuning dataclass, the TopKResult); it imports the backend registry,
the first stage (validation) and the method (pipeline), nothing above them.

    run_prefill(...)         validation, one backend, pipeline.run_litetopk: the implementation
    run_dense_prefill(...)   the same for the dense baseline (pipeline.run_dense)
    litetopk::prefill        prefill(...) -> the seven result fields, new tensors
    litetopk::prefill_out    prefill_out(..., values, raw_indices, ...) writes them into caller tensors
    litetopk::dense_prefill, litetopk::dense_prefill_out: the same two for the dense baseline

Each op is a torch.library.custom_op (as FlashInfer registers its kernels) with a fake
implementation: empty tensors of the result's shapes and dtypes (result.RESULT_FIELDS) on the inputs'
device, from the shapes alone. torch.compile traces the call through the fake and runs the real
implementation (run_prefill) at run time, so a compiled call returns the eager call's bits.

The schema, decided (a custom op takes tensors, optional tensors and scalars, no dict or dataclass):
- inputs: the eight tensors of docs/contract.md §2 in their order, then `kv_scale: Tensor?` (given:
  the cache is AITER's format) and `workspace: Tensor(a!)?` (optional, and mutated: the call carves
  its buffers from it); every other argument is keyword-only, with the Python API's default.
- `out=`: a second op, `prefill_out`, takes the seven result tensors as mutated arguments (any
  strides: an engine's `buf[:rows, :K]`) and returns nothing. Engines call the operator inside
  compiled graphs with preallocated index buffers (vLLM's topk_indices_buffer, sglang's
  c4_sparse_page_indices), so the answer must land in the caller's buffers under torch.compile as it
  does in eager. operator.py allocates the fields the caller's dict leaves out (`out_fields`:
  torch.empty, traced into the graph) and passes all seven. Under compilation the mutations are
  functionalized and then re-inplaced by inductor: its output code calls prefill_out on the
  caller's buffers and workspace themselves (seen on CPU). A backend without that pass (aot_eager)
  runs the op on clones and copies them back: the same bits, one copy more, and a cloned workspace
  on a CPU lies on 64 bytes, not the 256 validation asks for (InputError: compile with inductor,
  or call without a workspace). `prefill` (no out=) mutates nothing but the workspace and returns
  seven new tensors.
- the tuning (pipeline.LiteTopKTuning) is flattened into its seven fields (`tuning_options`), keyword
  arguments whose defaults are the production settings: a handful of scalars that the graph keeps
  as constants (tests/kernels/test_ops.py checks that the schema names every field of the dataclass).
- the result: a tuple in RESULT_FIELDS order (values, raw_indices, physical_indices, counts, status,
  repaired, candidates), wrapped back into a TopKResult by operator.py.

Eager calls do not go through the dispatcher: outside torch.compile (torch.compiler.is_compiling())
operator.py calls run_prefill directly. That saves the custom op's dispatch (~50 us of host time a
call, measured on a CPU for a trivial op: 58 us through torch.library against 8 us direct) and keeps
every InputError the eager API raises before any device work as it is. Errors raised at run time
(InputError, RowFaultError with check=True, DeviceError) leave a compiled call as they leave an eager
one. check=True synchronizes with the host: no more capturable in a compiled model's CUDA graphs
(mode="reduce-overhead") than in eager. LiteTopKGraphs (graphs.py) is the eager API's own CUDA-graph
runner, not for compiled models: they capture these ops in their own graphs.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .errors import InputError
from .pipeline import LiteTopKTuning, run_dense, run_litetopk
from .registry import get_backend, on_device
from .result import RESULT_FIELDS, TopKResult
from .validation import check_topk, validate_prefill

#: The result fields as the ops return them (RESULT_FIELDS order).
Fields = tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]
#: The production tuning: the default of every call and of the ops' flattened tuning arguments.
DEFAULT_TUNING = LiteTopKTuning()


# -- the implementation -----------------------------------------------------------------------------


def run_prefill(
    q_fp4,
    q_scale,
    kv_cache,
    block_table,
    weights,
    row_to_batch,
    starts,
    ends,
    *,
    topk: int,
    weight_scale: float = 1.0,
    backend: str = "auto",
    repair: bool = True,
    tuning: LiteTopKTuning | None = None,
    out: dict | None = None,
    max_seq_len: int | None = None,
    kv_scale: Tensor | None = None,
    check: bool = False,
    workspace: Tensor | None = None,
) -> TopKResult:
    """litetopk_prefill's work (operator.py says what it takes and returns): validation, the backend
    the name stands for on the inputs' device, then pipeline.run_litetopk on that device."""
    problem = validate_prefill(
        q_fp4,
        q_scale,
        kv_cache,
        block_table,
        weights,
        row_to_batch,
        starts,
        ends,
        topk=topk,
        weight_scale=weight_scale,
        max_seq_len=max_seq_len,
        kv_scale=kv_scale,
        out=out,
        workspace=workspace,
    )
    chosen = get_backend(backend, problem.device)
    with on_device(problem.device, chosen):
        return run_litetopk(problem, chosen, repair=repair, tuning=tuning or DEFAULT_TUNING, out=out, check=check)


def run_dense_prefill(
    q_fp4,
    q_scale,
    kv_cache,
    block_table,
    weights,
    row_to_batch,
    starts,
    ends,
    *,
    topk: int,
    weight_scale: float = 1.0,
    backend: str = "auto",
    selector: str = "torch",
    out: dict | None = None,
    max_seq_len: int | None = None,
    kv_scale: Tensor | None = None,
    check: bool = False,
    workspace: Tensor | None = None,
) -> TopKResult:
    """dense_topk_prefill's work: validation, the backend, then pipeline.run_dense on the inputs' device."""
    problem = validate_prefill(
        q_fp4,
        q_scale,
        kv_cache,
        block_table,
        weights,
        row_to_batch,
        starts,
        ends,
        topk=topk,
        weight_scale=weight_scale,
        max_seq_len=max_seq_len,
        kv_scale=kv_scale,
        out=out,
        workspace=workspace,
    )
    chosen = get_backend(backend, problem.device)
    with on_device(problem.device, chosen):
        return run_dense(problem, chosen, selector=selector, out=out, check=check)


def tuning_options(tuning: LiteTopKTuning) -> dict:
    """The ops' keyword arguments for `tuning`: its fields, flattened (module docstring)."""
    return dict(
        calibration=tuning.calibration,
        sample_size=tuning.sample_size,
        capacity_factor=tuning.capacity_factor,
        candidate_capacity=tuning.candidate_capacity,
        calibration_offset=tuning.calibration_offset,
        repair_rows=tuning.repair_rows,
        dense_route_bytes=tuning.dense_route_bytes,
    )


def out_fields(out: dict, like: Tensor, topk: int) -> dict[str, Tensor]:
    """The seven result tensors of an out= call through prefill_out: the caller's (checked at run time
    by validation.check_out) and new ones (torch.empty on `like`'s device) for the fields `out` leaves
    out. InputError for a key that is no result field."""
    unknown = [name for name in out if name not in RESULT_FIELDS]
    if unknown:
        raise InputError(f"out[{unknown[0]!r}] is not a result field; fields: {tuple(RESULT_FIELDS)}")
    rows = like.shape[0]
    return {
        name: out[name] if name in out else torch.empty(shape_of(rows, topk), dtype=dtype, device=like.device)
        for name, (shape_of, dtype) in RESULT_FIELDS.items()
    }


def _fields(result: TopKResult) -> Fields:
    return tuple(getattr(result, name) for name in RESULT_FIELDS)


def _empty_fields(q_fp4: Tensor, topk: int) -> Fields:
    """The fake result: empty tensors of every field's shape and dtype on the inputs' device."""
    check_topk(topk)
    rows = q_fp4.shape[0]
    return tuple(q_fp4.new_empty(shape_of(rows, topk), dtype=dtype) for shape_of, dtype in RESULT_FIELDS.values())


# -- the LiteTopK method ----------------------------------------------------------------------------


@torch.library.custom_op("litetopk::prefill", mutates_args=("workspace",))
def prefill(
    q_fp4: Tensor,
    q_scale: Tensor,
    kv_cache: Tensor,
    block_table: Tensor,
    weights: Tensor,
    row_to_batch: Tensor,
    starts: Tensor,
    ends: Tensor,
    kv_scale: Tensor | None,
    workspace: Tensor | None,
    *,
    topk: int,
    weight_scale: float = 1.0,
    backend: str = "auto",
    repair: bool = True,
    max_seq_len: int | None = None,
    check: bool = False,
    calibration: str = DEFAULT_TUNING.calibration,
    sample_size: int = DEFAULT_TUNING.sample_size,
    capacity_factor: int = DEFAULT_TUNING.capacity_factor,
    candidate_capacity: int | None = None,
    calibration_offset: float = DEFAULT_TUNING.calibration_offset,
    repair_rows: int = DEFAULT_TUNING.repair_rows,
    dense_route_bytes: int = DEFAULT_TUNING.dense_route_bytes,
) -> Fields:
    # litetopk_prefill(..., out=None) as an op: the result fields in RESULT_FIELDS order, new tensors.
    tuning = LiteTopKTuning(
        calibration=calibration,
        sample_size=sample_size,
        capacity_factor=capacity_factor,
        candidate_capacity=candidate_capacity,
        calibration_offset=calibration_offset,
        repair_rows=repair_rows,
        dense_route_bytes=dense_route_bytes,
    )
    return _fields(
        run_prefill(
            q_fp4,
            q_scale,
            kv_cache,
            block_table,
            weights,
            row_to_batch,
            starts,
            ends,
            topk=topk,
            weight_scale=weight_scale,
            backend=backend,
            repair=repair,
            tuning=tuning,
            max_seq_len=max_seq_len,
            kv_scale=kv_scale,
            check=check,
            workspace=workspace,
        )
    )


@prefill.register_fake
def _prefill_fake(q_fp4, *inputs, topk, **options):
    return _empty_fields(q_fp4, topk)


@torch.library.custom_op("litetopk::prefill_out", mutates_args=("workspace", *RESULT_FIELDS))
def prefill_out(
    q_fp4: Tensor,
    q_scale: Tensor,
    kv_cache: Tensor,
    block_table: Tensor,
    weights: Tensor,
    row_to_batch: Tensor,
    starts: Tensor,
    ends: Tensor,
    kv_scale: Tensor | None,
    workspace: Tensor | None,
    values: Tensor,
    raw_indices: Tensor,
    physical_indices: Tensor,
    counts: Tensor,
    status: Tensor,
    repaired: Tensor,
    candidates: Tensor,
    *,
    topk: int,
    weight_scale: float = 1.0,
    backend: str = "auto",
    repair: bool = True,
    max_seq_len: int | None = None,
    check: bool = False,
    calibration: str = DEFAULT_TUNING.calibration,
    sample_size: int = DEFAULT_TUNING.sample_size,
    capacity_factor: int = DEFAULT_TUNING.capacity_factor,
    candidate_capacity: int | None = None,
    calibration_offset: float = DEFAULT_TUNING.calibration_offset,
    repair_rows: int = DEFAULT_TUNING.repair_rows,
    dense_route_bytes: int = DEFAULT_TUNING.dense_route_bytes,
) -> None:
    # litetopk_prefill(..., out={every field}) as an op: the seven caller tensors written in place.
    tuning = LiteTopKTuning(
        calibration=calibration,
        sample_size=sample_size,
        capacity_factor=capacity_factor,
        candidate_capacity=candidate_capacity,
        calibration_offset=calibration_offset,
        repair_rows=repair_rows,
        dense_route_bytes=dense_route_bytes,
    )
    out = dict(zip(RESULT_FIELDS, (values, raw_indices, physical_indices, counts, status, repaired, candidates)))
    run_prefill(
        q_fp4,
        q_scale,
        kv_cache,
        block_table,
        weights,
        row_to_batch,
        starts,
        ends,
        topk=topk,
        weight_scale=weight_scale,
        backend=backend,
        repair=repair,
        tuning=tuning,
        out=out,
        max_seq_len=max_seq_len,
        kv_scale=kv_scale,
        check=check,
        workspace=workspace,
    )


@prefill_out.register_fake
def _prefill_out_fake(q_fp4, *inputs, topk, **options):
    check_topk(topk)  # a fake tensor holds no bytes to write: the shapes are the caller's


# -- the dense baseline -----------------------------------------------------------------------------


@torch.library.custom_op("litetopk::dense_prefill", mutates_args=("workspace",))
def dense_prefill(
    q_fp4: Tensor,
    q_scale: Tensor,
    kv_cache: Tensor,
    block_table: Tensor,
    weights: Tensor,
    row_to_batch: Tensor,
    starts: Tensor,
    ends: Tensor,
    kv_scale: Tensor | None,
    workspace: Tensor | None,
    *,
    topk: int,
    weight_scale: float = 1.0,
    backend: str = "auto",
    selector: str = "torch",
    max_seq_len: int | None = None,
    check: bool = False,
) -> Fields:
    # dense_topk_prefill(..., out=None) as an op.
    return _fields(
        run_dense_prefill(
            q_fp4,
            q_scale,
            kv_cache,
            block_table,
            weights,
            row_to_batch,
            starts,
            ends,
            topk=topk,
            weight_scale=weight_scale,
            backend=backend,
            selector=selector,
            max_seq_len=max_seq_len,
            kv_scale=kv_scale,
            check=check,
            workspace=workspace,
        )
    )


@dense_prefill.register_fake
def _dense_prefill_fake(q_fp4, *inputs, topk, **options):
    return _empty_fields(q_fp4, topk)


@torch.library.custom_op("litetopk::dense_prefill_out", mutates_args=("workspace", *RESULT_FIELDS))
def dense_prefill_out(
    q_fp4: Tensor,
    q_scale: Tensor,
    kv_cache: Tensor,
    block_table: Tensor,
    weights: Tensor,
    row_to_batch: Tensor,
    starts: Tensor,
    ends: Tensor,
    kv_scale: Tensor | None,
    workspace: Tensor | None,
    values: Tensor,
    raw_indices: Tensor,
    physical_indices: Tensor,
    counts: Tensor,
    status: Tensor,
    repaired: Tensor,
    candidates: Tensor,
    *,
    topk: int,
    weight_scale: float = 1.0,
    backend: str = "auto",
    selector: str = "torch",
    max_seq_len: int | None = None,
    check: bool = False,
) -> None:
    # dense_topk_prefill(..., out={every field}) as an op.
    out = dict(zip(RESULT_FIELDS, (values, raw_indices, physical_indices, counts, status, repaired, candidates)))
    run_dense_prefill(
        q_fp4,
        q_scale,
        kv_cache,
        block_table,
        weights,
        row_to_batch,
        starts,
        ends,
        topk=topk,
        weight_scale=weight_scale,
        backend=backend,
        selector=selector,
        out=out,
        max_seq_len=max_seq_len,
        kv_scale=kv_scale,
        check=check,
        workspace=workspace,
    )


@dense_prefill_out.register_fake
def _dense_prefill_out_fake(q_fp4, *inputs, topk, **options):
    check_topk(topk)


#: Every op of the module by its qualified name (torch.ops.litetopk.<name>).
OPS = {
    "litetopk::prefill": prefill,
    "litetopk::prefill_out": prefill_out,
    "litetopk::dense_prefill": dense_prefill,
    "litetopk::dense_prefill_out": dense_prefill_out,
}

__all__ = [
    "DEFAULT_TUNING",
    "OPS",
    "dense_prefill",
    "dense_prefill_out",
    "out_fields",
    "prefill",
    "prefill_out",
    "run_dense_prefill",
    "run_prefill",
    "tuning_options",
]
