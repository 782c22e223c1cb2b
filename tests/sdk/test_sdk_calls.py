"""The SDK's remaining calls (issue 17, item 6): retrieve_futures (the batched
poll the SDK's sampling clients now use), cancel_future, join_sampling_session,
sessions/search, auth/token + whoami (with --jwt-auth), trace_export, and
unload_model."""
from __future__ import annotations

import json
import os
import pickle
import subprocess
import time
from pathlib import Path

import pytest
import tinker
from tinker import types

from conftest import BASE_MODEL, adam, counting_datum, new_training_client, rest_client, service_client
from test_bad_input import json_error, request

KEY = "tml-calls"


def post(srv, route, body, key=KEY):
    status, ctype, data = request(srv.port, "POST", f"/api/v1/{route}", body, key=key)
    if "json" not in ctype:  # a sampling result: protobuf
        return status, {"protobuf_bytes": len(data)}
    return status, json.loads(data) if data else None


def poll(srv, rid, key=KEY):
    """retrieve_future until it is no longer try_again; the parsed answer."""
    for _ in range(200):
        status, body = post(srv, "retrieve_future", {"request_id": rid}, key)
        if body.get("type") != "try_again" and body.get("status") != "try_again":
            return status, body
    raise AssertionError("never finished")


def log_routes(srv):
    return [json.loads(l).get("route") for l in srv.log_path.read_text().splitlines() if l.startswith("{")]


def sampler(srv, key=KEY):
    sc = service_client(srv.base_url, key)
    return sc, sc.create_sampling_client(base_model=BASE_MODEL).result(timeout=60)


def prompt_json(tokens):
    return {"chunks": [{"type": "encoded_text", "tokens": tokens}]}


def test_sampling_goes_through_retrieve_futures_and_join(start_server):
    srv = start_server("--log-format", "json")
    sc, sp = sampler(srv)
    params = types.SamplingParams(max_tokens=6, temperature=1.0, seed=7)
    prompt = types.ModelInput.from_ints([100, 101, 102])
    futs = [sp.sample(prompt, 2, params) for _ in range(4)]
    outs = [f.result(timeout=120) for f in futs]
    assert all(len(o.sequences) == 2 and len(o.sequences[0].tokens) == 6 for o in outs)
    # a pickled copy (the SDK's "shadow" client) joins the session for its own client id
    copy = pickle.loads(pickle.dumps(sp))
    out = copy.sample(prompt, 1, params).result(timeout=120)
    assert len(out.sequences[0].tokens) == 6
    routes = log_routes(srv)
    print("retrieve_futures polls:", routes.count("retrieve_futures"), "joins:", routes.count("join_sampling_session"))
    assert routes.count("retrieve_futures") >= 1 and routes.count("join_sampling_session") == 1


def test_retrieve_futures_over_http(start_server):
    srv = start_server()
    sc, sp = sampler(srv)
    sid = sp._sampling_session_id
    status, j1 = post(srv, "join_sampling_session", {"sampling_session_id": sid})
    status, j2 = post(srv, "join_sampling_session", {"sampling_session_id": sid})
    assert (j1["client_counter"], j2["client_counter"]) == (1, 2)
    clone = j2["client_counter"]
    body = {"sampling_session_id": sid, "num_samples": 1, "prompt": prompt_json([100, 101]),
            "sampling_params": {"max_tokens": 3, "seed": 1}}
    ids = []
    for i in range(3):
        status, r = post(srv, "asample", {**body, "seq_id": clone * 1_000_000_000 + i})
        assert status == 200, r
        ids.append(r["request_id"])
    status, bad = post(srv, "asample", {**body, "seq_id": clone * 1_000_000_000 + 3, "num_samples": 0})
    ids.append(bad["request_id"])  # fails at once: reported as failed
    target = {"type": "sampling_session", "sampling_session_id": sid, "cloned_sampler_id": clone}
    seen, cursor = {}, 0
    while len(seen) < 4:
        status, r = post(srv, "retrieve_futures", {"target": target, "prev_cursor": cursor})
        assert status == 200, r
        for c in r["completions"]:
            seen[c["request_id"]] = c
        cursor = r["cursor"]
    assert set(seen) == set(ids)
    assert seen[ids[3]]["state"] == "failed" and all(seen[i]["state"] == "finished" for i in ids[:3])
    assert all(seen[i]["response_payload_uncompressed_size"] > 0 for i in ids[:3])
    # acknowledged by prev_cursor: an immediate poll returns nothing new; another client sees none of them
    status, r = post(srv, "retrieve_futures", {"target": target, "prev_cursor": cursor, "timeout": 0})
    assert r["completions"] == [] and r["cursor"] == cursor
    status, r = post(srv, "retrieve_futures", {"target": {**target, "cloned_sampler_id": 1}, "timeout": 0})
    assert r["completions"] == []
    for rid in ids[:3]:
        status, res = poll(srv, rid)
        assert status == 200
    # another tenant's session is unknown
    status, r = post(srv, "retrieve_futures", {"target": target, "timeout": 0}, key="tml-else")
    assert status == 404


def test_cancel_future(start_server):
    srv = start_server()
    sc, sp = sampler(srv)
    sid = sp._sampling_session_id
    body = {"sampling_session_id": sid, "num_samples": 16, "prompt": prompt_json([100, 101]),
            "sampling_params": {"max_tokens": 200, "seed": 1}}
    ids = [post(srv, "asample", {**body, "seq_id": i})[1]["request_id"] for i in range(6)]
    status, _ = post(srv, "cancel_future", {"request_id": ids[-1]})  # still queued: dropped
    assert status == 200
    status, r = poll(srv, ids[-1])
    assert r["category"] == "cancelled", r
    status, _ = post(srv, "cancel_future", {"request_id": ids[0]})  # running (or queued): its result is discarded
    status, r = poll(srv, ids[0])
    assert r["category"] == "cancelled", r
    for rid in ids[1:-1]:
        status, r = poll(srv, rid)
        assert "error" not in r, r
    # unknown ids and other tenants' futures are 404; a finished future is left alone
    assert post(srv, "cancel_future", {"request_id": "req-" + "0" * 32})[0] == 404
    assert post(srv, "cancel_future", {"request_id": ids[1]}, key="tml-else")[0] == 404
    assert post(srv, "cancel_future", {"request_id": ids[1]})[0] == 200
    assert "error" not in poll(srv, ids[1])[1]

    # a training op held ahead of its run's order: cancelled, its slot still keeps the order
    tc = new_training_client(sc, rank=4, seed=3)
    status, held = post(srv, "optim_step", {"model_id": tc.model_id, "seq_id": 2, "adam_params": {}})
    assert post(srv, "cancel_future", {"request_id": held["request_id"]})[0] == 200
    status, first = post(srv, "optim_step", {"model_id": tc.model_id, "seq_id": 1, "adam_params": {}})
    status, r = poll(srv, first["request_id"])
    assert "metrics" in r, r
    status, r = poll(srv, held["request_id"])
    assert r["category"] == "cancelled", r
    status, third = post(srv, "optim_step", {"model_id": tc.model_id, "seq_id": 3, "adam_params": {}})
    status, r = poll(srv, third["request_id"])
    assert "metrics" in r and r["metrics"]["step:max"] == 2, r  # the cancelled step did not run


def test_sessions_search(start_server):
    srv = start_server()
    made = []
    for i in range(3):
        sc = service_client(srv.base_url, KEY, user_metadata={"exp": "search", "i": str(i)})
        new_training_client(sc, rank=4, seed=i)  # the session is created with the first client
        made.append(sc.holder.get_session_id())
    service_client(srv.base_url, "tml-else", user_metadata={"exp": "search"}).create_sampling_client(
        base_model=BASE_MODEL).result(timeout=60)
    rc = rest_client(srv.base_url, KEY)
    page = rc.search_sessions(types.SessionSearchRequest(user_metadata={"exp": "search"}, limit=2)).result()
    got = [s.session_id for s in page.sessions]
    assert len(got) == 2 and page.next_cursor is not None
    page2 = rc.search_sessions(types.SessionSearchRequest(user_metadata={"exp": "search"}, limit=2,
                                                          cursor=page.next_cursor)).result()
    got += [s.session_id for s in page2.sessions]
    assert page2.next_cursor is None
    assert sorted(got) == sorted(made), (got, made)  # newest first, the other tenant's absent
    one = rc.search_sessions(types.SessionSearchRequest(session_id=made[1])).result().sessions
    assert [s.session_id for s in one] == [made[1]] and one[0].user_metadata["i"] == "1"
    assert one[0].status is not None and one[0].status.type == "active"
    none = rc.search_sessions(types.SessionSearchRequest(user_metadata={"exp": "nope"})).result()
    assert none.sessions == []


def test_whoami_and_jwt_auth(start_server, tmp_path):
    keys = tmp_path / "keys.txt"
    keys.write_text("tml-k1 team1\ntml-k2 team2\n")
    srv = start_server("--keys", str(keys), "--jwt-auth")
    who = rest_client(srv.base_url, "tml-k1").whoami().result()
    assert who.user_urn == "tml:user:team1" and who.org_urn == "tml:organization:team1", who
    # the whole SDK works through the exchanged token
    sc = service_client(srv.base_url, "tml-k2")
    tc = new_training_client(sc, rank=4, seed=1)
    tc.forward_backward([counting_datum(0)], "cross_entropy").result(timeout=60)
    tc.optim_step(adam()).result(timeout=60)
    runs = rest_client(srv.base_url, "tml-k2").list_training_runs().result().training_runs
    assert [r.model_owner for r in runs] == ["team2"]
    # an unknown key gets no token; a forged token is refused with invalid_token (the SDK re-exchanges)
    status, _, _ = request(srv.port, "POST", "/api/v1/auth/token", {}, key="tml-nope")
    assert status == 401
    c = __import__("http.client").client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
    c.request("GET", "/api/v1/training_runs", headers={"X-API-Key": "eyJhbGciOiJIUzI1NiJ9.e30.forged"})
    r = c.getresponse()
    r.read()
    assert r.status == 401 and 'error="invalid_token"' in (r.getheader("WWW-Authenticate") or "")
    # the CLI's whoami
    cli = Path(os.environ.get("TWK_SDK_VENV", "build/venv-sdk")) / "bin" / "tinker"
    if cli.exists():
        env = dict(os.environ, TINKER_BASE_URL=srv.base_url, TINKER_API_KEY="tml-k1")
        out = subprocess.run([str(cli), "--format", "json", "auth", "whoami"], env=env, capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0 and "tml:user:team1" in out.stdout, out.stderr + out.stdout


def test_trace_export_says_why(start_server):
    srv = start_server()
    sc, sp = sampler(srv)
    sid = sc.holder.get_session_id()
    with pytest.raises(RuntimeError) as e:
        rest_client(srv.base_url, KEY).export_session_trace(sid).result()
    assert "not available" in str(e.value)
    status, _, _ = request(srv.port, "GET", f"/api/v1/sessions/{sid}/trace_export", key="tml-else")
    assert status == 404


def test_unload_model(start_server):
    srv = start_server()
    sc = service_client(srv.base_url, KEY)
    tc = new_training_client(sc, rank=4, seed=1)
    tc.forward_backward([counting_datum(0)], "cross_entropy").result(timeout=60)
    path = tc.save_state("before-unload").result(timeout=60).path
    status, r = post(srv, "unload_model", {"model_id": tc.model_id})
    assert status == 200 and r["model_id"] == tc.model_id
    status, r = poll(srv, r["request_id"])
    assert r == {"model_id": tc.model_id, "type": "unload_model"}, r
    with pytest.raises(Exception) as e:
        tc.forward([counting_datum(1)], "cross_entropy").result(timeout=60)
    assert "not loaded" in str(e.value)
    assert post(srv, "get_info", {"model_id": tc.model_id})[0] == 200
    assert post(srv, "unload_model", {"model_id": tc.model_id}, key="tml-else")[0] == 404
    # its checkpoint still loads into a new client
    tc2 = sc.create_training_client_from_state(path)
    tc2 = tc2.result(timeout=60) if hasattr(tc2, "result") else tc2
    tc2.forward([counting_datum(1)], "cross_entropy").result(timeout=60)
