"""DistributedTrainer checkpoints with real processes on 127.0.0.1: files, atomic writes, bit-identical
resume (load_checkpoint, resume_from_checkpoint="latest" or a path), restart under the launcher after
a rank dies, a 2-rank checkpoint loaded in a single process, and clear errors for bad files.

The oracle of a resume is the run that never stopped: same world size, same data, same seeds, and the
parameters must be bit-identical (sha256 of their raw bytes) and the histories equal.

Every rank script writes its results as JSON to out/<tag>.<rank>.json in the test's tmp_path.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from harness import clean_env, free_port, kill_group, kill_recorded
from trainer_scripts import RANK_PRELUDE, UNSET, outputs, run

POSIX = os.name == "posix"


PRELUDE = RANK_PRELUDE + r'''
(HERE / "pids").mkdir(exist_ok=True)
(HERE / "pids" / str(os.getpid())).write_text(str(RANK))
HISTORY = ("train_losses", "train_accuracies", "val_losses", "val_accuracies", "effective_batch_size",
           "world_size", "start_epoch")
'''

CKPT = re.compile(r"checkpoint_epoch_(\d{4})\.ckpt")


def listing(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir()) if path.exists() else []


def leftovers(tmp_path: Path) -> list[str]:
    """Temporary files anywhere under tmp_path (an atomic write leaves none)."""
    return sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")
                  if "tmp" in p.name.lower() or p.name.startswith(".") or p.name.endswith(("~", ".part")))


def assert_same(reports: list[dict], *keys: str) -> None:
    for key in keys:
        for r, rep in enumerate(reports[1:], start=1):
            assert rep[key] == reports[0][key], f"{key} differs between rank 0 and rank {r}"


def assert_same_run(got: dict, want: dict, what: str) -> None:
    """got/want: one rank's report with 'digest', 'params' and 'history'."""
    for key in ("train_losses", "train_accuracies", "val_losses", "val_accuracies"):
        assert got["history"][key] == want["history"][key], \
            f"{what}: history.{key}\n  got  {got['history'][key]}\n  want {want['history'][key]}"
    if got["digest"] != want["digest"]:
        diffs = [float(np.max(np.abs(np.asarray(a, np.float32) - np.asarray(b, np.float32))))
                 for a, b in zip(got["params"], want["params"])]
        pytest.fail(f"{what}: parameters are not bit-identical (max |difference| per tensor: {diffs})")


# ------------------------------------------------------------------------------- checkpoint files

FILES = PRELUDE + r'''
D.init()
X, y = blobs(200, seed=1)
model = build(seed=0)
trainer = D.DistributedTrainer(model, cx.CrossEntropyLoss(), cx.AdamOptimizer(0.01))
ck = HERE / "ck"
master_only = os.environ["MASTER_ONLY"] == "1"
trainer.fit(X, y, config(epochs=5, batch_size=16, checkpoint_every_n_epochs=2, checkpoint_dir=str(ck),
                         save_on_master_only=master_only))
after_fit = sorted(p.name for p in ck.iterdir()) if ck.exists() else None   # before any other collective
res = {"after_fit": after_fit}
if master_only:
    explicit = HERE / "explicit.ckpt"
    trainer.save_checkpoint(str(explicit))
    res["after_save"] = explicit.stat().st_size if explicit.exists() else None
    D.barrier()
    res["final_size"] = explicit.stat().st_size
dump("files", **res)
'''


@pytest.mark.parametrize("master_only", [True, False], ids=["master-only", "every-rank"])
def test_checkpoint_files_every_n_epochs_atomic_then_barrier(ranks, master_only):
    run(ranks, FILES, 2, env={"MASTER_ONLY": int(master_only)})
    reports = outputs(ranks.tmp_path, "files", 2)
    if master_only:
        want = ["checkpoint_epoch_0002.ckpt", "checkpoint_epoch_0004.ckpt"]
    else:
        want = sorted(f"checkpoint_epoch_{e:04d}.rank{r}.ckpt" for e in (2, 4) for r in (0, 1))
    assert listing(ranks.tmp_path / "ck") == want
    for r, rep in enumerate(reports):
        # the barrier after the save: no rank leaves fit before the files are complete
        assert rep["after_fit"] == want, f"rank {r} saw {rep['after_fit']} when fit returned"
        if master_only:
            assert rep["after_save"] == rep["final_size"] > 0, \
                f"rank {r}: save_checkpoint returned before the file was complete ({rep['after_save']} bytes)"
    assert leftovers(ranks.tmp_path) == [], "temporary files left behind"


# ---------------------------------------------------------------------- resume: bit-identical runs

# A causal Transformer language model (dropout in its attention and feed-forward, whose masks come from
# the layers' seeds) on next-token windows: build() and blobs() in place of the MLP on blobs.
LANGUAGE_MODEL = r'''
V, T = 11, 8


def build(seed=0, dropout=None):
    cx.manual_seed(seed)
    m = cx.SequentialModel()
    m.add(cx.EmbeddingModule(V, 16))
    m.add(cx.PositionalEncodingModule(T, 16))
    m.add(cx.TransformerEncoderModule(16, 2, 32, dropout=dropout or 0.0, causal=True))
    m.add(cx.LinearModule(16, V))
    return m


def blobs(n, seed):
    """Windows of a noisy cycle of V symbols: ids (n, T) as float32, as the trainer passes them, and
    the next ids (n, T)."""
    rng = np.random.RandomState(seed)
    text = (np.arange(n + T + 1) + (rng.rand(n + T + 1) < 0.2)) % V
    ids = np.stack([text[i:i + T + 1] for i in range(n)])
    return ids[:, :-1].astype(np.float32), ids[:, 1:].astype(np.int64)
'''

RESUME_RUNS = r'''
D.init()
MODE, HOW = os.environ["MODE"], os.environ["HOW"]
X, y = blobs(244, seed=5)      # validation_split 0.25: 183 training rows (padded on 2 ranks), 61 validation
common = dict(batch_size=16, shuffle=True, seed=3, validation_split=0.25, checkpoint_every_n_epochs=1)

if MODE == "full":             # the oracle: 4 epochs without a stop
    model = build(seed=0, dropout=0.3)
    trainer = D.DistributedTrainer(model, cx.CrossEntropyLoss(), cx.AdamOptimizer(0.01))
    h = trainer.fit(X, y, config(epochs=4, checkpoint_dir=str(HERE / "ck_full"), **common))
elif MODE == "first":          # 2 epochs, checkpoints 0001 and 0002, and an explicit one
    model = build(seed=0, dropout=0.3)
    trainer = D.DistributedTrainer(model, cx.CrossEntropyLoss(), cx.AdamOptimizer(0.01))
    h = trainer.fit(X, y, config(epochs=2, checkpoint_dir=str(HERE / "ck"), **common))
    trainer.save_checkpoint(str(HERE / "explicit.ckpt"))
else:                          # new processes, another initial model, a fresh optimizer, the RNG elsewhere
    model = build(seed=99, dropout=0.3)
    cx.manual_seed(12345)
    trainer = D.DistributedTrainer(model, cx.CrossEntropyLoss(), cx.AdamOptimizer(0.01))
    cfg = config(epochs=4, checkpoint_dir=str(HERE / "ck"), **common)
    if HOW == "load_checkpoint":
        trainer.load_checkpoint(str(HERE / "explicit.ckpt"))
    elif HOW == "resume_latest":
        cfg.resume_from_checkpoint = "latest"
    else:
        cfg.resume_from_checkpoint = str(HERE / "ck" / "checkpoint_epoch_0002.ckpt")
    h = trainer.fit(X, y, cfg)
dump(MODE, history=hist(h), params=params(model), digest=digest(model))
'''
RESUME = PRELUDE + RESUME_RUNS
RESUME_LM = PRELUDE + LANGUAGE_MODEL + RESUME_RUNS


@pytest.mark.parametrize("how", ["load_checkpoint", "resume_latest", "resume_path"])
def test_resumed_run_is_bit_identical_to_an_uninterrupted_one(ranks, how):
    for mode in ("full", "first", "resume"):
        run(ranks, RESUME, 2, env={"MODE": mode, "HOW": how})
    full, first, resumed = (outputs(ranks.tmp_path, mode, 2) for mode in ("full", "first", "resume"))
    for reports in (full, first, resumed):
        assert_same(reports, "digest", "history")
    assert first[0]["history"]["train_losses"] == full[0]["history"]["train_losses"][:2], \
        "the first 2 epochs differ from the uninterrupted run's (is training deterministic?)"
    assert full[0]["history"]["start_epoch"] == 0
    assert resumed[0]["history"]["start_epoch"] == 2
    assert len(resumed[0]["history"]["train_losses"]) == len(resumed[0]["history"]["val_losses"]) == 4, \
        f"the resumed history should hold all 4 epochs: {resumed[0]['history']}"
    assert_same_run(resumed[0], full[0], f"2 epochs + {how} + 2 epochs vs 4 epochs")
    # the resumed run goes on writing checkpoints where the first one stopped
    assert [m.group(1) for m in map(CKPT.fullmatch, listing(ranks.tmp_path / "ck")) if m] == \
        ["0001", "0002", "0003", "0004"], listing(ranks.tmp_path / "ck")
    assert leftovers(ranks.tmp_path) == []


def test_a_language_model_with_dropout_resumes_bit_identically(ranks):
    """Issue 35's "checkpoints and resume": a Transformer block's dropout masks, the positions over
    (N, T) targets and Adam's state all continue where the checkpoint left them."""
    for mode in ("full", "first", "resume"):
        run(ranks, RESUME_LM, 2, env={"MODE": mode, "HOW": "resume_latest"}, timeout=90)
    full, first, resumed = (outputs(ranks.tmp_path, mode, 2) for mode in ("full", "first", "resume"))
    for reports in (full, first, resumed):
        assert_same(reports, "digest", "history")
    losses = full[0]["history"]["train_losses"]
    assert losses[-1] < 0.8 * losses[0], f"the language model did not learn: {losses}"
    assert first[0]["history"]["train_losses"] == losses[:2]
    assert_same_run(resumed[0], full[0], "a language model: 2 epochs + resume latest + 2 epochs vs 4 epochs")


@pytest.mark.parametrize("first,resumed", [("1", "1"), ("1", "0"), ("0", "1")],
                         ids=["sharded-sharded", "sharded-plain", "plain-sharded"])
def test_sharded_optimizer_state_resumes_bit_identically(ranks, first, resumed):
    """CYXWIZ_DDP_SHARD_OPTIMIZER=1: the checkpoint holds the whole optimizer state put together from
    the ranks' shards, and a job loads it whether or not it shards its step. The oracle is the plain
    (unsharded) run that never stopped: at 2 ranks on one host a sharded step gives the same bits."""
    shard = "CYXWIZ_DDP_SHARD_OPTIMIZER"
    run(ranks, RESUME, 2, env={"MODE": "full", "HOW": "load_checkpoint", shard: "0"})
    run(ranks, RESUME, 2, env={"MODE": "first", "HOW": "load_checkpoint", shard: first})
    run(ranks, RESUME, 2, env={"MODE": "resume", "HOW": "load_checkpoint", shard: resumed})
    full, again = outputs(ranks.tmp_path, "full", 2), outputs(ranks.tmp_path, "resume", 2)
    assert_same(again, "digest", "history")
    assert again[0]["history"]["start_epoch"] == 2
    assert_same_run(again[0], full[0], f"2 epochs (shard={first}) + load_checkpoint + 2 epochs (shard={resumed}) "
                                       "vs 4 plain epochs")


FRESH = PRELUDE + r'''
D.init()
X, y = blobs(200, seed=1)

def train(**kw):
    model = build(seed=0)
    trainer = D.DistributedTrainer(model, cx.CrossEntropyLoss(), cx.AdamOptimizer(0.01))
    h = trainer.fit(X, y, config(epochs=2, batch_size=16, seed=3, **kw))
    return dict(history=hist(h), params=params(model), digest=digest(model))

dump("latest", **train(resume_from_checkpoint="latest", checkpoint_dir=str(HERE / "nothing_here")))
dump("plain", **train())
'''


def test_resume_latest_without_a_checkpoint_starts_fresh(ranks):
    run(ranks, FRESH, 2)
    latest, plain = outputs(ranks.tmp_path, "latest", 2), outputs(ranks.tmp_path, "plain", 2)
    assert latest[0]["history"]["start_epoch"] == 0
    assert len(latest[0]["history"]["train_losses"]) == 2
    assert_same_run(latest[0], plain[0], 'resume_from_checkpoint="latest" with no checkpoint vs no resume')


# ----------------------------------------------------------- restart under the launcher after a crash

TRAIN_FT = PRELUDE + r'''
tag, crash = sys.argv[1], sys.argv[2]
attempt = os.environ["CYXWIZ_RESTART_COUNT"]
with open(HERE / f"{tag}.attempts", "a") as f:
    f.write(f"{RANK} {attempt}\n")
D.init()
X, y = blobs(244, seed=5)
ck = HERE / f"ck_{tag}"
model = build(seed=0, dropout=0.3)
trainer = D.DistributedTrainer(model, cx.CrossEntropyLoss(), cx.AdamOptimizer(0.01))
cfg = config(epochs=5, batch_size=16, shuffle=True, seed=3, validation_split=0.25, checkpoint_every_n_epochs=1,
             checkpoint_dir=str(ck), resume_from_checkpoint="latest")
if attempt == "0" and crash == "after-epoch-2":
    cfg.epochs = 2                    # epochs 1-2 (checkpointed); rank 1 dies as epoch 3 begins
    trainer.fit(X, y, cfg)
    if RANK == 1:
        os._exit(1)
    D.barrier()                       # rank 0 is in a collective when its peer dies
    time.sleep(60)
    sys.exit(5)
if attempt == "0" and crash == "mid-training" and RANK == 1:
    def die():                        # dies once checkpoint 2 exists: in epoch 3 or a later one
        while not (ck / "checkpoint_epoch_0002.ckpt").exists():
            time.sleep(0.001)
        time.sleep(0.005)
        os._exit(1)
    threading.Thread(target=die, daemon=True).start()
h = trainer.fit(X, y, cfg)
if attempt == "0" and crash == "mid-training":
    if RANK == 1:
        os._exit(1)                   # too late for the thread: die anyway, so attempt 0 fails
    D.barrier()
    time.sleep(60)
    sys.exit(5)
dump(tag, history=hist(h), params=params(model), digest=digest(model), attempt=attempt)
'''


def launch(ranks, args: list[str], timeout: float = 50) -> subprocess.CompletedProcess:
    """python -m pycyxwiz.launch in its own session, a hard timeout, then every rank it started is killed."""
    proc = ranks.popen([sys.executable, "-m", "pycyxwiz.launch", *args],
                       clean_env(CYXWIZ_NUM_THREADS="1", DISTRIBUTED_TIMEOUT_MS="20000"), text=False)
    try:
        [result] = ranks.wait([proc], timeout)  # kills the launcher and its group at the deadline
    finally:
        kill_group(proc.pid)  # the group may outlive its leader
        left = kill_recorded(ranks.tmp_path / "pids", ranks.tmp_path)  # ranks live in their own sessions
    stderr = result.err.decode("utf-8", "replace")
    assert result.rc is not None and not left, \
        f"the launcher timed out or left ranks running (pids {left}); its stderr:\n{stderr}"
    return subprocess.CompletedProcess(proc.args, result.rc, result.out.decode("utf-8", "replace"), stderr)


def attempts(tmp_path: Path, tag: str) -> list[tuple[int, str]]:
    return sorted((int(r), a) for r, a in (line.split() for line in (tmp_path / f"{tag}.attempts").read_text()
                                           .splitlines()))


@pytest.mark.skipif(not POSIX, reason="POSIX process groups")
@pytest.mark.parametrize("crash", ["after-epoch-2", "mid-training"])
def test_launcher_restart_resumes_from_the_latest_checkpoint(ranks, tmp_path, crash):
    script = tmp_path / "train_ft.py"
    script.write_text(textwrap.dedent(TRAIN_FT))
    common = ["--nproc-per-node", "2", "--max-restarts", "1", "--kill-timeout", "2"]

    clean = launch(ranks, [*common, "--master-port", str(free_port()), str(script), "clean", "none"])
    assert clean.returncode == 0, clean.stderr
    assert attempts(tmp_path, "clean") == [(0, "0"), (1, "0")]
    want = outputs(tmp_path, "clean", 2)

    crashed = launch(ranks, [*common, "--master-port", str(free_port()), str(script), "crashed", crash])
    assert crashed.returncode == 0, crashed.stderr
    assert "restart 1 of 1" in crashed.stderr, crashed.stderr
    assert attempts(tmp_path, "crashed") == [(0, "0"), (0, "1"), (1, "0"), (1, "1")]
    got = outputs(tmp_path, "crashed", 2)
    assert [g["attempt"] for g in got] == ["1", "1"]
    assert_same(got, "digest", "history")
    start = got[0]["history"]["start_epoch"]
    assert start == 2 if crash == "after-epoch-2" else 2 <= start <= 5, f"restarted at epoch {start}"
    assert len(got[0]["history"]["train_losses"]) == 5
    assert_same_run(got[0], want[0], f"crash ({crash}) + restart vs uninterrupted, both under the launcher")
    assert [m.group(1) for m in map(CKPT.fullmatch, listing(tmp_path / "ck_crashed")) if m] == \
        ["0001", "0002", "0003", "0004", "0005"], listing(tmp_path / "ck_crashed")


# ------------------------------------------------------- a 2-rank checkpoint in a single process

TWO_RANKS = PRELUDE + r'''
D.init()
X, y = blobs(300, seed=1)
Xt, _ = blobs(50, seed=2)
model = build(seed=0, dropout=0.3)
trainer = D.DistributedTrainer(model, cx.CrossEntropyLoss(), cx.AdamOptimizer(0.01))
trainer.fit(X, y, config(epochs=2, batch_size=16))
pred = trainer.predict(Xt)
trainer.save_checkpoint(str(HERE / "two.ckpt"))
dump("two", pred=pred.tolist(), params=params(model), digest=digest(model))
'''

ONE_PROCESS = PRELUDE + r'''
D.init()                        # no RANK/WORLD_SIZE: a world of one
Xt, _ = blobs(50, seed=2)
model = build(seed=42, dropout=0.3)
trainer = D.DistributedTrainer(model, cx.CrossEntropyLoss(), cx.AdamOptimizer(0.01))
trainer.load_checkpoint(str(HERE / "two.ckpt"))
pred = trainer.predict(Xt)
model.eval()
dump("one", world=D.get_world_size(), pred=pred.tolist(), forward=model.forward(Xt).tolist(),
     params=params(model), digest=digest(model))
'''


def test_two_rank_checkpoint_loads_in_a_single_process(ranks):
    run(ranks, TWO_RANKS, 2)
    two = outputs(ranks.tmp_path, "two", 2)
    assert_same(two, "digest", "pred")
    run(ranks, ONE_PROCESS, 1, env=UNSET)
    [one] = outputs(ranks.tmp_path, "one", 1)
    assert one["world"] == 1
    assert one["digest"] == two[0]["digest"], "the parameters loaded in one process differ from rank 0's"
    pred = np.asarray(one["pred"], np.float32)
    assert pred.shape == (50, 4)
    np.testing.assert_allclose(pred, np.asarray(two[0]["pred"], np.float32), rtol=1e-5, atol=1e-6,
                               err_msg="predict in one process vs predict on 2 ranks")
    np.testing.assert_allclose(pred, np.asarray(one["forward"], np.float32), rtol=1e-5, atol=1e-6,
                               err_msg="predict vs model.forward in eval mode")


# ---------------------------------------------------------------------------------- bad files

BAD_FILES = PRELUDE + r'''
D.init()
model = build(seed=0)
trainer = D.DistributedTrainer(model, cx.CrossEntropyLoss(), cx.AdamOptimizer(0.01))
good = HERE / "good.ckpt"
trainer.save_checkpoint(str(good))
if RANK == 0:
    data = good.read_bytes()
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0xFF
    bad = {"empty.ckpt": b"", "header_only.ckpt": data[:12], "truncated.ckpt": data[: len(data) // 2],
           "last_byte_missing.ckpt": data[:-1], "corrupt.ckpt": bytes(flipped),
           "text.ckpt": b"this is not a checkpoint\n" * 20, "zip.ckpt": b"PK\x03\x04" + bytes(range(256)) * 4}
    for name, content in bad.items():
        (HERE / name).write_bytes(content)
D.barrier()
before = digest(model)
res = {}
for name in ["empty.ckpt", "header_only.ckpt", "truncated.ckpt", "last_byte_missing.ckpt", "corrupt.ckpt",
             "text.ckpt", "zip.ckpt", "missing.ckpt"]:
    t0 = time.monotonic()
    try:
        trainer.load_checkpoint(str(HERE / name))
        res[name] = {"cls": None}
    except Exception as e:
        res[name] = {"cls": type(e).__name__, "format": isinstance(e, cx.ModelFormatError),
                     "value": isinstance(e, ValueError), "missing": isinstance(e, FileNotFoundError),
                     "msg": str(e), "elapsed": time.monotonic() - t0}
untouched = digest(model) == before
x = np.full(4, RANK + 1.0, np.float32)
D.all_reduce(x)                       # the job still works after the errors
trainer.load_checkpoint(str(good))
dump("bad", res=res, untouched=untouched, sum=x.tolist(), reloaded=digest(model) == before)
'''


def test_bad_checkpoint_files_raise_model_format_error_on_every_rank(ranks):
    run(ranks, BAD_FILES, 2)
    problems = []
    for r, rep in enumerate(outputs(ranks.tmp_path, "bad", 2)):
        for name, e in rep["res"].items():
            if e["cls"] is None:
                problems.append(f"rank {r} {name}: load_checkpoint raised nothing")
                continue
            if name == "missing.ckpt":
                if not e["missing"]:
                    problems.append(f"rank {r} {name}: expected FileNotFoundError, got {e['cls']}: {e['msg']}")
            elif not (e["format"] and e["value"]):
                problems.append(f"rank {r} {name}: expected cx.ModelFormatError, got {e['cls']}: {e['msg']}")
            if name not in e["msg"]:
                problems.append(f"rank {r} {name}: the message does not name the file: {e['msg']!r}")
            if e["elapsed"] > 10:
                problems.append(f"rank {r} {name}: took {e['elapsed']:.1f} s")
        if not rep["untouched"]:
            problems.append(f"rank {r}: a failed load_checkpoint changed the model's parameters")
        if rep["sum"] != [3.0] * 4 or not rep["reloaded"]:
            problems.append(f"rank {r}: after the errors all_reduce gave {rep['sum']}, reload ok={rep['reloaded']}")
    assert not problems, "\n".join(problems)


ARCH = PRELUDE + r'''
D.init()
loss = cx.CrossEntropyLoss()
src = build(seed=0, hidden=24)
D.DistributedTrainer(src, loss, cx.AdamOptimizer(0.01)).save_checkpoint(str(HERE / "h24.ckpt"))
res = {}
others = {"hidden 40": lambda: build(seed=0, hidden=40),
          "Tanh for ReLU": lambda: build(seed=0, hidden=24, act=cx.TanhModule),
          "extra layer": lambda: build(seed=0, hidden=24, dropout=0.5)}
for what, make in others.items():
    model = make()
    trainer = D.DistributedTrainer(model, loss, cx.AdamOptimizer(0.01))
    t0 = time.monotonic()
    try:
        trainer.load_checkpoint(str(HERE / "h24.ckpt"))
        res[what] = {"cls": None}
    except Exception as e:
        res[what] = {"cls": type(e).__name__, "value": isinstance(e, ValueError), "msg": str(e),
                     "elapsed": time.monotonic() - t0}
x = np.ones(3, np.float32)
D.all_reduce(x)
dump("arch", res=res, sum=x.tolist())
'''


def test_checkpoint_of_another_architecture_raises_value_error(ranks):
    run(ranks, ARCH, 2)
    problems = []
    for r, rep in enumerate(outputs(ranks.tmp_path, "arch", 2)):
        for what, e in rep["res"].items():
            if e["cls"] is None:
                problems.append(f"rank {r} {what}: load_checkpoint raised nothing")
            elif not e["value"]:
                problems.append(f"rank {r} {what}: expected a ValueError, got {e['cls']}: {e['msg']}")
            elif e["elapsed"] > 10:
                problems.append(f"rank {r} {what}: took {e['elapsed']:.1f} s")
        e = rep["res"]["hidden 40"]
        if e["cls"] is not None and not ("24" in e["msg"] and "40" in e["msg"]):
            problems.append(f"rank {r}: the message does not name the difference (24 vs 40): {e['msg']!r}")
        if rep["sum"] != [2.0] * 3:
            problems.append(f"rank {r}: all_reduce after the errors gave {rep['sum']}")
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------------------- hostile checkpoint files

HOSTILE = PRELUDE + r'''
import resource, struct, zlib
D.init()                        # a world of one
CASE = os.environ["CASE"]
d = 1024
cx.manual_seed(0)
model = cx.SequentialModel()
model.add(cx.LinearModule(d, d, bias=False))
trainer = D.DistributedTrainer(model, cx.CrossEntropyLoss(), cx.SGDOptimizer(0.1))
good = HERE / "good.ckpt"
trainer.save_checkpoint(str(good))
raw = good.read_bytes()
payload = raw[24:-4]

def s(text):
    return struct.pack("<I", len(text)) + text.encode()

layer = (s("LinearModule") + struct.pack("<I", 3) + s("bias") + struct.pack("<d", 0.0) + s("in_features")
         + struct.pack("<d", d) + s("out_features") + struct.pack("<d", d))
assert payload.startswith(struct.pack("<I", 1) + layer + struct.pack("<I", 1) + s("0.weight"))
if CASE == "stacked":           # the model's one layer stacked 4096 times, still one d x d tensor stored
    payload = struct.pack("<I", 4096) + layer * 4096 + payload[4 + len(layer):]
else:                           # no history yet: four empty lists; the first now claims 10**7 values
    mixed = s("") + b"\x00"    # then (version 2) mixed_precision None and no loss scaler
    assert payload.endswith(struct.pack("<4I", 0, 0, 0, 0) + mixed)
    payload = payload[:-16 - len(mixed)] + struct.pack("<I", 10**7)
bad = HERE / "bad.ckpt"
bad.write_bytes(raw[:16] + struct.pack("<Q", len(payload)) + payload + struct.pack("<I", zlib.crc32(payload) & 0xFFFFFFFF))

def status(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith(key + ":"))

limit = status("VmSize") + (512 << 20)
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")                # the peak (VmHWM) restarts from the current size
before = status("VmRSS")
try:
    trainer.load_checkpoint(str(bad))
    res = {"cls": None}
except BaseException as e:
    res = {"cls": type(e).__name__, "format": isinstance(e, cx.ModelFormatError), "msg": str(e)}
res["growth"] = status("VmHWM") - before
res["size"] = bad.stat().st_size
dump("hostile", **res)
'''


@pytest.mark.parametrize("case", ["stacked", "history"])
def test_hostile_checkpoint_is_refused_without_allocating_what_it_claims(ranks, case):
    # stacked: 4 MiB on disk describing 4096 x LinearModule(1024, 1024), 16 GiB of weights;
    # history: a list of 10**7 doubles (80 MB) announced with 4 bytes left in the file.
    run(ranks, HOSTILE, 1, env={**UNSET, "CASE": case}, timeout=90)
    [rep] = outputs(ranks.tmp_path, "hostile", 1)
    assert rep["cls"] is not None and rep["format"], f"expected cx.ModelFormatError, got {rep}"
    assert rep["growth"] < 3 * rep["size"] + (16 << 20), \
        f"peak memory rose by {rep['growth'] >> 20} MiB for a {rep['size'] >> 20} MiB file"
    assert "bad.ckpt" in rep["msg"]
    assert ("parameter tensors" if case == "stacked" else "history length 10000000") in rep["msg"], rep["msg"]


# ------------------------------------------------------------- "latest" skips damaged checkpoints

LATEST_DAMAGED = PRELUDE + r'''
import shutil, subprocess
D.init()
X, y = blobs(200, seed=1)
ck, all_bad = HERE / "ck", HERE / "all_bad"
common = dict(batch_size=16, shuffle=True, seed=3, checkpoint_every_n_epochs=1)

def trainer_for(seed):
    model = build(seed=seed)
    return model, D.DistributedTrainer(model, cx.CrossEntropyLoss(), cx.AdamOptimizer(0.01))

def flip(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))

model, trainer = trainer_for(0)
first = trainer.fit(X, y, config(epochs=4, checkpoint_dir=str(ck), **common))
if RANK == 0:
    shutil.copytree(ck, all_bad)
    flip(ck / "checkpoint_epoch_0004.ckpt")                       # a bad sector
    three = ck / "checkpoint_epoch_0003.ckpt"
    three.write_bytes(three.read_bytes()[:1000])                   # cut short
    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)
    (ck / f"checkpoint_epoch_0004.ckpt.tmp.{dead}.0").write_bytes(b"CYXCKPT1")   # a writer that died
    for p in all_bad.iterdir():
        flip(p)
D.barrier()
model, trainer = trainer_for(7)
resumed = trainer.fit(X, y, config(epochs=5, checkpoint_dir=str(ck), resume_from_checkpoint="latest", **common))
res = {"first": hist(first), "resumed": hist(resumed)}
model, trainer = trainer_for(7)
t0 = time.monotonic()
try:
    trainer.fit(X, y, config(epochs=5, checkpoint_dir=str(all_bad), resume_from_checkpoint="latest", **common))
    res["all_bad"] = {"cls": None}
except Exception as e:
    res["all_bad"] = {"cls": type(e).__name__, "format": isinstance(e, cx.ModelFormatError), "msg": str(e),
                      "elapsed": time.monotonic() - t0}
x = np.full(2, RANK + 1.0, np.float32)
D.all_reduce(x)                 # the job still works after the error
res["sum"] = x.tolist()
dump("latest_damaged", **res)
'''


def test_resume_latest_falls_back_to_the_newest_checkpoint_that_decodes(ranks):
    results = run(ranks, LATEST_DAMAGED, 2, env={"CYXWIZ_LOG_LEVEL": "warning"}, timeout=90)
    reports = outputs(ranks.tmp_path, "latest_damaged", 2)
    assert_same(reports, "resumed")
    first, resumed = reports[0]["first"], reports[0]["resumed"]
    assert resumed["start_epoch"] == 2, f"resumed after epoch {resumed['start_epoch']}, expected 2"
    # epochs 1-2 come from checkpoint 2 and epoch 3 retrains from it: the same as the first run's
    for key in ("train_losses", "train_accuracies"):
        assert resumed[key][:3] == first[key][:3], f"{key}: {resumed[key]} vs {first[key]}"
    assert len(resumed["train_losses"]) == 5
    warning = results[0].err
    for bad in ("checkpoint_epoch_0004.ckpt", "checkpoint_epoch_0003.ckpt"):
        assert bad in warning, f"rank 0's warnings do not name {bad}:\n{warning}"
    assert "checkpoint_epoch_0002.ckpt" in warning, warning
    # the run rewrote epochs 3-5 over the damaged files; the dead writer's temporary file is gone
    assert [m.group(1) for m in map(CKPT.fullmatch, listing(ranks.tmp_path / "ck")) if m] == \
        ["0001", "0002", "0003", "0004", "0005"], listing(ranks.tmp_path / "ck")
    assert leftovers(ranks.tmp_path) == []
    for r, rep in enumerate(reports):
        e = rep["all_bad"]
        assert e["cls"] is not None and e["format"], f"rank {r}: expected cx.ModelFormatError, got {e}"
        for epoch in range(1, 5):
            assert f"checkpoint_epoch_{epoch:04d}.ckpt" in e["msg"], f"rank {r}: {e['msg']}"
        assert e["elapsed"] < 10
        assert rep["sum"] == [3.0, 3.0]
