"""The optional shared secret (CYXWIZ_SECRET): ranks prove they hold it; the secret never travels."""

import hashlib
import hmac
import json
import os

import pytest

import pycyxwiz as cx

ALL_REDUCE = """
import json, numpy as np, pycyxwiz as cx
try:
    cx.distributed.init()
    a = np.full(4, cx.distributed.get_rank() + 1.0, np.float32)
    cx.distributed.all_reduce(a)
    print(json.dumps({"sum": a.tolist()}))
    cx.distributed.finalize()
except Exception as e:
    print(json.dumps({"error": type(e).__name__, "message": str(e)}))
"""


@pytest.mark.parametrize("key,message", [(b"", b""), (b"key", b"The quick brown fox jumps over the lazy dog"),
                                         (b"k" * 64, b"x" * 55), (b"k" * 65, b"x" * 56), (b"s" * 200, bytes(range(256)) * 9)])
def test_hmac_matches_python(key, message):
    ours = cx._core.distributed._hmac_sha256(key.decode(), message)
    assert ours == hmac.new(key, message, hashlib.sha256).digest()


def test_the_same_secret_on_every_rank_forms_the_job(ranks):
    res = ranks.run(ALL_REDUCE, 3, env={"CYXWIZ_SECRET": "s3cret"})
    outs = [json.loads(r.out.strip().splitlines()[-1]) for r in res]
    assert outs == [{"sum": [6.0] * 4}] * 3, ranks.report(res)


@pytest.mark.parametrize("secret1", ["other", "<unset>"], ids=["wrong-secret", "no-secret"])
def test_a_process_without_the_secret_is_refused_and_told_why(ranks, secret1):
    res = ranks.run(ALL_REDUCE, 2, env={"CYXWIZ_SECRET": "s3cret", "DISTRIBUTED_TIMEOUT_MS": "3000"},
                    rank_env={1: {"CYXWIZ_SECRET": secret1}})
    intruder = json.loads(res[1].out.strip().splitlines()[-1])
    assert intruder["error"] == "DistStoreError", ranks.report(res)
    assert "CYXWIZ_SECRET" in intruder["message"] and "refused this rank" in intruder["message"]
    # Rank 0 logs the refusal, and never prints the secret itself.
    assert "refused a connection" in res[0].err and "CYXWIZ_SECRET" in res[0].err
    assert all("s3cret" not in r.out + r.err for r in res)


def test_a_secret_only_on_the_caller_is_refused(ranks):
    res = ranks.run(ALL_REDUCE, 2, env={"DISTRIBUTED_TIMEOUT_MS": "3000"}, rank_env={1: {"CYXWIZ_SECRET": "mine"}})
    intruder = json.loads(res[1].out.strip().splitlines()[-1])
    assert intruder["error"] == "DistStoreError" and "this rank has none" in intruder["message"], ranks.report(res)


def test_repr_never_shows_the_secret(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                "PMI_RANK", "PMI_SIZE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CYXWIZ_SECRET", "hunter2")
    config = cx.distributed.DistributedConfig.from_environment()
    assert config.secret == "hunter2"
    assert "hunter2" not in repr(config) and "shared secret" in repr(config)
    assert os.environ["CYXWIZ_SECRET"] == "hunter2"
