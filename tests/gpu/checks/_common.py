"""What the direct GPU checks of issue 14 share: a NCCL world set up in the environment, a watchdog
that ends a hung process, and the one JSON line each check prints on stdout.

The checks run on a real GPU (tests/gpu/run_on_gpu.sh) and under the host emulator
(tests/gpu/test_runtime_checks.py, CYXWIZ_CUDA_LIBRARY=...). Exit status of every check:
0 pass, 1 the bug showed (or a wrong result), 2 inconclusive (the situation the check needs could not be
produced here: it says why), 3 the watchdog ended a hung process.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/: the checks run as plain scripts too
from harness import free_port  # noqa: E402

PASS, FAIL, INCONCLUSIVE, HUNG = 0, 1, 2, 3
EMULATOR_NAME = "pycyxwiz host emulator"

# Launcher variables that would make cx.distributed.init() join some other job.
_FOREIGN = ("SLURM_", "OMPI_", "PMI_", "PMIX_", "TORCHELASTIC_", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK")


def nccl_env(rank: int, world_size: int, port: int, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of one NCCL rank on 127.0.0.1 (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_*)."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if not k.startswith(_FOREIGN)}
    env.update(DISTRIBUTED_BACKEND="nccl", RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), PYTHONUNBUFFERED="1")
    return env


def emit(result: dict) -> None:
    """The check's one line on stdout (the caller parses the last line that starts with '{')."""
    sys.stdout.write(json.dumps(result, sort_keys=True) + "\n")
    sys.stdout.flush()


def last_json(text: str) -> dict | None:
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None


def is_emulated(cx) -> bool:
    try:
        return cx.cuda.get_device_name(0) == EMULATOR_NAME
    except Exception:  # noqa: BLE001 - no GPU at all: not an emulator either
        return False


class Watchdog:
    """Ends the process with HUNG (os._exit: no cleanup that could hang too) when the current phase
    outlives its deadline; prints the check's JSON line first, saying which phase hung.

    A daemon thread sleeping on a condition variable: it needs the GIL only to fire, and every call it
    guards (init, finalize, the steps) releases the GIL while it waits."""

    def __init__(self, result: dict):
        self._result = result
        self._cond = threading.Condition()
        self._phase, self._deadline, self._start = "", None, 0.0
        threading.Thread(target=self._run, name="watchdog", daemon=True).start()

    def arm(self, phase: str, seconds: float) -> None:
        with self._cond:
            self._phase, self._start = phase, time.monotonic()
            self._deadline = self._start + seconds
            self._cond.notify()

    def disarm(self) -> None:
        with self._cond:
            self._deadline = None
            self._cond.notify()

    def _run(self) -> None:
        with self._cond:
            while True:
                if self._deadline is None:
                    self._cond.wait()
                    continue
                left = self._deadline - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                waited = time.monotonic() - self._start
                self._result.update(verdict="hung", hung_in=self._phase, hung_after_s=round(waited, 1))
                sys.stderr.write(f"watchdog: {self._phase} still running after {waited:.1f} s; exiting with {HUNG}\n")
                sys.stderr.flush()
                emit(self._result)
                os._exit(HUNG)
