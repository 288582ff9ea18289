"""The operator as torch custom ops (kernels/ops.py; docs/contract.md §7): compiled models call it without
a graph break and get the eager bits.

- compiled: torch.compile(fullgraph=True) of a small module calling litetopk_prefill / dense_topk_prefill
  (with and without `out=` into a strided slice of a preallocated index buffer) traces through the ops
  and returns the eager call's bits, the buffer written in place; rows that change between calls
  compile once (dynamic shapes). On the CPU the compile uses torch's "aot_eager" backend: the same
  tracing, fake tensors and functionalization that inductor sees, without inductor's C++ code
  generation (5-15 s a graph on the two cores of CI, where aot_eager takes about one);
- fake: under FakeTensorMode the ops return every field of docs/contract.md §3 with its dtype and
  shape on the inputs' device, from shapes alone; torch.library.opcheck passes on every op;
- the schema: every LiteTopKTuning field is a keyword argument of the LiteTopK ops, with the dataclass's
  default; errors: the ops raise the eager API's errors (eager, and from a compiled call at run time),
  a K outside SUPPORTED_TOPK fails the trace;
- GPU (marked gpu): the same with backend="triton" and inductor, on a prefill-shaped and a
  decode-shaped (paged mode) problem.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from litetopk.kernels import (
    InputDtypeError,
    LiteTopKTuning,
    TopKResult,
    UnsupportedTopKError,
    dense_topk_prefill,
    litetopk_prefill,
    random_problem,
)
from litetopk.kernels.ops import OPS, tuning_options
from tests.problems import results_equal

#: docs/contract.md §3, restated: each result field's dtype and shape for `rows` rows and K.
CONTRACT_FIELDS = {
    "values": (torch.float32, lambda rows, k: (rows, k)),
    "raw_indices": (torch.int32, lambda rows, k: (rows, k)),
    "physical_indices": (torch.int32, lambda rows, k: (rows, k)),
    "counts": (torch.int32, lambda rows, k: (rows,)),
    "status": (torch.int32, lambda rows, k: (rows,)),
    "repaired": (torch.int32, lambda rows, k: (rows,)),
    "candidates": (torch.int32, lambda rows, k: (rows,)),
}
OPERATORS = {"litetopk_prefill": litetopk_prefill, "dense_topk_prefill": dense_topk_prefill}
BUFFER_COLUMNS = 600  # the engine's index buffer is wider than K: the operator writes a strided slice


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles from scratch (no graph or recompile count carried over from another test)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class CallsTheOperator(torch.nn.Module):
    """A model's layer that calls the operator, as an engine's indexer does: into the engine's own
    preallocated index buffer (`out=`), or returning new tensors."""

    def __init__(self, operator: str, topk: int, backend: str, into_buffer: bool, **options):
        super().__init__()
        self.operator, self.topk, self.backend, self.into_buffer = OPERATORS[operator], topk, backend, into_buffer
        self.options = options

    def forward(
        self, q_fp4, q_scale, kv_cache, block_table, weights, row_to_batch, starts, ends, index_buffer
    ) -> TopKResult:
        out = {"raw_indices": index_buffer[:, : self.topk]} if self.into_buffer else None
        return self.operator(
            q_fp4,
            q_scale,
            kv_cache,
            block_table,
            weights,
            row_to_batch,
            starts,
            ends,
            topk=self.topk,
            backend=self.backend,
            out=out,
            **self.options,
        )


def new_buffer(rows: int, device) -> torch.Tensor:
    return torch.full((rows, BUFFER_COLUMNS), -7, dtype=torch.int32, device=device)


class GraphsSeen:
    """A torch.compile backend that compiles every graph dynamo hands it with `backend` and keeps the source
    of those it compiled (so a test can read how many graphs a module took and which ops they call; an
    attempt that `backend` refuses, after which dynamo traces again, is not a graph)."""

    def __init__(self, backend: str):
        self.backend = torch._dynamo.lookup_backend(backend)
        self.codes: list[str] = []

    def __call__(self, graph_module, example_inputs):
        compiled = self.backend(graph_module, example_inputs)
        self.codes.append(graph_module.code)
        return compiled


def check_compiled_against_eager(module, problems, compiler: str, where: str, **compile_options) -> GraphsSeen:
    """Run `module` compiled (fullgraph: a graph break is an error) and eager on each problem: the same
    TopKResult bits, and the same index buffer contents where the module writes one."""
    seen = GraphsSeen(compiler)
    compiled = torch.compile(module, fullgraph=True, backend=seen, **compile_options)
    for p in problems:
        rows = p.q_fp4.shape[0]
        at = f"{where}, {rows} rows"
        eager_buffer, compiled_buffer = new_buffer(rows, p.q_fp4.device), new_buffer(rows, p.q_fp4.device)
        want = module(*p.args(), eager_buffer)
        got = compiled(*p.args(), compiled_buffer)
        assert isinstance(got, TopKResult), f"{at}: the compiled module returns {type(got).__name__}"
        assert results_equal(got, want) == [], f"{at}: fields {results_equal(got, want)} differ from eager"
        assert torch.equal(compiled_buffer, eager_buffer), f"{at}: the index buffer differs from eager"
        if module.into_buffer:
            assert torch.equal(compiled_buffer[:, : module.topk], got.raw_indices), f"{at}: out= not written in place"
            assert bool((compiled_buffer[:, module.topk :] == -7).all()), f"{at}: written beyond [:, :K]"
    return seen


# -- compiled on the CPU (reference backend) ------------------------------------------------------------

COMPILE_CASES = {  # name: (operator, into_buffer, options)
    "litetopk_prefill": ("litetopk_prefill", False, dict(tuning=LiteTopKTuning(sample_size=200))),
    "litetopk_prefill, out= into an index buffer": (
        "litetopk_prefill",
        True,
        dict(tuning=LiteTopKTuning(sample_size=200)),
    ),
    "dense_topk_prefill": ("dense_topk_prefill", False, {}),
    "dense_topk_prefill, out= into an index buffer": ("dense_topk_prefill", True, {}),
}


@pytest.mark.parametrize("name", list(COMPILE_CASES))
def test_a_compiled_module_calls_the_op_and_returns_the_eager_bits(name, seed):
    operator, into_buffer, options = COMPILE_CASES[name]
    p = random_problem(4, [900, 700], 512, seed=seed, causal=False)
    module = CallsTheOperator(operator, 512, "reference", into_buffer, **options)
    seen = check_compiled_against_eager(module, [p], "aot_eager", f"[{name}] seed {seed}")
    op = ("dense_prefill" if operator == "dense_topk_prefill" else "prefill") + ("_out" if into_buffer else "")
    assert len(seen.codes) == 1, f"[{name}]: {len(seen.codes)} graphs (one expected: no graph break)"
    assert f"litetopk.{op}" in seen.codes[0], f"[{name}]: the graph does not call litetopk::{op}:\n{seen.codes[0]}"


def test_rows_that_change_between_calls_compile_once(seed):
    """dynamic=True: one graph serves calls of 6 and 10 rows (the fake result's shapes follow the rows)."""
    module = CallsTheOperator("litetopk_prefill", 512, "reference", True)
    problems = [random_problem(rows, [800, 600], 512, seed=seed + rows, causal=False) for rows in (6, 10)]
    seen = check_compiled_against_eager(module, problems, "aot_eager", f"[dynamic rows] seed {seed}", dynamic=True)
    assert len(seen.codes) == 1, f"seed {seed}: {len(seen.codes)} graphs for two row counts"


# -- fake tensors and opcheck ---------------------------------------------------------------------------


def op_arguments(name: str, p, topk: int) -> tuple[tuple, dict]:
    """(args, kwargs) of the op `name` for problem `p`: its tensors, no kv_scale, no workspace, and for the
    _out ops a new tensor for every result field."""
    rows = p.q_fp4.shape[0]
    args = (*p.args(), None, None)
    if name.endswith("_out"):
        args += tuple(torch.empty(shape_of(rows, topk), dtype=dtype) for dtype, shape_of in CONTRACT_FIELDS.values())
    return args, dict(topk=topk, backend="reference")


@pytest.mark.parametrize("name", ["litetopk::prefill", "litetopk::dense_prefill"])
@pytest.mark.parametrize("rows, topk", [(3, 512), (5, 1024), (0, 512)])
def test_the_fake_result_has_every_field_of_the_contract(name, rows, topk):
    p = random_problem(max(rows, 1), 700, topk, seed=0)
    if rows == 0:
        p = dataclasses.replace(
            p, **{f: getattr(p, f)[:0] for f in ("q_fp4", "q_scale", "weights", "row_to_batch", "starts", "ends")}
        )
    with FakeTensorMode() as mode:
        args, kwargs = op_arguments(name, p, topk)
        fields = OPS[name](*(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args), **kwargs)
    assert len(fields) == len(CONTRACT_FIELDS), f"{name}: {len(fields)} fields"
    for (field, (dtype, shape_of)), got in zip(CONTRACT_FIELDS.items(), fields):
        where = f"{name}, rows {rows}, K {topk}: {field}"
        assert got.dtype == dtype and tuple(got.shape) == shape_of(rows, topk), (
            f"{where}: {got.dtype} {list(got.shape)}, want {dtype} {list(shape_of(rows, topk))}"
        )
        assert got.device == p.q_fp4.device, f"{where}: on {got.device}"


@pytest.mark.parametrize("name", list(OPS))
def test_opcheck_passes(name, seed):
    """torch.library.opcheck: the schema (mutations and aliasing as declared), the fake against the real
    implementation, and the op under AOT dispatch with dynamic shapes."""
    p = random_problem(3, [600, 500, 400], 512, seed=seed, causal=False)
    args, kwargs = op_arguments(name, p, 512)
    torch.library.opcheck(OPS[name], args, kwargs)


# -- the schema and errors ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["litetopk::prefill", "litetopk::prefill_out"])
def test_the_litetopk_ops_take_every_tuning_field_with_its_default(name):
    schema = OPS[name]._opoverload._schema
    keywords = {arg.name: arg.default_value for arg in schema.arguments if arg.kwarg_only}
    for field in dataclasses.fields(LiteTopKTuning):
        assert field.name in keywords, f"{name}: LiteTopKTuning.{field.name} is not an argument of the op"
        assert keywords[field.name] == field.default, f"{name}: {field.name} defaults to {keywords[field.name]}"
    tuning = LiteTopKTuning(
        calibration="scan", sample_size=300, capacity_factor=4, candidate_capacity=900, repair_rows=3
    )
    assert tuning_options(tuning) == dataclasses.asdict(tuning), "tuning_options drops or renames a field"


def test_the_ops_raise_the_eager_errors():
    p = random_problem(2, 700, 512, seed=0)
    args, kwargs = op_arguments("litetopk::prefill", p, 512)
    with pytest.raises(InputDtypeError, match="q_fp4 must be uint8"):
        OPS["litetopk::prefill"](args[0].to(torch.int32), *args[1:], **kwargs)
    with pytest.raises(UnsupportedTopKError, match="topk=2048 is not supported"):
        OPS["litetopk::prefill"](*args, **{**kwargs, "topk": 2048})


def test_an_unsupported_k_fails_the_trace():
    p = random_problem(2, 700, 512, seed=0)
    compiled = torch.compile(
        CallsTheOperator("litetopk_prefill", 2048, "reference", False), fullgraph=True, backend="aot_eager"
    )
    with pytest.raises(Exception, match="topk=2048 is not supported"):
        compiled(*p.args(), new_buffer(2, "cpu"))


def test_a_compiled_call_raises_the_eager_input_errors():
    """The checks that read strides and dtypes run in the op at run time: the same InputError as in eager."""
    p = random_problem(2, 700, 512, seed=0)
    compiled = torch.compile(
        CallsTheOperator("litetopk_prefill", 512, "reference", True), fullgraph=True, backend="aot_eager"
    )
    wrong = torch.zeros((2, BUFFER_COLUMNS), dtype=torch.float32)
    with pytest.raises(InputDtypeError, match=r"out\['raw_indices'\] must be int32"):
        compiled(*p.args(), wrong)


def test_eager_calls_of_the_op_give_the_apis_bits(seed):
    p = random_problem(4, [900, 700], 512, seed=seed, causal=False)
    args, kwargs = op_arguments("litetopk::prefill", p, 512)
    got = TopKResult(*OPS["litetopk::prefill"](*args, **kwargs))
    want = litetopk_prefill(*p.args(), topk=512, backend="reference")
    assert results_equal(got, want) == [], f"seed {seed}: fields {results_equal(got, want)} differ"


# -- compiled on the GPU (Triton backend, inductor) -----------------------------------------------------

GPU_PROBLEMS = {  # name: random_problem's arguments (rows, sequence lengths)
    "prefill-shaped: 32 rows of one sequence": (32, [6000]),
    "decode-shaped (paged mode): 8 rows of 4 sequences": (8, [3000, 5000, 2000, 4000]),
}


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(COMPILE_CASES))
@pytest.mark.parametrize("problem", list(GPU_PROBLEMS))
def test_a_compiled_module_returns_the_eager_bits_on_the_gpu(name, problem, seed):
    operator, into_buffer, _ = COMPILE_CASES[name]
    rows, keys = GPU_PROBLEMS[problem]
    p = random_problem(rows, keys, 512, device="cuda", seed=seed)
    module = CallsTheOperator(operator, 512, "triton", into_buffer)
    seen = check_compiled_against_eager(module, [p], "inductor", f"[{name}, {problem}] seed {seed}")
    assert len(seen.codes) == 1, f"[{name}, {problem}]: {len(seen.codes)} graphs"
