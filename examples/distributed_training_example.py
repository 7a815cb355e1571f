"""Data-parallel training with pycyxwiz, end to end: the guide's comprehensive example.

    python examples/distributed_training_example.py                          # one process
    ./launch_distributed.sh 2 python examples/distributed_training_example.py --epochs 5
    ./launch_distributed.sh 2 python examples/distributed_training_example.py --low-level
    torchrun --nproc_per_node=2 examples/distributed_training_example.py --scale-lr sqrt
    ./launch_distributed.sh 2 python examples/distributed_training_example.py --shard-optimizer

Two ways to train the same model on the same synthetic 10-class problem:

* default: `DistributedTrainer.fit` does everything (sharding with DistributedSampler, gradient
  averaging, metrics reduced across ranks, a validation split, rank-0 logging, checkpoints every
  --checkpoint-every epochs, resuming with --resume);
* --low-level: the loop written out with `DistributedDataParallel`, `DistributedSampler` and
  `DistributedBatchIterator`, including gradient accumulation over --accumulation-steps batches
  with `no_sync()` and metrics reduced with `all_reduce` by hand.

Both end alike: loss and accuracy on a held-out test set (every rank takes part, every rank gets the
same numbers), predictions for a few test rows, the model saved by rank 0 only (--out), finalize().
"""

import argparse
import os
import time

import numpy as np

import pycyxwiz as cx

dist = cx.distributed


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=64, help="per rank (effective batch = this x world size)")
    p.add_argument("--lr", type=float, default=0.001, help="learning rate for --base-batch-size samples per step")
    p.add_argument("--base-batch-size", type=int, default=64, help="the batch size --lr was tuned for")
    p.add_argument("--scale-lr", choices=["linear", "sqrt", "none"], default="linear",
                   help="scale --lr to the effective batch size (default: linear)")
    p.add_argument("--samples", type=int, default=6000, help="size of the synthetic training set")
    p.add_argument("--validation-split", type=float, default=0.1)
    p.add_argument("--checkpoint-dir", default="./checkpoints")
    p.add_argument("--checkpoint-every", type=int, default=1, help="epochs between checkpoints (0: none)")
    p.add_argument("--resume", nargs="?", const="latest", default="",
                   help="continue from a checkpoint: the newest in --checkpoint-dir (no value) or a path")
    p.add_argument("--low-level", action="store_true",
                   help="write the loop out with DDP + DistributedSampler + DistributedBatchIterator")
    p.add_argument("--accumulation-steps", type=int, default=2, help="--low-level: batches per optimizer step")
    p.add_argument("--shard-optimizer", action="store_true",
                   help="shard the optimizer step across the ranks (ZeRO stage 1: each rank updates 1/N)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--out", default="distributed_model.cyxmodel", help="rank 0 saves the trained model here")
    args = p.parse_args()
    if args.low_level and args.resume:
        p.error("--resume continues a DistributedTrainer run; the --low-level loop saves plain .cyxmodel files")
    return args


def make_dataset(n, features=784, classes=10, seed=0):
    rng = np.random.default_rng(seed)
    prototypes = rng.normal(0.0, 1.0, size=(classes, features))
    y = rng.integers(0, classes, size=n)
    X = prototypes[y] + rng.normal(0.0, 6.5, size=(n, features))
    return X.astype(np.float32), y


def build_model():
    model = cx.SequentialModel()
    model.add(cx.LinearModule(784, 256))
    model.add(cx.ReLUModule())
    model.add(cx.LinearModule(256, 10))
    return model


def log(*a):
    """Only rank 0 talks (every rank computes the same numbers)."""
    if dist.is_master():
        print(*a, flush=True)


# ---- the high-level path -------------------------------------------------------------------------

def ddp_settings(args):
    ddp_config = dist.DDPConfig()
    ddp_config.broadcast_parameters = True     # every rank starts from rank 0's weights
    ddp_config.bucket_size_mb = 25             # gradients are averaged bucket by bucket during backward
    ddp_config.shard_optimizer = args.shard_optimizer  # each rank updates its 1/N of every bucket
    return ddp_config


def train_with_trainer(args, model, loss_fn, optimizer, X_train, y_train):
    trainer = dist.DistributedTrainer(model, loss_fn, optimizer, ddp_settings(args))

    config = dist.DistributedTrainingConfig()
    config.epochs = args.epochs
    config.batch_size = args.batch_size            # per rank
    config.shuffle = True
    config.seed = args.seed                        # each epoch's order: seed + epoch, the same on every rank
    config.verbose = True                          # rank 0 only
    config.log_every_n_batches = 10
    config.checkpoint_every_n_epochs = args.checkpoint_every
    config.checkpoint_dir = args.checkpoint_dir    # checkpoint_epoch_0005.ckpt, written by rank 0
    config.save_on_master_only = True
    config.validation_split = args.validation_split  # this last fraction of X_train is held out
    if args.resume == "latest":
        config.resume_from_checkpoint = "latest"   # newest checkpoint in checkpoint_dir, if there is one
    elif args.resume:
        trainer.load_checkpoint(args.resume)       # collective: every rank loads it

    history = trainer.fit(X_train, y_train, config)

    # The history covers every epoch from the first, including those a resumed checkpoint had done
    # (history.start_epoch of them); every rank holds the same numbers.
    log(f"trained epochs {history.start_epoch + 1}..{len(history.train_losses)} "
        f"on {history.world_size} rank(s), effective batch {history.effective_batch_size}, "
        f"{history.total_time_seconds:.2f} s, {history.samples_per_second:.0f} samples/s")
    for i, (loss, acc) in enumerate(zip(history.train_losses, history.train_accuracies)):
        val = ""
        if i < len(history.val_losses):
            val = f"  val loss {history.val_losses[i]:.4f}  val accuracy {history.val_accuracies[i]:.4f}"
        resumed = "  (from the checkpoint)" if i < history.start_epoch else ""
        log(f"  history[{i}]: loss {loss:.4f}  accuracy {acc:.4f}{val}{resumed}")
    return trainer


# ---- the low-level path --------------------------------------------------------------------------

def reduced_mean(loss_sum, correct, count):
    """Sum (loss, correct, count) over the ranks: every rank gets the global figures."""
    totals = np.array([loss_sum, correct, count], dtype=np.float64)
    dist.all_reduce(totals, op=dist.ReduceOp.SUM)
    return totals[0] / totals[2], totals[1] / totals[2]


def evaluate_sharded(model, loss_fn, X, y, batch_size=256):
    """Each rank evaluates its own contiguous part of X (each row exactly once), then the sums are reduced."""
    part = np.array_split(np.arange(len(X)), dist.get_world_size())[dist.get_rank()]
    model.eval()
    loss_sum = correct = 0.0
    for start in range(0, len(part), batch_size):
        idx = part[start:start + batch_size]
        out = model.forward(X[idx])
        loss_sum += loss_fn.forward(out, y[idx]) * len(idx)
        correct += cx.accuracy(out, y[idx]) * len(idx)
    model.train()
    return reduced_mean(loss_sum, correct, len(part))


def train_low_level(args, model, loss_fn, optimizer, X_train, y_train):
    # Hold out the last fraction for validation, as DistributedTrainingConfig.validation_split does.
    n_val = int(len(X_train) * args.validation_split)
    X_fit, y_fit = X_train[:len(X_train) - n_val], y_train[:len(y_train) - n_val]
    X_val, y_val = X_train[len(X_train) - n_val:], y_train[len(y_train) - n_val:]

    ddp = dist.DistributedDataParallel(model, ddp_settings(args))
    log(f"DDP buckets (parameters, bytes), reduced in this order: {ddp.bucket_sizes()}")
    if ddp.shard_optimizer:
        log(f"optimizer step sharded across {ddp.get_world_size()} ranks: each updates 1/{ddp.get_world_size()} "
            "of every bucket")

    # Every rank gets the same number of samples, so the same number of batches; drop_last=True leaves
    # out the few rows that do not divide evenly (the default repeats a few rows instead).
    sampler = dist.DistributedSampler(dataset_size=len(X_fit), shuffle=True, seed=args.seed, drop_last=True)
    batches = dist.DistributedBatchIterator(sampler, batch_size=args.batch_size)
    steps = args.accumulation_steps
    log(f"{sampler.local_size()} of {sampler.total_size()} samples per rank, {batches.num_batches()} batches "
        f"of {args.batch_size}, an optimizer step every {steps} batches "
        f"(effective batch {args.batch_size * steps * ddp.get_world_size()})")

    n_batches = batches.num_batches()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)                # IMPORTANT: a new order each epoch, the same on every rank;
                                                # the iterator starts its next pass (as batches.reset(epoch))
        t0 = time.perf_counter()
        loss_sum = correct = count = 0.0
        for i, indices in enumerate(batches):
            xb, yb = X_fit[indices], y_fit[indices]
            # The batches of one optimizer step: `steps` of them, fewer in the last group of the epoch.
            group_start = i - i % steps
            group_size = min(steps, n_batches - group_start)
            last_of_group = i == group_start + group_size - 1

            output = ddp.forward(xb)
            loss = loss_fn.forward(output, yb)
            grad = loss_fn.backward(output, yb) / group_size   # the mean over the whole group
            if last_of_group:
                ddp.backward(grad)              # averages the accumulated sum across ranks, bucket by bucket
                ddp.update_parameters(optimizer)   # waits for the all-reduce, steps, zeroes the gradients
            else:
                with ddp.no_sync():             # accumulate locally: no communication for this batch
                    ddp.backward(grad)

            loss_sum += loss * len(indices)
            correct += cx.accuracy(output, yb) * len(indices)
            count += len(indices)
        train_loss, train_acc = reduced_mean(loss_sum, correct, count)
        val_loss, val_acc = evaluate_sharded(model, loss_fn, X_val, y_val) if n_val else (float("nan"),) * 2
        log(f"Epoch {epoch + 1}/{args.epochs} - loss {train_loss:.4f} - acc {train_acc:.4f} - "
            f"val_loss {val_loss:.4f} - val_acc {val_acc:.4f} - {time.perf_counter() - t0:.2f}s")

        if args.checkpoint_every and (epoch + 1) % args.checkpoint_every == 0:
            # Only rank 0 writes; the barrier keeps the others from racing ahead of (or reading) a half-written file.
            if dist.is_master():
                os.makedirs(args.checkpoint_dir, exist_ok=True)
                model.save(os.path.join(args.checkpoint_dir, f"lowlevel_epoch_{epoch + 1:04d}.cyxmodel"))
            dist.barrier()
    return ddp


# ---- main ----------------------------------------------------------------------------------------

def main():
    args = parse_args()
    dist.init()                                  # RANK/WORLD_SIZE/... (or torchrun, srun, mpirun); a world of one otherwise
    rank, world = dist.get_rank(), dist.get_world_size()
    cx.manual_seed(args.seed)                    # the same initial weights everywhere (DDP broadcasts rank 0's anyway)

    X, y = make_dataset(args.samples + 1000)     # every rank builds the same arrays
    X_train, y_train, X_test, y_test = X[:args.samples], y[:args.samples], X[args.samples:], y[args.samples:]

    lr = args.lr
    if args.scale_lr != "none":
        # The effective batch grows with the world size (and with accumulation in the low-level path).
        per_step = args.batch_size * (args.accumulation_steps if args.low_level else 1)
        lr = dist.scale_learning_rate(args.lr, args.base_batch_size, rule=args.scale_lr, batch_size=per_step)
    log(f"world size {world}, batch {args.batch_size} per rank, learning rate {args.lr} -> {lr:g} "
        f"({args.scale_lr} scaling), {'DDP loop' if args.low_level else 'DistributedTrainer'}")

    model = build_model()
    loss_fn = cx.CrossEntropyLoss()
    optimizer = cx.AdamOptimizer(lr)

    if args.low_level:
        train_low_level(args, model, loss_fn, optimizer, X_train, y_train)
        test_loss, test_acc = evaluate_sharded(model, loss_fn, X_test, y_test)
        model.eval()
        predictions = model.forward(X_test[:8]).argmax(axis=1)
    else:
        trainer = train_with_trainer(args, model, loss_fn, optimizer, X_train, y_train)
        test_loss, test_acc = trainer.evaluate(X_test, y_test)     # collective: every rank gets the same
        predictions = trainer.predict(X_test[:8]).argmax(axis=1)   # collective: every rank gets all rows
    log(f"test loss {test_loss:.4f}  test accuracy {test_acc:.4f}")
    log(f"predictions {predictions.tolist()}, labels {y_test[:8].tolist()}")

    if dist.is_master():                         # save once, not once per rank
        model.save(args.out)
        log(f"saved {args.out} (rank {rank} of {world})")
    dist.barrier()                               # nobody leaves before the file is complete
    dist.finalize()


if __name__ == "__main__":
    main()
