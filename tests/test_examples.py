"""The examples, run for real: one process, two ranks through launch_distributed.sh, two ranks started
by hand, torchrun. Each run has a hard timeout and a free port of its own, and whatever it started is
killed when the test ends, passed or failed. Assertions are on what a user sees: the saved model loads
and predicts, only rank 0 printed the epoch lines, the accuracy the example printed."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from harness import Ranks, free_port, rank_env

import pycyxwiz as cx

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
TIMEOUT = 60
POSIX = os.name == "posix"
posix_only = pytest.mark.skipif(not POSIX, reason="POSIX shell and process groups")

# The line the trainer prints on rank 0 at the end of each epoch when stdout is not a terminal
# ("Epoch 2/5 - loss 0.1234 - acc 0.9688 - ..."); the low-level example prints the same.
EPOCH_LINE = re.compile(r"^Epoch \d+/\d+ - loss ")


def python(script: str, *args) -> list[str]:
    return [sys.executable, EXAMPLES / script, *args]


def launch(n: int, script: str, *args) -> list[str]:
    """./launch_distributed.sh N python examples/<script> args..., with this interpreter."""
    return ["sh", ROOT / "launch_distributed.sh", str(n), *python(script, *args)]


def run_by_hand(ranks: Ranks, world: int, cmd: list[str], timeout: float = TIMEOUT, **extra) -> list[tuple[str, str]]:
    """RANK=r WORLD_SIZE=world cmd, one process per rank, as in the guide's manual launch."""
    port = free_port()
    procs = [ranks.popen(cmd, rank_env(RANK=r, LOCAL_RANK=r, WORLD_SIZE=world, MASTER_ADDR="127.0.0.1",
                                       MASTER_PORT=port, **extra), rank=r) for r in range(world)]
    results = [ranks.finish(p, timeout) for p in procs]
    assert all(r.rc == 0 for r in results), ranks.report(results)
    return [(r.out, r.err) for r in results]


def rank_lines(out: str, rank: int) -> list[str]:
    """The lines the launcher forwarded from `rank` (it prefixes each with "[rank R] ")."""
    prefix = f"[rank {rank}] "
    return [line[len(prefix):] for line in out.splitlines() if line.startswith(prefix)]


def epoch_lines(text: str | list[str]) -> list[str]:
    lines = text.splitlines() if isinstance(text, str) else text
    return [line for line in lines if EPOCH_LINE.search(line)]


def check_model(path: Path, features=784, classes: int = 10) -> None:
    """The saved file loads in a single process and predicts; `features`: a row's size or a sample's shape."""
    assert path.is_file(), f"{path} was not written"
    model = cx.SequentialModel.load(str(path))
    model.eval()
    sample = tuple(features) if isinstance(features, tuple) else (features,)
    out = model.forward(np.random.default_rng(0).normal(size=(5, *sample)).astype(np.float32))
    assert out.shape == (5, classes) and np.isfinite(out).all()


# ---- examples/quick_start.py ---------------------------------------------------------------------

QUICK = {"QUICKSTART_EPOCHS": "2"}


def test_quick_start_single_process(ranks, tmp_path):
    out, err = ranks.command(python("quick_start.py"), rank_env(**QUICK))
    assert len(epoch_lines(out)) == 2, out + err
    assert "world size 1" in out
    check_model(tmp_path / "model.cyxmodel")              # the guide's file name, in the current directory


@posix_only
def test_quick_start_launcher_two_ranks(ranks, tmp_path):
    out, err = ranks.command(launch(2, "quick_start.py", "--out", tmp_path / "qs.cyxmodel"),
                             rank_env(MASTER_PORT=free_port(), **QUICK))
    assert len(epoch_lines(rank_lines(out, 0))) == 2, out + err
    assert epoch_lines(rank_lines(out, 1)) == [], "rank 1 printed epoch lines:\n" + out
    assert "world size 2, effective batch 128" in out
    check_model(tmp_path / "qs.cyxmodel")
    assert not (tmp_path / "model.cyxmodel").exists()


def test_quick_start_by_hand(ranks, tmp_path):
    (out0, err0), (out1, err1) = run_by_hand(ranks, 2, python("quick_start.py"),
                                             QUICKSTART_OUT=tmp_path / "hand.cyxmodel", **QUICK)
    assert len(epoch_lines(out0)) == 2, out0 + err0
    assert out1.strip() == "", "rank 1 printed on stdout:\n" + out1
    check_model(tmp_path / "hand.cyxmodel")


@posix_only
@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun (PyTorch) is not installed")
def test_quick_start_torchrun(ranks, tmp_path):
    torchrun = Path(shutil.which("torchrun"))
    out, err = ranks.command([torchrun, "--nproc_per_node=2", f"--master_port={free_port()}",
                              EXAMPLES / "quick_start.py", "--out", tmp_path / "tr.cyxmodel"], rank_env(**QUICK))
    assert len(epoch_lines(out)) == 2, out + err          # torchrun does not prefix: rank 1 printed none
    assert "world size 2" in out
    check_model(tmp_path / "tr.cyxmodel")


# ---- examples/distributed_training_example.py ----------------------------------------------------

def parse_test_accuracy(out: str) -> float:
    found = re.findall(r"test accuracy\s+([0-9.]+)", out)
    assert found, "no test accuracy printed:\n" + out
    return float(found[-1])


@posix_only
def test_comprehensive_example_trainer(ranks, tmp_path):
    ckpt = tmp_path / "ckpt"
    args = ["--epochs", "2", "--samples", "2000", "--checkpoint-dir", ckpt, "--out", tmp_path / "m.cyxmodel"]
    out, err = ranks.command(launch(2, "distributed_training_example.py", *args), rank_env(MASTER_PORT=free_port()))
    rank0, rank1 = rank_lines(out, 0), rank_lines(out, 1)
    assert rank1 == [], "rank 1 printed:\n" + out
    assert len(epoch_lines(rank0)) >= 2, out + err
    assert "learning rate 0.001 -> 0.002 (linear scaling)" in out   # 64 x 2 ranks / base batch 64
    assert parse_test_accuracy(out) > 0.8, out
    assert sorted(p.name for p in ckpt.iterdir()) == ["checkpoint_epoch_0001.ckpt", "checkpoint_epoch_0002.ckpt"]
    check_model(tmp_path / "m.cyxmodel")

    # --resume: a longer run continues after the newest checkpoint instead of starting over.
    out, err = ranks.command(launch(2, "distributed_training_example.py", *args[2:], "--epochs", "3", "--resume"),
                             rank_env(MASTER_PORT=free_port()))
    assert "trained epochs 3..3" in out, out + err
    assert "checkpoint_epoch_0003.ckpt" in {p.name for p in ckpt.iterdir()}


@pytest.mark.parametrize("shard", [False, True], ids=["plain", "shard-optimizer"])
def test_comprehensive_example_low_level(ranks, tmp_path, shard):
    args = ["--low-level", "--epochs", "2", "--samples", "2000", "--accumulation-steps", "2",
            "--scale-lr", "sqrt", "--checkpoint-dir", tmp_path / "ckpt", "--out", tmp_path / "low.cyxmodel",
            *(["--shard-optimizer"] if shard else [])]
    (out0, err0), (out1, err1) = run_by_hand(ranks, 2, python("distributed_training_example.py", *args))
    assert ("optimizer step sharded across 2 ranks" in out0) == shard, out0
    assert out1.strip() == "", "rank 1 printed on stdout:\n" + out1
    assert len(epoch_lines(out0)) == 2, out0 + err0
    assert parse_test_accuracy(out0) > 0.8, out0
    # sqrt scaling of the effective batch 64 x 2 accumulation steps x 2 ranks over the base 64
    assert "learning rate 0.001 -> 0.002 (sqrt scaling)" in out0
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["lowlevel_epoch_0001.cyxmodel",
                                                                     "lowlevel_epoch_0002.cyxmodel"]
    check_model(tmp_path / "low.cyxmodel")


# ---- examples/digits_distributed.py --------------------------------------------------------------

def test_digits_two_ranks(ranks, tmp_path):
    pytest.importorskip("sklearn", reason="examples/digits_distributed.py needs scikit-learn")
    (out0, err0), (out1, _) = run_by_hand(ranks, 2, python("digits_distributed.py", "--out", tmp_path / "d.cyxmodel"))
    assert out1.strip() == "", "rank 1 printed on stdout:\n" + out1
    assert parse_test_accuracy(out0) > 0.9, out0 + err0
    check_model(tmp_path / "d.cyxmodel", features=64)


# ---- examples/cnn_digits.py ----------------------------------------------------------------------

def test_cnn_digits_two_ranks_reach_98_percent(ranks, tmp_path):
    pytest.importorskip("sklearn", reason="examples/cnn_digits.py needs scikit-learn")
    (out0, err0), (out1, _) = run_by_hand(ranks, 2, python("cnn_digits.py", "--epochs", "8",
                                                           "--out", tmp_path / "cnn.cyxmodel"))
    assert out1.strip() == "", "rank 1 printed on stdout:\n" + out1
    assert "(N, 64, 4, 4)" in out0  # the summary's shapes
    assert parse_test_accuracy(out0) >= 0.98, out0 + err0
    check_model(tmp_path / "cnn.cyxmodel", features=(1, 8, 8))


# ---- examples/char_lm.py --------------------------------------------------------------------------

def test_char_lm_two_ranks_beat_the_unigram_entropy(ranks):
    """Issue 35's target: a 2-block character model trained through fit on 2 ranks reaches a held-out
    loss at most 0.6x the text's unigram entropy (the source of argparse), and writes a sample."""
    (out0, err0), (out1, _) = run_by_hand(ranks, 2, python("char_lm.py", "--epochs", "6", "--sample", "80"))
    assert out1.strip() == "", "rank 1 printed on stdout:\n" + out1
    m = re.search(r"held-out loss ([0-9.]+) nats/char .* unigram entropy ([0-9.]+); ratio ([0-9.]+)", out0)
    assert m, out0 + err0
    loss, entropy = float(m.group(1)), float(m.group(2))
    assert 2.0 < entropy < 4.0 and loss <= 0.6 * entropy, out0
    sample = out0.split("sample:\n", 1)[1]
    assert len(sample.rstrip("\n")) >= 80, out0


def test_digits_without_sklearn_says_so(ranks, tmp_path):
    """Without scikit-learn the example exits with a message naming the package, not a traceback."""
    (tmp_path / "sklearn.py").write_text("raise ImportError('scikit-learn is not installed (simulated)')\n")
    r = ranks.finish(ranks.popen(python("digits_distributed.py"), rank_env(PYTHONPATH=tmp_path)))
    assert r.rc != 0 and "pip install scikit-learn" in r.err and "Traceback" not in r.err, r.err


# ---- examples/slurm/train.sbatch -----------------------------------------------------------------

SBATCH = EXAMPLES / "slurm" / "train.sbatch"

# Stand-ins for Slurm's commands: `srun` starts SLURM_NTASKS copies of its command with the variables
# srun gives each task; `scontrol show hostnames` names this machine; `python` is this interpreter.
FAKE_SRUN = """#!/bin/sh
while [ "${1#-}" != "$1" ]; do shift; done
i=0; pids=""
while [ "$i" -lt "$SLURM_NTASKS" ]; do
    SLURM_PROCID=$i SLURM_LOCALID=$i SLURM_STEP_ID=0 "$@" &
    pids="$pids $!"
    i=$((i + 1))
done
rc=0
for p in $pids; do wait "$p" || rc=$?; done
exit $rc
"""
FAKE_SCONTROL = """#!/bin/sh
[ "$1 $2" = "show hostnames" ] && echo localhost
"""


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
def test_slurm_script_syntax():
    subprocess.run(["bash", "-n", SBATCH], check=True, timeout=30)
    text = SBATCH.read_text()
    assert "scontrol show hostnames" in text and "srun" in text and "MASTER_PORT" in text


@posix_only
def test_slurm_script_runs_under_a_simulated_srun(ranks, tmp_path):
    """The sbatch script itself, with srun/scontrol stand-ins: the ranks find each other from the
    SLURM_* variables alone (no RANK/WORLD_SIZE), train, and rank 0 saves the model."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL),
                       ("python", f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    port = free_port()
    while not 20000 < port < 40000:               # the script derives MASTER_PORT = 20000 + job id % 20000
        port = free_port()
    env = rank_env(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", SLURM_JOB_ID=port - 20000,
                   SLURM_NTASKS=2, SLURM_JOB_NUM_NODES=1, SLURM_JOB_NODELIST="localhost", SLURM_CPUS_PER_TASK=1)
    # The script runs examples/... from the repository root.
    out, err = ranks.command(["bash", SBATCH, "--epochs", "2", "--samples", "1000", "--checkpoint-dir",
                              tmp_path / "ckpt", "--out", tmp_path / "slurm.cyxmodel"], env, cwd=ROOT)
    assert f"rendezvous on localhost:{port}" in out, out + err
    assert len(epoch_lines(out)) == 2, "expected rank 0's two epoch lines only:\n" + out + err
    assert "saved " in out and "(rank 0 of 2)" in out, out + err
    check_model(tmp_path / "slurm.cyxmodel")
