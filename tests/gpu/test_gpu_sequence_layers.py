"""The sequence-model layers on a GPU: EmbeddingModule, PositionalEncodingModule, LayerNormModule,
MultiHeadAttentionModule and TransformerEncoderModule. The oracle is the CPU engine (itself held to torch
by tests/test_sequence_layers.py): the same model from the same seed on the CPU and on the GPU, fed the
same arrays; forward, input gradient and parameter gradients (accumulated twice) within 1e-5 of the
largest value (float32 sums in other orders: cuBLAS's, the kernels' block sums); a causal language
model's Adam steps; the out-of-range id error; a graphed Transformer step equal to the eager one (with
dropout: the nested dropouts' seeds are redrawn for each replay); DDP 2 ranks x 4 sequences == 1 x 8.

Dropout draws its GPU masks from another stream than the CPU's, so equality runs use dropout 0 in
training (dropout > 0 is checked in eval, and by its properties). Needs a usable GPU (skipped otherwise).
"""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from gpu_support import DDP_PRELUDE, assert_same_digest, ddp_reports, requires_gpu, requires_two_gpus, seq, twins
from gpu_support import close as close_to
from harness import rank_env

import pycyxwiz as cx

pytestmark = requires_gpu

SEQ = dict(rtol=1e-5, atol=1e-5)


def close(got, want, what, tol=SEQ):
    close_to(got, want, what, tol)


def floats(shape, seed=1):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 1.5 + 0.3).astype(np.float32)
    x.flat[:2] = [40.0, -40.0]  # large scores: the softmax's and the norm's stability
    return x


def ids(shape, vocab, seed=1, dtype=np.int64):
    """Ids with many repeats (a few rows of the table take most of the gradient)."""
    rng = np.random.default_rng(seed)
    return np.minimum(rng.geometric(0.35, shape) - 1, vocab - 1).astype(dtype)


# name: (layers, input maker); dropout 0 where training would draw masks.
CASES = {
    "embedding_int64": (lambda: [cx.EmbeddingModule(13, 8)], lambda: ids((4, 7), 13)),
    "embedding_float_ids": (lambda: [cx.EmbeddingModule(13, 8)], lambda: ids((4, 7), 13, dtype=np.float32)),
    "embedding_wide": (lambda: [cx.EmbeddingModule(5, 300)], lambda: ids((3, 9), 5)),
    "positions_sinusoidal": (lambda: [cx.PositionalEncodingModule(16, 8)], lambda: floats((3, 5, 8))),
    "positions_learned": (lambda: [cx.PositionalEncodingModule(16, 8, learned=True)], lambda: floats((3, 5, 8))),
    "layernorm": (lambda: [cx.LayerNormModule(8)], lambda: floats((3, 5, 8))),
    "layernorm_two_dims": (lambda: [cx.LayerNormModule((4, 6), eps=1e-3)], lambda: floats((2, 3, 4, 6))),
    "layernorm_wide_offset": (lambda: [cx.LayerNormModule(300)], lambda: floats((70, 300)) + 1000.0),
    "attention_1_head": (lambda: [cx.MultiHeadAttentionModule(8, 1)], lambda: floats((3, 5, 8))),
    "attention_2_heads_causal": (lambda: [cx.MultiHeadAttentionModule(8, 2, causal=True)], lambda: floats((3, 5, 8))),
    "attention_4_heads_no_bias": (lambda: [cx.MultiHeadAttentionModule(12, 4, bias=False)], lambda: floats((2, 6, 12))),
    "attention_8_heads_causal": (lambda: [cx.MultiHeadAttentionModule(16, 8, causal=True)], lambda: floats((3, 7, 16))),
    "attention_one_position": (lambda: [cx.MultiHeadAttentionModule(8, 2, causal=True)], lambda: floats((4, 1, 8))),
    "transformer_pre_norm_causal": (lambda: [cx.TransformerEncoderModule(16, 4, 32, dropout=0.0, causal=True)],
                                    lambda: floats((3, 6, 16))),
    "transformer_post_norm_relu": (lambda: [cx.TransformerEncoderModule(16, 2, 24, dropout=0.0, activation="relu",
                                                                        norm_first=False)], lambda: floats((2, 5, 16))),
    "gpt_stack": (lambda: [cx.EmbeddingModule(11, 16), cx.PositionalEncodingModule(8, 16, learned=True),
                           cx.TransformerEncoderModule(16, 2, 32, dropout=0.0, causal=True),
                           cx.TransformerEncoderModule(16, 4, 32, dropout=0.0, causal=True), cx.LayerNormModule(16),
                           cx.LinearModule(16, 11)], lambda: ids((3, 8), 11)),
}


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("name", list(CASES))
def test_sequence_layer_on_the_gpu_matches_the_cpu(name, training):
    layers, make_input = CASES[name]
    cpu, gpu = twins(layers)
    if not training:
        cpu.eval()
        gpu.eval()
    x = make_input()
    out_c, out_g = cpu.forward(x), gpu.forward(x)
    assert isinstance(out_g, cx.Tensor) and out_g.device == "cuda:0", f"{name}: forward returned {out_g!r}"
    close(out_g, out_c, f"{name}: forward")
    g = np.random.default_rng(2).standard_normal(out_c.shape).astype(np.float32)
    takes_ids = x.dtype != np.float32 or name.startswith(("embedding", "gpt"))
    cpu.zero_grad()
    gpu.zero_grad()
    dx_c, dx_g = cpu.backward(g, input_grad=not takes_ids), gpu.backward(g, input_grad=not takes_ids)
    if not takes_ids:
        close(dx_g, dx_c, f"{name}: input gradient")
    names = [n for n, _ in cpu.named_parameters()]
    for pname, a, b in zip(names, cpu.gradients(), gpu.gradients()):
        close(b, a, f"{name}: gradient of {pname}")
    cpu.backward(g)
    gpu.backward(g)
    for pname, a, b in zip(names, cpu.gradients(), gpu.gradients()):
        close(b, a, f"{name}: accumulated gradient of {pname}")


def test_the_embedding_gradient_sums_repeated_ids_in_the_cpus_order():
    """The scatter-add is deterministic: each table element summed in position order, the CPU's order,
    so the float32 sums are bit-identical (no atomics whose order varies), run after run."""
    cpu, gpu = twins(lambda: [cx.EmbeddingModule(6, 40)])
    x = ids((16, 33), 6, seed=5)
    assert np.bincount(x.ravel()).max() > 100  # a row takes over 100 gradients
    g = np.random.default_rng(3).standard_normal((16, 33, 40)).astype(np.float32)
    grads = []
    for model in (cpu, gpu, gpu):
        model.zero_grad()
        model.forward(x)
        model.backward(g)
        grads.append(np.asarray(model.gradients()[0]))
    np.testing.assert_array_equal(grads[1], grads[0], err_msg="GPU embedding gradient vs the CPU's")
    np.testing.assert_array_equal(grads[2], grads[1], err_msg="two GPU runs")


def test_layernorm_and_attention_gradients_are_deterministic():
    """The parameters' gradients of LayerNorm (chunked double sums) and attention (GEMMs, column sums)
    are the same bits run after run."""
    _, gpu = twins(lambda: [cx.LayerNormModule(24), cx.MultiHeadAttentionModule(24, 3, causal=True)])
    x = floats((5, 130, 24))
    g = np.random.default_rng(4).standard_normal(x.shape).astype(np.float32)
    runs = []
    for _ in range(2):
        gpu.zero_grad()
        gpu.forward(x)
        gpu.backward(g)
        runs.append([np.asarray(p) for p in gpu.gradients()])
    for i, (a, b) in enumerate(zip(*runs)):
        np.testing.assert_array_equal(a, b, err_msg=f"gradient {i}, second run")


def test_dropout_in_attention_and_blocks_on_the_gpu():
    """Training with dropout > 0: the GPU's masks differ from the CPU's, so check what must hold: the
    output differs from eval's, a second forward draws new masks, and eval equals the CPU's eval."""
    cpu, gpu = twins(lambda: [cx.TransformerEncoderModule(16, 4, 32, dropout=0.3, causal=True)])
    x = floats((3, 6, 16))
    a, b = np.asarray(gpu.forward(x)), np.asarray(gpu.forward(x))
    assert not np.allclose(a, b), "two training forwards drew the same dropout masks"
    gpu.backward(np.ones_like(a))
    assert all(np.isfinite(np.asarray(p)).all() for p in gpu.gradients())
    cpu.eval()
    gpu.eval()
    close(gpu.forward(x), cpu.forward(x), "eval forward with dropout=0.3")
    assert not np.allclose(a, np.asarray(gpu.forward(x)), atol=1e-3), "training forward equals eval's"


def test_attention_dropout_is_unbiased_on_the_gpu():
    """Attention's dropout on the weights scales the kept ones by 1/keep, so E[dropped P] = P: the mean
    output of 200 draws approaches eval's as closely as the CPU's does (a wrong scale, or the mask on
    another tensor, lands far off: 0.06 is the sampling error of 200 draws at p = 0.5)."""
    errors = {}
    for device in ("cpu", "cuda"):
        cx.manual_seed(0)
        model = seq(cx.MultiHeadAttentionModule(8, 2, dropout=0.5)).to(device)
        x = floats((64, 4, 8))
        mean = np.mean([np.asarray(model.forward(x)) for _ in range(200)], axis=0)
        model.eval()
        want = np.asarray(model.forward(x))
        errors[device] = float(np.abs(mean - want).mean() / np.abs(want).mean())
    assert errors["cuda"] < 0.1 and errors["cuda"] < 1.5 * errors["cpu"], errors


def test_a_causal_language_model_trains_on_the_gpu_as_on_the_cpu(tmp_path):
    """Five Adam steps of a 2-block causal LM (embedding, learned positions, pre-norm blocks, final norm,
    vocabulary head; (N, T, V) cross-entropy): the parameters agree; the GPU model's file loads on the CPU."""
    cpu, gpu = twins(CASES["gpt_stack"][0], seed=3)
    loss = cx.CrossEntropyLoss()
    opts = cx.AdamOptimizer(0.01), cx.AdamOptimizer(0.01)
    for step in range(5):
        rng = np.random.default_rng([6, step])
        tokens = rng.integers(0, 11, (4, 9))
        x, y = tokens[:, :-1], tokens[:, 1:].astype(np.int64)
        losses = []
        for model, opt in zip((cpu, gpu), opts):
            out = model.forward(x)
            losses.append(loss.forward(out, y))
            model.zero_grad()
            model.backward(loss.backward(out, y))
            opt.step(model)
        assert abs(losses[1] - losses[0]) <= 1e-5 * abs(losses[0]), f"step {step}: loss {losses}"
    for (pname, _), a, b in zip(cpu.named_parameters(), cpu.parameters(), gpu.parameters()):
        if pname.endswith("self_attn.in_proj_bias"):
            # The key bias's gradient is zero in exact arithmetic (it adds q.b to every score of a row,
            # which the softmax ignores): rounding noise, which Adam turns into whole steps of either
            # sign on either device. The query and value biases are compared.
            a, b = np.delete(np.asarray(a), np.s_[16:32]), np.delete(np.asarray(b), np.s_[16:32])
        close(b, a, f"{pname} after 5 Adam steps", dict(rtol=1e-4, atol=1e-5))
    path = tmp_path / "lm.cyxmodel"
    gpu.save(str(path))
    back = cx.SequentialModel.load(str(path))
    x = np.random.default_rng(9).integers(0, 11, (2, 8))
    close(back.forward(x), gpu.forward(x), "a GPU model saved and loaded on the CPU")


@pytest.mark.parametrize("bad,where,dtype", [(13, "(1, 2)", np.int64), (-1, "(0, 4)", np.int32),
                                             (13.0, "(1, 2)", np.float32), (2.5, "(0, 4)", np.float32)],
                         ids=["too-large", "negative-int32", "float-too-large", "not-an-integer"])
def test_an_invalid_id_on_the_gpu_raises_the_cpus_error(bad, where, dtype):
    """The GPU kernel flags the first invalid position; the engine reads it back and raises the CPU's
    message, naming the id, its position and the vocabulary. The model stays usable."""
    cpu, gpu = twins(lambda: [cx.EmbeddingModule(13, 8), cx.LinearModule(8, 3)])
    x = ids((2, 5), 13, dtype=dtype)
    r, c = (1, 2) if where == "(1, 2)" else (0, 4)
    x[r, c] = bad
    x[1, 4] = bad  # a later invalid position: the first one is named
    messages = []
    for model in (cpu, gpu):
        with pytest.raises(ValueError) as info:
            model.forward(x)
        messages.append(str(info.value))
    assert messages[1] == messages[0], f"GPU: {messages[1]!r}\nCPU: {messages[0]!r}"
    shown = f"{bad:g}" if dtype == np.float32 else str(bad)
    assert f"token id {shown} at position {where}" in messages[1], messages[1]
    good = ids((2, 5), 13)
    close(gpu.forward(good), cpu.forward(good), "forward after the error")


def test_the_transformer_under_autocast_on_the_gpu():
    """cx.autocast("bfloat16"): the linear layers (in the block and the head) multiply bfloat16 operands,
    attention's products and the norms stay float32, on the GPU as on the CPU (a bfloat16 tolerance)."""
    cpu, gpu = twins(lambda: [cx.TransformerEncoderModule(16, 4, 32, dropout=0.0, causal=True),
                              cx.LinearModule(16, 5)])
    x = floats((3, 6, 16))
    with cx.autocast("bfloat16"):
        out_g = gpu.forward(x)
        want = cpu.forward(x)
    plain = cpu.forward(x)
    diff = np.abs(np.asarray(out_g) - np.asarray(plain)).max()
    assert 1e-5 < diff < 0.5, f"autocast on the GPU differs from float32 by {diff}"
    close(out_g, want, "bfloat16 transformer, GPU vs CPU", dict(rtol=1e-2, atol=1e-2))
    g = np.random.default_rng(5).standard_normal(np.asarray(want).shape).astype(np.float32)
    with cx.autocast("bfloat16"):
        cpu.forward(x)
    cpu.zero_grad()
    gpu.zero_grad()
    close(gpu.backward(g, input_grad=True), cpu.backward(g, input_grad=True), "bfloat16 input gradient",
          dict(rtol=1e-2, atol=1e-2))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_attention_under_autocast_takes_16_bit_projections_on_the_gpu_as_on_the_cpu(dtype, causal):
    """Under cx.autocast, attention's input and output projections multiply 16-bit operands on the GPU as
    on the CPU (Q, K, V rounded to the 16-bit type, the core in float32): the GPU's forward, input gradient
    and parameter gradients lie far closer to the CPU's autocast results than autocast lies from float32
    (the two differ only where float32 sums in another order round to the other 16-bit neighbour)."""
    cpu, gpu = twins(lambda: [cx.MultiHeadAttentionModule(32, 4, causal=causal)])
    x = floats((3, 7, 32))
    g = np.random.default_rng(4).standard_normal((3, 7, 32)).astype(np.float32)

    def run(model, half):
        model.zero_grad()
        if half:
            with cx.autocast(dtype):
                out = model.forward(x)
        else:
            out = model.forward(x)
        dx = model.backward(g, input_grad=True)
        return [np.asarray(out), np.asarray(dx)] + [np.asarray(p).copy() for p in model.gradients()]

    want, plain, got = run(cpu, True), run(cpu, False), run(gpu, True)
    names = ["forward", "input gradient"] + [n for n, _ in cpu.named_parameters()]
    for what, w, p, o in zip(names, want, plain, got):
        rounding = float(np.abs(w - p).mean())
        assert rounding > 0, f"{what}: autocast changed nothing on the CPU"
        off = float(np.abs(o - w).mean())
        assert off < 0.05 * rounding, (f"{dtype} {what}: the GPU is {off:.3g} from the CPU's autocast result on "
                                       f"average, autocast itself moves it {rounding:.3g} from float32")


STEP_SCRIPT = r'''
import json, sys
import numpy as np
import pycyxwiz as cx
import pycyxwiz.distributed as D

D.init()
rng = np.random.RandomState(9)
tokens = rng.randint(0, 11, (5 * 4 + 2, 7))
X = tokens[:, :-1].astype(np.float32)   # the ids as the trainer's float32
y = tokens[:, 1:].astype(np.int64)
result = {}
for graphs in (False, True):
    cx.manual_seed(4)
    model = cx.SequentialModel()
    for layer in (cx.EmbeddingModule(11, 16), cx.PositionalEncodingModule(6, 16),
                  cx.TransformerEncoderModule(16, 4, 32, dropout=0.2, causal=True),
                  cx.TransformerEncoderModule(16, 2, 24, dropout=0.2, activation="relu", norm_first=False),
                  cx.LinearModule(16, 11)):
        model.add(layer)
    model.to("cuda")
    ddp = D.DistributedDataParallel(model)
    step = D.TrainStep(ddp, cx.CrossEntropyLoss(), cx.AdamOptimizer(0.02), cuda_graphs=graphs)
    for epoch in range(2):
        step.reset()
        for i in range(0, len(X), 4):
            step(X[i:i + 4], y[i:i + 4])
    result[str(graphs)] = dict(graphed=step.graphed, replays=step.replays, loss=step.loss(),
                               params=[p.tolist() for p in model.parameters()])
json.dump(result, open(sys.argv[1], "w"))
D.finalize()
'''


def test_graphed_transformer_step_matches_the_eager_step(ranks, tmp_path):
    """A language model's training step (embedding with float ids, attention, norms, dropout inside the
    blocks and on the attention weights) captured into a CUDA graph and replayed: the same loss and
    weights as eager steps. Equal only if every nested dropout redraws its seed before each replay as
    an eager forward draws it (a seed frozen in the graph would repeat one mask)."""
    script, out = tmp_path / "step.py", tmp_path / "step.json"
    script.write_text(STEP_SCRIPT)
    ranks.command([sys.executable, str(script), str(out)], rank_env(), timeout=180)
    result = json.loads(out.read_text())
    eager, graphed = result["False"], result["True"]
    assert graphed["graphed"] and graphed["replays"] == 2 * 5 - 1, graphed  # the short last batch runs eagerly
    assert not eager["graphed"]
    np.testing.assert_allclose(graphed["loss"], eager["loss"], rtol=1e-5)
    for i, (g, e) in enumerate(zip(graphed["params"], eager["params"])):
        np.testing.assert_allclose(np.array(g), np.array(e), rtol=1e-5, atol=1e-6, err_msg=f"parameter {i}")


# 2 ranks x 4 sequences against 1 process x 8 (tests/test_sequence_layers.py's TWO_RANKS_VS_ONE, with
# the oracle on this rank's GPU too): a causal LM of 2 blocks with its (N, T, vocab) cross-entropy.
DDP_GPT = DDP_PRELUDE + r'''
BACKEND = os.environ.get("DISTRIBUTED_BACKEND", "cpu")


def lm(seed=0):
    cx.manual_seed(seed)
    m = cx.SequentialModel()
    m.add(cx.EmbeddingModule(11, 16))
    m.add(cx.PositionalEncodingModule(8, 16, learned=True))
    for _ in range(2):
        m.add(cx.TransformerEncoderModule(16, 2, 32, dropout=0.0, causal=True))
    m.add(cx.LayerNormModule(16))
    m.add(cx.LinearModule(16, 11))
    return m


def tokens(step, n):
    rng = np.random.default_rng([5, step])
    t = rng.integers(0, 11, (n, 9))
    return t[:, :-1], t[:, 1:].astype(np.int64)


STEPS, N = 4, 8
B = N // WS
D.init()
model = lm()
if BACKEND != "nccl":
    model.to("cuda:0")   # the CPU backend does not move models: the ranks share one GPU
ddp = D.DistributedDataParallel(model)   # NCCL: moves the model to cuda:LOCAL_RANK
expect(model.device.startswith("cuda"), f"model on {model.device}")
opt = cx.SGDOptimizer(0.1, momentum=0.9)
for step in range(STEPS):
    X, y = tokens(step, N)
    out = ddp.forward(shard(X, B))
    ddp.backward(LOSS.backward(out, shard(y, B)))
    ddp.update_parameters(opt)
one = lm().to(model.device)
opt1 = cx.SGDOptimizer(0.1, momentum=0.9)
for step in range(STEPS):
    X, y = tokens(step, N)
    out = one.forward(X)
    one.zero_grad()
    one.backward(LOSS.backward(out, y))
    opt1.step(one)
worst = max(float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30)) for a, b in zip(ddp.parameters(), one.parameters()))
finish(digest=digest(ddp.parameters()), worst=worst)
'''


@pytest.mark.parametrize("backend", [pytest.param("nccl", marks=requires_two_gpus), "cpu"],
                         ids=["nccl-2-gpus", "cpu-2-ranks-on-1-gpu"])
def test_ddp_of_a_causal_lm_on_gpus_two_ranks_equal_one_process(ranks, backend):
    """DDP of a GPU language model: 2 ranks x 4 sequences == 1 process x 8 after four SGD steps (1e-5 of
    the largest value), parameters bit-identical on the ranks; over NCCL on two GPUs, and on the CPU
    backend with both ranks on one GPU."""
    results = ranks.run(DDP_GPT, 2, env={"DISTRIBUTED_BACKEND": backend}, timeout=120)
    reports = ddp_reports(ranks, results, 2)
    worst = max(rep["worst"] for rep in reports)
    assert worst <= 1e-5, f"2 ranks x 4 differ from 1 x 8 by {worst:.3g} of the largest value"
    assert_same_digest(reports)
