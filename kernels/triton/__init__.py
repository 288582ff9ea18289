"""Triton backend: the H200 path (any CUDA GPU; CPU tensors under TRITON_INTERPRET=1, how CI tests it).

Layer: backends. Only what the Triton scoring backend needs of its own; the stages' Triton twins,
shared by every backend on NVIDIA, live in the stage files (row_checks.py, calibration.py, ...), the
ordering keys' Triton helpers in keys.py. In the order a call uses them:
    backend.py           TritonBackend: ScoringBackend over the modules below
    operands.py          MXFP4 -> exact int8 operands, keys and queries in one launch, and their flags
    schedule.py          the scoring kernels' programs, built on the device
    scoring.py           fused tensor-core scoring + LiteTopK filter (the CI-tested kernel)
    scoring_gluon.py     its sm_90 twin in Gluon (the same bits; compiled offline in CI)
    scan_calibration.py  the scan's own calibration (calibration="scan"), both kernels' steps
    scan_outputs.py      the scan's state -> CandidateScan (finish_scan: Triton and torch twins)
    subset.py            the repair's subset operands and schedule (Triton and torch twins)
compile/sm90.py and compile/sm90_glue.py build these kernels for sm_90 without a GPU (the ISA checks
of tests/kernels)."""

from .backend import TritonBackend

__all__ = ["TritonBackend"]
