""".cyxmodel files: bit-exact round trips, atomic writes, and a clear cx.ModelFormatError for every
kind of damaged or foreign file.

Container (cpp/cyxwiz/common/binary_io.h), little-endian:
    magic "CYXMODEL" (8) | version u32 | reserved u32 | payload size u64 | payload | crc32(payload) u32
Payload (cpp/cyxwiz/nn/model_file.h):
    module count u32 | per module: type str, attr count u32, (key str, f64)... |
    tensor count u32 | per tensor: name str, dtype u8, rank u32, dims i64..., data
    str = u32 length + bytes
"""

import os
import shutil
import struct
import subprocess
import sys
import textwrap
import threading
import zlib

import numpy as np
import pytest

import pycyxwiz as cx

HEADER = 24
MAGIC = b"CYXMODEL"


# --------------------------------------------------------------------------------------------- helpers


def build(layers, seed=0):
    cx.manual_seed(seed)
    model = cx.SequentialModel()
    for layer in layers:
        model.add(layer)
    return model


def every_layer_model(seed=0):
    return build(
        [
            cx.LinearModule(6, 8),
            cx.ReLUModule(),
            cx.LinearModule(8, 8, bias=False),
            cx.SigmoidModule(),
            cx.LinearModule(8, 5),
            cx.TanhModule(),
            cx.GELUModule(),
            cx.DropoutModule(0.3),
            cx.LinearModule(5, 4, bias=False),
            cx.SoftmaxModule(),
        ],
        seed,
    )


MODELS = {
    "every-layer": every_layer_model,
    "linear-bias": lambda: build([cx.LinearModule(3, 2)]),
    "linear-nobias": lambda: build([cx.LinearModule(3, 2, bias=False)]),
    "relu": lambda: build([cx.LinearModule(3, 4), cx.ReLUModule()]),
    "sigmoid": lambda: build([cx.LinearModule(3, 4), cx.SigmoidModule()]),
    "tanh": lambda: build([cx.LinearModule(3, 4), cx.TanhModule()]),
    "gelu": lambda: build([cx.LinearModule(3, 4), cx.GELUModule()]),
    "softmax": lambda: build([cx.LinearModule(3, 4), cx.SoftmaxModule()]),
    "dropout": lambda: build([cx.LinearModule(3, 4), cx.DropoutModule(0.125), cx.LinearModule(4, 2, bias=False)]),
    "dropout-p0": lambda: build([cx.LinearModule(3, 4), cx.DropoutModule(0.0)]),
    "no-parameters": lambda: build([cx.ReLUModule(), cx.TanhModule()]),
    "wide": lambda: build([cx.LinearModule(300, 200), cx.GELUModule(), cx.LinearModule(200, 10)]),
}


def in_features(model):
    for i in range(len(model)):
        layer = model[i]
        if isinstance(layer, cx.LinearModule):
            return layer.in_features
    return 3


def saved(tmp_path, model=None, name="model.cyxmodel"):
    model = model if model is not None else every_layer_model()
    path = tmp_path / name
    model.save(str(path))
    return path


def s(text):
    b = text.encode()
    return struct.pack("<I", len(b)) + b


def layer_bytes(type_name, **attrs):
    out = s(type_name) + struct.pack("<I", len(attrs))
    for key in sorted(attrs):
        out += s(key) + struct.pack("<d", attrs[key])
    return out


def tensor_bytes(name, array, dtype_code=None):
    codes = {np.dtype(np.float32): 0, np.dtype(np.float64): 1, np.dtype(np.int32): 2, np.dtype(np.int64): 3}
    code = codes[array.dtype] if dtype_code is None else dtype_code
    out = s(name) + struct.pack("<BI", code, array.ndim)
    out += b"".join(struct.pack("<q", d) for d in array.shape)
    return out + np.ascontiguousarray(array).tobytes()


def container(payload, version=1, reserved=0):
    return (MAGIC + struct.pack("<IIQ", version, reserved, len(payload)) + payload
            + struct.pack("<I", zlib.crc32(payload) & 0xFFFFFFFF))


def load_error(path):
    with pytest.raises(cx.ModelFormatError) as info:
        cx.SequentialModel.load(str(path))
    assert isinstance(info.value, ValueError)
    message = str(info.value)
    assert str(path) in message, message
    return message


def decode_payload(payload):
    """Independent reader of the payload format: [(type, attrs)], [(name, array)], bytes consumed."""
    pos = 0

    def take(n):
        nonlocal pos
        assert pos + n <= len(payload)
        chunk = payload[pos:pos + n]
        pos += n
        return chunk

    def u32():
        return struct.unpack("<I", take(4))[0]

    def string():
        return take(u32()).decode()

    layers = []
    for _ in range(u32()):
        type_name = string()
        attrs = {}
        for _ in range(u32()):
            key = string()
            attrs[key] = struct.unpack("<d", take(8))[0]
        layers.append((type_name, attrs))
    dtypes = {0: np.float32, 1: np.float64, 2: np.int32, 3: np.int64}
    tensors = []
    for _ in range(u32()):
        name = string()
        code, rank = struct.unpack("<BI", take(5))
        shape = struct.unpack(f"<{rank}q", take(8 * rank))
        dtype = np.dtype(dtypes[code])
        n = int(np.prod(shape)) if rank else 1
        tensors.append((name, np.frombuffer(take(n * dtype.itemsize), dtype).reshape(shape)))
    return layers, tensors, pos


# ------------------------------------------------------------------------------------------ round trip


@pytest.mark.parametrize("name", list(MODELS))
def test_round_trip_is_bit_exact(tmp_path, name):
    model = MODELS[name]()
    path = saved(tmp_path, model)
    loaded = cx.SequentialModel.load(str(path))

    assert repr(loaded) == repr(model)
    assert len(loaded) == len(model)
    assert loaded.num_parameters() == model.num_parameters()
    names_a = [n for n, _ in model.named_parameters()]
    names_b = [n for n, _ in loaded.named_parameters()]
    assert names_a == names_b
    for (_, a), (_, b) in zip(model.named_parameters(), loaded.named_parameters()):
        assert a.dtype == b.dtype == np.float32
        assert a.shape == b.shape
        assert np.array_equal(a, b)
        assert a.tobytes() == b.tobytes()
        assert not np.shares_memory(a, b)
    for i in range(len(model)):
        assert type(loaded[i]) is type(model[i])
        if isinstance(model[i], cx.LinearModule):
            assert loaded[i].bias == model[i].bias
            assert loaded[i].in_features == model[i].in_features
            assert loaded[i].out_features == model[i].out_features
        if isinstance(model[i], cx.DropoutModule):
            assert loaded[i].p == model[i].p

    x = np.random.default_rng(0).normal(size=(7, in_features(model))).astype(np.float32)
    model.eval()
    loaded.eval()
    out_a, out_b = model.forward(x), loaded.forward(x)
    assert np.array_equal(out_a, out_b)


def test_loaded_model_is_independent_and_trains(tmp_path):
    model = every_layer_model()
    loaded = cx.SequentialModel.load(str(saved(tmp_path, model)))
    original = [p.copy() for p in model.parameters()]
    loaded.parameters()[0][...] = 7.0
    for p, o in zip(model.parameters(), original):
        assert np.array_equal(p, o)
    # Loaded models accept gradients and optimizer steps like any other.
    x = np.ones((3, 6), np.float32)
    loaded.eval()
    out = loaded.forward(x)
    loaded.backward(cx.CrossEntropyLoss().backward(out, np.array([0, 1, 2])))
    assert any(np.any(g) for g in loaded.gradients())


def test_round_trip_preserves_special_float_values_bitwise(tmp_path):
    model = build([cx.LinearModule(4, 3)])
    weight, bias = model.parameters()
    weight[...] = np.array(
        [[np.nan, np.inf, -np.inf, -0.0],
         [np.float32(1e-45), -np.float32(1e-40), np.finfo(np.float32).max, np.finfo(np.float32).tiny],
         [1.0, -1.0, 1 / 3, np.pi]],
        dtype=np.float32,
    )
    bias[...] = np.array([-0.0, 0.0, np.float32(1e-42)], np.float32)
    loaded = cx.SequentialModel.load(str(saved(tmp_path, model)))
    for a, b in zip(model.parameters(), loaded.parameters()):
        assert a.tobytes() == b.tobytes()


def test_empty_model_round_trip(tmp_path):
    loaded = cx.SequentialModel.load(str(saved(tmp_path, cx.SequentialModel())))
    assert len(loaded) == 0
    assert loaded.parameters() == []


def test_file_layout_matches_the_documented_format(tmp_path):
    model = every_layer_model()
    raw = saved(tmp_path, model).read_bytes()
    assert raw[:8] == MAGIC
    version, reserved, payload_size = struct.unpack("<IIQ", raw[8:HEADER])
    assert version == 1
    assert reserved == 0
    assert len(raw) == HEADER + payload_size + 4
    payload = raw[HEADER:HEADER + payload_size]
    assert struct.unpack("<I", raw[-4:])[0] == zlib.crc32(payload) & 0xFFFFFFFF

    layers, tensors, consumed = decode_payload(payload)
    assert consumed == len(payload)
    assert [t for t, _ in layers] == [model[i].__class__.__name__ for i in range(len(model))]
    assert layers[0][1] == {"in_features": 6.0, "out_features": 8.0, "bias": 1.0}
    assert layers[2][1] == {"in_features": 8.0, "out_features": 8.0, "bias": 0.0}
    assert layers[7][1] == {"p": 0.3}
    assert [n for n, _ in tensors] == [n for n, _ in model.named_parameters()]
    for (_, stored), (_, live) in zip(tensors, model.named_parameters()):
        assert stored.dtype == np.float32
        assert np.array_equal(stored, live)


def test_handcrafted_file_loads(tmp_path):
    weight = np.array([[1.5, -2.0, 0.25]], np.float32)
    payload = (struct.pack("<I", 2) + layer_bytes("LinearModule", in_features=3.0, out_features=1.0, bias=0.0)
               + layer_bytes("TanhModule") + struct.pack("<I", 1) + tensor_bytes("0.weight", weight))
    path = tmp_path / "hand.cyxmodel"
    path.write_bytes(container(payload))
    model = cx.SequentialModel.load(str(path))
    assert repr(model) == repr(build([cx.LinearModule(3, 1, bias=False), cx.TanhModule()]))
    assert np.array_equal(model.parameters()[0], weight)
    x = np.array([[1.0, 1.0, 4.0]], np.float32)
    np.testing.assert_allclose(model.forward(x), np.tanh(x @ weight.T), rtol=1e-6)


def test_load_accepts_pathlike_and_str(tmp_path):
    path = saved(tmp_path)
    a = cx.SequentialModel.load(str(path))
    b = cx.SequentialModel.load(os.fspath(path))
    assert repr(a) == repr(b)


# ------------------------------------------------------------------------------------- atomic writes


def test_save_leaves_no_temporary_files(tmp_path):
    model = every_layer_model()
    for _ in range(3):
        model.save(str(tmp_path / "m.cyxmodel"))
    assert sorted(os.listdir(tmp_path)) == ["m.cyxmodel"]


def test_save_replaces_an_existing_file(tmp_path):
    path = tmp_path / "m.cyxmodel"
    path.write_bytes(b"an old, unrelated file that is longer than nothing" * 100)
    first = build([cx.LinearModule(3, 2)], seed=1)
    first.save(str(path))
    second = build([cx.LinearModule(5, 4), cx.ReLUModule()], seed=2)
    second.save(str(path))
    loaded = cx.SequentialModel.load(str(path))
    assert repr(loaded) == repr(second)
    for a, b in zip(loaded.parameters(), second.parameters()):
        assert np.array_equal(a, b)
    assert sorted(os.listdir(tmp_path)) == ["m.cyxmodel"]


def test_save_into_missing_directory_raises_oserror(tmp_path):
    target = tmp_path / "does" / "not" / "exist" / "m.cyxmodel"
    with pytest.raises(OSError) as info:
        every_layer_model().save(str(target))
    assert isinstance(info.value, FileNotFoundError)
    assert str(target) in str(info.value)
    assert not (tmp_path / "does").exists()
    assert os.listdir(tmp_path) == []


def test_failed_save_keeps_previous_state_and_cleans_up(tmp_path):
    # The target is a directory: rename() fails after the temp file was written.
    target = tmp_path / "taken"
    target.mkdir()
    (target / "inside.txt").write_text("keep me")
    with pytest.raises(OSError) as info:
        every_layer_model().save(str(target))
    assert str(target) in str(info.value)
    assert sorted(os.listdir(tmp_path)) == ["taken"]
    assert os.listdir(target) == ["inside.txt"]
    assert (target / "inside.txt").read_text() == "keep me"


def test_concurrent_saves_to_one_path_are_atomic(tmp_path):
    # save() releases the GIL; two threads saving to one path must each publish a whole file, and neither
    # may fail (the temp name must not be shared between threads of one process).
    path = str(tmp_path / "m.cyxmodel")
    models = [build([cx.LinearModule(128, 128), cx.LinearModule(128, 64)], seed=i) for i in range(4)]
    errors, corrupt = [], []
    for _ in range(15):
        barrier = threading.Barrier(len(models))

        def work(m):
            barrier.wait()
            try:
                m.save(path)
            except Exception as e:  # noqa: BLE001
                errors.append(repr(e))

        threads = [threading.Thread(target=work, args=(m,)) for m in models]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        try:
            loaded = cx.SequentialModel.load(path)
        except cx.ModelFormatError as e:
            corrupt.append(str(e))
            continue
        assert any(all(np.array_equal(a, b) for a, b in zip(loaded.parameters(), m.parameters())) for m in models)
    assert errors == [], f"{len(errors)} saves failed, first: {errors[0]}"
    assert corrupt == [], f"{len(corrupt)} published files were corrupt, first: {corrupt[0]}"
    assert os.listdir(tmp_path) == ["m.cyxmodel"]


def dead_pid():
    """The pid of a process that has exited and been reaped."""
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          timeout=60)
    return int(proc.stdout)


HOLD = textwrap.dedent(
    """
    import fcntl, sys
    files = [open(p, "rb+") for p in sys.argv[1:]]
    for f in files:
        fcntl.flock(f, fcntl.LOCK_EX)
    print("holding", flush=True)
    sys.stdin.read()
    """
)


def test_save_removes_temporary_files_of_dead_writers_only(tmp_path):
    whole = saved(tmp_path, every_layer_model(), "source.cyxmodel").read_bytes()
    dead = dead_pid()
    live = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    holder = None
    try:
        left_by_crashes = {
            f"m.cyxmodel.tmp.{dead}.0": whole[:len(whole) // 2],   # killed in the middle of its write
            f"other.cyxmodel.tmp.{dead}.7": b"",                   # killed before its first buffer was flushed
        }
        not_ours_to_remove = {
            f"m.cyxmodel.tmp.{live.pid}.0": whole[:100],           # a live writer's
            f"locked.cyxmodel.tmp.{dead}.1": whole[:200],          # locked: a writer on another host
            f"notes.tmp.{dead}.2": b"another program's file\n",    # not a pycyxwiz model
            f"m.cyxmodel.tmp.{dead}": whole[:50],                  # not the writer's name pattern
        }
        for name, data in {**left_by_crashes, **not_ours_to_remove}.items():
            (tmp_path / name).write_bytes(data)
        holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / f"locked.cyxmodel.tmp.{dead}.1")],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert holder.stdout.readline().strip() == "holding"
        model = every_layer_model(seed=3)
        model.save(str(tmp_path / "m.cyxmodel"))
        assert sorted(os.listdir(tmp_path)) == sorted(["source.cyxmodel", "m.cyxmodel", *not_ours_to_remove])
        for name, data in not_ours_to_remove.items():
            assert (tmp_path / name).read_bytes() == data, name
        loaded = cx.SequentialModel.load(str(tmp_path / "m.cyxmodel"))
        assert all(np.array_equal(a, b) for a, b in zip(loaded.parameters(), model.parameters()))
    finally:
        for p in (live, holder):
            if p is not None:
                p.kill()
                p.communicate(timeout=30)


@pytest.mark.skipif(shutil.which("strace") is None, reason="observing fsync needs strace")
def test_save_syncs_the_directory_after_the_rename(tmp_path):
    folder = tmp_path / "folder"
    folder.mkdir()
    target = folder / "m.cyxmodel"
    trace = tmp_path / "trace"
    script = "import sys, pycyxwiz as cx; m = cx.SequentialModel(); m.add(cx.LinearModule(3, 2)); m.save(sys.argv[1])"
    proc = subprocess.run(["strace", "-f", "-y", "-o", str(trace), "-e", "trace=fsync,fdatasync,rename,renameat,renameat2",
                           sys.executable, "-c", script, str(target)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    calls = [line for line in trace.read_text().splitlines() if str(folder) in line]
    renamed = [i for i, line in enumerate(calls) if "rename" in line and line.rstrip().endswith("= 0")]
    file_synced = [i for i, line in enumerate(calls) if "sync(" in line and ".tmp." in line]
    dir_synced = [i for i, line in enumerate(calls) if "sync(" in line and f"<{folder}>" in line]
    assert len(renamed) == 1 and file_synced and dir_synced, "\n".join(calls)
    assert file_synced[0] < renamed[0] < dir_synced[0], "\n".join(calls)


# --------------------------------------------------------------------------------------- bad files


def test_missing_file_raises_file_not_found(tmp_path):
    path = tmp_path / "nope.cyxmodel"
    with pytest.raises(FileNotFoundError) as info:
        cx.SequentialModel.load(str(path))
    assert str(path) in str(info.value)
    assert info.value.errno == 2


def test_directory_is_not_reported_as_a_corrupt_model(tmp_path):
    # A directory is an OS-level problem (IsADirectoryError, like open()), not a foreign model file.
    with pytest.raises(OSError) as info:
        cx.SequentialModel.load(str(tmp_path))
    assert not isinstance(info.value, cx.ModelFormatError), str(info.value)


def test_empty_file(tmp_path):
    path = tmp_path / "empty.cyxmodel"
    path.write_bytes(b"")
    assert "empty" in load_error(path)


@pytest.mark.parametrize("where", ["header-8", "header-12", "header-20", "header-23", "payload-start", "payload-mid",
                                   "before-checksum", "last-byte"])
def test_truncated_file(tmp_path, where):
    raw = saved(tmp_path).read_bytes()
    payload_size = len(raw) - HEADER - 4
    cut = {
        "header-8": 8,
        "header-12": 12,
        "header-20": 20,
        "header-23": 23,
        "payload-start": HEADER,
        "payload-mid": HEADER + payload_size // 2,
        "before-checksum": HEADER + payload_size,
        "last-byte": len(raw) - 1,
    }[where]
    path = tmp_path / "cut.cyxmodel"
    path.write_bytes(raw[:cut])
    message = load_error(path)
    assert "truncated" in message
    if cut >= HEADER:
        assert f"expected {len(raw)} bytes, found {cut}" in message


def test_truncated_inside_magic(tmp_path):
    raw = saved(tmp_path).read_bytes()
    path = tmp_path / "cut.cyxmodel"
    path.write_bytes(raw[:4])
    message = load_error(path)
    assert "truncated" in message or "magic" in message


@pytest.mark.parametrize("offset", ["first", "middle", "last"])
def test_flipped_payload_byte_fails_checksum(tmp_path, offset):
    raw = bytearray(saved(tmp_path).read_bytes())
    payload_size = len(raw) - HEADER - 4
    index = {"first": HEADER, "middle": HEADER + payload_size // 2, "last": HEADER + payload_size - 1}[offset]
    raw[index] ^= 0x10
    path = tmp_path / "flipped.cyxmodel"
    path.write_bytes(bytes(raw))
    assert "checksum" in load_error(path)


def test_flipped_checksum_byte(tmp_path):
    raw = bytearray(saved(tmp_path).read_bytes())
    raw[-2] ^= 0x01
    path = tmp_path / "flipped.cyxmodel"
    path.write_bytes(bytes(raw))
    assert "checksum" in load_error(path)


def test_each_single_bit_flip_in_a_small_file_is_caught(tmp_path):
    raw = saved(tmp_path, build([cx.LinearModule(2, 1)])).read_bytes()
    path = tmp_path / "bits.cyxmodel"
    for index in range(len(raw)):
        if 12 <= index < 16:  # reserved field: not interpreted
            continue
        damaged = bytearray(raw)
        damaged[index] ^= 0x04
        path.write_bytes(bytes(damaged))
        load_error(path)


FOREIGN = {
    "png": b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\rIHDR" + bytes(range(64)),
    "random": np.random.default_rng(0).integers(0, 256, size=1000, dtype=np.uint8).tobytes(),
    "text": b"hello, this is a plain text file\nwith two lines\n",
    "short": b"abc",
    "zip": b"PK\x03\x04" + b"\x00" * 100,
    "numpy-npy": b"\x93NUMPY\x01\x00" + b"v" * 50,
    "lowercase-magic": b"cyxmodel" + b"\x01\x00\x00\x00" + b"\x00" * 20,
}


@pytest.mark.parametrize("kind", list(FOREIGN))
def test_foreign_file(tmp_path, kind):
    path = tmp_path / f"foreign.{kind}"
    path.write_bytes(FOREIGN[kind])
    message = load_error(path)
    assert "not a pycyxwiz model file" in message


def test_newer_format_version_asks_for_an_upgrade(tmp_path):
    raw = bytearray(saved(tmp_path).read_bytes())
    raw[8:12] = struct.pack("<I", 99)
    path = tmp_path / "future.cyxmodel"
    path.write_bytes(bytes(raw))
    message = load_error(path)
    assert "version 99" in message
    assert "upgrade" in message.lower()


def test_version_zero_is_rejected(tmp_path):
    raw = bytearray(saved(tmp_path).read_bytes())
    raw[8:12] = struct.pack("<I", 0)
    path = tmp_path / "v0.cyxmodel"
    path.write_bytes(bytes(raw))
    assert "version 0" in load_error(path)


@pytest.mark.parametrize("extra", [b"\x00", b"garbage after the end", b"\x00" * 4096])
def test_extra_trailing_bytes(tmp_path, extra):
    raw = saved(tmp_path).read_bytes()
    path = tmp_path / "long.cyxmodel"
    path.write_bytes(raw + extra)
    message = load_error(path)
    assert "too long" in message
    assert f"expected {len(raw)} bytes, found {len(raw) + len(extra)}" in message


@pytest.mark.parametrize("delta", [-1, 1, 1 << 40])
def test_payload_size_field_disagreeing_with_file_size(tmp_path, delta):
    raw = bytearray(saved(tmp_path).read_bytes())
    size = struct.unpack("<Q", raw[16:24])[0]
    raw[16:24] = struct.pack("<Q", size + delta)
    path = tmp_path / "size.cyxmodel"
    path.write_bytes(bytes(raw))
    message = load_error(path)
    assert ("truncated" if delta > 0 else "too long") in message


# Payloads with a valid checksum whose content is wrong: the decoder must reject them field by field.
LINEAR_2_1 = layer_bytes("LinearModule", in_features=2.0, out_features=1.0, bias=0.0)
W21 = np.array([[1.0, 2.0]], np.float32)

CRAFTED = {
    "trailing-payload-bytes": (
        struct.pack("<I", 1) + layer_bytes("ReLUModule") + struct.pack("<I", 0) + b"\x00",
        "unexpected bytes after the last tensor"),
    "unknown-layer": (
        struct.pack("<I", 1) + layer_bytes("EvilModule") + struct.pack("<I", 0), "unknown layer type 'EvilModule'"),
    "missing-attribute": (
        struct.pack("<I", 1) + layer_bytes("LinearModule", in_features=2.0, out_features=1.0) + struct.pack("<I", 0),
        "bias"),
    "bad-dropout-p": (
        struct.pack("<I", 1) + layer_bytes("DropoutModule", p=1.5) + struct.pack("<I", 0), "DropoutModule"),
    "fractional-size": (
        struct.pack("<I", 1) + layer_bytes("LinearModule", in_features=2.5, out_features=1.0, bias=1.0)
        + struct.pack("<I", 0), "in_features"),
    "layers-do-not-chain": (
        struct.pack("<I", 2) + layer_bytes("LinearModule", in_features=2.0, out_features=3.0, bias=0.0)
        + layer_bytes("LinearModule", in_features=4.0, out_features=1.0, bias=0.0) + struct.pack("<I", 2)
        + tensor_bytes("0.weight", np.ones((3, 2), np.float32)) + tensor_bytes("1.weight", np.ones((1, 4), np.float32)),
        "cannot follow"),
    "no-weights-stored": (struct.pack("<I", 1) + LINEAR_2_1 + struct.pack("<I", 0), "but the file stores 0 tensors of 0 values"),
    "tensor-count": (struct.pack("<I", 1) + LINEAR_2_1 + struct.pack("<I", 2) + tensor_bytes("0.weight", W21)
                     + tensor_bytes("0.bias", np.ones(1, np.float32)), "parameter tensors"),
    "tensor-name": (struct.pack("<I", 1) + LINEAR_2_1 + struct.pack("<I", 1) + tensor_bytes("0.bias", W21),
                    "expected tensor '0.weight'"),
    "tensor-dtype": (struct.pack("<I", 1) + LINEAR_2_1 + struct.pack("<I", 1)
                     + tensor_bytes("0.weight", W21.astype(np.float64)), "float64"),
    "tensor-shape": (struct.pack("<I", 1) + LINEAR_2_1 + struct.pack("<I", 1) + tensor_bytes("0.weight", W21.T),
                     "(2, 1)"),
    "tensor-data-short": (struct.pack("<I", 1) + LINEAR_2_1 + struct.pack("<I", 1)
                          + tensor_bytes("0.weight", W21)[:-3], "past the end"),
    "unknown-dtype-code": (struct.pack("<I", 1) + LINEAR_2_1 + struct.pack("<I", 1)
                           + tensor_bytes("0.weight", W21, dtype_code=9), "dtype code 9"),
    "huge-rank": (struct.pack("<I", 1) + LINEAR_2_1 + struct.pack("<I", 1) + s("0.weight")
                  + struct.pack("<BI", 0, 1000), "rank"),
    "huge-dims": (struct.pack("<I", 1) + LINEAR_2_1 + struct.pack("<I", 1) + s("0.weight")
                  + struct.pack("<BIqq", 0, 2, 1 << 40, 1 << 40), "implausible"),
    "negative-dim": (struct.pack("<I", 1) + LINEAR_2_1 + struct.pack("<I", 1) + s("0.weight")
                     + struct.pack("<BIqq", 0, 2, -1, 2), "implausible"),
    "huge-string": (struct.pack("<I", 1) + struct.pack("<I", 0xFFFFFFFF) + bytes(4), "string length"),
    "string-past-the-end": (struct.pack("<I", 1) + struct.pack("<I", 1000) + bytes(8), "string of 1000 bytes"),
    "huge-layer-count": (struct.pack("<I", 0xFFFFFFFF), "layer count"),
    "cut-inside-layer": (struct.pack("<I", 3) + layer_bytes("ReLUModule"), "past the end"),
    "empty-payload": (b"", "past the end"),
}


@pytest.mark.parametrize("case", list(CRAFTED))
def test_structurally_invalid_payload_with_valid_checksum(tmp_path, case):
    payload, problem = CRAFTED[case]
    path = tmp_path / f"{case}.cyxmodel"
    path.write_bytes(container(payload))
    message = load_error(path)
    assert problem in message


def test_tiny_file_claiming_a_huge_layer_is_rejected_without_allocating_it(tmp_path):
    # 100 bytes that describe LinearModule(100000, 100000) but hold no weights: the loader must report the
    # missing data as a format error, not try to allocate 2 x 40 GB first. Run under a 4 GiB address-space
    # limit so that the outcome does not depend on this machine's memory.
    path = tmp_path / "huge.cyxmodel"
    payload = (struct.pack("<I", 1) + layer_bytes("LinearModule", in_features=1e5, out_features=1e5, bias=0.0)
               + struct.pack("<I", 1) + s("0.weight") + struct.pack("<BIqq", 0, 2, 100000, 100000))
    path.write_bytes(container(payload))
    code = textwrap.dedent(
        f"""
        import resource, pycyxwiz as cx
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
        try:
            cx.SequentialModel.load({str(path)!r})
        except cx.ModelFormatError as e:
            print("FORMATERROR", e)
        except BaseException as e:
            print("OTHER", type(e).__name__, e)
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "FORMATERROR" in proc.stdout, proc.stdout


# ------------------------------------------------------------------------- hostile files: bounded memory

# Loads argv[1] under an address-space limit of (what is mapped now + argv[2] MiB) and prints the outcome
# and how far the peak resident size rose during the load. The peak is VmHWM, reset to the current size
# first: ru_maxrss cannot be reset and starts with the parent's peak after exec.
LOAD_UNDER_LIMIT = textwrap.dedent(
    """
    import os, resource, sys
    import numpy as np
    import pycyxwiz as cx

    def status(key):
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) << 10 for line in f if line.startswith(key + ":"))

    limit = status("VmSize") + (int(sys.argv[2]) << 20)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = status("VmRSS")
    try:
        cx.SequentialModel.load(sys.argv[1])
        print("LOADED")
    except cx.ModelFormatError as e:
        print("FORMATERROR", e)
    except BaseException as e:
        print("OTHER", type(e).__name__, e)
    print("GROWTH", status("VmHWM") - before)
    """
)


def load_under_limit(path, headroom_mib):
    """(outcome line, peak RSS growth in bytes) of loading `path` in a fresh interpreter."""
    proc = subprocess.run([sys.executable, "-c", LOAD_UNDER_LIMIT, str(path), str(headroom_mib)],
                          capture_output=True, text=True, timeout=120)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0 and len(lines) == 2, \
        f"the loader died (exit {proc.returncode}): {proc.stdout[-2000:]} {proc.stderr[-2000:]}"
    return lines[0], int(lines[1].split()[1])


def stacked_linear_file(tmp_path, d, layers):
    """A real LinearModule(d, d, bias=False) file whose architecture section is rewritten to stack
    `layers` copies of that layer, still storing the one d x d tensor (checksum fixed)."""
    raw = saved(tmp_path, build([cx.LinearModule(d, d, bias=False)]), "one.cyxmodel").read_bytes()
    payload = raw[HEADER:-4]
    weight = decode_payload(payload)[1][0][1]
    tensors = struct.pack("<I", 1) + tensor_bytes("0.weight", weight)
    assert payload.endswith(tensors)       # layer count | one layer | tensor count | 0.weight
    layer = payload[4:len(payload) - len(tensors)]
    assert layer == layer_bytes("LinearModule", in_features=float(d), out_features=float(d), bias=0.0)
    path = tmp_path / "stacked.cyxmodel"
    path.write_bytes(container(struct.pack("<I", layers) + layer * layers + tensors))
    return path


def test_stacked_layers_sharing_one_stored_tensor_are_refused_within_the_file_size(tmp_path):
    # 16 MiB on disk, 4096 x LinearModule(2048, 2048) described: 64 GiB of weights (and as much again of
    # gradients) if the loader built the layers before matching them against what the file stores.
    d, layers = 2048, 4096
    path = stacked_linear_file(tmp_path, d, layers)
    size = path.stat().st_size
    outcome, growth = load_under_limit(path, 512)
    assert outcome.startswith("FORMATERROR"), outcome
    assert str(path) in outcome
    assert "parameter tensors" in outcome and f"{layers * d * d}" in outcome, outcome
    assert growth < 3 * size + (16 << 20), f"peak memory rose by {growth >> 20} MiB for a {size >> 20} MiB file"


def test_a_count_is_checked_against_the_bytes_left_before_allocating(tmp_path):
    # 100000 layers announced, none stored: refused before a vector of 100000 layer descriptions exists.
    path = tmp_path / "count.cyxmodel"
    path.write_bytes(container(struct.pack("<I", 100000)))
    outcome, growth = load_under_limit(path, 256)
    assert growth < (3 << 20), f"peak memory rose by {growth >> 10} KiB for a {path.stat().st_size} byte file"
    assert outcome.startswith("FORMATERROR") and "layer count 100000" in outcome, outcome
