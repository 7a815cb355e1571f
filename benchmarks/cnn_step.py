#!/usr/bin/env python3
"""Time one CNN training step (forward, loss, backward, Adam step): pycyxwiz vs PyTorch, same threads.

    python benchmarks/cnn_step.py                         # 1 and 2 threads, the 3-block CNN and the small ResNet
    python benchmarks/cnn_step.py --threads 1 --models cnn3 --rounds 3 --steps 5   # a quick look
    python benchmarks/cnn_step.py --out benchmarks/results/cnn_step_2core.md

Models (NCHW float32 input 3x32x32, batch 32, 10 classes, cross-entropy, Adam lr 1e-3):
  cnn3    three blocks Conv3x3 -> BatchNorm2D -> ReLU (32, 64, 128 channels; max pool 2 after the first
          two), global average pooling, Linear(128, 10)
  resnet  a ResNet-8 for 32x32: stem Conv3x3(16) + BN + ReLU, three residual stages (16, 32, 64
          channels, stride 2 at the second and third, 1x1 projection shortcuts), GAP, Linear
Both frameworks get the same architecture (torch's weights are copied into ours) and the same batches.
Timing: rounds interleaved (ours, torch, ours, ...), each a median over `steps` timed steps after a
warm-up; reported: the median of the round medians and ratio = torch / ours (>= 1: we are faster).
"""

import argparse
import datetime
import platform
import statistics
import time

import numpy as np

import pycyxwiz as cx

try:
    import torch
except ImportError:  # the pycyxwiz column alone
    torch = None

BATCH, CLASSES, LR = 32, 10, 1e-3


def cx_cnn3():
    m = cx.SequentialModel()
    chans = [3, 32, 64, 128]
    for i in range(3):
        m.add(cx.Conv2DModule(chans[i], chans[i + 1], 3, padding=1))
        m.add(cx.BatchNorm2DModule(chans[i + 1]))
        m.add(cx.ReLUModule())
        if i < 2:
            m.add(cx.MaxPool2DModule(2))
    m.add(cx.GlobalAvgPool2DModule())
    m.add(cx.FlattenModule())  # a no-op view, so that the layer indices are torch's (AdaptiveAvgPool2d, Flatten)
    m.add(cx.LinearModule(128, CLASSES))
    return m


def torch_cnn3():
    nn = torch.nn
    layers, chans = [], [3, 32, 64, 128]
    for i in range(3):
        layers += [nn.Conv2d(chans[i], chans[i + 1], 3, padding=1), nn.BatchNorm2d(chans[i + 1]), nn.ReLU()]
        if i < 2:
            layers.append(nn.MaxPool2d(2))
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, CLASSES))


def cx_block(cin, cout, stride):
    body = cx.SequentialModel()
    for m in (cx.Conv2DModule(cin, cout, 3, stride, 1, use_bias=False), cx.BatchNorm2DModule(cout), cx.ReLUModule(),
              cx.Conv2DModule(cout, cout, 3, 1, 1, use_bias=False), cx.BatchNorm2DModule(cout)):
        body.add(m)
    shortcut = None
    if stride != 1 or cin != cout:
        shortcut = cx.SequentialModel()
        shortcut.add(cx.Conv2DModule(cin, cout, 1, stride, use_bias=False))
        shortcut.add(cx.BatchNorm2DModule(cout))
    return cx.ResidualModule(body, shortcut)


def cx_resnet():
    m = cx.SequentialModel()
    for layer in (cx.Conv2DModule(3, 16, 3, 1, 1, use_bias=False), cx.BatchNorm2DModule(16), cx.ReLUModule(),
                  cx_block(16, 16, 1), cx.ReLUModule(), cx_block(16, 32, 2), cx.ReLUModule(), cx_block(32, 64, 2),
                  cx.ReLUModule(), cx.GlobalAvgPool2DModule(), cx.FlattenModule(), cx.LinearModule(64, CLASSES)):
        m.add(layer)
    return m


def torch_block(cin, cout, stride):
    """cx_block in torch: the same submodule names (body, shortcut), so named_parameters() line up."""
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
                                      nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout))
            self.shortcut = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                             if stride != 1 or cin != cout else None)

        def forward(self, x):
            return self.body(x) + (x if self.shortcut is None else self.shortcut(x))

    return Block()


def torch_resnet():
    nn = torch.nn
    return nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(), torch_block(16, 16, 1),
                         nn.ReLU(), torch_block(16, 32, 2), nn.ReLU(), torch_block(32, 64, 2), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, CLASSES))


MODELS = {"cnn3": (cx_cnn3, torch_cnn3), "resnet": (cx_resnet, torch_resnet)}


def copy_weights(ours, theirs):
    mine = dict(ours.named_parameters())
    for name, p in theirs.named_parameters():
        mine[name][...] = p.detach().numpy()


def batches(n):
    rng = np.random.default_rng(0)
    return [(rng.standard_normal((BATCH, 3, 32, 32)).astype(np.float32), rng.integers(0, CLASSES, BATCH))
            for _ in range(n)]


def time_ours(model, opt, data):
    loss = cx.CrossEntropyLoss()
    times = []
    for x, y in data:
        t0 = time.perf_counter()
        out = model.forward(x)
        model.zero_grad()
        model.backward(loss.backward(out, y))
        opt.step(model)
        times.append(time.perf_counter() - t0)
    return times


def time_torch(model, opt, data):
    loss = torch.nn.CrossEntropyLoss()
    times = []
    for x, y in data:
        xt, yt = torch.from_numpy(x), torch.from_numpy(y)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss(model(xt), yt).backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    return times


def measure(name, threads, rounds, steps, warmup):
    cx.set_num_threads(threads)
    make_cx, make_torch = MODELS[name]
    cx.manual_seed(0)
    ours = make_cx()
    opt_ours = cx.AdamOptimizer(LR)
    data = batches(steps + warmup)
    result = {"ours": []}
    if torch is not None:
        torch.set_num_threads(threads)
        torch.manual_seed(0)
        theirs = make_torch()
        copy_weights(ours, theirs)
        opt_torch = torch.optim.Adam(theirs.parameters(), lr=LR)
        result["torch"] = []
    for _ in range(rounds):
        result["ours"].append(statistics.median(time_ours(ours, opt_ours, data)[warmup:]))
        if torch is not None:
            result["torch"].append(statistics.median(time_torch(theirs, opt_torch, data)[warmup:]))
    return {k: statistics.median(v) for k, v in result.items()}, {k: (min(v), max(v)) for k, v in result.items()}


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--out", default="", help="also write the table to this markdown file")
    p.add_argument("--quick", action="store_true", help="CI smoke run: one thread, one round of 2 steps")
    args = p.parse_args()
    if args.quick:
        args.threads, args.rounds, args.steps, args.warmup = [1], 1, 2, 1
    lines = [f"# CNN training step, pycyxwiz vs PyTorch ({datetime.date.today()})", "",
             f"Machine: {cpu_name()}, {platform.machine()}; torch {torch.__version__ if torch else 'not installed'}; "
             f"convolutions: {cx.build_info()['conv']}",
             f"Batch {BATCH} of 3x32x32, Adam; {args.rounds} interleaved rounds of {args.steps} steps "
             f"(+{args.warmup} warm-up); median of the round medians (min..max).", "",
             "| model | threads | pycyxwiz ms | torch ms | torch / pycyxwiz |", "|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    for name in args.models:
        for threads in args.threads:
            med, span = measure(name, threads, args.rounds, args.steps, args.warmup)
            ours = f"{med['ours'] * 1e3:.1f} ({span['ours'][0] * 1e3:.1f}..{span['ours'][1] * 1e3:.1f})"
            theirs = (f"{med['torch'] * 1e3:.1f} ({span['torch'][0] * 1e3:.1f}..{span['torch'][1] * 1e3:.1f})"
                      if "torch" in med else "-")
            ratio = f"{med['torch'] / med['ours']:.2f}" if "torch" in med else "-"
            line = f"| {name} | {threads} | {ours} | {theirs} | {ratio} |"
            lines.append(line)
            print(line, flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
