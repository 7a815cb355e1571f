"""Run PyTorch's own distributed tests against a backend ("cyxwiz", and "gloo" as the baseline) and
write a markdown summary. Not part of CI: it needs PyTorch's test sources, which CI does not have.

    python tools/torch_suite/run.py --source /path/to/pytorch [--backends cyxwiz,gloo] [--full]

--source (or $PYTORCH_SRC): a PyTorch checkout, or a bare git directory (read with `git show`; pick
the tree with --rev, e.g. v2.13.0). Only test files are read from it: PyTorch's test helpers
(torch.testing._internal, distributed_test.py included) come with the installed torch wheel.

Each file runs in its own temporary directory under pytest with a time limit per file, `nice -n 10`,
at most --jobs pytest processes at once. shim/sitecustomize.py makes the files' CPU backend the one
under test in every process (see its docstring); shim/test_distributed_backend.py runs
distributed_test.py for any backend name. Outcomes stream to a JSON-lines file per run, so a file
killed at its limit still counts what ran; classes.py says why each known failure fails.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from classes import classify  # noqa: E402

# distributed_test.py's tests that a quick run keeps: the CPU ones that run for cyxwiz under its own
# gates (66 in the full run of docs/pytorch_suite.md), less the repeats (full-group and profiler
# variants), to keep both backends under ~20 minutes.
QUICK = [
    "test_Backend_enum_class", "test_get_backend", "test_get_rank_size_group", "test_destroy_group",
    "test_all_reduce_sum", "test_all_reduce_max", "test_all_reduce_min", "test_all_reduce_product",
    "test_all_reduce_sum_async", "test_all_reduce_sum_complex", "test_all_reduce_complex_unsupported_ops",
    "test_all_reduce_full_group_sum", "test_broadcast", "test_broadcast_full_group", "test_all_gather",
    "test_all_gather_complex", "test_all_gather_coalesced_simple", "test_all_gather_coalesced_with_empty",
    "test_all_gather_coalesced_complex", "test_reduce_sum", "test_reduce_max", "test_reduce_sum_twice",
    "test_gather", "test_gather_checks", "test_scatter", "test_scatter_checks", "test_barrier",
    "test_send_recv", "test_send_recv_with_tag", "test_send_recv_any_source", "test_isend", "test_irecv",
    "test_DistributedDataParallelCPU", "test_DistributedDataParallelCPU_grad_is_view",
    "test_DistributedDataParallel_requires_grad", "test_ddp_create_graph", "test_ddp_logging_data_cpu",
    "test_static_graph_api_cpu",
]
# The CPU tests gloo runs that distributed_test.py skips for any backend not named gloo (or nccl/ucc):
# run on cyxwiz with gloo's gates (TORCH_SUITE_GATES_OF, see shim/test_distributed_backend.py).
GLOO_GATED = [
    "test_accumulate_gradients_no_sync", "test_accumulate_gradients_no_sync_allreduce_hook",
    "test_accumulate_gradients_no_sync_allreduce_with_then_hook", "test_accumulate_gradients_no_sync_grad_is_view",
    "test_all_gather_object_default_pg", "test_all_gather_object_subgroup", "test_all_reduce_coalesced_full_group_max",
    "test_all_reduce_coalesced_full_group_min", "test_all_reduce_coalesced_full_group_product",
    "test_all_reduce_coalesced_full_group_sum", "test_all_reduce_coalesced_max", "test_all_reduce_coalesced_min",
    "test_all_reduce_coalesced_product", "test_all_reduce_coalesced_sum", "test_barrier_timeout_full_group",
    "test_batch_isend_irecv_gloo", "test_batch_isend_irecv_gloo_tags", "test_get_future",
    "test_grads_same_across_ranks_with_no_sync", "test_monitored_barrier_gloo",
    "test_monitored_barrier_gloo_rank_0_timeout", "test_monitored_barrier_gloo_subgroup", "test_scatter_object_list",
    "test_sparse_all_reduce_sum",
]


@dataclass
class Entry:
    name: str                       # as the table shows it
    test: str                       # the file pytest runs, in the run's directory
    sources: list = field(default_factory=list)  # paths read from --source, copied beside it
    shim: bool = False              # the test file is ours (shim/), not PyTorch's
    env: dict = field(default_factory=dict)
    quick: list | None = None       # test names a quick run keeps (None: all)
    only: list | None = None        # test names this entry always runs, quick or full
    backends: tuple | None = None   # the backends it runs for (None: every one asked for)
    shards: int = 1                 # pytest processes that split this file
    cls: str = ""                   # the test class of those names ({B}: BACKEND upper-cased)


DIST = "distributed_test.py (DistributedTest._DistTestBase, 2 ranks)"
SELECTION = [
    Entry(DIST, "test_distributed_backend.py", shim=True, env={"WORLD_SIZE": "2"}, quick=QUICK, shards=2,
          cls="TestDistBackendWithSpawn{B}"),
    Entry(DIST.replace("2 ranks", "2 ranks, gloo's skip gates") + ": the tests gated to gloo by name",
          "test_distributed_backend.py", shim=True, env={"WORLD_SIZE": "2", "TORCH_SUITE_GATES_OF": "gloo"},
          only=GLOO_GATED, backends=("cyxwiz",), shards=2, cls="TestDistBackendWithSpawn{B}"),
    Entry("test/distributed/test_c10d_object_collectives.py (4 ranks)", "test_c10d_object_collectives.py",
          sources=["test/distributed/test_c10d_object_collectives.py"]),
]


class Source:
    """Test files from a PyTorch checkout or a bare git directory."""

    def __init__(self, where: str | None, rev: str):
        if not where:
            sys.exit("torch_suite: no PyTorch sources: pass --source PATH (a checkout or a bare git dir of "
                     "PyTorch's repository, ideally at the tag of the installed torch) or set PYTORCH_SRC")
        self.root = Path(where)
        if not self.root.exists():
            sys.exit(f"torch_suite: --source {where} does not exist; clone PyTorch there or point it at a checkout")
        self.bare = (self.root / "HEAD").is_file() and (self.root / "objects").is_dir()
        self.rev = rev
        if not self.bare and not (self.root / "test" / "distributed").is_dir():
            sys.exit(f"torch_suite: {where} has no test/distributed/: is it a PyTorch checkout?")

    def describe(self) -> str:
        if self.bare:
            sha = subprocess.run(["git", f"--git-dir={self.root}", "rev-parse", self.rev], capture_output=True,
                                 text=True).stdout.strip()
            return f"bare git {self.root} at {self.rev} ({sha})"
        origin = self.root / "ORIGIN.txt"  # written by whoever assembled a partial tree by hand
        return f"{self.root}" + (f" ({origin.read_text().strip()})" if origin.exists() else "")

    def copy(self, rel: str, dest: Path) -> None:
        if self.bare:
            r = subprocess.run(["git", f"--git-dir={self.root}", "show", f"{self.rev}:{rel}"], capture_output=True)
            if r.returncode != 0:
                sys.exit(f"torch_suite: {rel} is not in {self.root} at {self.rev}: {r.stderr.decode().strip()}")
            dest.write_bytes(r.stdout)
        else:
            src = self.root / rel
            if not src.is_file():
                sys.exit(f"torch_suite: {src} is missing from the PyTorch sources")
            shutil.copy(src, dest)


def run_one(entry: Entry, backend: str, src: Source | None, shard: int, args) -> dict:
    """One pytest process over one file (or one shard of it); returns its outcomes."""
    work = Path(tempfile.mkdtemp(prefix=f"torch_suite_{backend}_"))
    try:
        (work / "barrier").touch()   # distributed_test.py's TEMP_DIR wants it
        if entry.shim:
            shutil.copy(HERE / "shim" / entry.test, work / entry.test)
        for rel in entry.sources:
            src.copy(rel, work / Path(rel).name)
        results = work / "results.jsonl"
        env = dict(os.environ, BACKEND=backend, TORCH_SUITE_BACKEND=backend, TEMP_DIR=str(work),
                   TORCH_SUITE_RESULTS=str(results), TORCH_SUITE_TRACE=str(work / "groups.txt"),
                   PYTHONPATH=os.pathsep.join([str(HERE / "shim"), str(work)]),
                   DISTRIBUTED_TESTS_DEFAULT_TIMEOUT=str(args.test_timeout), **entry.env)
        names = entry.only or (entry.quick if (entry.quick and not args.full and not args.k) else None)
        # A quick list names whole tests: node ids, since -k would also match every longer name.
        cls = entry.cls.format(B=backend.upper())
        targets = [f"{entry.test}::{cls}::{n}" for n in names] if names else [entry.test]
        cmd = ["nice", "-n", "10", sys.executable, "-m", "pytest", *targets, "-q", "-p", "torch_suite_report",
               "-p", "no:cacheprovider", f"--shard={shard}/{entry.shards}"] + (["-k", args.k] if args.k else [])
        start = time.time()
        log = open(work / "pytest.log", "w")
        proc = subprocess.Popen(cmd, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        timed_out = False
        try:
            proc.wait(timeout=args.file_timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)   # pytest and the rank processes it spawned
            proc.wait()
        log.close()
        rows = [json.loads(line) for line in results.read_text().splitlines()] if results.exists() else []
        tail = (work / "pytest.log").read_text(errors="replace").splitlines()[-3:]
        groups = len((work / "groups.txt").read_text().splitlines()) if (work / "groups.txt").exists() else 0
        return {"rows": rows, "seconds": time.time() - start, "timed_out": timed_out, "rc": proc.returncode,
                "tail": tail, "groups": groups}
    finally:
        shutil.rmtree(work, ignore_errors=True)


_RANK = {"error": 5, "failed": 4, "xpassed": 3, "skipped": 2, "xfailed": 1, "passed": 0}


def summarize(rows: list) -> dict:
    """One outcome per test (a test that passes and then errors in teardown is an error)."""
    per: dict = {}
    for r in rows:
        name = r["test"].rsplit("::", 1)[-1]
        if name not in per or _RANK[r["outcome"]] > _RANK[per[name]["outcome"]]:
            per[name] = r
    return per


def markdown(results: dict, backends: list, src_desc: str, args, wall: float) -> str:
    out = [f"# PyTorch distributed tests against {', '.join(backends)}", "",
           f"- torch {_torch_version()}; test sources: {src_desc}",
           f"- selection: {'full' if args.full else 'quick'}{' -k ' + args.k if args.k else ''}; "
           f"per-file limit {args.file_timeout} s, per-test limit {args.test_timeout} s; wall {wall / 60:.1f} min", "",
           "Groups: process groups the backend under test created (one per rank per group; shows the tests ran on "
           "it). Skipped tests that start no rank process cost nothing.", "",
           "| file | backend | passed | failed | errors | skipped | groups | minutes |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for entry in SELECTION:
        for b in backends:
            res = results.get((entry.name, b))
            if res is None:
                continue
            per = res["per"]
            count = {k: sum(1 for r in per.values() if r["outcome"] == k) for k in _RANK}
            note = " (hit the per-file limit)" if res["timed_out"] else ""
            groups = res["groups"] if b == "cyxwiz" else "-"
            out.append(f"| {entry.name} | {b} | {count['passed'] + count['xfailed']}"
                       f" | {count['failed'] + count['xpassed']} | {count['error']} | {count['skipped']} | {groups}"
                       f" | {res['seconds'] / 60:.1f}{note} |")
    for b in backends:
        bad = [(e.name, n, r) for e in SELECTION
               for n, r in sorted(results.get((e.name, b), {"per": {}})["per"].items())
               if r["outcome"] in ("failed", "error", "xpassed")]
        out += ["", f"## {b}: {len(bad)} failing", ""]
        if bad:
            out += ["| test | class | first line of the reason |", "| --- | --- | --- |"]
            for _, name, r in bad:
                why = r["reason"].replace("|", "\\|")
                out.append(f"| {name} | {classify(b, name, r['reason'])} | {why} |")
    skips: dict = {}
    for (name, b), res in results.items():
        for t, r in res["per"].items():
            if r["outcome"] == "skipped":
                skips.setdefault((b, r["reason"]), []).append(t)
    out += ["", "## Skip reasons (count per backend)", "", "| backend | tests | reason |", "| --- | --- | --- |"]
    for (b, why), tests in sorted(skips.items(), key=lambda kv: (kv[0][0], -len(kv[1]))):
        out.append(f"| {b} | {len(tests)} | {why.replace('|', '/')} |")
    return "\n".join(out) + "\n"


def _torch_version() -> str:
    r = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__, torch.version.git_version)"],
                       capture_output=True, text=True)
    return r.stdout.strip()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--source", default=os.environ.get("PYTORCH_SRC"), help="PyTorch checkout or bare git dir")
    p.add_argument("--rev", default="HEAD", help="tree to read from a bare git dir (e.g. v2.13.0)")
    p.add_argument("--backends", default="cyxwiz,gloo")
    p.add_argument("--full", action="store_true", help="every test of distributed_test.py, not the quick list")
    p.add_argument("-k", default=None, help="pytest -k expression applied to every file (overrides the quick list)")
    p.add_argument("--only", default=None, help="comma-separated substrings of the file names to run")
    p.add_argument("--jobs", type=int, default=2, help="pytest processes at once (each starts its own ranks)")
    p.add_argument("--file-timeout", type=int, default=1500, help="seconds for one pytest process")
    p.add_argument("--test-timeout", type=int, default=90, help="seconds for one test's rank processes")
    p.add_argument("--out", default="torch_suite_summary.md")
    p.add_argument("--json", default=None, help="also write every outcome here")
    args = p.parse_args()

    entries = [e for e in SELECTION if not args.only or any(s in e.name for s in args.only.split(","))]
    needs_source = any(e.sources for e in entries)
    src = Source(args.source, args.rev) if needs_source else None
    backends = args.backends.split(",")
    if "cyxwiz" in backends:
        r = subprocess.run([sys.executable, "-c", "import pycyxwiz.torch"], capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"torch_suite: `import pycyxwiz.torch` fails here: {r.stderr.strip().splitlines()[-1:]}; "
                     "install the package (pip install .) in this environment first")
    jobs = [(e, b, s) for b in backends for e in entries for s in range(e.shards) if not e.backends or b in e.backends]
    start = time.time()
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        done = list(zip(jobs, pool.map(lambda j: run_one(j[0], j[1], src, j[2], args), jobs)))
    results: dict = {}
    for (e, b, _), res in done:
        agg = results.setdefault((e.name, b), {"rows": [], "seconds": 0.0, "timed_out": False, "groups": 0})
        agg["rows"] += res["rows"]
        agg["groups"] += res["groups"]
        agg["seconds"] = max(agg["seconds"], res["seconds"])   # shards run side by side
        agg["timed_out"] |= res["timed_out"]
        if not res["rows"] and res["rc"] not in (0, 5):  # 5: pytest selected no test (an empty shard)
            print(f"torch_suite: {e.name} [{b}] reported nothing; pytest's last lines: {res['tail']}", file=sys.stderr)
    for res in results.values():
        res["per"] = summarize(res["rows"])
    wall = time.time() - start
    text = markdown(results, backends, src.describe() if src else "(none needed)", args, wall)
    Path(args.out).write_text(text)
    if args.json:
        keep = ("per", "seconds", "groups", "timed_out")
        Path(args.json).write_text(json.dumps({f"{n} [{b}]": {k: r[k] for k in keep} for (n, b), r in results.items()},
                                              indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
