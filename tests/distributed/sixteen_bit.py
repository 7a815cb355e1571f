"""Rank-script pieces shared by the 16-bit tests (test_gradient_dtype.py, test_ddp_mixed_precision.py,
tests/gpu/test_gpu_gradient_dtype.py), spliced after a PRELUDE that defines np and expect.

ORACLE: the 16-bit exchange's exact result at 2 ranks, from both ranks' own float32 gradients
(bfloat16: each rank rounds its gradient, the sum is rounded once, then the average; float16: each
rank rounds gradient/2, the sum is rounded once), and expect_exchanged(), which compares DDP's result
with it bit for bit.
DIGITS_DATA: scikit-learn's digits, standardised, shuffled and split 3:1 into Xtr, ytr, Xte, yte.
"""

ORACLE = r'''

def bf16(x):
    """float32 -> bfloat16 (nearest, ties to even) -> float32, as the engine rounds."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return r.astype(np.uint32).view(np.float32)


def f16(x):
    return np.asarray(x, dtype=np.float32).astype(np.float16).astype(np.float32)


def expect_exchanged(have, g0, g1, wire, step):
    """have: the gradients DDP exchanged in `wire` at `step`; g0, g1: ranks 0 and 1's own gradients."""
    if wire == "bfloat16":
        want = bf16(bf16(bf16(g0) + bf16(g1)) / np.float32(2))
    else:
        half = np.float32(0.5)
        want = f16(f16(g0 * half) + f16(g1 * half))
    expect(not np.array_equal(have, (g0 + g1) / 2), f"step {step}: the gradients are the float32 average: not exchanged in {wire}")
    if not np.array_equal(have, want):
        i = int(np.flatnonzero(have != want)[0])
        expect(False, f"step {step}: {int((have != want).sum())} of {have.size} gradients differ from the {wire} oracle; "
                      f"first at {i}: {have[i]!r} vs {want[i]!r} (float32 average {(g0[i] + g1[i]) / 2!r})")
'''

DIGITS_DATA = r'''
from sklearn.datasets import load_digits

X, y = load_digits(return_X_y=True)
X = ((X - X.mean(0)) / (X.std(0) + 1e-6)).astype(np.float32)
y = y.astype(np.int64)
order = np.random.default_rng(0).permutation(len(X))   # the file is ordered by writer: shuffle before the split
X, y = X[order], y[order]
cut = len(X) * 3 // 4
Xtr, ytr, Xte, yte = X[:cut], y[:cut], X[cut:], y[cut:]
'''
