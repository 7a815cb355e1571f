#!/usr/bin/env python3
"""Time one Transformer training step (forward, loss, backward, Adam step): pycyxwiz vs PyTorch, same threads.

    python benchmarks/transformer_step.py                    # issue 35's model, 1 and 2 threads
    python benchmarks/transformer_step.py --context 1024 --batch 2 --rounds 2
    python benchmarks/transformer_step.py --quick            # CI smoke run
    python benchmarks/transformer_step.py --autocast         # also both under bfloat16 autocast

Model: token embedding (vocab 256) + learned positions, 2 encoder blocks (d_model 128, 4 heads,
feed-forward 512, GELU, pre-norm, causal, no dropout), LayerNorm, Linear to the vocabulary;
cross-entropy over every position; Adam lr 1e-3. Input: --batch sequences of --context tokens.
torch: the same layers (nn.TransformerEncoderLayer(batch_first=True, norm_first=True) with a causal
mask: its attention runs scaled_dot_product_attention), torch's weights copied into ours.
Timing: rounds interleaved (ours, torch, ours, ...), each the median over --steps steps after a
warm-up; reported: the median of the round medians and ratio = torch / ours (>= 1: we are faster).
--autocast: two more rows per round, ours under cx.autocast("bfloat16") and torch under
torch.autocast("cpu", torch.bfloat16), on copies of the same weights; reported with ours bf16 / ours
float32 (<= 1: autocast is no slower) and the bfloat16 provider (cx.build_info()["blas16"]).
Peak memory (--memory): the peak RSS growth over two steps from before the first (activations, what
backward keeps, optimizer state), ours and torch's each in a fresh process.
"""

import argparse
import datetime
import statistics
import subprocess
import sys
import time

import numpy as np

import pycyxwiz as cx
from cnn_step import time_ours  # one step of ours, timed: the same loop as the CNN benchmark's

try:
    import torch
except ImportError:
    torch = None

VOCAB, D, HEADS, FF, BLOCKS, LR = 256, 128, 4, 512, 2, 1e-3


def cx_model(T):
    m = cx.SequentialModel()
    m.add(cx.EmbeddingModule(VOCAB, D))
    m.add(cx.PositionalEncodingModule(T, D, learned=True))
    for _ in range(BLOCKS):
        m.add(cx.TransformerEncoderModule(D, HEADS, FF, dropout=0.0, causal=True))
    m.add(cx.LayerNormModule(D))
    m.add(cx.LinearModule(D, VOCAB))
    return m


class TorchModel(torch.nn.Module if torch else object):
    def __init__(self, T):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, D)
        self.pos = torch.nn.Parameter(torch.randn(T, D) * 0.02)
        self.blocks = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(D, HEADS, FF, dropout=0.0, activation="gelu", batch_first=True,
                                             norm_first=True) for _ in range(BLOCKS))
        self.norm = torch.nn.LayerNorm(D)
        self.head = torch.nn.Linear(D, VOCAB)
        self.register_buffer("mask", torch.nn.Transformer.generate_square_subsequent_mask(T), persistent=False)

    def forward(self, ids):
        x = self.embed(ids) + self.pos[: ids.shape[1]]
        for block in self.blocks:
            x = block(x, src_mask=self.mask, is_causal=True)
        return self.head(self.norm(x))


def copy_weights(ours, theirs):
    # In layer order: torch lists the module's own parameter (pos) before its submodules'; ours is layer 1.
    named = dict(theirs.named_parameters())
    order = ["embed.weight", "pos"] + [n for n in named if n not in ("embed.weight", "pos")]
    for (name, mine), theirs_name in zip(ours.named_parameters(), order):
        assert mine.shape == tuple(named[theirs_name].shape), (name, theirs_name)
        mine[...] = named[theirs_name].detach().numpy()


def data(n, batch, T):
    rng = np.random.default_rng(0)
    return [(rng.integers(0, VOCAB, (batch, T)), rng.integers(0, VOCAB, (batch, T))) for _ in range(n)]


def time_torch(model, opt, batches, bf16=False):
    times = []
    for x, y in batches:
        xt, yt = torch.from_numpy(x), torch.from_numpy(y)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(xt)
        torch.nn.functional.cross_entropy(logits.float().reshape(-1, VOCAB), yt.reshape(-1)).backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    return times


def time_ours_bf16(model, opt, batches):
    with cx.autocast("bfloat16"):
        return time_ours(model, opt, batches)


def measure(args, threads):
    cx.set_num_threads(threads)
    cx.manual_seed(0)
    ours = cx_model(args.context)
    opt_ours = cx.AdamOptimizer(LR)
    batches = data(args.steps + args.warmup, args.batch, args.context)
    runs = {"ours": lambda: time_ours(ours, opt_ours, batches)}
    if args.autocast:
        cx.manual_seed(0)
        ours16, opt16 = cx_model(args.context), cx.AdamOptimizer(LR)
        runs["ours bf16"] = lambda: time_ours_bf16(ours16, opt16, batches)
    if torch is not None:
        torch.set_num_threads(threads)
        torch.manual_seed(0)
        theirs = TorchModel(args.context)
        copy_weights(ours, theirs)
        opt_torch = torch.optim.Adam(theirs.parameters(), lr=LR)
        runs["torch"] = lambda: time_torch(theirs, opt_torch, batches)
        if args.autocast:
            torch.manual_seed(0)
            theirs16 = TorchModel(args.context)
            copy_weights(ours, theirs16)
            opt_torch16 = torch.optim.Adam(theirs16.parameters(), lr=LR)
            runs["torch bf16"] = lambda: time_torch(theirs16, opt_torch16, batches, bf16=True)
    result = {k: [] for k in runs}
    for _ in range(args.rounds):
        for k, run in runs.items():
            result[k].append(statistics.median(run()[args.warmup:]))
    return {k: statistics.median(v) for k, v in result.items()}


def peak_growth(args, who):
    """Peak RSS growth (MiB) of one step in a fresh process (so each framework's peak is its own)."""
    code = (f"import sys; sys.argv=['x','--context','{args.context}','--batch','{args.batch}'];"
            f"import transformer_step as t; t.one_step_peak('{who}')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=sys.path[0] or ".",
                         timeout=600, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def one_step_peak(who):
    args = parse_args()
    cx.set_num_threads(1)
    batch = data(1, args.batch, args.context)
    if who == "ours":
        model, opt = cx_model(args.context), cx.AdamOptimizer(LR)
        step = lambda: time_ours(model, opt, batch)  # noqa: E731
    else:
        torch.set_num_threads(1)
        model = TorchModel(args.context)
        opt = torch.optim.Adam(model.parameters(), lr=LR)
        step = lambda: time_torch(model, opt, batch)  # noqa: E731
    # Linux: "5" into clear_refs resets the high-water mark (VmHWM) to the current RSS, so the imports'
    # own peak does not hide the steps'.
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = status_kib("VmRSS")  # model and data made, no step yet
    step()
    step()
    print((status_kib("VmHWM") - before) / 1024.0)


def status_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--autocast", action="store_true", help="also ours and torch's steps under bfloat16 autocast")
    p.add_argument("--memory", action="store_true", help="also the peak RSS growth of a step, each framework alone")
    p.add_argument("--quick", action="store_true", help="smoke run: 1 thread, 1 round of 2 steps")
    p.add_argument("--out", default="", help="also write the table to this markdown file")
    args = p.parse_args()
    if args.quick:
        args.threads, args.rounds, args.steps, args.warmup = [1], 1, 2, 1
    return args


def main():
    args = parse_args()
    lines = [f"Transformer training step: 2 blocks, d_model {D}, {HEADS} heads, ff {FF}, context {args.context}, "
             f"batch {args.batch}, Adam; {datetime.date.today()}; median of {args.rounds} round medians "
             f"of {args.steps} steps", "", "| threads | pycyxwiz ms | torch ms | torch / ours |", "|---:|---:|---:|---:|"]
    if args.autocast:
        lines[2:] = ["| threads | pycyxwiz ms | torch ms | torch / ours | pycyxwiz bf16 ms | torch bf16 ms | "
                     "torch bf16 / ours bf16 | ours bf16 / ours float32 |", "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for threads in args.threads:
        r = measure(args, threads)
        t = r.get("torch")
        row = (f"| {threads} | {r['ours'] * 1e3:.1f} | {t * 1e3:.1f} | {t / r['ours']:.2f} |" if t else
               f"| {threads} | {r['ours'] * 1e3:.1f} | - | - |")
        if args.autocast:
            o16, t16 = r["ours bf16"], r.get("torch bf16")
            row += (f" {o16 * 1e3:.1f} | {t16 * 1e3:.1f} | {t16 / o16:.2f} |" if t16 else f" {o16 * 1e3:.1f} | - | - |")
            row += f" {o16 / r['ours']:.2f} |"
        lines.append(row)
    if args.autocast:
        lines += ["", f"bfloat16 products: {cx.build_info()['blas16']}"]
    if args.memory and torch is not None:
        ours, theirs = peak_growth(args, "ours"), peak_growth(args, "torch")
        lines += ["", f"Peak RSS growth over two steps from before the first (one thread): pycyxwiz {ours:.0f} MiB, "
                  f"torch {theirs:.0f} MiB"]
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
