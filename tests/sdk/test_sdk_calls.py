"""The SDK's remaining calls (issue 17, item 6): retrieve_futures (the batched
poll the SDK's sampling clients now use), cancel_future, join_sampling_session,
sessions/search, auth/token + whoami (with --jwt-auth), trace_export (a Perfetto
trace of the session, downloaded and decoded), and unload_model."""
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


# ---- trace_export: the session's timeline as a Perfetto trace ----

def perfetto_classes():
    """Trace / TracePacket / TrackDescriptor / TrackEvent / DebugAnnotation: the fields these tests
    read, with the numbers of Perfetto's protos (protos/perfetto/trace/...), built at run time with
    the protobuf package (fields left out are kept as unknown fields)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    fd = descriptor_pb2.FileDescriptorProto(name="twk_perfetto_subset.proto", package="twk.pf", syntax="proto2")

    def msg(name, *fields):
        m = fd.message_type.add(name=name)
        for fname, num, ftype, label, tname in fields:
            f = m.field.add(name=fname, number=num, type=ftype, label=label)
            if tname:
                f.type_name = ".twk.pf." + tname

    opt, rep = F.LABEL_OPTIONAL, F.LABEL_REPEATED
    msg("DebugAnnotation", ("name", 10, F.TYPE_STRING, opt, None), ("int_value", 4, F.TYPE_INT64, opt, None),
        ("string_value", 6, F.TYPE_STRING, opt, None))
    msg("TrackEvent", ("type", 9, F.TYPE_INT32, opt, None), ("track_uuid", 11, F.TYPE_UINT64, opt, None),
        ("name", 23, F.TYPE_STRING, opt, None), ("categories", 22, F.TYPE_STRING, rep, None),
        ("debug_annotations", 4, F.TYPE_MESSAGE, rep, "DebugAnnotation"))
    msg("TrackDescriptor", ("uuid", 1, F.TYPE_UINT64, opt, None), ("name", 2, F.TYPE_STRING, opt, None),
        ("parent_uuid", 5, F.TYPE_UINT64, opt, None), ("description", 14, F.TYPE_STRING, opt, None))
    msg("TracePacket", ("timestamp", 8, F.TYPE_UINT64, opt, None),
        ("trusted_packet_sequence_id", 10, F.TYPE_UINT32, opt, None),
        ("track_event", 11, F.TYPE_MESSAGE, opt, "TrackEvent"),
        ("track_descriptor", 60, F.TYPE_MESSAGE, opt, "TrackDescriptor"))
    msg("Trace", ("packet", 1, F.TYPE_MESSAGE, rep, "TracePacket"))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("twk.pf.Trace"))


def decode_trace(data: bytes):
    """(tracks {uuid: (name, parent_uuid, description)}, slices [dict]) of a .pftrace, each slice's
    begin and end paired on its track (TYPE_SLICE_BEGIN = 1, TYPE_SLICE_END = 2)."""
    trace = perfetto_classes()()
    trace.ParseFromString(data)
    tracks, slices, open_ = {}, [], {}
    for p in trace.packet:
        assert p.trusted_packet_sequence_id == 1, p
        if p.HasField("track_descriptor"):
            d = p.track_descriptor
            tracks[d.uuid] = (d.name, d.parent_uuid, d.description)
        if p.HasField("track_event"):
            e = p.track_event
            assert e.track_uuid in tracks, "an event before its track's descriptor"
            if e.type == 1:
                args = {a.name: (a.string_value if a.HasField("string_value") else a.int_value)
                        for a in e.debug_annotations}
                open_.setdefault(e.track_uuid, []).append(
                    {"name": e.name, "track": e.track_uuid, "begin": p.timestamp, "args": args,
                     "categories": list(e.categories)})
            else:
                assert e.type == 2, e
                s = open_[e.track_uuid].pop()
                s["end"] = p.timestamp
                slices.append(s)
    assert not any(open_.values()), "slices never ended"
    return tracks, slices


def download(url):
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=30) as r:  # no API key: the signature is the permission
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_trace_export(start_server, tmp_path):
    from collections import Counter

    srv = start_server()
    sc = service_client(srv.base_url, KEY)
    sid = sc.holder.get_session_id()
    tc = new_training_client(sc, rank=4, seed=1)
    for i in range(3):  # pipelined, as the SDK's users do: a run's requests overlap in time
        fb, opt = tc.forward_backward([counting_datum(i)], "cross_entropy"), tc.optim_step(adam())
        fb.result(timeout=60)
        opt.result(timeout=60)
    path = tc.save_weights_for_sampler("traced").result(timeout=60).path
    sp = sc.create_sampling_client(model_path=path)
    sp = sp.result(timeout=60) if hasattr(sp, "result") else sp
    params = types.SamplingParams(max_tokens=4, temperature=1.0, seed=3)
    futs = [sp.sample(types.ModelInput.from_ints([100, 101, 102]), 2, params) for _ in range(2)]
    assert all(len(f.result(timeout=120).sequences) == 2 for f in futs)
    # a sampling request that fails (num_samples 0) from a joined client of the same sampler
    sampler_id = sp._sampling_session_id
    status, j = post(srv, "join_sampling_session", {"sampling_session_id": sampler_id})
    status, bad = post(srv, "asample", {"sampling_session_id": sampler_id, "num_samples": 0,
                                        "seq_id": j["client_counter"] * 1_000_000_000,
                                        "prompt": prompt_json([100]), "sampling_params": {"max_tokens": 2}})
    assert status == 200, bad
    poll(srv, bad["request_id"])
    want = {"create_model": 1, "forward_backward": 3, "optim_step": 3, "save_weights_for_sampler": 1, "asample": 3}

    rc = rest_client(srv.base_url, KEY)
    url = rc.export_session_trace(sid).result()
    assert url.startswith(srv.base_url) and "sig=" in url and "expires=" in url, url
    status, data = download(url)
    assert status == 200, data[:300]
    tracks, slices = decode_trace(data)
    print(f"trace: {len(data)} bytes, {len(tracks)} tracks, {len(slices)} slices")
    assert Counter(s["name"] for s in slices) == want, Counter(s["name"] for s in slices)
    assert all(s["begin"] < s["end"] for s in slices)
    assert len({s["args"]["request_id"] for s in slices}) == len(slices)
    # the tracks: "session <id>" on top; under it the run's and the sampler's (several same-named
    # lanes where requests overlapped), each slice on its subject's track
    session_uuid = [u for u, (name, parent, _) in tracks.items() if name == f"session {sid}"]
    assert len(session_uuid) == 1
    assert "11 requests recorded, 0 dropped" in tracks[session_uuid[0]][2], tracks[session_uuid[0]]
    names = {name for u, (name, parent, _) in tracks.items() if u != session_uuid[0]}
    assert names == {tc.model_id, sampler_id}, names
    assert all(parent == session_uuid[0] for u, (name, parent, _) in tracks.items() if u != session_uuid[0])
    for s in slices:
        track_name = tracks[s["track"]][0]
        assert track_name == (sampler_id if s["name"] == "asample" else tc.model_id), (s, track_name)
        assert s["categories"] == (["sample"] if s["name"] == "asample" else ["train"])
    failed = [s for s in slices if s["args"]["status"] == "failed"]
    assert len(failed) == 1 and failed[0]["name"] == "asample" and failed[0]["args"]["category"] == "user", failed
    assert all(s["args"]["tokens"] == 16 for s in slices if s["name"] == "forward_backward")
    assert sorted(s["args"]["tokens"] for s in slices if s["name"] == "asample" and s["args"]["status"] == "ok") == [8, 8]

    # the same records: the same file (not rebuilt); new records: a new trace
    traces = srv.data_dir / "traces" / sid
    before = sorted(p.name for p in traces.iterdir())
    assert len(before) == 1
    status, again = download(rc.export_session_trace(sid).result())
    assert again == data and sorted(p.name for p in traces.iterdir()) == before
    tc.forward_backward([counting_datum(9)], "cross_entropy").result(timeout=60)
    status, newer = download(url)  # an old URL serves the newest trace built
    assert newer == data
    url2 = rc.export_session_trace(sid).result()
    status, newer = download(url2)
    assert status == 200
    tracks2, slices2 = decode_trace(newer)
    assert Counter(s["name"] for s in slices2) == {**want, "forward_backward": 4}
    assert len(list(traces.iterdir())) == 1  # the older file is gone

    # another tenant's session is unknown; a tampered URL is refused
    status, _, _ = request(srv.port, "GET", f"/api/v1/sessions/{sid}/trace_export", key="tml-else")
    assert status == 404
    base, q = url2.split("?", 1)
    sig = q.split("sig=")[1]
    tampered = base + "?" + q.replace("sig=" + sig, "sig=" + ("0" if sig[0] != "0" else "1") + sig[1:])
    assert download(tampered)[0] == 403
    other = base.replace(sid, "sess-0000000000000000")
    assert download(other + "?" + q)[0] == 403  # the signature names the session
    assert download(url2.replace("expires=", "expires=1"))[0] == 403

    # the SDK's CLI writes the file
    cli = Path(os.environ.get("TWK_SDK_VENV", "build/venv-sdk")) / "bin" / "tinker"
    if cli.exists():
        out_file = tmp_path / "cli.pftrace"
        env = dict(os.environ, TINKER_BASE_URL=srv.base_url, TINKER_API_KEY=KEY)
        r = subprocess.run([str(cli), "session", "export-trace", sid, "--output", str(out_file)], env=env,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr + r.stdout
        assert out_file.read_bytes() == newer


def test_trace_url_expires(start_server):
    srv = start_server("--url-ttl", "1")
    sc, sp = sampler(srv)
    sid = sc.holder.get_session_id()
    url = rest_client(srv.base_url, KEY).export_session_trace(sid).result()
    tracks, slices = decode_trace(download(url)[1])  # a session with no request yet: its track alone
    assert slices == [] and [t[0] for t in tracks.values()] == [f"session {sid}"]
    time.sleep(2.2)
    status, body = download(url)
    assert status == 410 and b"expired" in body, body


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
