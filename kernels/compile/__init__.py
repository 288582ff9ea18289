"""Offline compile tools: build the kernels for a GPU this machine does not have, and read back what
the compilers made of them (registers, stack, shared memory, instruction mixes, the final ISA).

Layer: public face (tools run as `python -m`; nothing in the operator's path imports them). They
import the kernels they build from below: the stages' Triton kernels, triton/ and flydsl/.

    python -m litetopk.kernels.compile.sm90 OUT_DIR        the Gluon scoring kernel's variants for sm_90
    python -m litetopk.kernels.compile.sm90_glue OUT_DIR   every other Triton kernel of the pipeline
    python -m litetopk.kernels.compile.gfx950 DUMP_DIR     every FlyDSL kernel variant for gfx950

CI runs all three (tests/kernels: test_gluon_compile.py, test_wide_gluon_compile.py,
test_glue_compile.py, test_flydsl_compile.py); bench/probes/sass_offline.py reads instruction mixes.
"""
