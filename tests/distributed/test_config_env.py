"""DistributedConfig.from_environment(), explicit configs, the NCCL stub, a world of one, and real
worlds configured only through the variables of Slurm, Open MPI and MPICH.

The parsing tests run in this process: monkeypatch changes os.environ, which the C++ getenv sees.
Every variable that from_environment() reads is removed first, so the machine's own environment
(a CI runner inside Slurm, say) cannot leak into a case. Nothing here calls init() successfully in
this process; worlds that must start are separate processes (the `ranks` fixture).
"""

from __future__ import annotations

import json
import os

import pytest
from harness import free_port

import pycyxwiz as cx

dist = cx.distributed

READ_VARIABLES = [
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "DISTRIBUTED_BACKEND",
    "DISTRIBUTED_TIMEOUT_MS", "CYXWIZ_JOB_ID", "TORCHELASTIC_RUN_ID", "MPI_LOCALRANKID",
    "CYXWIZ_MASTER_PORT", "CYXWIZ_RING_SLICE_BYTES", "CYXWIZ_SPIN_US", "LOCAL_WORLD_SIZE",
]
READ_PREFIXES = ("SLURM_", "OMPI_", "PMI_", "PMIX_", "TORCHELASTIC_")


@pytest.fixture
def environ(monkeypatch):
    """Returns set_env(**vars): clears every variable the config reads, then sets `vars`."""
    for name in list(os.environ):
        if name in READ_VARIABLES or name.startswith(READ_PREFIXES):
            monkeypatch.delenv(name)

    def set_env(variables: dict[str, str]) -> None:
        for k, v in variables.items():
            monkeypatch.setenv(k, v)

    return set_env


def fields(c) -> dict:
    return dict(rank=c.rank, world_size=c.world_size, local_rank=c.local_rank, master_addr=c.master_addr,
                master_port=c.master_port, backend=c.backend, timeout_ms=c.timeout_ms, job_id=c.job_id,
                source=c.source)


# The guide's defaults.
DEFAULTS = dict(rank=0, world_size=1, local_rank=0, master_addr="127.0.0.1", master_port=29500,
                backend=dist.BackendType.CPU, timeout_ms=30000, job_id="", source="default")


def test_defaults_without_any_variable(environ):
    assert fields(dist.DistributedConfig.from_environment()) == DEFAULTS
    assert fields(dist.DistributedConfig()) == DEFAULTS


LAUNCHERS = [
    # torchrun / the launcher / by hand
    ({"RANK": "2", "WORLD_SIZE": "4"}, dict(rank=2, world_size=4, local_rank=2, source="RANK/WORLD_SIZE")),
    ({"RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "0"}, dict(rank=2, world_size=4, local_rank=0, source="RANK/WORLD_SIZE")),
    ({"RANK": "0", "WORLD_SIZE": "1"}, dict(rank=0, world_size=1, local_rank=0, source="RANK/WORLD_SIZE")),
    ({"WORLD_SIZE": "1"}, dict(rank=0, world_size=1, local_rank=0, source="RANK/WORLD_SIZE")),
    # srun
    ({"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1"}, dict(rank=5, world_size=8, local_rank=1, source="Slurm")),
    ({"SLURM_PROCID": "5", "SLURM_NTASKS": "8"}, dict(rank=5, world_size=8, local_rank=5, source="Slurm")),
    # mpirun (Open MPI)
    ({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "6", "OMPI_COMM_WORLD_LOCAL_RANK": "1"},
     dict(rank=3, world_size=6, local_rank=1, source="Open MPI")),
    ({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "6"}, dict(rank=3, world_size=6, local_rank=3, source="Open MPI")),
    # MPICH / Intel MPI
    ({"PMI_RANK": "1", "PMI_SIZE": "3", "MPI_LOCALRANKID": "0"}, dict(rank=1, world_size=3, local_rank=0, source="MPICH")),
    ({"PMI_RANK": "2", "PMI_SIZE": "3"}, dict(rank=2, world_size=3, local_rank=2, source="MPICH")),
    # precedence: RANK/WORLD_SIZE, then Slurm, then Open MPI, then MPICH
    ({"RANK": "1", "WORLD_SIZE": "2", "SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "3"},
     dict(rank=1, world_size=2, local_rank=1, source="RANK/WORLD_SIZE")),
    ({"SLURM_PROCID": "4", "SLURM_NTASKS": "7", "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
      "PMI_RANK": "0", "PMI_SIZE": "9"}, dict(rank=4, world_size=7, local_rank=4, source="Slurm")),
    ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "PMI_RANK": "0", "PMI_SIZE": "9"},
     dict(rank=1, world_size=2, local_rank=1, source="Open MPI")),
    ({"RANK": "0", "WORLD_SIZE": "3", "OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "5",
      "PMI_RANK": "4", "PMI_SIZE": "9"}, dict(rank=0, world_size=3, local_rank=0, source="RANK/WORLD_SIZE")),
]


@pytest.mark.parametrize("env, want", LAUNCHERS, ids=[" ".join(f"{k}={v}" for k, v in e.items()) for e, _ in LAUNCHERS])
def test_launcher_variables_and_precedence(environ, env, want):
    environ(env)
    got = fields(dist.DistributedConfig.from_environment())
    # Rank variables change the rank fields only: the rest keeps the guide's defaults.
    assert got == {**DEFAULTS, **want}


NODE_LISTS = [
    ("gpu[03-05,9],cpu1", "gpu03"),
    ("node17", "node17"),
    ("n[1-4]", "n1"),
    ("a,b,c", "a"),
    ("c[009-011]", "c009"),
    ("gpu[7]", "gpu7"),
    ("x[100-101],y[1-2]", "x100"),
    ("rack[2,5]-n[10-12]", "rack2-n10"),
    ("10.0.0.5", "10.0.0.5"),
]


@pytest.mark.parametrize("variable", ["SLURM_JOB_NODELIST", "SLURM_NODELIST"])
@pytest.mark.parametrize("node_list, master", NODE_LISTS)
def test_slurm_node_list_gives_the_master_host(environ, variable, node_list, master):
    environ({"SLURM_PROCID": "1", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", variable: node_list})
    c = dist.DistributedConfig.from_environment()
    assert (c.master_addr, c.source, c.rank, c.world_size) == (master, "Slurm", 1, 4)


def test_slurm_master_host_precedence(environ, monkeypatch):
    environ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "jobnode[4-5]", "SLURM_NODELIST": "other[1-2]"})
    assert dist.DistributedConfig.from_environment().master_addr == "jobnode4"  # SLURM_JOB_NODELIST first
    monkeypatch.setenv("MASTER_ADDR", "10.9.8.7")
    assert dist.DistributedConfig.from_environment().master_addr == "10.9.8.7"  # MASTER_ADDR over both
    monkeypatch.delenv("MASTER_ADDR")
    monkeypatch.delenv("SLURM_JOB_NODELIST")
    monkeypatch.delenv("SLURM_NODELIST")
    assert dist.DistributedConfig.from_environment().master_addr == "127.0.0.1"  # no node list: the default


SETTINGS = [
    ({"MASTER_ADDR": "10.1.2.3"}, dict(master_addr="10.1.2.3")),
    ({"MASTER_ADDR": "head-node.cluster"}, dict(master_addr="head-node.cluster")),
    ({"MASTER_PORT": "1"}, dict(master_port=1)),
    ({"MASTER_PORT": "65535"}, dict(master_port=65535)),
    ({"MASTER_PORT": "29501"}, dict(master_port=29501)),
    ({"DISTRIBUTED_BACKEND": "cpu"}, dict(backend=dist.BackendType.CPU)),
    ({"DISTRIBUTED_BACKEND": "CPU"}, dict(backend=dist.BackendType.CPU)),
    ({"DISTRIBUTED_BACKEND": "Gloo"}, dict(backend=dist.BackendType.CPU)),
    ({"DISTRIBUTED_BACKEND": "tcp"}, dict(backend=dist.BackendType.CPU)),
    ({"DISTRIBUTED_BACKEND": "nccl"}, dict(backend=dist.BackendType.NCCL)),
    ({"DISTRIBUTED_BACKEND": "NCCL"}, dict(backend=dist.BackendType.NCCL)),
    ({"DISTRIBUTED_BACKEND": "GPU"}, dict(backend=dist.BackendType.NCCL)),
    ({"DISTRIBUTED_BACKEND": "Cuda"}, dict(backend=dist.BackendType.NCCL)),
    ({"DISTRIBUTED_TIMEOUT_MS": "1"}, dict(timeout_ms=1)),
    ({"DISTRIBUTED_TIMEOUT_MS": "45000"}, dict(timeout_ms=45000)),
    ({"DISTRIBUTED_TIMEOUT_MS": "86400000"}, dict(timeout_ms=86400000)),
    # job identity
    ({"CYXWIZ_JOB_ID": "a", "TORCHELASTIC_RUN_ID": "b", "SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0"}, dict(job_id="a")),
    ({"TORCHELASTIC_RUN_ID": "b", "SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "OMPI_MCA_ess_base_jobid": "x"}, dict(job_id="b")),
    ({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "2", "OMPI_MCA_ess_base_jobid": "x", "PMIX_NAMESPACE": "ns"}, dict(job_id="7.2")),
    ({"OMPI_MCA_ess_base_jobid": "12345", "PMIX_NAMESPACE": "ns"}, dict(job_id="12345")),
    ({"PMIX_NAMESPACE": "ns"}, dict(job_id="ns")),
]


@pytest.mark.parametrize("env, want", SETTINGS, ids=[" ".join(f"{k}={v}" for k, v in e.items()) for e, _ in SETTINGS])
def test_settings_from_the_environment(environ, env, want):
    environ(env)
    assert fields(dist.DistributedConfig.from_environment()) == {**DEFAULTS, **want}


BAD = [
    # (variables, names the message must contain)
    ({"RANK": "1"}, ["RANK", "WORLD_SIZE"]),
    ({"WORLD_SIZE": "4"}, ["WORLD_SIZE", "RANK"]),
    ({"RANK": "4x", "WORLD_SIZE": "8"}, ["RANK", "4x"]),
    ({"RANK": "", "WORLD_SIZE": "8"}, ["RANK"]),
    ({"RANK": " 4", "WORLD_SIZE": "8"}, ["RANK"]),
    ({"RANK": "4 ", "WORLD_SIZE": "8"}, ["RANK"]),
    ({"RANK": "1e3", "WORLD_SIZE": "8"}, ["RANK", "1e3"]),
    ({"RANK": "0x1", "WORLD_SIZE": "8"}, ["RANK", "0x1"]),
    ({"RANK": "1.0", "WORLD_SIZE": "8"}, ["RANK", "1.0"]),
    ({"RANK": "-", "WORLD_SIZE": "8"}, ["RANK"]),
    ({"RANK": "4", "WORLD_SIZE": "4"}, ["RANK", "4", "out of range"]),
    ({"RANK": "-1", "WORLD_SIZE": "4"}, ["RANK", "-1", "out of range"]),
    ({"RANK": "0", "WORLD_SIZE": "two"}, ["WORLD_SIZE", "two"]),
    ({"RANK": "0", "WORLD_SIZE": ""}, ["WORLD_SIZE"]),
    ({"RANK": "0", "WORLD_SIZE": "0"}, ["WORLD_SIZE", "out of range"]),
    ({"RANK": "0", "WORLD_SIZE": "-2"}, ["WORLD_SIZE"]),
    ({"RANK": "0", "WORLD_SIZE": "99999999999999999999"}, ["WORLD_SIZE"]),
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "-1"}, ["LOCAL_RANK", "-1"]),
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "gpu0"}, ["LOCAL_RANK", "gpu0"]),
    ({"SLURM_PROCID": "1"}, ["SLURM_PROCID", "SLURM_NTASKS"]),
    ({"SLURM_NTASKS": "4"}, ["SLURM_NTASKS", "SLURM_PROCID"]),
    ({"SLURM_PROCID": "x", "SLURM_NTASKS": "4"}, ["SLURM_PROCID", "x"]),
    ({"SLURM_PROCID": "8", "SLURM_NTASKS": "8"}, ["SLURM_PROCID", "out of range"]),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_LOCALID": "-3"}, ["SLURM_LOCALID"]),
    ({"OMPI_COMM_WORLD_RANK": "1"}, ["OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"]),
    ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "0"}, ["OMPI_COMM_WORLD_SIZE"]),
    ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "z"}, ["OMPI_COMM_WORLD_LOCAL_RANK"]),
    ({"PMI_RANK": "1"}, ["PMI_RANK", "PMI_SIZE"]),
    ({"PMI_RANK": "3", "PMI_SIZE": "3"}, ["PMI_RANK", "out of range"]),
    ({"PMI_RANK": "0", "PMI_SIZE": "3", "MPI_LOCALRANKID": "-1"}, ["MPI_LOCALRANKID"]),
    ({"MASTER_PORT": "0"}, ["MASTER_PORT", "out of range"]),
    ({"MASTER_PORT": "70000"}, ["MASTER_PORT", "70000"]),
    ({"MASTER_PORT": "65536"}, ["MASTER_PORT", "65536"]),
    ({"MASTER_PORT": "-1"}, ["MASTER_PORT"]),
    ({"MASTER_PORT": "abc"}, ["MASTER_PORT", "abc"]),
    ({"MASTER_PORT": ""}, ["MASTER_PORT"]),
    ({"MASTER_PORT": "29500x"}, ["MASTER_PORT", "29500x"]),
    ({"MASTER_ADDR": ""}, ["MASTER_ADDR"]),
    ({"DISTRIBUTED_BACKEND": "mpi"}, ["DISTRIBUTED_BACKEND", "mpi"]),
    ({"DISTRIBUTED_BACKEND": ""}, ["DISTRIBUTED_BACKEND"]),
    ({"DISTRIBUTED_BACKEND": "cpu "}, ["DISTRIBUTED_BACKEND"]),
    ({"DISTRIBUTED_TIMEOUT_MS": "0"}, ["DISTRIBUTED_TIMEOUT_MS"]),
    ({"DISTRIBUTED_TIMEOUT_MS": "-5"}, ["DISTRIBUTED_TIMEOUT_MS", "-5"]),
    ({"DISTRIBUTED_TIMEOUT_MS": "abc"}, ["DISTRIBUTED_TIMEOUT_MS", "abc"]),
    ({"DISTRIBUTED_TIMEOUT_MS": "1.5"}, ["DISTRIBUTED_TIMEOUT_MS", "1.5"]),
    ({"DISTRIBUTED_TIMEOUT_MS": ""}, ["DISTRIBUTED_TIMEOUT_MS"]),
]


@pytest.mark.parametrize("env, names", BAD, ids=[" ".join(f"{k}={v!r}" for k, v in e.items()) for e, _ in BAD])
def test_bad_values_raise_value_error_naming_the_variable(environ, env, names):
    environ(env)
    with pytest.raises(ValueError) as info:
        dist.DistributedConfig.from_environment()
    for name in names:
        assert name in str(info.value), str(info.value)
    # init() reads the same environment, and refuses before touching the network.
    try:
        with pytest.raises(ValueError) as again:
            dist.init()
        assert str(again.value) == str(info.value)
        assert not dist.is_initialized()
    finally:
        dist.finalize()


# The tuning variables: a unit, a typo or a value outside the range is an error naming the variable,
# the value and the accepted range, never a number cut short ("1MB" read as 1 byte) or a silent 0.
BAD_TUNING = [
    ("CYXWIZ_RING_SLICE_BYTES", "1MB", "is not an integer", "1024..1073741824"),
    ("CYXWIZ_RING_SLICE_BYTES", "1e6", "is not an integer", "1024..1073741824"),
    ("CYXWIZ_RING_SLICE_BYTES", " 4096", "is not an integer", "1024..1073741824"),
    ("CYXWIZ_RING_SLICE_BYTES", "0", "is out of range", "1024..1073741824"),
    ("CYXWIZ_RING_SLICE_BYTES", "100", "is out of range", "1024..1073741824"),
    ("CYXWIZ_RING_SLICE_BYTES", "-1048576", "is out of range", "1024..1073741824"),
    ("CYXWIZ_RING_SLICE_BYTES", "4294967296", "is out of range", "1024..1073741824"),
    ("CYXWIZ_RING_SLICE_BYTES", "99999999999999999999999", "is out of range", "1024..1073741824"),
    ("CYXWIZ_SPIN_US", "abc", "is not an integer", "0..1000000"),
    ("CYXWIZ_SPIN_US", "50us", "is not an integer", "0..1000000"),
    ("CYXWIZ_SPIN_US", "-1", "is out of range", "0..1000000"),
    ("CYXWIZ_SPIN_US", "1000001", "is out of range", "0..1000000"),
    ("LOCAL_WORLD_SIZE", "two", "is not an integer", "at least 1"),
    ("LOCAL_WORLD_SIZE", "0", "is out of range", "at least 1"),
]


@pytest.mark.parametrize("name, value, problem, accepted", BAD_TUNING,
                         ids=[f"{n}={v!r}" for n, v, _, _ in BAD_TUNING])
def test_bad_tuning_values_raise_value_error_naming_variable_value_and_range(environ, name, value, problem, accepted):
    environ({name: value})
    with pytest.raises(ValueError) as info:
        dist.DistributedConfig.from_environment()
    message = str(info.value)
    assert message.startswith(f"{name}={value!r} {problem}: expected "), message
    assert accepted in message, message
    # init() reads them whatever config it is given, an explicit one too, before touching the network.
    for config in (None, dist.DistributedConfig()):
        try:
            with pytest.raises(ValueError) as again:
                dist.init(config)
            assert str(again.value) == message
            assert not dist.is_initialized()
        finally:
            dist.finalize()


@pytest.mark.parametrize("value", ["", "1024", "1048576", "1073741824"])
def test_good_ring_slice_bytes_are_accepted(environ, value):
    environ({"CYXWIZ_RING_SLICE_BYTES": value, "CYXWIZ_SPIN_US": "0", "LOCAL_WORLD_SIZE": "2"})
    assert fields(dist.DistributedConfig.from_environment()) == DEFAULTS


def _first_rank(local_rank):
    return local_rank


@pytest.mark.parametrize("value", ["80x", "", " 80", "8_0", "+", "0", "65536", "99999999999999999999"])
def test_spawn_checks_master_port_as_init_does(environ, value):
    # The same value gives the same message in spawn (Python) and in init() (C++).
    environ({"MASTER_PORT": value})
    with pytest.raises(ValueError) as cpp:
        dist.DistributedConfig.from_environment()
    if value == "":
        return  # spawn takes an empty MASTER_PORT as unset (a free port), as the launcher does
    with pytest.raises(ValueError) as py:
        dist.spawn(_first_rank, nprocs=1, timeout=30)
    assert str(py.value) == str(cpp.value), (str(py.value), str(cpp.value))
    assert str(py.value).startswith(f"MASTER_PORT={value!r} is "), str(py.value)


def test_spawn_checks_its_master_port_argument(environ):
    with pytest.raises(ValueError, match=r"master_port='70000' is out of range: expected a TCP port, 1\.\.65535"):
        dist.spawn(_first_rank, nprocs=1, master_port=70000, timeout=30)


DDP_FLAG = r'''
import pycyxwiz as cx
cx.distributed.init()
model = cx.SequentialModel()
model.add(cx.LinearModule(2, 2))
try:
    cx.distributed.DistributedDataParallel(model)
except ValueError as e:
    print("ValueError:", e)
else:
    print("accepted")
'''


@pytest.mark.parametrize("name", ["CYXWIZ_DDP_OVERLAP", "CYXWIZ_DDP_CHECK_GRADIENTS"])
def test_bad_ddp_flag_is_refused_naming_the_variable(ranks, name):
    [result] = ranks.run(DDP_FLAG, 1, env={name: "maybe"})
    assert result.rc == 0, ranks.report([result])
    assert result.out.strip() == (f"ValueError: {name}='maybe' is not a flag: expected 1 or 0 "
                                  f"(also true/false, yes/no, on/off)"), ranks.report([result])


def bad_config(**changes):
    c = dist.DistributedConfig()
    # Valid everywhere but in `changes`; a port nobody serves and a short timeout bound the damage
    # should a bad config get through.
    c.world_size, c.rank, c.master_port, c.timeout_ms = 2, 1, free_port(), 2000
    for k, v in changes.items():
        setattr(c, k, v)
    return c


BAD_CONFIGS = [
    (dict(rank=5), "DistributedConfig.rank=5 is out of range"),
    (dict(rank=2), "DistributedConfig.rank=2 is out of range"),
    (dict(rank=-1), "DistributedConfig.rank=-1 is out of range"),
    (dict(world_size=0, rank=0), "DistributedConfig.world_size=0"),
    (dict(world_size=-3, rank=0), "DistributedConfig.world_size=-3"),
    (dict(local_rank=-1), "DistributedConfig.local_rank=-1"),
    (dict(master_port=0), "DistributedConfig.master_port=0"),
    (dict(master_port=70000), "DistributedConfig.master_port=70000"),
    (dict(timeout_ms=0), "DistributedConfig.timeout_ms=0"),
    (dict(timeout_ms=-10), "DistributedConfig.timeout_ms=-10"),
    (dict(master_addr=""), "DistributedConfig.master_addr"),
]


@pytest.mark.parametrize("changes, message", BAD_CONFIGS, ids=[repr(c) for c, _ in BAD_CONFIGS])
def test_explicit_config_is_validated(environ, changes, message):
    try:
        with pytest.raises(ValueError, match=message.replace(".", r"\.")):
            dist.init(bad_config(**changes))
        assert not dist.is_initialized()
    finally:
        dist.finalize()


@pytest.mark.skipif(cx.cuda.is_available(), reason="a GPU is usable here: the NCCL backend is allowed")
def test_nccl_backend_is_refused_without_a_gpu(environ, monkeypatch):
    # A CPU-only build says it has no NCCL backend; a CUDA build on a machine without a GPU says why.
    c = dist.DistributedConfig()
    c.backend = dist.BackendType.NCCL
    assert c.backend == dist.BackendType.NCCL
    try:
        with pytest.raises(dist.DistBackendError) as info:
            dist.init(c)
        message = str(info.value)
        assert "NCCL" in message and "CUDA" in message and "DISTRIBUTED_BACKEND=cpu" in message, message
        assert isinstance(info.value, dist.DistError) and isinstance(info.value, RuntimeError)
        assert not dist.is_initialized()
        for value in ["nccl", "gpu", "CUDA"]:  # from the environment too
            monkeypatch.setenv("DISTRIBUTED_BACKEND", value)
            with pytest.raises(dist.DistBackendError, match="NCCL"):
                dist.init()
            assert not dist.is_initialized()
    finally:
        dist.finalize()


def test_exception_hierarchy():
    assert issubclass(dist.DistError, RuntimeError)
    assert issubclass(dist.DistNetworkError, dist.DistError) and issubclass(dist.DistNetworkError, ConnectionError)
    assert issubclass(dist.DistTimeoutError, dist.DistError) and issubclass(dist.DistTimeoutError, TimeoutError)
    assert issubclass(dist.DistStoreError, dist.DistError)
    assert issubclass(dist.DistBackendError, dist.DistError)
    assert not issubclass(dist.DistStoreError, (ConnectionError, TimeoutError))


WORLD_OF_ONE = r'''
import json, os
import numpy as np
import pycyxwiz as cx
dist = cx.distributed
errors = []
cfg = dist.DistributedConfig.from_environment()
dist.init()
info = dict(rank=dist.get_rank(), world_size=dist.get_world_size(), local_rank=dist.get_local_rank(),
            is_master=dist.is_master(), backend=dist.get_backend(), source=dist.get_config().source,
            port=dist.get_config().master_port, timeout_ms=dist.get_config().timeout_ms,
            addr=dist.get_config().master_addr, from_env_source=cfg.source)
rng = np.random.default_rng(7)
for dtype in ["float32", "float64", "int32", "int64"]:
    for op in ["SUM", "AVG", "MAX", "MIN", "PRODUCT"]:
        for shape in [(0,), (1,), (7,), (3, 5), (100003,)]:
            x = (rng.standard_normal(shape) * 1000).astype(dtype)
            if dtype.startswith("float") and x.size > 3:
                x.flat[3] = np.nan
            before = x.copy()
            dist.all_reduce(x, op=getattr(dist.ReduceOp, op))
            if x.tobytes() != before.tobytes() or x.shape != before.shape:
                errors.append(f"all_reduce {op} {dtype} {shape} is not the identity")
    x = (rng.standard_normal(11) * 1000).astype(dtype)
    before = x.copy()
    dist.broadcast(x, src=0)
    parts = dist.all_gather(x)
    part = dist.reduce_scatter(x)
    if x.tobytes() != before.tobytes():
        errors.append(f"broadcast {dtype} changed the array")
    if len(parts) != 1 or parts[0].tobytes() != before.tobytes():
        errors.append(f"all_gather {dtype}: {parts}")
    if part.shape != (11,) or part.tobytes() != before.tobytes():
        errors.append(f"reduce_scatter {dtype}: {part}")
dist.barrier()
dist.finalize()
print(json.dumps(dict(info=info, errors=errors)))
'''

UNSET_ALL = {"RANK": "<unset>", "WORLD_SIZE": "<unset>", "MASTER_ADDR": "<unset>", "MASTER_PORT": "<unset>",
             "DISTRIBUTED_TIMEOUT_MS": "<unset>", "LOCAL_RANK": "<unset>"}


def test_world_of_one_without_any_variable(ranks):
    [result] = ranks.run(WORLD_OF_ONE, 1, env=UNSET_ALL)
    assert result.rc == 0, ranks.report([result])
    out = json.loads(result.out.strip().splitlines()[-1])
    assert out["errors"] == []
    assert out["info"] == dict(rank=0, world_size=1, local_rank=0, is_master=True, backend="cpu", source="default",
                               port=29500, timeout_ms=30000, addr="127.0.0.1", from_env_source="default")


LAUNCHED = r'''
import json, os
import numpy as np
import pycyxwiz as cx
dist = cx.distributed
dist.init()
c = dist.get_config()
info = dict(rank=dist.get_rank(), world_size=dist.get_world_size(), local_rank=dist.get_local_rank(),
            source=c.source, job_id=c.job_id, addr=c.master_addr, port=c.master_port)
x = np.random.default_rng(info["rank"]).standard_normal(1000)
y = np.arange(6, dtype=np.int64) * (info["rank"] + 1)
dist.all_reduce(x)
dist.all_reduce(y, op=dist.ReduceOp.MAX)
dist.finalize()
print(json.dumps(dict(info=info, x=x.tolist(), y=y.tolist())))
'''


def launcher_env(family: str, rank: int, world_size: int) -> dict:
    if family == "slurm":  # two "nodes": every task is local rank 0; the master host comes from the node list
        return {"SLURM_PROCID": rank, "SLURM_NTASKS": world_size, "SLURM_LOCALID": 0,
                "SLURM_JOB_NODELIST": "localhost,node[2-3]", "SLURM_JOB_ID": 4242, "SLURM_STEP_ID": 0,
                "MASTER_ADDR": "<unset>"}
    if family == "openmpi":
        return {"OMPI_COMM_WORLD_RANK": rank, "OMPI_COMM_WORLD_SIZE": world_size,
                "OMPI_COMM_WORLD_LOCAL_RANK": rank, "OMPI_MCA_ess_base_jobid": 777}
    return {"PMI_RANK": rank, "PMI_SIZE": world_size, "MPI_LOCALRANKID": world_size - 1 - rank, "PMIX_NAMESPACE": "kvs_9"}


@pytest.mark.parametrize("family, world_size, source, job_id, addr", [
    ("slurm", 2, "Slurm", "4242.0", "localhost"),
    ("openmpi", 2, "Open MPI", "777", "127.0.0.1"),
    ("mpich", 3, "MPICH", "kvs_9", "127.0.0.1"),
])
def test_world_configured_by_launcher_variables(ranks, family, world_size, source, job_id, addr):
    import numpy as np

    rank_env = {r: {**launcher_env(family, r, world_size), "RANK": "<unset>", "WORLD_SIZE": "<unset>"}
                for r in range(world_size)}
    results = ranks.run(LAUNCHED, world_size, rank_env=rank_env)
    assert all(r.rc == 0 for r in results), ranks.report(results)
    outs = [json.loads(r.out.strip().splitlines()[-1]) for r in results]
    want_x = sum(np.random.default_rng(r).standard_normal(1000) for r in range(world_size))
    want_y = (np.arange(6) * world_size).tolist()
    for r, out in zip(range(world_size), outs):
        want_local = {"slurm": 0, "openmpi": r, "mpich": world_size - 1 - r}[family]
        assert out["info"] == dict(rank=r, world_size=world_size, local_rank=want_local, source=source,
                                   job_id=job_id, addr=addr, port=ranks.port)
        np.testing.assert_allclose(out["x"], want_x, rtol=1e-12, atol=1e-12)
        assert out["y"] == want_y
        assert out["x"] == outs[0]["x"]  # the same bits on every rank
