"""pytest plugin (``-p torch_suite_report``): one JSON line per test outcome, appended as each test
ends, so a file killed at its time limit still reports what ran. ``--shard=i/n`` keeps every n-th
collected test, to split one long file between parallel pytest processes."""

import json
import os
import re

import pytest

# The line a child rank's traceback ends with, e.g. "RuntimeError: ...": PyTorch's harness reports a
# failing rank as "Process 0 exited with error code 10 and exception:" followed by that traceback.
_EXC_LINE = re.compile(r"^\s*(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Failed)\b.*")


def pytest_addoption(parser):
    parser.addoption("--shard", default="0/1", help="i/n: run the tests whose index % n == i")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    i, n = (int(x) for x in config.getoption("--shard").split("/"))
    if n > 1:
        keep = [t for k, t in enumerate(items) if k % n == i]
        config.hook.pytest_deselected(items=[t for t in items if t not in keep])
        items[:] = keep


def _reason(report) -> str:
    """The first line that explains an outcome: a skip's reason, or the exception a rank died of."""
    if report.skipped and isinstance(report.longrepr, tuple):
        return str(report.longrepr[2]).removeprefix("Skipped: ")
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None and crash.message else (report.longreprtext or "")
    lines = [re.sub(r"^E\s+", "", ln).strip() for ln in text.splitlines()]
    first = next((ln for ln in lines if ln), "")
    if "exited with error code" not in first:
        return first
    # The rank's own exception: the last exception line of its traceback.
    found = [ln for ln in lines[1:] if _EXC_LINE.match(ln) and "exited with error code" not in ln]
    return found[-1] if found else first


def pytest_runtest_logreport(report):
    path = os.environ.get("TORCH_SUITE_RESULTS")
    if not path:
        return
    if report.when == "call" or report.outcome != "passed":
        outcome = report.outcome
        if report.when != "call" and report.outcome == "failed":
            outcome = "error"
        if hasattr(report, "wasxfail"):
            outcome = "xfailed" if report.skipped else "xpassed"
        with open(path, "a") as f:
            f.write(json.dumps({"test": report.nodeid, "outcome": outcome, "when": report.when,
                                "seconds": round(report.duration, 2),
                                "reason": _reason(report)[:300] if outcome != "passed" else ""}) + "\n")
