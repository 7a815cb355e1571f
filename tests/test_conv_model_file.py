"""Convolutional models in model files, gradient checkpointing and the trainer's shapes.

Model files: a save/load round trip of a ResNet-style model (convolutions, BatchNorm buffers, residual
blocks) gives bit-identical outputs in eval and training mode and the same buffers; a tiny file that
describes a huge convolution is refused without allocating it. Gradient checkpointing replays a
segment's forward: BatchNorm must not count that batch twice, so the running statistics and the
gradients equal those of a plain step bit for bit.
"""

import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import pycyxwiz as cx
from test_model_file import container, layer_bytes, s, tensor_bytes


def small_resnet(seed=0):
    cx.manual_seed(seed)
    body = cx.SequentialModel()
    for m in (cx.Conv2DModule(8, 8, 3, padding=1, use_bias=False), cx.BatchNorm2DModule(8), cx.ReLUModule(),
              cx.Conv2DModule(8, 8, 3, padding=1, use_bias=False), cx.BatchNorm2DModule(8)):
        body.add(m)
    down = cx.SequentialModel()
    for m in (cx.Conv2DModule(8, 16, 3, stride=2, padding=1), cx.BatchNorm2DModule(16), cx.LeakyReLUModule(0.1),
              cx.Conv2DModule(16, 16, 3, padding=1)):
        down.add(m)
    model = cx.SequentialModel()
    for m in (cx.Conv2DModule(3, 8, 3, padding=1), cx.BatchNorm2DModule(8), cx.SwishModule(), cx.ResidualModule(body),
              cx.MishModule(), cx.ResidualModule(down, cx.Conv2DModule(8, 16, 1, stride=2)), cx.ELUModule(),
              cx.MaxPool2DModule(2), cx.AvgPool2DModule(2, padding=1), cx.GlobalAvgPool2DModule(), cx.BatchNorm1DModule(16),
              cx.FlattenModule(), cx.LinearModule(16, 10)):
        model.add(m)
    return model


def test_conv_model_round_trip_is_bit_exact(tmp_path):
    model = small_resnet()
    x = np.random.default_rng(0).standard_normal((4, 3, 8, 8)).astype(np.float32)
    for _ in range(2):
        model.forward(x)  # training forwards move the running statistics away from their start
    path = tmp_path / "resnet.cyxmodel"
    model.save(str(path))
    loaded = cx.SequentialModel.load(str(path))
    assert repr(loaded) == repr(model)
    for (n1, a), (n2, b) in zip(model.named_parameters(), loaded.named_parameters()):
        assert n1 == n2 and np.array_equal(a, b)
    buffers = model.named_buffers()
    assert len(buffers) == 3 * 5 and buffers[0][0] == "1.running_mean"
    assert any(n.startswith("5.shortcut.0.") for n, _ in model.named_parameters())
    for (n1, a), (n2, b) in zip(buffers, loaded.named_buffers()):
        assert n1 == n2 and np.array_equal(a, b), n1
    model.eval()
    loaded.eval()
    np.testing.assert_array_equal(loaded.forward(x), model.forward(x))
    model.train()
    loaded.train()
    np.testing.assert_array_equal(loaded.forward(x), model.forward(x))


def test_tiny_file_claiming_a_huge_convolution_is_refused_without_allocating_it(tmp_path):
    # Conv2DModule(1e5, 1e5, kernel 100 x 100): 4e14 bytes of weights described in a few hundred bytes.
    path = tmp_path / "huge_conv.cyxmodel"
    attrs = dict(in_channels=1e5, out_channels=1e5, kernel_h=100.0, kernel_w=100.0, stride_h=1.0, stride_w=1.0,
                 padding_h=0.0, padding_w=0.0, dilation_h=1.0, dilation_w=1.0, groups=1.0, bias=0.0)
    payload = (struct.pack("<I", 1) + layer_bytes("Conv2DModule", **attrs) + struct.pack("<I", 1) + s("0.weight")
               + struct.pack("<BIqqqq", 0, 4, 100000, 100000, 100, 100))
    path.write_bytes(container(payload))
    code = textwrap.dedent(f"""
        import resource, pycyxwiz as cx
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
        try:
            cx.SequentialModel.load({str(path)!r})
        except cx.ModelFormatError as e:
            print("FORMATERROR", e)
        except BaseException as e:
            print("OTHER", type(e).__name__, e)
        """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "FORMATERROR" in out.stdout, out.stdout + out.stderr


def test_a_batchnorm_buffer_of_the_wrong_shape_is_refused(tmp_path):
    attrs = dict(num_features=3.0, eps=1e-5, momentum=0.1, sync=0.0)
    tensors = [("0.weight", np.ones(3, np.float32)), ("0.bias", np.zeros(3, np.float32)),
               ("0.running_mean", np.zeros(3, np.float32)), ("0.running_var", np.ones((1, 3), np.float32)),
               ("0.num_batches_tracked", np.array(5, np.int64))]
    payload = struct.pack("<I", 1) + layer_bytes("BatchNorm1DModule", **attrs) + struct.pack("<I", len(tensors))
    good = payload + b"".join(tensor_bytes(n, a if n != "0.running_var" else a[0]) for n, a in tensors)
    bad = payload + b"".join(tensor_bytes(n, a) for n, a in tensors)
    (tmp_path / "good.cyxmodel").write_bytes(container(good))
    loaded = cx.SequentialModel.load(str(tmp_path / "good.cyxmodel"))
    assert [n for n, _ in loaded.named_buffers()] == ["0.running_mean", "0.running_var", "0.num_batches_tracked"]
    assert int(loaded.buffers()[2]) == 5
    (tmp_path / "bad.cyxmodel").write_bytes(container(bad))
    with pytest.raises(cx.ModelFormatError, match="running_var"):
        cx.SequentialModel.load(str(tmp_path / "bad.cyxmodel"))


@pytest.mark.parametrize("segments", [2, 3])
def test_gradient_checkpointing_counts_each_batch_once(segments):
    plain, checkpointed = small_resnet(), small_resnet()
    checkpointed.set_gradient_checkpointing(segments)
    loss = cx.CrossEntropyLoss()
    opt1, opt2 = cx.SGDOptimizer(0.05, momentum=0.9), cx.SGDOptimizer(0.05, momentum=0.9)
    rng = np.random.default_rng(1)
    for _ in range(3):
        x = rng.standard_normal((6, 3, 8, 8)).astype(np.float32)
        y = rng.integers(0, 10, 6)
        for model, opt in ((plain, opt1), (checkpointed, opt2)):
            out = model.forward(x)
            model.zero_grad()
            model.backward(loss.backward(out, y))
            opt.step(model)
    for (n, a), (_, b) in zip(plain.named_parameters(), checkpointed.named_parameters()):
        np.testing.assert_array_equal(a, b, err_msg=n)
    for (n, a), (_, b) in zip(plain.named_buffers(), checkpointed.named_buffers()):
        np.testing.assert_array_equal(a, b, err_msg=n)
    assert int(dict(checkpointed.named_buffers())["1.num_batches_tracked"]) == 3


def test_optimizers_never_step_buffers():
    model = small_resnet()
    x = np.random.default_rng(2).standard_normal((4, 3, 8, 8)).astype(np.float32)
    model.forward(x)
    before = [b.copy() for b in model.buffers()]
    model.zero_grad()
    model.backward(np.ones((4, 10), np.float32))
    cx.AdamOptimizer(0.1).step(model)
    for a, b in zip(before, model.buffers()):
        np.testing.assert_array_equal(a, b)
