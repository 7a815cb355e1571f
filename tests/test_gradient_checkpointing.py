"""SequentialModel.set_gradient_checkpointing(segments): activations kept only at segment boundaries,
each earlier segment's forward recomputed in backward.

The oracle is the same model trained without checkpointing, from the same seed, in the same process:
recomputation replays the same kernels on the same inputs and Dropout redraws the same masks, so
gradients, parameters after several Adam steps and the random stream's state afterwards must be equal
bit for bit (==, not a tolerance). That checkpointing really drops activations is proven twice: a layer
of an earlier segment has no cache after a checkpointed forward (its own backward raises), and a fresh
process's peak resident memory for a step is clearly lower (test_peak_memory_drops).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from harness import clean_env

import pycyxwiz as cx

SEED = 5


def build(seed=SEED):
    """13 layers, 10 segment units: Linear+ReLU pairs run fused (and stay in one segment), Dropout
    draws masks in two segments, every cached activation type (ReLU, Tanh, GELU, Dropout's mask)."""
    cx.manual_seed(seed)
    m = cx.SequentialModel()
    for layer in (cx.LinearModule(12, 24), cx.ReLUModule(), cx.DropoutModule(0.25), cx.LinearModule(24, 24),
                  cx.TanhModule(), cx.LinearModule(24, 24), cx.ReLUModule(), cx.DropoutModule(0.1),
                  cx.LinearModule(24, 24), cx.ReLUModule(), cx.LinearModule(24, 16), cx.GELUModule(),
                  cx.LinearModule(16, 5)):
        m.add(layer)
    return m


LAYERS = len(build())


def batch(step, n=32):
    rng = np.random.default_rng([77, step])
    return rng.standard_normal((n, 12)).astype(np.float32), rng.integers(0, 5, n)


def train(segments, steps=4, input_grad=False):
    """Adam steps with dropout; returns (parameters, last gradients, input gradients, rng state after)."""
    m = build()
    m.set_gradient_checkpointing(segments)
    loss, opt = cx.CrossEntropyLoss(), cx.AdamOptimizer(0.01)
    input_grads = []
    for step in range(steps):
        X, y = batch(step)
        opt.zero_grad(m)
        dx = m.backward(loss.backward(m.forward(X), y), input_grad=input_grad)
        if input_grad:
            input_grads.append(np.array(dx))
        grads = [g.copy() for g in m.gradients()]
        opt.step(m)
    return [p.copy() for p in m.parameters()], grads, input_grads, cx.get_rng_state()


def assert_identical(got, want, what):
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want)):
        assert a.shape == b.shape and np.array_equal(a, b), (
            f"{what}[{i}]: {int((a != b).sum())} of {a.size} elements differ, max |diff| {np.abs(a - b).max():.3g}")


@pytest.fixture(scope="module")
def plain():
    return train(0, input_grad=True)


@pytest.mark.parametrize("segments", [1, *range(2, LAYERS + 1), LAYERS + 3])
def test_training_is_bit_identical(plain, segments):
    params, grads, input_grads, rng = train(segments, input_grad=True)
    assert_identical(grads, plain[1], "gradients")
    assert_identical(params, plain[0], "parameters after 4 Adam steps")
    assert_identical(input_grads, plain[2], "input gradients")
    assert rng == plain[3], "the random stream ends elsewhere: the next step would draw other masks"


def test_dropout_masks_matter_here():
    """The equality above could hide a replay that skips Dropout: another seed's masks must change
    the gradients, so a wrong replay of the masks would show."""
    a, b = build(SEED), build(SEED)
    X, y = batch(0)
    loss = cx.CrossEntropyLoss()
    for m, seed in ((a, 1), (b, 2)):
        cx.manual_seed(seed)
        m.backward(loss.backward(m.forward(X), y))
    assert not np.array_equal(a.gradients()[0], b.gradients()[0])


def test_earlier_segments_drop_their_caches():
    m = build()
    X, y = batch(0)
    g = np.ones((len(X), 24), np.float32)
    m.forward(X)
    m[0].backward(g)  # plain: every layer keeps its input until the next forward
    m.set_gradient_checkpointing(2)
    assert m.gradient_checkpointing == 2
    m.forward(X)
    with pytest.raises(ValueError, match="LinearModule.backward called before forward"):
        m[0].backward(g)  # first segment: released after the forward
    m[LAYERS - 1].backward(np.ones((len(X), 5), np.float32))  # last segment: kept for backward
    m.backward(np.ones((len(X), 5), np.float32))  # recomputes the first segment
    m.eval()
    m.forward(X)  # eval: the plain forward, every layer keeps its input
    m[0].backward(g)


def test_accumulation_over_three_backwards():
    def run(segments, reuse_forward):
        m = build()
        m.set_gradient_checkpointing(segments)
        loss = cx.CrossEntropyLoss()
        out = None
        for step in range(3):  # no zero_grad: the gradients add up
            X, y = batch(step)
            if out is None or not reuse_forward:
                out = m.forward(X)
            m.backward(loss.backward(out, y))
        return [g.copy() for g in m.gradients()], cx.get_rng_state()

    for reuse in (False, True):  # True: three backwards after one forward, which a plain model allows
        want = run(0, reuse)
        for segments in (2, 3, LAYERS):
            got = run(segments, reuse)
            assert_identical(got[0], want[0], f"accumulated gradients (segments={segments}, one forward={reuse})")
            assert got[1] == want[1]


def test_eval_forward_is_unchanged():
    a, b = build(), build()
    b.set_gradient_checkpointing(3)
    X, _ = batch(0)
    for m in (a, b):
        m.eval()
    assert np.array_equal(a.forward(X), b.forward(X))
    a.train()
    b.train()
    cx.manual_seed(9)
    out_a = a.forward(X)
    cx.manual_seed(9)
    assert np.array_equal(out_a, b.forward(X))


def test_eval_between_forward_and_backward():
    """A model switched to eval() after a training forward still backpropagates that forward (the
    replay runs Dropout in training mode, with the masks it drew)."""
    results = []
    for segments in (0, 3):
        m = build()
        m.set_gradient_checkpointing(segments)
        X, y = batch(0)
        out = m.forward(X)
        m.eval()
        m.backward(cx.CrossEntropyLoss().backward(out, y))
        assert not m.training
        results.append([g.copy() for g in m.gradients()])
    assert_identical(results[1], results[0], "gradients")


def test_backward_without_forward_raises():
    m = build()
    m.set_gradient_checkpointing(3)
    with pytest.raises(ValueError, match="backward called before forward"):
        m.backward(np.ones((4, 5), np.float32))


def test_settings():
    m = build()
    assert m.gradient_checkpointing == 0
    m.set_gradient_checkpointing(4)
    assert m.gradient_checkpointing == 4
    with pytest.raises(ValueError, match="segments must be 0"):
        m.set_gradient_checkpointing(-1)
    with pytest.raises(TypeError, match="not a bool"):
        m.set_gradient_checkpointing(True)
    assert m.gradient_checkpointing == 4
    m.set_gradient_checkpointing(0)
    assert m.gradient_checkpointing == 0


def test_not_in_model_files(tmp_path):
    """A runtime setting: the file of a checkpointed model is byte for byte a plain model's, and a
    loaded model starts with checkpointing off."""
    a, b = build(), build()
    b.set_gradient_checkpointing(3)
    a.save(str(tmp_path / "a.cyxmodel"))
    b.save(str(tmp_path / "b.cyxmodel"))
    assert (tmp_path / "a.cyxmodel").read_bytes() == (tmp_path / "b.cyxmodel").read_bytes()
    assert cx.SequentialModel.load(str(tmp_path / "b.cyxmodel")).gradient_checkpointing == 0


# ------------------------------------------------------------------------------------------- memory

MEMORY = r'''
import json, sys
import numpy as np
import pycyxwiz as cx

segments = int(sys.argv[1])
cx.manual_seed(0)
m = cx.SequentialModel()
m.add(cx.LinearModule(784, 2048))
for _ in range(7):
    m.add(cx.ReLUModule())
    m.add(cx.LinearModule(2048, 2048))
m.add(cx.ReLUModule())
m.add(cx.LinearModule(2048, 10))
m.set_gradient_checkpointing(segments)
loss, opt = cx.CrossEntropyLoss(), cx.SGDOptimizer(0.001)
rng = np.random.default_rng(0)
X = rng.standard_normal((512, 784)).astype(np.float32)
y = rng.integers(0, 10, 512)

def step():
    opt.zero_grad(m)
    m.backward(loss.backward(m.forward(X), y))
    opt.step(m)

def kib(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))

step()                 # optimizer state, BLAS buffers
m.forward(X[:1])       # the plain model's caches shrink to one row: both start from the same state
try:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")   # resets VmHWM to the current resident size
except OSError as e:
    print(json.dumps({"skip": f"cannot reset VmHWM through /proc/self/clear_refs: {e}"}))
    sys.exit(0)
base = kib("VmRSS")
for _ in range(2):
    step()
print(json.dumps({"base": base, "peak": kib("VmHWM")}))
'''


def peak_increase(tmp_path, segments):
    script = tmp_path / "memory.py"
    script.write_text(textwrap.dedent(MEMORY))
    # No host block cache and a fixed mmap threshold: every tensor is its own mapping, returned to the
    # system when freed, so the resident size follows the live tensors instead of what the cache or
    # malloc's heap happened to keep.
    env = clean_env(CYXWIZ_NUM_THREADS=1, MALLOC_MMAP_THRESHOLD_=65536, CYXWIZ_HOST_CACHE=0)
    out = subprocess.run([sys.executable, str(script), str(segments)], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout.strip().splitlines()[-1])
    if "skip" in r:
        pytest.skip(r["skip"])
    return (r["peak"] - r["base"]) / 1024


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/status and clear_refs")
def test_peak_memory_drops(tmp_path):
    """784-2048x8-10 at batch 512: the plain step's activations are 8 x 4 MiB (+ the input's copy);
    three segments keep 2 boundaries and one segment's (about 4 x 4 MiB), plus the same backward
    temporaries. Expected ~0.6x; 0.75x leaves room for allocator noise and fails if nothing is dropped."""
    plain = peak_increase(tmp_path, 0)
    checkpointed = peak_increase(tmp_path, 3)
    assert plain > 30, f"the plain step's peak grew by only {plain:.1f} MiB: the measurement is broken"
    assert checkpointed < 0.75 * plain, f"peak increase: checkpointed {checkpointed:.1f} MiB, plain {plain:.1f} MiB"
