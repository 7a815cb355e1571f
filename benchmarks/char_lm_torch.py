#!/usr/bin/env python3
"""examples/char_lm.py's model and data in pycyxwiz and in PyTorch, one process each: held-out loss side by side.

    python benchmarks/char_lm_torch.py                 # argparse's source, 8 epochs, batch 64
    python benchmarks/char_lm_torch.py --epochs 4 --threads 2

The same windows, split, architecture (embedding + learned positions, 2 causal pre-norm blocks, d 64,
4 heads, ff 256, final LayerNorm, linear head), optimizer (Adam, lr 3e-3), batch size, epochs and
sample order (one shuffled order per epoch, shared); initial weights differ (each framework draws its
own). Reported: each framework's held-out loss (nats/char), its ratio to the unigram entropy, and the
training time.
"""

import argparse
import os
import sys
import time

import numpy as np
import torch

import pycyxwiz as cx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from char_lm import build, windows  # noqa: E402


class TorchLM(torch.nn.Module):
    def __init__(self, vocab, args):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, args.dim)
        self.pos = torch.nn.Parameter(torch.randn(args.context, args.dim) * 0.02)
        self.blocks = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(args.dim, args.heads, 4 * args.dim, dropout=0.0, activation="gelu",
                                             batch_first=True, norm_first=True) for _ in range(args.blocks))
        self.norm = torch.nn.LayerNorm(args.dim)
        self.head = torch.nn.Linear(args.dim, vocab)
        self.register_buffer("mask", torch.nn.Transformer.generate_square_subsequent_mask(args.context),
                             persistent=False)

    def forward(self, ids):
        x = self.embed(ids) + self.pos[: ids.shape[1]]
        for block in self.blocks:
            x = block(x, src_mask=self.mask, is_causal=True)
        return self.head(self.norm(x))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--text", default=argparse.__file__)
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    args.context, args.dim, args.blocks, args.heads, args.lr = 64, 64, 2, 4, 3e-3
    with open(args.text, encoding="utf-8") as f:
        text = f.read()
    chars = sorted(set(text))
    ids = np.array([chars.index(c) for c in text], dtype=np.int64)
    cut = int(len(ids) * 0.9)
    X, y = windows(ids[:cut], args.context, args.context // 2)
    Xv, yv = windows(ids[cut:], args.context, args.context)
    X, Xv = X.astype(np.int64), Xv.astype(np.int64)
    counts = np.bincount(ids[:cut], minlength=len(chars))
    q = counts[counts > 0] / cut
    unigram = float(-(q * np.log(q)).sum())
    orders = [np.random.default_rng([0, e]).permutation(len(X)) for e in range(args.epochs)]
    V = len(chars)

    cx.set_num_threads(args.threads)
    cx.manual_seed(0)
    ours, loss, opt = build(V, args), cx.CrossEntropyLoss(), cx.AdamOptimizer(args.lr)
    t0 = time.perf_counter()
    for order in orders:
        for b in range(0, len(order), args.batch_size):
            rows = order[b:b + args.batch_size]
            out = ours.forward(X[rows])
            ours.zero_grad()
            ours.backward(loss.backward(out, y[rows]))
            opt.step(ours)
    ours_time = time.perf_counter() - t0
    ours.eval()
    ours_loss = loss.forward(ours.forward(Xv), yv)

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    theirs = TorchLM(V, args)
    topt = torch.optim.Adam(theirs.parameters(), lr=args.lr)
    Xt, yt = torch.from_numpy(X), torch.from_numpy(y)
    t0 = time.perf_counter()
    for order in orders:
        for b in range(0, len(order), args.batch_size):
            rows = torch.from_numpy(order[b:b + args.batch_size])
            topt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(theirs(Xt[rows]).reshape(-1, V), yt[rows].reshape(-1)).backward()
            topt.step()
    torch_time = time.perf_counter() - t0
    theirs.eval()
    with torch.no_grad():
        torch_loss = torch.nn.functional.cross_entropy(theirs(torch.from_numpy(Xv)).reshape(-1, V),
                                                       torch.from_numpy(yv).reshape(-1)).item()
    print(f"{os.path.basename(args.text)}: {len(text)} characters, {V} distinct; unigram entropy {unigram:.3f} "
          f"nats/char; {args.epochs} epochs of {len(X)} windows, batch {args.batch_size}, {args.threads} thread(s)")
    print("| framework | held-out loss (nats/char) | / unigram entropy | training s |")
    print("|---|---:|---:|---:|")
    print(f"| pycyxwiz | {ours_loss:.3f} | {ours_loss / unigram:.2f} | {ours_time:.1f} |")
    print(f"| torch | {torch_loss:.3f} | {torch_loss / unigram:.2f} | {torch_time:.1f} |")


if __name__ == "__main__":
    main()
