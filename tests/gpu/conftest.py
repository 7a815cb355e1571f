"""Fixtures of the GPU tests.

    ranks   tests/distributed's harness: rank processes on 127.0.0.1, a free port, a hard timeout,
            every process killed at the end of the test (passed or failed).
    runner  tests/test_examples.py's process runner (same guarantees) for the examples.
    gpu     skips the test unless this process can use a GPU, with the reason cx.cuda gives. A module
            whose every test needs one uses `pytestmark = requires_gpu` from gpu_support instead.
"""

from __future__ import annotations

import pytest
from gpu_support import Ranks, Runner, gpu_skip_reason

import pycyxwiz as cx


@pytest.fixture
def ranks(tmp_path):
    r = Ranks(tmp_path)
    try:
        yield r
    finally:
        r.cleanup()


@pytest.fixture
def runner(tmp_path):
    r = Runner(tmp_path)
    try:
        yield r
    finally:
        r.cleanup()


@pytest.fixture
def gpu():
    if not cx.cuda.is_available():
        pytest.skip(gpu_skip_reason())
    return cx.cuda.device_count()
