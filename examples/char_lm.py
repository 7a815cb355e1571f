"""A character-level language model, trained data-parallel, that then writes a sample.

    ./launch_distributed.sh 2 python examples/char_lm.py                  # the source of Python's argparse
    ./launch_distributed.sh 2 python examples/char_lm.py --text my.txt --epochs 20

A GPT in miniature: token embeddings and learned positions, two causal Transformer blocks (pre-norm),
a final LayerNorm and a linear layer to the vocabulary; cross-entropy over every position predicts each
next character. The text's first 90% trains (windows of --context characters, each rank its share per
epoch), the last 10% is held out. Printed at the end: the held-out loss against the text's unigram
entropy (the loss of a model that knows only how often each character occurs), and a sample.
"""

import argparse
import os

import numpy as np

import pycyxwiz as cx

D = cx.distributed


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--text", default=argparse.__file__, help="a UTF-8 text file (default: the source of argparse)")
    p.add_argument("--context", type=int, default=64, help="characters per training window")
    p.add_argument("--dim", type=int, default=64, help="the model's width (d_model)")
    p.add_argument("--blocks", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=32, help="windows per rank per step")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--sample", type=int, default=300, help="characters to generate at the end")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def windows(ids, context, stride):
    """(inputs, next-character targets), both (count, context)."""
    starts = np.arange(0, len(ids) - context - 1, stride)
    X = np.stack([ids[s:s + context] for s in starts])
    y = np.stack([ids[s + 1:s + context + 1] for s in starts])
    return X.astype(np.float32), y.astype(np.int64)  # ids travel as float32 through the trainer


def build(vocab, args):
    model = cx.SequentialModel()
    model.add(cx.EmbeddingModule(vocab, args.dim))
    model.add(cx.PositionalEncodingModule(args.context, args.dim, learned=True))
    for _ in range(args.blocks):
        model.add(cx.TransformerEncoderModule(args.dim, args.heads, 4 * args.dim, dropout=0.0, causal=True))
    model.add(cx.LayerNormModule(args.dim))
    model.add(cx.LinearModule(args.dim, vocab))
    return model


def main():
    args = parse_args()
    D.init()
    with open(args.text, encoding="utf-8") as f:
        text = f.read()
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    ids = np.array([index[c] for c in text], dtype=np.int64)
    cut = int(len(ids) * 0.9)
    X, y = windows(ids[:cut], args.context, args.context // 2)
    Xv, yv = windows(ids[cut:], args.context, args.context)
    counts = np.bincount(ids[:cut], minlength=len(chars))
    p = counts[counts > 0] / cut
    unigram = float(-(p * np.log(p)).sum())  # nats per character

    cx.manual_seed(args.seed)
    model = build(len(chars), args)
    trainer = D.DistributedTrainer(model, cx.CrossEntropyLoss(), cx.AdamOptimizer(args.lr))
    config = D.DistributedTrainingConfig()
    config.epochs, config.batch_size, config.seed = args.epochs, args.batch_size, args.seed
    config.verbose = D.get_rank() == 0
    trainer.fit(X, y, config)
    val_loss, val_accuracy = trainer.evaluate(Xv, yv)
    if D.get_rank() == 0:
        name = os.path.basename(args.text)
        print(f"{name}: {len(text)} characters, {len(chars)} distinct; {D.get_world_size()} ranks")
        print(f"held-out loss {val_loss:.3f} nats/char ({val_accuracy:.1%} of next characters right); "
              f"unigram entropy {unigram:.3f}; ratio {val_loss / unigram:.2f}")
        prompt = ids[cut:cut + 16]
        sample = model.generate(prompt, args.sample, temperature=0.8, top_k=10, seed=args.seed)
        print("sample:\n" + "".join(chars[i] for i in sample))
    D.finalize()


if __name__ == "__main__":
    main()
