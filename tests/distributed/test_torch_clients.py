"""Two real clients of `pycyxwiz.torch` train on the "cyxwiz" backend as they do on "gloo": PyTorch
Lightning (its DDPStrategy with process_group_backend="cyxwiz") and Hugging Face Accelerate
(torch.distributed.init_process_group("cyxwiz") before Accelerator(cpu=True)).

Each script runs twice on 2 rank processes started as torchrun would start them (the `ranks`
harness: 127.0.0.1, a free port per run, a hard timeout, every process killed at the end): first with
"gloo", the oracle, then with "cyxwiz". The final parameters must be bit-identical and the metrics each
client computes through the process group (Lightning's logged sync_dist metrics, Accelerate's
gather_for_metrics and reduce) equal: with 2 ranks every float sum has one rounding, the same in either
order, and AVG over 2 is an exact halving, so nothing but a wrong collective can tell the runs apart.

pytorch-lightning and accelerate are optional, as torch is: a test skips with the reason where its
client is not installed or cannot be imported (the ImportError of the rank process).
"""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest
from harness import free_port

torch = pytest.importorskip("torch")


def _installed(module: str, package: str):
    return pytest.mark.skipif(importlib.util.find_spec(module) is None,
                              reason=f"No module named '{module}' (pip install {package})")


# The head of both scripts: the client is imported in the rank (an ImportError is reported as SKIP), one
# compute thread per rank, and a spy on the "cyxwiz" process group that counts every call the client
# makes through it (all_reduce by op and dtype): the test checks that the calls it is about happened.
PRELUDE = r'''
import json, os, sys
try:
    import torch
    import torch.distributed as dist
    import pycyxwiz.torch  # registers "cyxwiz"
    CLIENT_IMPORTS
except ImportError as e:
    print("SKIP " + json.dumps(f"{type(e).__name__}: {e}"), flush=True)
    sys.exit(0)
import numpy as np

torch.set_num_threads(1)
BACKEND, OUT = os.environ["TEST_BACKEND"], os.environ["TEST_OUT"]
RANK, WS = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
CALLS = {}
_OPS = {int(getattr(dist.ReduceOp, n)): n for n in ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR")}


def _spy(name):
    fn = getattr(pycyxwiz.torch.CyxwizProcessGroup, name)

    def called(self, *args, **kwargs):
        key = name
        if name.startswith("allreduce"):
            opts = args[1] if len(args) > 1 else kwargs.get("opts")
            op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
            op = _OPS.get(int(op.op if type(op) is dist.ReduceOp else op), str(op))
            key = f"{name} {op} {str(args[0][0].dtype).replace('torch.', '')}"
        CALLS[key] = CALLS.get(key, 0) + 1
        return fn(self, *args, **kwargs)
    setattr(pycyxwiz.torch.CyxwizProcessGroup, name, called)


for _name in ("allreduce", "allreduce_coalesced", "broadcast", "allgather", "all_gather_single", "allgather_coalesced",
              "reduce_scatter", "reduce_scatter_single", "barrier", "reduce", "gather", "scatter", "alltoall",
              "all_to_all_single", "send", "recv"):
    _spy(_name)


def blobs(n, seed):
    """4 separable gaussian blobs in 20 dimensions (the same centres for every seed)."""
    centers = torch.randn(4, 20, generator=torch.Generator().manual_seed(1234)) * 1.5
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 4, (n,), generator=g)
    return centers[y] + torch.randn(n, 20, generator=g), y


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def finish(rank, params, **report):
    np.save(f"{OUT}.{rank}.npy", torch.cat([p.detach().reshape(-1) for p in params]).numpy())
    print("RESULT " + json.dumps({"rank": rank, "backend": dist.get_backend(), "calls": CALLS, **report}), flush=True)
'''

LIGHTNING = PRELUDE.replace("CLIENT_IMPORTS", "import pytorch_lightning as pl; "
                                              "from pytorch_lightning.strategies import DDPStrategy") + r'''


class Net(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = mlp()

    def training_step(self, batch, i):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss, sync_dist=True)
        return loss

    def validation_step(self, batch, i):
        x, y = batch
        logits = self.net(x)
        # sync_dist: at the epoch's end lightning_fabric's _sync_ddp all-reduces the weighted sum of each
        # metric and its int64 count of samples with ReduceOp.AVG ("mean"); on "gloo" it asks for SUM and
        # divides itself, truncating the count as torch's (NCCL's) integer AVG does.
        self.log("val_loss", torch.nn.functional.cross_entropy(logits, y), sync_dist=True)
        self.log("val_acc", (logits.argmax(1) == y).float().mean(), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.01)


class Record(pl.Callback):
    """The synced metrics after each epoch's validation."""

    def __init__(self):
        self.epochs = []

    def on_train_epoch_end(self, trainer, module):
        self.epochs.append({k: float(v) for k, v in sorted(trainer.callback_metrics.items())})


pl.seed_everything(0, verbose=False)
train_set = torch.utils.data.TensorDataset(*blobs(512, 1))
train = torch.utils.data.DataLoader(train_set, batch_size=32, sampler=torch.utils.data.DistributedSampler(
    train_set, num_replicas=WS, rank=RANK, shuffle=True, seed=0))
# Validation: rank 0 sees 125 samples, rank 1 126 (4 batches each), so the int64 count sums to 251 and
# its AVG is truncated to 125, as Lightning's own SUM-and-divide on "gloo" truncates it (a backend that
# rounded would give 126). Once every sample is right, val_acc reads 125.5 / 125 = 1.004 on both
# backends: Lightning's mean of uneven ranks, not ours.
x, y = blobs(251, 2)
mine = slice(0, 125) if RANK == 0 else slice(125, 251)
val = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[mine], y[mine]), batch_size=32)
record = Record()
trainer = pl.Trainer(accelerator="cpu", devices=WS, num_nodes=1, strategy=DDPStrategy(process_group_backend=BACKEND),
                     max_epochs=3, use_distributed_sampler=False, enable_progress_bar=False, enable_checkpointing=False,
                     enable_model_summary=False, logger=False, default_root_dir=os.getcwd(), callbacks=[record])
model = Net()
trainer.fit(model, train, val)   # its sanity check runs 2 validation batches and syncs first
[validated] = trainer.validate(model, val, verbose=False)
assert trainer.global_rank == RANK and trainer.world_size == WS, (trainer.global_rank, trainer.world_size)
finish(trainer.global_rank, model.parameters(), epochs=record.epochs, validated=validated)
'''


def run_both(ranks, code, tmp_path, env, timeout=120):
    """`code` on 2 ranks with "gloo" (the oracle), then "cyxwiz"; the reports of each rank by backend.
    Gloo sometimes aborts at exit after a complete run (see test_torch_backend.results_of): its report
    must be there; the "cyxwiz" ranks must also exit 0."""
    reports = {}
    for backend in ("gloo", "cyxwiz"):
        ranks.port = free_port()
        procs = ranks.start(code, 2, env={"TEST_BACKEND": backend, "TEST_OUT": tmp_path / backend, **env},
                            rank_env={r: {"LOCAL_RANK": r} for r in range(2)}, name=f"{backend}_run.py")
        results = ranks.wait(procs, timeout)
        for r in results:
            skip = [line for line in r.out.splitlines() if line.startswith("SKIP ")]
            if skip:
                pytest.skip(json.loads(skip[0][5:]))
        assert all(r.rc == 0 for r in results) or backend == "gloo", ranks.report(results)[-8000:]
        lines = [[json.loads(line[7:]) for line in r.out.splitlines() if line.startswith("RESULT ")] for r in results]
        assert all(lines), ranks.report(results)[-8000:]
        reports[backend] = [rep[-1] for rep in lines]
        assert [rep["backend"] for rep in reports[backend]] == [backend, backend], reports[backend]
    for r in range(2):
        np.testing.assert_array_equal(np.load(tmp_path / f"cyxwiz.{r}.npy"), np.load(tmp_path / f"gloo.{r}.npy"),
                                      err_msg=f"rank {r}: the parameters after training on cyxwiz and on gloo")
    np.testing.assert_array_equal(np.load(tmp_path / "cyxwiz.0.npy"), np.load(tmp_path / "cyxwiz.1.npy"),
                                  err_msg="the ranks ended with different parameters")
    return reports


@_installed("pytorch_lightning", "pytorch-lightning")
@pytest.mark.timeout(300)
def test_lightning_ddp_on_cyxwiz_trains_as_on_gloo(ranks, tmp_path):
    """Trainer(accelerator="cpu", devices=2, strategy=DDPStrategy(process_group_backend="cyxwiz")),
    ranks started as torchrun does (LOCAL_RANK set: Lightning starts no processes of its own), 3 epochs
    of Adam with validation after each: the parameters end bit-identical to the same run on gloo, and
    the metrics logged with sync_dist=True (whose sample count is an int64 all-reduced with ReduceOp.AVG,
    what the backend refused before) agree exactly, on both ranks, after each epoch and in validate()."""
    reports = run_both(ranks, LIGHTNING, tmp_path, {"NODE_RANK": 0})
    for r in range(2):
        cyx, gloo = reports["cyxwiz"][r], reports["gloo"][r]
        assert len(cyx["epochs"]) == 3 and set(cyx["epochs"][0]) == {"train_loss", "val_acc", "val_loss"}, cyx
        assert cyx["epochs"] == gloo["epochs"] and cyx["validated"] == gloo["validated"], (cyx, gloo)
        assert cyx["epochs"] == reports["cyxwiz"][0]["epochs"], "the ranks logged different metrics"
        assert cyx["epochs"][-1]["val_loss"] < 0.5 * cyx["epochs"][0]["val_loss"], cyx["epochs"]  # it learned
        # The call this test is about went through the backend (the sanity check's and every epoch's sync).
        assert cyx["calls"].get("allreduce AVG int64", 0) >= 5, cyx["calls"]


ACCELERATE = PRELUDE.replace("CLIENT_IMPORTS", "from accelerate import Accelerator") + r'''
# Accelerate picks "gloo" itself for several CPU processes and refuses any other name in
# InitProcessGroupKwargs; a process group that exists already is the one it uses.
dist.init_process_group(BACKEND)
accelerator = Accelerator(cpu=True)
torch.manual_seed(0)
model = mlp()
optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
train = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*blobs(512, 1)), batch_size=32, shuffle=True)
val = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*blobs(250, 2)), batch_size=32)
model, optimizer, train, val = accelerator.prepare(model, optimizer, train, val)
epochs = []
for epoch in range(3):
    model.train()
    for x, y in train:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
    model.eval()
    correct, labels, losses = [], [], []
    with torch.no_grad():
        for x, y in val:
            logits = model(x)
            # all ranks' predictions, less the samples the last batch repeats to even the ranks out
            p, l = accelerator.gather_for_metrics((logits.argmax(1), y))
            correct.append(p == l)
            labels.append(l)
            losses.append(accelerator.reduce(torch.nn.functional.cross_entropy(logits, y), "mean"))
    epochs.append({"samples": len(torch.cat(labels)), "label_sum": int(torch.cat(labels).sum()),
                   "accuracy": float(torch.cat(correct).float().mean()), "val_loss": float(torch.stack(losses).mean()),
                   "train_loss": float(loss.detach())})
accelerator.wait_for_everyone()
report = {"epochs": epochs, "want_label_sum": int(blobs(250, 2)[1].sum()), "process_index": accelerator.process_index,
          "num_processes": accelerator.num_processes, "distributed_type": str(accelerator.distributed_type)}
finish(RANK, accelerator.unwrap_model(model).parameters(), **report)
accelerator.end_training()  # destroys the process group
'''


@_installed("accelerate", "accelerate")
@pytest.mark.timeout(300)
def test_accelerate_on_cyxwiz_trains_as_on_gloo(ranks, tmp_path):
    """init_process_group("cyxwiz") before Accelerator(cpu=True), ranks started as torchrun does;
    accelerator.prepare(model, optimizer, train and validation loaders), 3 epochs of Adam with
    accelerator.backward, and each epoch's validation through gather_for_metrics and reduce("mean"):
    the parameters end bit-identical to the same run on gloo, the gathered and reduced metrics equal."""
    reports = run_both(ranks, ACCELERATE, tmp_path, {"LOCAL_WORLD_SIZE": 2, "OMP_NUM_THREADS": 1,
                                                     "HF_HUB_OFFLINE": 1})
    for r in range(2):
        cyx, gloo = reports["cyxwiz"][r], reports["gloo"][r]
        assert (cyx["process_index"], cyx["num_processes"], cyx["distributed_type"]) == \
            (r, 2, "DistributedType.MULTI_CPU"), cyx
        assert len(cyx["epochs"]) == 3 and cyx["epochs"] == gloo["epochs"], (cyx, gloo)
        # gather_for_metrics dropped the samples the sharded loader repeats: the whole validation set.
        assert all(e["samples"] == 250 for e in cyx["epochs"]), cyx["epochs"]
        assert cyx["epochs"][-1]["val_loss"] < 0.5 * cyx["epochs"][0]["val_loss"], cyx["epochs"]
        # gather_for_metrics: torch's list all_gather (Accelerate's state.backend still reads "gloo", so it
        # does not use all_gather_into_tensor); reduce: all_reduce SUM, then its own division.
        assert cyx["calls"].get("allgather", 0) > 0 and cyx["calls"].get("allreduce SUM float32", 0) > 0, cyx["calls"]
        assert all(e["label_sum"] == cyx["want_label_sum"] for e in cyx["epochs"]), cyx
    assert reports["cyxwiz"][0]["epochs"][-1]["val_loss"] == reports["cyxwiz"][1]["epochs"][-1]["val_loss"]
