"""Real data, several ranks: the 8x8 handwritten digits bundled with scikit-learn, trained with
DistributedTrainer.

    python examples/digits_distributed.py
    ./launch_distributed.sh 2 python examples/digits_distributed.py
    torchrun --nproc_per_node=2 examples/digits_distributed.py --epochs 40

scikit-learn is needed only for `load_digits` (1797 images shipped inside the package, nothing is
downloaded): `pip install scikit-learn`. Every rank loads the same arrays, standardizes them with the
training set's statistics and splits them with the same seed; the trainer then gives each rank its own
shard. Rank 0 prints the test accuracy (about 0.97).
"""

import argparse
import sys

import numpy as np

try:
    from sklearn.datasets import load_digits
except ImportError:
    sys.exit("examples/digits_distributed.py needs scikit-learn for its bundled digits data set: "
             "pip install scikit-learn")

import pycyxwiz as cx

dist = cx.distributed


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.002)
    p.add_argument("--test-fraction", type=float, default=0.2)
    p.add_argument("--out", default="", help="rank 0 saves the trained model here (default: not saved)")
    args = p.parse_args()

    dist.init()
    cx.manual_seed(0)

    digits = load_digits()                       # X: (1797, 64) pixel intensities 0..16, y: 0..9
    X, y = digits.data.astype(np.float32), digits.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(X))   # the same split on every rank
    n_test = int(len(X) * args.test_fraction)
    test, train = order[:n_test], order[n_test:]
    mean, std = X[train].mean(axis=0), X[train].std(axis=0)
    std[std == 0] = 1.0                          # a few border pixels are always 0
    X = (X - mean) / std
    X_train, y_train, X_test, y_test = X[train], y[train], X[test], y[test]

    model = cx.SequentialModel()
    model.add(cx.LinearModule(64, 128))
    model.add(cx.ReLUModule())
    model.add(cx.LinearModule(128, 10))
    trainer = dist.DistributedTrainer(model, cx.CrossEntropyLoss(), cx.AdamOptimizer(args.lr))

    config = dist.DistributedTrainingConfig()
    config.epochs = args.epochs
    config.batch_size = args.batch_size
    config.seed = 0
    config.log_every_n_batches = 10
    history = trainer.fit(X_train, y_train, config)

    test_loss, test_acc = trainer.evaluate(X_test, y_test)   # every rank takes part and gets the same result
    if trainer.is_master():
        print(f"digits: {len(X_train)} training and {len(X_test)} test images, {history.world_size} rank(s), "
              f"{history.total_time_seconds:.2f} s")
        print(f"test loss {test_loss:.4f}")
        print(f"test accuracy {test_acc:.4f}")
        if args.out:
            model.save(args.out)
            print(f"saved {args.out}")
    dist.finalize()


if __name__ == "__main__":
    main()
