"""The distributed training guide's Quick Start, runnable as it stands (docs/distributed.md).

    python examples/quick_start.py                                   # one process
    ./launch_distributed.sh 2 python examples/quick_start.py         # two ranks on this machine
    torchrun --nproc_per_node=2 examples/quick_start.py              # the same under torchrun
    RANK=0 WORLD_SIZE=2 python examples/quick_start.py &             # by hand, one line per rank
    RANK=1 WORLD_SIZE=2 python examples/quick_start.py

The guide's script trains on `X_train`/`y_train`; here they are a synthetic 784-feature, 10-class
problem (a noisy copy of one of ten random prototypes per row), made from a fixed seed, so every rank
builds the same array and the DistributedSampler gives each rank its own part of it. Everything from
`cx.distributed.init()` on is the guide's code; only the number of epochs
(QUICKSTART_EPOCHS, default 10) and the output file (--out or QUICKSTART_OUT, default
model.cyxmodel in the current directory) can be changed.
"""

import argparse
import os

import numpy as np

import pycyxwiz as cx


def make_dataset(n=4000, features=784, classes=10, seed=0):
    """Rows of a noisy class prototype: learnable, yet no single pixel gives the class away."""
    rng = np.random.default_rng(seed)
    prototypes = rng.normal(0.0, 1.0, size=(classes, features))
    y = rng.integers(0, classes, size=n)
    X = prototypes[y] + rng.normal(0.0, 6.5, size=(n, features))
    return X.astype(np.float32), y


parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--out", default=os.environ.get("QUICKSTART_OUT", "model.cyxmodel"),
                    help="where rank 0 saves the trained model (default: $QUICKSTART_OUT or model.cyxmodel)")
parser.add_argument("--epochs", type=int, default=int(os.environ.get("QUICKSTART_EPOCHS", "10")),
                    help="epochs to train (default: $QUICKSTART_EPOCHS or 10, as in the guide)")
args = parser.parse_args()

X_train, y_train = make_dataset()

# ---- the guide's Quick Start from here on ------------------------------------------------------

# Initialize distributed
cx.distributed.init()

# Create model
model = cx.SequentialModel()
model.add(cx.LinearModule(784, 256))
model.add(cx.ReLUModule())
model.add(cx.LinearModule(256, 10))

# Create trainer
trainer = cx.distributed.DistributedTrainer(
    model,
    cx.CrossEntropyLoss(),
    cx.AdamOptimizer(0.001)
)

# Configure and train
config = cx.distributed.DistributedTrainingConfig()
config.epochs = args.epochs
config.batch_size = 64  # Per-GPU batch size

history = trainer.fit(X_train, y_train, config)

# Save model (master only)
if trainer.is_master():
    model.save(args.out)
    print(f"world size {history.world_size}, effective batch {history.effective_batch_size}: "
          f"final loss {history.train_losses[-1]:.4f}, accuracy {history.train_accuracies[-1]:.4f}; "
          f"saved {args.out}")

cx.distributed.finalize()
