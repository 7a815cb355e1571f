"""A PyTorch DDP training script, as the DDP guides write it, on pycyxwiz's backend: the only change
from a Gloo script is `import pycyxwiz.torch` and backend="cyxwiz".

    torchrun --nproc_per_node=2 examples/torch_ddp.py --epochs 5 --batch-size 64
    torchrun --nproc_per_node=2 examples/torch_ddp.py --backend gloo      # the same run on Gloo

Synthetic data (a fixed random teacher network labels Gaussian inputs), DistributedSampler, Adam;
rank 0 prints the loss and accuracy per epoch and the time per epoch.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import pycyxwiz.torch  # noqa: F401 - registers the "cyxwiz" backend


def make_data(n: int = 4096, features: int = 32, classes: int = 4):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, features, generator=g)
    teacher = torch.randn(features, classes, generator=g)
    return TensorDataset(x, (x @ teacher).argmax(1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--backend", default="cyxwiz")
    args = ap.parse_args()

    dist.init_process_group(backend=args.backend)  # RANK, WORLD_SIZE, MASTER_ADDR/PORT from torchrun
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))

    data = make_data()
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)
    model = DDP(nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 4)))
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        start, total, correct, seen = time.perf_counter(), 0.0, 0, 0
        for x, y in loader:
            opt.zero_grad()
            out = model(x)
            loss = nn.functional.cross_entropy(out, y)
            loss.backward()
            opt.step()
            total += loss.item() * len(y)
            correct += int((out.argmax(1) == y).sum())
            seen += len(y)
        stats = torch.tensor([total, correct, seen], dtype=torch.float64)
        dist.all_reduce(stats)
        if rank == 0:
            print(f"epoch {epoch + 1}/{args.epochs}: loss {stats[0] / stats[2]:.4f}, accuracy "
                  f"{stats[1] / stats[2]:.3f}, {time.perf_counter() - start:.2f} s ({args.backend}, {world} ranks)",
                  flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
