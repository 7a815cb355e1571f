#!/usr/bin/env python3
"""Time one GPT-2-small-sized training step on a GPU under bf16 autocast: pycyxwiz (eager, and its
CUDA-graph step) vs PyTorch (nn.TransformerEncoderLayer with norm_first and batch_first, its attention
through scaled_dot_product_attention, torch.autocast bf16), same model, same batches, one process.

    python benchmarks/gpu_transformer_step.py                # 4 blocks, batch 8 x 1024 tokens, 3 rounds
    python benchmarks/gpu_transformer_step.py --blocks 12    # the whole GPT-2 small depth
    python benchmarks/gpu_transformer_step.py --quick        # smoke run (tiny sizes; the host emulator too)

Model: GPT-2 small's sizes (vocabulary 50257, d_model 768, 12 heads, feed-forward 3072, GELU, context
1024) as a causal pre-norm stack: token embedding + learned positions, --blocks encoder blocks
(dropout 0: both frameworks then compute the same function, and no masks are drawn), LayerNorm, a
Linear to the vocabulary; cross-entropy over every position; Adam lr 1e-4. Why 4 blocks by default:
the ratio per block does not depend on the depth (only the embedding's and the vocabulary head's share
of the step does), and 4 keep a round short on a lent GPU whose time is counted; --blocks 12 is the
whole depth (ours keeps each block's attention weights, N x H x T x T floats = 403 MB at these sizes).
Mixed precision: ours under cx.autocast("bfloat16") (TrainStep(mixed_precision="bf16") for the graph):
the linear layers multiply bfloat16 operands; attention's products, the norms and the softmax stay
float32 (docs/gpu.md), where torch's SDPA runs a bfloat16 fused kernel. torch's weights are copied
into ours. Inputs are device tensors (torch CUDA tensors that pycyxwiz reads through
__cuda_array_interface__); without CUDA in torch (the emulator) numpy batches and no torch.
Timing: rounds interleaved (ours, ours graphed, torch, ...), each the median of `steps` steps
synchronised one by one after a warm-up; reported: the median of the round medians and ratio =
ours / torch (<= 1: we are faster). No figure has been measured yet: it waits for a lent GPU.
"""

import argparse
import datetime
import sys

import numpy as np

import pycyxwiz as cx
from gpu_cnn_step import compare  # the same rounds, timing and table as the GPU CNN benchmark's

try:
    import torch
except ImportError:
    torch = None

LR = 1e-4


def cx_model(a):
    m = cx.SequentialModel()
    m.add(cx.EmbeddingModule(a.vocab, a.d_model))
    m.add(cx.PositionalEncodingModule(a.context, a.d_model, learned=True))
    for _ in range(a.blocks):
        m.add(cx.TransformerEncoderModule(a.d_model, a.heads, a.ff, dropout=0.0, activation="gelu", causal=True))
    m.add(cx.LayerNormModule(a.d_model))
    m.add(cx.LinearModule(a.d_model, a.vocab))
    return m


def torch_model(a):
    nn = torch.nn

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(a.vocab, a.d_model)
            self.pos = nn.Parameter(torch.randn(a.context, a.d_model) * 0.02)
            self.blocks = nn.ModuleList(
                nn.TransformerEncoderLayer(a.d_model, a.heads, a.ff, dropout=0.0, activation="gelu", batch_first=True,
                                           norm_first=True) for _ in range(a.blocks))
            self.norm = nn.LayerNorm(a.d_model)
            self.head = nn.Linear(a.d_model, a.vocab)
            self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(a.context), persistent=False)

        def forward(self, ids):
            x = self.embed(ids) + self.pos[: ids.shape[1]]
            for block in self.blocks:
                x = block(x, src_mask=self.mask, is_causal=True)
            return self.head(self.norm(x))

    return GPT()


def copy_weights(ours, theirs):
    # In layer order: torch lists its own parameter (pos) before its submodules'; ours is layer 1.
    named = dict(theirs.named_parameters())
    order = ["embed.weight", "pos"] + [n for n in named if n not in ("embed.weight", "pos")]
    for (name, mine), theirs_name in zip(ours.named_parameters(), order):
        assert mine.shape == tuple(named[theirs_name].shape), (name, theirs_name)
        mine[...] = named[theirs_name].detach().cpu().numpy()


def ours_eager(model):
    loss, opt = cx.CrossEntropyLoss(), cx.AdamOptimizer(LR)

    def step(x, y):
        with cx.autocast("bfloat16"):
            out = model.forward(x)
        model.zero_grad()
        model.backward(loss.backward(out, y))  # follows what forward did (autocast.h)
        opt.step(model)
    return step


def ours_graphed(model):
    ddp = cx.distributed.DistributedDataParallel(model)
    train = cx.distributed.TrainStep(ddp, cx.CrossEntropyLoss(), cx.AdamOptimizer(LR), cuda_graphs=True,
                                     mixed_precision="bf16")
    step = lambda x, y: train(x, y)  # noqa: E731
    step.train_step = train
    return step


def torch_step(model):
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    lossfn = torch.nn.CrossEntropyLoss()

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            out = model(x)
        lossfn(out.float().flatten(0, 1), y.flatten()).backward()
        opt.step()
    return step


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--blocks", type=int, default=4)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--d-model", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--ff", type=int, default=3072)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--quick", action="store_true",
                   help="smoke run: 1 block, d_model 16, 2 heads, ff 32, vocab 50, batch 2 x 8 tokens, 1 round of 2 steps")
    p.add_argument("--out", default="", help="also write the table to this markdown file")
    a = p.parse_args()
    if a.quick:
        a.blocks, a.batch, a.context, a.d_model, a.heads, a.ff, a.vocab = 1, 2, 8, 16, 2, 32, 50
        a.rounds, a.steps, a.warmup = 1, 2, 2
    if not cx.cuda.is_available():
        print(f"no usable GPU: {cx.cuda.unavailable_reason()}", file=sys.stderr)
        sys.exit(2)  # run_on_gpu.sh's "limited": nothing to measure here
    use_torch = torch is not None and torch.cuda.is_available()
    if not cx.distributed.is_initialized():
        cx.distributed.init()  # a world of one, for TrainStep
    rng = np.random.default_rng(0)
    host = [(rng.integers(0, a.vocab, (a.batch, a.context)), rng.integers(0, a.vocab, (a.batch, a.context)))
            for _ in range(4)]
    cx.manual_seed(0)
    compare([cx_model(a), cx_model(a)], (lambda: torch_model(a)) if use_torch else None, copy_weights, host, a,
            (ours_eager, ours_graphed, torch_step),
            lambda graphed: f"GPT-2-small-sized causal LM, {a.blocks} blocks (d_model {a.d_model}, {a.heads} heads, ff "
                            f"{a.ff}, vocab {a.vocab}), batch {a.batch} x {a.context} tokens, bf16 autocast, Adam, "
                            f"{datetime.date.today()}; {a.rounds} rounds x {a.steps} steps; the CUDA-graph step {graphed}")
    cx.distributed.finalize()


if __name__ == "__main__":
    main()
