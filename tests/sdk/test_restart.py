"""Crash safety: a server killed with SIGKILL in the middle of a forward_backward
restarts on the same data dir with its runs and checkpoints, and training
clients created from the saved states reproduce the logprobs recorded before
the kill."""
from __future__ import annotations

import os
import random
import signal
import time

import pytest
import tinker
from tinker.lib.public_interfaces.training_client import TrainingClient

from conftest import (
    BASE_MODEL,
    adam,
    counting_datum,
    logprobs_of,
    new_training_client,
    rest_client,
    service_client,
)


def batch(step):
    rng = random.Random(300 + step)
    return [counting_datum(rng.randrange(32), 12) for _ in range(6)]


EVAL = [counting_datum(s, 12) for s in (0, 9, 17)]


@pytest.fixture
def no_telemetry(monkeypatch):
    # the first server is killed: keep the SDK's telemetry from retrying into the void
    monkeypatch.setenv("TINKER_TELEMETRY", "0")


@pytest.fixture
def crashed(start_server, tmp_path, no_telemetry):
    """Trains, saves twice, then SIGKILLs the server during a big forward_backward."""
    data_dir = tmp_path / "data"
    s1 = start_server(data_dir=data_dir)
    sc = service_client(s1.base_url, "tml-crash")
    tc = new_training_client(sc, rank=8, seed=31, user_metadata={"run": "before-crash"})
    rec = {}
    for step in range(3):
        tc.forward_backward(batch(step), "cross_entropy")
        tc.optim_step(adam())
    rec["p1"] = tc.save_state("r1").result(timeout=60).path
    rec["l1"] = logprobs_of(tc.forward(EVAL, "cross_entropy").result(timeout=60))
    for step in range(3, 5):
        tc.forward_backward(batch(step), "cross_entropy")
        tc.optim_step(adam())
    rec["p2"] = tc.save_state("r2").result(timeout=60).path
    rec["l2"] = logprobs_of(tc.forward(EVAL, "cross_entropy").result(timeout=60))
    rec["sp"] = tc.save_weights_for_sampler("r2-sampler").result(timeout=60).path
    assert rec["l1"] != rec["l2"]

    # a forward_backward that takes about a second on the tiny model; kill the
    # server once its POST has been accepted (the SDK's turn counter moved on)
    turn = tc._turn_counter
    tc.forward_backward([counting_datum(i, 256) for i in range(32)], "cross_entropy")
    deadline = time.time() + 10
    while tc._turn_counter == turn and time.time() < deadline:
        time.sleep(0.005)
    assert tc._turn_counter > turn, "the forward_backward was never submitted"
    time.sleep(0.05)
    os.kill(s1.pid, signal.SIGKILL)
    s1.proc.wait(timeout=20)
    rec.update(model_id=tc.model_id, data_dir=data_dir, session=sc.holder.get_session_id())
    s2 = start_server(data_dir=data_dir)
    rec["s2"] = s2
    return rec


def test_restart_keeps_runs_and_checkpoints(crashed):
    s2 = crashed["s2"]
    rc = rest_client(s2.base_url, "tml-crash")
    runs = rc.list_training_runs(limit=1000).result(timeout=30).training_runs
    old = [r for r in runs if r.training_run_id == crashed["model_id"]]
    assert len(old) == 1, [r.training_run_id for r in runs]
    assert old[0].base_model == BASE_MODEL and old[0].lora_rank == 8
    assert old[0].user_metadata == {"run": "before-crash"}
    cks = {c.tinker_path: c for c in rc.list_checkpoints(crashed["model_id"]).result(timeout=30).checkpoints}
    assert {crashed["p1"], crashed["p2"], crashed["sp"]} <= set(cks), list(cks)
    assert cks[crashed["p1"]].checkpoint_type == "training"
    assert crashed["p1"] in {c.tinker_path for c in rc.list_user_checkpoints(limit=1000).result(timeout=30).checkpoints}
    assert crashed["session"] in rc.list_sessions(limit=1000).result(timeout=30).sessions
    wi = rc.get_weights_info_by_tinker_path(crashed["p2"]).result(timeout=30)
    assert wi.lora_rank == 8 and wi.base_model == BASE_MODEL
    # no half-written checkpoint folders are left visible
    ck_root = crashed["data_dir"] / "checkpoints" / crashed["model_id"] / "weights"
    assert sorted(p.name for p in ck_root.iterdir() if not p.name.startswith(".")) == ["r1", "r2"]


def test_restart_load_state_into_new_run(crashed):
    """A new LoRA run of the same shape loads the checkpoints written before the crash exactly."""
    s2 = crashed["s2"]
    sc = service_client(s2.base_url, "tml-crash")
    tc = new_training_client(sc, rank=8, seed=999)
    for path, want in ((crashed["p1"], crashed["l1"]), (crashed["p2"], crashed["l2"])):
        tc.load_state(path).result(timeout=60)
        got = logprobs_of(tc.forward(EVAL, "cross_entropy").result(timeout=60))
        assert got == want, f"{path}: logprobs after restart differ"
    tc.load_state_with_optimizer(crashed["p2"]).result(timeout=60)
    tc.forward_backward(batch(9), "cross_entropy")
    tc.optim_step(adam()).result(timeout=60)


def test_restart_old_run_reports_lost_state(crashed):
    """The run's live state died with the process: using it fails clearly, it doesn't hang."""
    s2 = crashed["s2"]
    sc = service_client(s2.base_url, "tml-crash")
    holder = sc.holder
    info = tinker.types.GetInfoResponse(model_id=crashed["model_id"],
                                        model_data=tinker.types.ModelData(model_name=BASE_MODEL))
    stale = TrainingClient(holder, model_seq_id=0, model_id=crashed["model_id"], info=info)
    with pytest.raises(tinker.RequestFailedError) as e:
        stale.forward(EVAL, "cross_entropy").result(timeout=30)
    assert "restart" in str(e.value) or "not loaded" in str(e.value)


def test_restart_client_from_state_reproduces_logprobs(crashed):
    s2 = crashed["s2"]
    sc = service_client(s2.base_url, "tml-crash")
    for path, want in ((crashed["p1"], crashed["l1"]), (crashed["p2"], crashed["l2"])):
        tc = sc.create_training_client_from_state(path).result(timeout=60)
        got = logprobs_of(tc.forward(EVAL, "cross_entropy").result(timeout=60))
        assert got == want, f"{path}: logprobs after restart differ"
    # and it trains on
    tc.forward_backward(batch(9), "cross_entropy")
    tc.optim_step(adam()).result(timeout=60)
    # with the optimizer state
    tc2 = sc.create_training_client_from_state_with_optimizer(crashed["p2"]).result(timeout=60)
    assert logprobs_of(tc2.forward(EVAL, "cross_entropy").result(timeout=60)) == crashed["l2"]
