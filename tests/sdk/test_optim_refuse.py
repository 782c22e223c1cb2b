"""Refusing what twinkle does not support (issue 17, item 7): another optimizer's
optimizer_params, non-finite (null on the wire) or unknown AdamW hyperparameters,
and a create_model optimizer_config other than adamw fail naming the field; a
normal step still trains afterwards."""
from __future__ import annotations

import math

import pytest
import tinker
from tinker import types

from conftest import BASE_MODEL, adam, counting_datum, new_training_client, service_client
from test_bad_input import json_error, request


def fails_naming(fut, *words):
    with pytest.raises(Exception) as e:
        fut.result(timeout=60)
    msg = str(e.value)
    for w in words:
        assert w in msg, msg
    return msg


def test_optimizer_params_and_null_hyperparameters(server):
    sc = service_client(server.base_url, "tml-optim")
    tc = new_training_client(sc, rank=4, seed=3)
    tc.forward_backward([counting_datum(1)], "cross_entropy").result(timeout=60)
    msg = fails_naming(tc.optim_step(types.DimuonParams(learning_rate=1e-3)), "optimizer_params", "dimuon")
    print("dimuon:", msg)
    for field in ("learning_rate", "beta1", "eps"):
        bad = adam().model_copy(update={field: math.nan})
        msg = fails_naming(tc.optim_step(bad), field, "null")
        print(f"{field}=nan:", msg)
    bad = adam().model_copy(update={"weight_decay": math.inf})
    fails_naming(tc.optim_step(bad), "weight_decay")
    # nothing was applied, and the run still trains
    before = tc.forward([counting_datum(2)], "cross_entropy").result(timeout=60).metrics["loss:sum"]
    tc.forward_backward([counting_datum(2)], "cross_entropy").result(timeout=60)
    tc.optim_step(adam(1e-2)).result(timeout=60)
    after = tc.forward([counting_datum(2)], "cross_entropy").result(timeout=60).metrics["loss:sum"]
    print(f"loss before {before:.4f} after one step {after:.4f}")
    assert after < before


def test_unknown_adam_key_over_http(server):
    sc = service_client(server.base_url, "tml-optim")
    tc = new_training_client(sc, rank=4, seed=4)
    model_id = tc.model_id
    seq = tc._get_request_id() + 1  # the SDK sends its request id + 1
    status, ctype, data = request(server.port, "POST", "/api/v1/optim_step",
                                  {"model_id": model_id, "seq_id": seq,
                                   "adam_params": {"learning_rate": 1e-3, "nesterov": True}}, key="tml-optim")
    assert status == 200, data
    rid = __import__("json").loads(data)["request_id"]
    status, ctype, data = request(server.port, "POST", "/api/v1/retrieve_future", {"request_id": rid}, key="tml-optim")
    assert b"nesterov" in data, data


def test_create_model_optimizer_config(server):
    sc = service_client(server.base_url, "tml-optim")
    with pytest.raises(Exception) as e:
        new_training_client(sc, rank=4, optimizer=types.DimuonOptimizerConfig())
    assert "optimizer_config" in str(e.value) and "dimuon" in str(e.value), str(e.value)
    # adamw (the SDK's default) is accepted
    tc = new_training_client(sc, rank=4, optimizer=types.AdamOptimizerConfig())
    tc.forward([counting_datum(0)], "cross_entropy").result(timeout=60)
    status, ctype, data = request(server.port, "POST", "/api/v1/create_model",
                                  {"session_id": "x", "model_seq_id": 0, "base_model": BASE_MODEL,
                                   "optimizer_config": {"type": "adamw", "momentum": 0.9}}, key="tml-optim")
    # the session is checked first (404) or the config (400); either names its field
    assert status in (400, 404), data
