"""Train a small MLP on a synthetic 4-class problem in one process, save it, load it back.

    python examples/train_mlp.py [--epochs 5] [--out mlp.cyxmodel]

Prints the loss and accuracy per epoch and exits non-zero if the model did not learn or if the
reloaded model predicts differently: CI runs this as the README's quick start.
"""

import argparse
import os
import sys
import tempfile

import numpy as np

import pycyxwiz as cx


def make_blobs(n, features=20, classes=4, seed=0):
    rng = np.random.default_rng(seed)
    centers = rng.normal(0.0, 3.0, size=(classes, features))
    y = rng.integers(0, classes, size=n)
    X = centers[y] + rng.normal(0.0, 1.0, size=(n, features))
    return X.astype(np.float32), y


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "pycyxwiz_mlp.cyxmodel"))
    args = parser.parse_args()

    cx.manual_seed(0)
    X, y = make_blobs(6000)
    X_train, y_train, X_test, y_test = X[:5000], y[:5000], X[5000:], y[5000:]

    model = cx.SequentialModel()
    model.add(cx.LinearModule(20, 64))
    model.add(cx.ReLUModule())
    model.add(cx.LinearModule(64, 4))
    print(model.summary())

    loss_fn = cx.CrossEntropyLoss()
    optimizer = cx.AdamOptimizer(0.001)
    rng = np.random.default_rng(1)
    for epoch in range(args.epochs):
        order = rng.permutation(len(X_train))
        losses = []
        for start in range(0, len(order), args.batch_size):
            idx = order[start:start + args.batch_size]
            model.zero_grad()
            output = model.forward(X_train[idx])
            losses.append(loss_fn.forward(output, y_train[idx]))
            model.backward(loss_fn.backward(output, y_train[idx]))
            optimizer.step(model)
        model.eval()
        test_acc = cx.accuracy(model.forward(X_test), y_test)
        model.train()
        print(f"epoch {epoch + 1}/{args.epochs}  loss {np.mean(losses):.4f}  test accuracy {test_acc:.4f}")

    model.save(args.out)
    loaded = cx.SequentialModel.load(args.out)
    same = np.array_equal(loaded.forward(X_test), model.forward(X_test))
    print(f"saved {args.out}; reloaded model predicts identically: {same}")
    if test_acc < 0.95 or not same:
        sys.exit("the model did not learn the task or did not reload identically")


if __name__ == "__main__":
    main()
