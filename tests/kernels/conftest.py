"""Fixtures of the kernels tests: a fresh random seed per test, shown with every failure.

Every run draws new seeds; to replay a failure, set LITETOPK_TEST_SEED to the seed it printed.
"""

from __future__ import annotations

import os
import secrets

import pytest


@pytest.fixture
def seed(request) -> int:
    """A fresh seed for this test (or LITETOPK_TEST_SEED), attached to the test's report."""
    fixed = os.environ.get("LITETOPK_TEST_SEED")
    value = int(fixed) if fixed else secrets.randbits(31)
    request.node.add_report_section("call", "seed", f"seed={value} (replay: LITETOPK_TEST_SEED={value})")
    return value
