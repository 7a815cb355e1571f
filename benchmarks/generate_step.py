#!/usr/bin/env python3
"""Text generation with and without the key/value cache: SequentialModel.generate(use_cache=True/False).

    python benchmarks/generate_step.py             # 4 blocks, d_model 128, context 256, 240 new tokens
    python benchmarks/generate_step.py --quick     # CI smoke run

The model: embedding (vocab 256) + learned positions, causal pre-norm blocks (4 heads, ff 4 d_model),
LayerNorm, Linear to the vocabulary; random weights (the speed does not depend on them). One prompt of
--prompt tokens; --new tokens generated (prompt + new <= context: the window never slides). Both ways
give the same ids (checked here, and in tests/test_sequence_layers.py). Reported: seconds each (median of
--rounds, interleaved) and the ratio uncached / cached.
"""

import argparse
import statistics
import time

import numpy as np

import pycyxwiz as cx


def model(d, blocks, context, vocab=256):
    cx.manual_seed(0)
    m = cx.SequentialModel()
    m.add(cx.EmbeddingModule(vocab, d))
    m.add(cx.PositionalEncodingModule(context, d, learned=True))
    for _ in range(blocks):
        m.add(cx.TransformerEncoderModule(d, 4, 4 * d, dropout=0.0, causal=True))
    m.add(cx.LayerNormModule(d))
    m.add(cx.LinearModule(d, vocab))
    return m


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--blocks", type=int, default=4)
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--prompt", type=int, default=16)
    p.add_argument("--new", type=int, default=240)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="smoke run: tiny sizes, one round")
    args = p.parse_args()
    if args.quick:
        args.d_model, args.blocks, args.context, args.prompt, args.new, args.rounds = 32, 2, 32, 4, 20, 1
    cx.set_num_threads(args.threads)
    m = model(args.d_model, args.blocks, args.context)
    prompt = np.random.default_rng(0).integers(0, 256, (1, args.prompt))
    times = {True: [], False: []}
    outputs = {}
    for _ in range(args.rounds):
        for cache in (True, False):
            t0 = time.perf_counter()
            outputs[cache] = m.generate(prompt, args.new, temperature=0.8, top_k=40, seed=1, use_cache=cache)
            times[cache].append(time.perf_counter() - t0)
    assert np.array_equal(outputs[True], outputs[False]), "the cached generation differs from the uncached one"
    cached, full = statistics.median(times[True]), statistics.median(times[False])
    print(f"generate: {args.blocks} blocks, d_model {args.d_model}, context {args.context}, prompt {args.prompt}, "
          f"{args.new} new tokens, {args.threads} thread(s); median of {args.rounds}\n")
    print("| use_cache | seconds | tokens/s |\n|---|---:|---:|")
    print(f"| True | {cached:.3f} | {args.new / cached:.0f} |")
    print(f"| False | {full:.3f} | {args.new / full:.0f} |")
    print(f"\nuncached / cached: {full / cached:.2f}x")


if __name__ == "__main__":
    main()
