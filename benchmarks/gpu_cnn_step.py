#!/usr/bin/env python3
"""Time one ResNet-18 training step on a GPU: pycyxwiz (eager, and its CUDA-graph step) vs PyTorch with
cudnn.benchmark = True, same model, same batches, one process.

    python benchmarks/gpu_cnn_step.py                        # ResNet-18 for 32x32, batch 256, 5 rounds
    python benchmarks/gpu_cnn_step.py --batch 128 --rounds 3
    python benchmarks/gpu_cnn_step.py --quick                # smoke run (tiny widths; the host emulator too)

Model: the CIFAR ResNet-18 (stem Conv3x3(64) + BN + ReLU; four stages of two basic blocks, 64, 128, 256,
512 channels, stride 2 from the second stage, 1x1 projection shortcuts; global average pooling;
Linear(512, 10)), NCHW float32 input 3x32x32, cross-entropy, SGD with momentum 0.9 (lr 0.05). torch's
weights are copied into ours. Inputs are device tensors (torch CUDA tensors that pycyxwiz reads
through __cuda_array_interface__); without CUDA in torch (the emulator) numpy batches and no torch.
Timing: rounds interleaved (ours, ours graphed, torch, ...), each the median of `steps` steps
synchronised one by one after a warm-up; reported: the median of the round medians and ratio =
ours / torch (<= 1: we are faster). Targets (issue 33): eager <= 1.0, graphed <= 0.8.
Our convolution algorithms: cuDNN's heuristic, or with CYXWIZ_CUDNN_BENCHMARK=1 its timed search at a
shape's first use (read once per process: run twice to compare).
"""

import argparse
import datetime
import os
import statistics
import sys
import time

import numpy as np

import pycyxwiz as cx
from cnn_step import cx_block, torch, torch_block  # the same basic block as the CPU benchmark (torch may be None)

CLASSES, LR, MOMENTUM = 10, 0.05, 0.9


def stages(width):
    return [(width, 1), (2 * width, 2), (4 * width, 2), (8 * width, 2)]


def cx_resnet18(width):
    m = cx.SequentialModel()
    for layer in (cx.Conv2DModule(3, width, 3, 1, 1, use_bias=False), cx.BatchNorm2DModule(width), cx.ReLUModule()):
        m.add(layer)
    cin = width
    for cout, stride in stages(width):
        for s in (stride, 1):
            m.add(cx_block(cin, cout, s))
            m.add(cx.ReLUModule())
            cin = cout
    for layer in (cx.GlobalAvgPool2DModule(), cx.LinearModule(cin, CLASSES)):
        m.add(layer)
    return m


def torch_resnet18(width):
    nn = torch.nn
    layers, cin = [nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU()], width
    for cout, stride in stages(width):
        for s in (stride, 1):
            layers += [torch_block(cin, cout, s), nn.ReLU()]
            cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, CLASSES)]
    return nn.Sequential(*layers)


def copy_weights(ours, theirs):
    # In order: the layer indices differ at the end (torch's Flatten), the order does not.
    for (_, mine), (_, p) in zip(ours.named_parameters(), theirs.named_parameters()):
        mine[...] = p.detach().cpu().numpy()


def ours_eager(model):
    loss, opt = cx.CrossEntropyLoss(), cx.SGDOptimizer(LR, momentum=MOMENTUM)

    def step(x, y):
        out = model.forward(x)
        model.zero_grad()
        model.backward(loss.backward(out, y))
        opt.step(model)
    return step


def ours_graphed(model):
    ddp = cx.distributed.DistributedDataParallel(model)
    train = cx.distributed.TrainStep(ddp, cx.CrossEntropyLoss(), cx.SGDOptimizer(LR, momentum=MOMENTUM),
                                     cuda_graphs=True)
    step = lambda x, y: train(x, y)  # noqa: E731
    step.train_step = train
    return step


def torch_step(model):
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    lossfn = torch.nn.CrossEntropyLoss()

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        lossfn(model(x), y).backward()
        opt.step()
    return step


def timed(step, sync, data, warmup, steps):
    for i in range(warmup):
        step(*data[i % len(data)])
    sync()
    times = []
    for i in range(steps):
        t0 = time.perf_counter()
        step(*data[i % len(data)])
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def compare(models, make_theirs, copy, host, args, makers, title):
    """Ours eager (models[0]) and CUDA-graph-stepped (models[1]) against torch's step on the same data,
    rounds interleaved: prints the table and writes it to args.out. makers: (ours_eager, ours_graphed,
    torch_step); make_theirs: torch's model (None without a CUDA torch); title(graphed) heads the table."""
    use_torch = make_theirs is not None and torch is not None and torch.cuda.is_available()
    ours_eager_, ours_graphed_, torch_step_ = makers
    data = host
    if use_torch:
        torch.manual_seed(0)
        theirs = make_theirs()
        for m in models:
            copy(m, theirs)
        theirs = theirs.cuda()
        data = [(torch.from_numpy(x).cuda(), torch.from_numpy(y).cuda()) for x, y in host]
        torch.cuda.synchronize()
    for m in models:
        m.to("cuda")
    steps = {"ours": ours_eager_(models[0]), "ours, CUDA graph": ours_graphed_(models[1])}
    syncs = {name: cx.cuda.synchronize for name in steps}
    if use_torch:
        steps["torch"] = torch_step_(theirs)
        syncs["torch"] = torch.cuda.synchronize
    medians = {name: [] for name in steps}
    for _ in range(args.rounds):
        for name, step in steps.items():
            medians[name].append(timed(step, syncs[name], data, args.warmup, args.steps))
    graphed = steps["ours, CUDA graph"].train_step
    lines = [title(f"{'replayed' if graphed.graphed else 'NOT graphed'} ({graphed.replays} replays)"), "",
             "| variant | step ms (median) | min..max of rounds | / torch |", "|---|---:|---:|---:|"]
    base = statistics.median(medians["torch"]) if use_torch else None
    for name, ms in medians.items():
        m = statistics.median(ms)
        ratio = f"{m / base:.3f}" if base else "-"
        lines.append(f"| {name} | {m * 1e3:.2f} | {min(ms) * 1e3:.2f}..{max(ms) * 1e3:.2f} | {ratio} |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--width", type=int, default=64, help="channels of the first stage (ResNet-18: 64)")
    p.add_argument("--image", type=int, default=32)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="smoke run: width 4, batch 4, 8x8 images, 1 round of 2 steps")
    p.add_argument("--out", default="", help="also write the table to this markdown file")
    args = p.parse_args()
    if args.quick:
        args.batch, args.width, args.image, args.rounds, args.steps, args.warmup = 4, 4, 8, 1, 2, 2
    if not cx.cuda.is_available():
        print(f"no usable GPU: {cx.cuda.unavailable_reason()}", file=sys.stderr)
        sys.exit(2)  # run_on_gpu.sh's "limited": nothing to measure here
    use_torch = torch is not None and torch.cuda.is_available()
    if not cx.distributed.is_initialized():
        cx.distributed.init()  # a world of one, for TrainStep
    rng = np.random.default_rng(0)
    host = [(rng.standard_normal((args.batch, 3, args.image, args.image)).astype(np.float32),
             rng.integers(0, CLASSES, args.batch).astype(np.int64)) for _ in range(8)]
    cx.manual_seed(0)
    if use_torch:
        torch.backends.cudnn.benchmark = True
    models = [cx_resnet18(args.width), cx_resnet18(args.width)]
    algorithms = "cuDNN search" if os.environ.get("CYXWIZ_CUDNN_BENCHMARK") == "1" else "cuDNN heuristic"
    compare(models, (lambda: torch_resnet18(args.width)) if use_torch else None, copy_weights, host, args,
            (ours_eager, ours_graphed, torch_step),
            lambda graphed: f"ResNet-18 (width {args.width}) training step, batch {args.batch}, 3x{args.image}x"
                            f"{args.image}, {datetime.date.today()}; {args.rounds} rounds x {args.steps} steps; the "
                            f"CUDA-graph step {graphed}; our algorithms: {algorithms}")
    cx.distributed.finalize()


if __name__ == "__main__":
    main()
