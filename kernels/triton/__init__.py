"""Triton backend: the H200 path (any CUDA GPU; CPU tensors under TRITON_INTERPRET=1, how CI tests it).

The stages' Triton twins, in pipeline order (each torch twin is in kernels/, one file a stage):
    row_checks.py        validation's per-row checks in one launch
    decode.py            MXFP4 -> exact int8 operands, keys and queries in one launch, and their flags
    schedule.py          the scoring kernels' programs, built on the device
    calibration.py       the calibration stage's order statistics (calibration="sample")
    scoring.py           fused tensor-core scoring + LiteTopK filter (the CI-tested kernel)
    scoring_gluon.py     its sm_90 twin in Gluon (the same bits; compiled offline in CI)
    scan_calibration.py  the scan's own calibration (calibration="scan"), both kernels' steps
    certify.py           the scan's outputs and the certificate's bits
    repair.py            the repair's subset operands and its scatter
    radix_select.py      the exact candidate top-K
    dense_ties.py        the dense baseline's ties across the K-th place
    assembly.py          keys -> the published result
    keys.py              the ordering keys (selection.py) every kernel above shares
backend.py puts them behind ScoringBackend (TritonBackend); compile_sm90.py and compile_glue_sm90.py
build the kernels for sm_90 without a GPU (the ISA checks of tests/kernels)."""

from .backend import TritonBackend

__all__ = ["TritonBackend"]
