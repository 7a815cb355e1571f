"""A convolutional network, several ranks: scikit-learn's 8x8 digits as 1x8x8 images, trained with
DistributedTrainer and synchronised batch normalisation.

    python examples/cnn_digits.py
    ./launch_distributed.sh 2 python examples/cnn_digits.py
    torchrun --nproc_per_node=2 examples/cnn_digits.py --epochs 20

scikit-learn is needed only for `load_digits` (1797 images shipped inside the package, nothing is
downloaded): `pip install scikit-learn`. Every rank loads the same arrays and splits them with the same
seed; the trainer gives each rank its own shard, and convert_sync_batchnorm makes every BatchNorm
normalise over all ranks' rows together. Rank 0 prints the test accuracy (about 0.98).
"""

import argparse
import sys

import numpy as np

try:
    from sklearn.datasets import load_digits
except ImportError:
    sys.exit("examples/cnn_digits.py needs scikit-learn for its bundled digits data set: pip install scikit-learn")

import pycyxwiz as cx

dist = cx.distributed


def build_model():
    """Two conv blocks (Conv2D, BatchNorm2D, ReLU), a max pool, global average pooling, a classifier."""
    model = cx.SequentialModel()
    for layer in (cx.Conv2DModule(1, 32, 3, padding=1), cx.BatchNorm2DModule(32), cx.ReLUModule(),
                  cx.Conv2DModule(32, 64, 3, padding=1), cx.BatchNorm2DModule(64), cx.ReLUModule(),
                  cx.MaxPool2DModule(2),                                     # (N, 64, 4, 4)
                  cx.Conv2DModule(64, 64, 3, padding=1), cx.BatchNorm2DModule(64), cx.ReLUModule(),
                  cx.GlobalAvgPool2DModule(),                                # (N, 64)
                  cx.LinearModule(64, 10)):
        model.add(layer)
    return model


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.003)
    p.add_argument("--test-fraction", type=float, default=0.2)
    p.add_argument("--no-sync-bn", action="store_true", help="each rank's BatchNorm uses its own rows")
    p.add_argument("--out", default="", help="rank 0 saves the trained model here (default: not saved)")
    args = p.parse_args()

    dist.init()
    cx.manual_seed(0)

    digits = load_digits()
    X = (digits.images.astype(np.float32) / 16.0)[:, None, :, :]   # (1797, 1, 8, 8), NCHW
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(X))           # the same split on every rank
    n_test = int(len(X) * args.test_fraction)
    test, train = order[:n_test], order[n_test:]

    model = build_model()
    if not args.no_sync_bn:
        dist.convert_sync_batchnorm(model)
    trainer = dist.DistributedTrainer(model, cx.CrossEntropyLoss(), cx.AdamOptimizer(args.lr))
    if trainer.is_master():
        print(model.summary((1, 8, 8)))

    config = dist.DistributedTrainingConfig()
    config.epochs = args.epochs
    config.batch_size = args.batch_size
    config.seed = 0
    config.log_every_n_batches = 10
    history = trainer.fit(X[train], y[train], config)

    test_loss, test_acc = trainer.evaluate(X[test], y[test])   # every rank takes part and gets the same result
    if trainer.is_master():
        print(f"cnn digits: {len(train)} training and {len(test)} test images, {history.world_size} rank(s), "
              f"{history.total_time_seconds:.2f} s")
        print(f"test loss {test_loss:.4f}")
        print(f"test accuracy {test_acc:.4f}")
        if args.out:
            model.save(args.out)
            print(f"saved {args.out}")
    dist.finalize()


if __name__ == "__main__":
    main()
