"""Fixtures of every folder of tests/ (the helpers themselves are in tests/harness.py).

    ranks   a harness.Ranks for the test: every process it started is killed when the test ends,
            passed or failed.

At the end of the session, a process started through the harness that is still running, or a
/dev/shm/cyxwiz* segment that appeared during the session and is still there, fails the run (it is
reported as an error in the teardown of the last test, and killed).
"""

from __future__ import annotations

import pytest
from harness import Ranks, leftovers, shm_segments


@pytest.fixture
def ranks(tmp_path):
    r = Ranks(tmp_path)
    try:
        yield r
    finally:
        r.cleanup()


@pytest.fixture(scope="session", autouse=True)
def nothing_left_behind():
    before = shm_segments()
    yield
    left = leftovers(before)
    assert not left, "the tests left behind:\n  " + "\n  ".join(left)
