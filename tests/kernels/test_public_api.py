"""The public surface of `litetopk.kernels` (docs/contract.md §7): small, curated and as documented."""

from __future__ import annotations

import dataclasses
import doctest
import inspect

import pytest

import litetopk.kernels as kernels
from litetopk.kernels import adapters, aiter

#: Names docs/contract.md §7 promises to outside code.
CONTRACT_NAMES = {
    "SUPPORTED_TOPK",
    "PAGE_SIZE",
    "quantize_mxfp4",
    "dequantize_mxfp4",
    "pack_kv_cache",
    "unpack_kv_cache",
    "litetopk_prefill",
    "dense_topk_prefill",
    "TopKResult",
}
#: Further names the package exports on purpose: the error tree (errors.py), the status bits, the
#: backend names and the name `backend="auto"` resolves to (docs/contract.md), the page size in
#: bytes, the LiteTopK tuning knobs, the quick start's problem builder and the caller-owned workspace's
#: sizing and allocation and the graph runner (docs/operator-embedding.md). A new public name is a
#: decision: add it here and to the docs.
DOCUMENTED_EXTRAS = {
    "BACKEND_NAMES",
    "resolve_backend",
    "PAGE_BYTES",
    "RowStatus",
    "LiteTopKTuning",
    "random_problem",
    "LiteTopKError",
    "InputError",
    "InputDtypeError",
    "InputShapeError",
    "UnsupportedTopKError",
    "RowFaultError",
    "BackendUnavailableError",
    "DeviceError",
    "allocate_workspace",
    "workspace_bytes",
    "LiteTopKGraphs",
}


def test_all_is_exactly_the_contract_plus_the_documented_extras():
    exported = set(kernels.__all__)
    assert len(kernels.__all__) == len(exported), "__all__ lists a name twice"
    assert CONTRACT_NAMES <= exported, f"missing contract names: {sorted(CONTRACT_NAMES - exported)}"
    assert exported == CONTRACT_NAMES | DOCUMENTED_EXTRAS, (
        f"undocumented: {sorted(exported - CONTRACT_NAMES - DOCUMENTED_EXTRAS)}, "
        f"gone: {sorted((CONTRACT_NAMES | DOCUMENTED_EXTRAS) - exported)}"
    )


@pytest.mark.parametrize("name", sorted(CONTRACT_NAMES | DOCUMENTED_EXTRAS))
def test_every_exported_name_exists(name):
    assert hasattr(kernels, name), f"litetopk.kernels.{name} is in __all__ but does not exist"


def test_star_import_gives_exactly_all():
    namespace: dict = {}
    exec("from litetopk.kernels import *", namespace)
    assert set(namespace) - {"__builtins__"} == set(kernels.__all__)


def test_constants():
    assert kernels.SUPPORTED_TOPK == (512, 1024)
    assert kernels.PAGE_SIZE == 64
    assert kernels.PAGE_BYTES == 64 * 68 == 4352
    assert kernels.BACKEND_NAMES == ("auto", "reference", "triton", "flydsl")


def test_operator_signatures_match_the_contract():
    positional = ["q_fp4", "q_scale", "kv_cache", "block_table", "weights", "row_to_batch", "starts", "ends"]
    for fn in (kernels.litetopk_prefill, kernels.dense_topk_prefill):
        params = inspect.signature(fn).parameters
        assert list(params)[:8] == positional, fn.__name__
        assert all(params[p].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in positional)
        assert params["topk"].kind is inspect.Parameter.KEYWORD_ONLY
        assert params["topk"].default is inspect.Parameter.empty
        assert params["weight_scale"].default == 1.0 and params["backend"].default == "auto"
    assert inspect.signature(kernels.litetopk_prefill).parameters["repair"].default is True
    packing = inspect.signature(kernels.pack_kv_cache).parameters
    assert list(packing) == ["k_fp4", "k_scale", "block_table", "num_pages"]


def test_topk_result_fields():
    fields = [f.name for f in dataclasses.fields(kernels.TopKResult)]
    assert fields[:6] == ["values", "raw_indices", "physical_indices", "counts", "status", "repaired"]


def test_status_bits_match_the_contract():
    bits = {bit.name: int(bit) for bit in kernels.RowStatus if bit}
    assert bits == {
        "OVERFLOW": 1,
        "UNDERFILLED": 2,
        "NONFINITE": 4,
        "INVALID_PAGE": 8,
        "INVALID_ROW": 16,
        "SELECTOR_FAILURE": 32,
        "SLOT_OVERFLOW": 64,
        "UNSUPPORTED": 128,
    }


def test_input_fault_bits_are_the_faults_of_the_input():
    from litetopk.kernels.status import CAPACITY_EVENTS, INPUT_FAULTS

    s = kernels.RowStatus
    assert CAPACITY_EVENTS == s.OVERFLOW | s.UNDERFILLED
    assert INPUT_FAULTS == s.NONFINITE | s.INVALID_PAGE | s.INVALID_ROW | s.SLOT_OVERFLOW | s.UNSUPPORTED


def test_error_tree():
    assert issubclass(kernels.InputError, (kernels.LiteTopKError, ValueError))
    assert issubclass(kernels.InputDtypeError, kernels.InputError)
    assert issubclass(kernels.InputShapeError, kernels.InputError)
    assert issubclass(kernels.UnsupportedTopKError, kernels.InputError)
    assert issubclass(kernels.RowFaultError, kernels.LiteTopKError)
    assert issubclass(kernels.BackendUnavailableError, (kernels.LiteTopKError, RuntimeError))
    assert issubclass(kernels.DeviceError, (kernels.LiteTopKError, RuntimeError))


#: The public functions and classes whose docstrings read as FlashInfer's ops' do (docs/contract.md §7;
#: the package's STYLE §6): Parameters, Returns (a class: its __call__'s) and an Example that runs as written.
DOCUMENTED_CALLS = {
    "litetopk_prefill": kernels.litetopk_prefill,
    "dense_topk_prefill": kernels.dense_topk_prefill,
    "LiteTopKGraphs": kernels.LiteTopKGraphs,
    "workspace_bytes": kernels.workspace_bytes,
    "allocate_workspace": kernels.allocate_workspace,
    "random_problem": kernels.random_problem,
    "resolve_backend": kernels.resolve_backend,
    "topk_sglang_c4_indexer": adapters.topk_sglang_c4_indexer,
    "topk_sglang_fp4_indexer": adapters.topk_sglang_fp4_indexer,
    "topk_vllm_indexer_decode": adapters.topk_vllm_indexer_decode,
    "topk_vllm_indexer_prefill_chunk": adapters.topk_vllm_indexer_prefill_chunk,
    "topk_vllm_indexer": adapters.topk_vllm_indexer,
    "flydsl_pa_mqa_litetopk_fp4_prefill": aiter.flydsl_pa_mqa_litetopk_fp4_prefill,
}


@pytest.mark.parametrize("name", sorted(DOCUMENTED_CALLS))
def test_public_calls_document_parameters_returns_and_a_running_example(name):
    obj = DOCUMENTED_CALLS[name]
    doc = inspect.getdoc(obj)
    returns = inspect.getdoc(obj.__call__) if inspect.isclass(obj) else doc
    for section, text in (("Parameters", doc), ("Returns", returns), ("Example", doc)):
        assert f"\n{section}\n---" in text, f"{name}: the docstring has no {section} section"
    module = inspect.getmodule(obj)
    tests = doctest.DocTestFinder(recurse=False).find(obj, name, module=module, globs=vars(module))
    assert tests and tests[0].examples, f"{name}: its Example has no >>> lines"
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    report: list[str] = []
    runner.run(tests[0], out=report.append)
    assert runner.failures == 0, f"{name}: its Example does not run as written:\n" + "".join(report)
