"""Checkpoint TTL and publish (issue 17, item 5): the sweeper deletes expired
checkpoints (row and folder); ttl_seconds outside (0, ten years] is refused
naming the field; a published checkpoint is listed, sampled and loaded by
another tenant through its path, read-only, until it is unpublished; store
write failures are 5xx with a message."""
from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest
import tinker
from tinker import types

from conftest import adam, counting_datum, new_training_client, rest_client, sdk_training_call, service_client
from test_bad_input import json_error, request

OWNER, OTHER = "tml-owner", "tml-other"


def wait_until(cond, what, limit=60.0):
    """Polls cond() until true; fails after `limit` seconds (a bound, not a measured time)."""
    end = time.time() + limit
    while time.time() < end:
        if cond():
            return
        time.sleep(0.1)
    pytest.fail(f"never happened: {what}")


def ckpt_url(path: str, action: str = "") -> str:
    run, kind, name = path[len("tinker://"):].split("/")
    return f"/api/v1/training_runs/{run}/checkpoints/{kind}/{name}" + (f"/{action}" if action else "")


def folder_of(srv, path: str) -> Path:
    run, kind, name = path[len("tinker://"):].split("/")
    return srv.data_dir / "checkpoints" / run / kind / name


@pytest.fixture
def srv(start_server):
    return start_server("--checkpoint-sweep", "0.2")


@pytest.fixture
def trained(srv):
    sc = service_client(srv.base_url, OWNER)
    tc = new_training_client(sc, rank=4, seed=11)
    tc.forward_backward([counting_datum(0)], "cross_entropy").result(timeout=60)
    tc.optim_step(adam(1e-2)).result(timeout=60)
    return tc


def test_expired_checkpoints_are_swept(srv, trained):
    tc = trained
    # saved with a TTL long enough to see them on disk first, then shortened to 1 s
    short = tc.save_state("short", ttl_seconds=3600).result(timeout=60).path
    short_s = tc.save_weights_for_sampler("short-s", ttl_seconds=3600).result(timeout=60).path
    keep = tc.save_state("keep").result(timeout=60).path
    later = tc.save_state("later", ttl_seconds=3600).result(timeout=60).path
    rc = rest_client(srv.base_url, OWNER)
    listed = {c.tinker_path: c for c in rc.list_checkpoints(tc.model_id).result().checkpoints}
    assert listed[later].expires_at is not None and listed[keep].expires_at is None
    for p in (short, short_s, keep, later):
        assert folder_of(srv, p).is_dir()
    for p in (short, short_s):
        rc.set_checkpoint_ttl_from_tinker_path(p, 1).result()
    # and a save's own ttl_seconds is enforced the same way
    direct = tc.save_state("direct", ttl_seconds=1).result(timeout=60).path

    def gone():
        now = {c.tinker_path for c in rc.list_checkpoints(tc.model_id).result().checkpoints}
        return short not in now and short_s not in now and direct not in now
    wait_until(gone, "the 1 s checkpoints leave the listing")
    wait_until(lambda: not any(folder_of(srv, p).exists() for p in (short, short_s, direct)),
               "the expired folders are removed")
    now = {c.tinker_path for c in rc.list_checkpoints(tc.model_id).result().checkpoints}
    assert keep in now and later in now
    assert folder_of(srv, keep).is_dir() and folder_of(srv, later).is_dir()
    kind_dir = folder_of(srv, keep).parent
    wait_until(lambda: not [p for p in kind_dir.iterdir() if p.name.startswith(".")],
               "the renamed-aside folders are removed by the worker")
    # a TTL set afterwards is enforced too
    rc.set_checkpoint_ttl_from_tinker_path(keep, 1).result()
    wait_until(lambda: not folder_of(srv, keep).exists(), "keep, given a 1 s TTL, is removed")
    with pytest.raises(Exception):
        tc.load_state(keep).result(timeout=60)
    print("swept:", short, short_s, keep)


@pytest.mark.parametrize("ttl", [1e308, 10 * 366 * 86400, -5, 0])
def test_ttl_out_of_range_is_refused(srv, trained, ttl):
    tc = trained
    if ttl == 1e308:  # the SDK's own types refuse it (an int field): sent as the wire allows
        status, ctype, data, _ = sdk_training_call(tc, srv.port, "save_weights",
                                                   {"path": "bad-ttl", "ttl_seconds": ttl}, OWNER)
        assert status == 200, data
        status, ctype, data = request(srv.port, "POST", "/api/v1/retrieve_future",
                                      {"request_id": json.loads(data)["request_id"]}, key=OWNER)
        assert b"ttl_seconds" in data and b"out of range" in data, data
    else:
        with pytest.raises(Exception) as e:
            tc.save_state("bad-ttl", ttl_seconds=ttl).result(timeout=60)
        assert "ttl_seconds" in str(e.value), str(e.value)
    path = tc.save_state("ok").result(timeout=60).path
    status, ctype, data = request(srv.port, "PUT", ckpt_url(path, "ttl"), {"ttl_seconds": ttl}, key=OWNER)
    msg = json_error(status, ctype, data, 400)
    assert "ttl_seconds" in msg, msg
    # the tenant's listing still parses (the huge TTL once stored a garbage expires_at)
    ck = rest_client(srv.base_url, OWNER).list_user_checkpoints().result().checkpoints
    assert [c for c in ck if c.tinker_path == path][0].expires_at is None


def test_published_checkpoint_is_shared_read_only(srv, trained):
    tc = trained
    path = tc.save_state("shared").result(timeout=60).path
    spath = tc.save_weights_for_sampler("shared-s").result(timeout=60).path
    private = tc.save_state("private").result(timeout=60).path
    owner, other = rest_client(srv.base_url, OWNER), rest_client(srv.base_url, OTHER)
    osc = service_client(srv.base_url, OTHER)
    prompt = types.ModelInput.from_ints([100, 101, 102])
    params = types.SamplingParams(max_tokens=4, temperature=1.0, seed=3)

    # unpublished: invisible to the other tenant
    with pytest.raises(Exception):
        other.list_checkpoints(tc.model_id).result()
    with pytest.raises(Exception):
        osc.create_sampling_client(model_path=spath).result(timeout=60).sample(prompt, 1, params).result(timeout=60)

    owner.publish_checkpoint_from_tinker_path(path).result()
    owner.publish_checkpoint_from_tinker_path(spath).result()
    listed = {c.tinker_path: c for c in other.list_checkpoints(tc.model_id).result().checkpoints}
    assert set(listed) == {path, spath}, listed  # the private one stays hidden
    assert listed[path].public
    assert other.get_training_run(tc.model_id).result().training_run_id == tc.model_id
    assert other.get_weights_info_by_tinker_path(path).result().lora_rank == 4
    # sampling and create-from-state from the other tenant
    out = osc.create_sampling_client(model_path=spath).result(timeout=60).sample(prompt, 1, params).result(timeout=60)
    assert len(out.sequences[0].tokens) == 4
    mine = osc.create_training_client_from_state(path)
    mine = mine.result(timeout=60) if hasattr(mine, "result") else mine
    a = mine.forward([counting_datum(5)], "cross_entropy").result(timeout=60).metrics["loss:sum"]
    b = tc.forward([counting_datum(5)], "cross_entropy").result(timeout=60).metrics["loss:sum"]
    print(f"loss of the loaded copy {a:.6f}, of the owner's run {b:.6f}")
    assert abs(a - b) <= 1e-4 * max(1.0, abs(b))
    # read-only: the other tenant cannot delete, re-TTL or unpublish it
    for method, url in (("DELETE", ckpt_url(path)), ("PUT", ckpt_url(path, "ttl")),
                        ("DELETE", ckpt_url(path, "publish")), ("POST", ckpt_url(private, "publish"))):
        status, ctype, data = request(srv.port, method, url, {"ttl_seconds": 5} if method == "PUT" else None, key=OTHER)
        json_error(status, ctype, data, 404)
    status, _, data = request(srv.port, "GET", ckpt_url(path), key=OTHER)
    assert status == 200 and json.loads(data)["public"] is True
    assert folder_of(srv, path).is_dir()

    # unpublish revokes
    owner.unpublish_checkpoint_from_tinker_path(path).result()
    owner.unpublish_checkpoint_from_tinker_path(spath).result()
    with pytest.raises(Exception):
        other.list_checkpoints(tc.model_id).result()
    with pytest.raises(Exception):
        osc.create_sampling_client(model_path=spath).result(timeout=60).sample(prompt, 1, params).result(timeout=60)
    with pytest.raises(Exception):
        r = osc.create_training_client_from_state(path)
        (r.result(timeout=60) if hasattr(r, "result") else r).forward([counting_datum(5)], "cross_entropy").result(timeout=60)


def test_cli_lists_a_published_checkpoint(srv, trained):
    tc = trained
    path = tc.save_state("cli").result(timeout=60).path
    rest_client(srv.base_url, OWNER).publish_checkpoint_from_tinker_path(path).result()
    tinker_cli = Path(os.environ.get("TWK_SDK_VENV", "build/venv-sdk")) / "bin" / "tinker"
    if not tinker_cli.exists():
        pytest.skip(f"{tinker_cli} not found")
    env = dict(os.environ, TINKER_BASE_URL=srv.base_url)
    for key in (OWNER, OTHER):
        env["TINKER_API_KEY"] = key
        out = subprocess.run([str(tinker_cli), "--format", "json", "checkpoint", "info", path], env=env,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert path in out.stdout, out.stdout
    env["TINKER_API_KEY"] = OWNER
    out = subprocess.run([str(tinker_cli), "--format", "json", "checkpoint", "list"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and path in out.stdout, out.stderr + out.stdout


def test_store_failure_is_5xx(srv, trained):
    tc = trained
    path = tc.save_state("stuck").result(timeout=60).path
    db = sqlite3.connect(srv.data_dir / "twinkle.db" if (srv.data_dir / "twinkle.db").exists()
                         else next(srv.data_dir.glob("*.db")))
    # every change to the checkpoints table fails, as a full disk would make it
    db.execute("CREATE TRIGGER full_disk BEFORE UPDATE ON checkpoints BEGIN SELECT RAISE(FAIL, 'database or disk is full'); END")
    db.commit()
    for method, url, body in (("PUT", ckpt_url(path, "ttl"), {"ttl_seconds": 60}), ("POST", ckpt_url(path, "publish"), None),
                              ("DELETE", ckpt_url(path, "publish"), None)):
        status, ctype, data = request(srv.port, method, url, body, key=OWNER)
        msg = json_error(status, ctype, data, 500)
        assert "full" in msg, msg
        print(method, url.rsplit("/", 1)[-1], status, msg)
    db.execute("DROP TRIGGER full_disk")
    db.commit()
    db.close()
    status, _, _ = request(srv.port, "PUT", ckpt_url(path, "ttl"), {"ttl_seconds": 60}, key=OWNER)
    assert status == 200
