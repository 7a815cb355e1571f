"""Fixtures of the GPU tests (`ranks`, the process harness, is tests/conftest.py's).

    gpu     skips the test unless this process can use a GPU, with the reason cx.cuda gives. A module
            whose every test needs one uses `pytestmark = requires_gpu` from gpu_support instead.
"""

from __future__ import annotations

import pytest
from gpu_support import gpu_skip_reason

import pycyxwiz as cx


@pytest.fixture
def gpu():
    if not cx.cuda.is_available():
        pytest.skip(gpu_skip_reason())
    return cx.cuda.device_count()
