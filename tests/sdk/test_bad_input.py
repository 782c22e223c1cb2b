"""Bad input: raw HTTP (malformed requests, oversized bodies, bad JSON and
protobuf, wrong field types, unknown ids, missing keys) gets the right status
with a JSON body naming the problem; through the SDK, invalid training data
fails the future with a message naming the field, and the same training client
keeps working afterwards (its seq_id ordering is not stuck)."""
from __future__ import annotations

import http.client
import json
import math
import select
import socket
import time

import pytest
import tinker
from tinker import types
from tinker.proto.request_conv import forward_backward_request_to_proto

from conftest import adam, counting_datum, make_datum, new_training_client, service_client

KEY = "tml-badinput"


def raw_exchange(port: int, data: bytes, timeout: float = 10.0) -> bytes:
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(data)
        out = b""
        while True:
            try:
                b = s.recv(65536)
            except (ConnectionResetError, socket.timeout):
                break
            if not b:
                break
            out += b
            if parse_response(out, complete_only=True) is not None:
                break
        return out
    finally:
        s.close()


def parse_response(raw: bytes, complete_only: bool = False):
    """(status, headers, body) of one HTTP/1.1 response with Content-Length."""
    head, sep, body = raw.partition(b"\r\n\r\n")
    if not sep:
        if complete_only:
            return None
        raise AssertionError(f"no HTTP response: {raw[:200]!r}")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for l in lines[1:]:
        k, _, v = l.partition(":")
        headers[k.strip().lower()] = v.strip()
    n = int(headers.get("content-length", len(body)))
    if complete_only and len(body) < n:
        return None
    return status, headers, body[:n]


def request(port, method, path, body=None, key=KEY, content_type="application/json", headers=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    h = {"Content-Type": content_type}
    if key is not None:
        h["X-API-Key"] = key
    h.update(headers or {})
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
    c.request(method, path, body=body, headers=h)
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, r.getheader("Content-Type") or "", data


def json_error(status, ctype, data, want_status):
    assert status == want_status, (status, data[:300])
    assert "application/json" in ctype, ctype
    assert data, "error responses must have a body (an empty 400 is retried by the SDK)"
    body = json.loads(data)
    assert isinstance(body, dict)
    msg = body.get("error") or body.get("detail")
    assert isinstance(msg, str) and msg, body
    return msg


@pytest.fixture(scope="module")
def port(server):
    return server.port


@pytest.fixture(scope="module")
def model(server):
    """A training client of KEY's tenant (its model id is used by the raw requests)."""
    sc = service_client(server.base_url, KEY)
    return new_training_client(sc, rank=4, seed=9)


# ---- raw HTTP ----

@pytest.mark.parametrize("raw", [
    b"GARBAGE\r\n\r\n",
    b"POST /api/v1/create_session HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
    b"POST /api/v1/create_session HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    b"GET /api/v1/healthz HTTP/1.1\r\nBad Header Line\r\n\r\n",
], ids=["bad-method", "bad-content-length", "length-and-chunked", "bad-header-line"])
def test_malformed_http_is_400_with_json(port, raw):
    out = raw_exchange(port, raw)
    status, headers, body = parse_response(out)
    json_error(status, headers.get("content-type", ""), body, 400)


def test_server_survives_garbage(port):
    raw_exchange(port, b"\x00\x01\x02\xff" * 100 + b"\r\n\r\n")
    status, _, body = request(port, "GET", "/api/v1/healthz", key=None)
    assert status == 200 and json.loads(body) == {"status": "ok"}


def send_big(port: int, n: int, chunked: bool = False) -> bytes:
    """Sends a POST with an n-byte body, stopping as soon as the server answers."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    head = (b"POST /api/v1/create_session HTTP/1.1\r\nHost: x\r\nX-API-Key: " + KEY.encode() +
            b"\r\nContent-Type: application/json\r\n")
    head += b"Transfer-Encoding: chunked\r\n\r\n" if chunked else b"Content-Length: %d\r\n\r\n" % n
    out = b""
    try:
        s.sendall(head)
        piece = b"x" * 65536
        sent = 0
        while sent < n:
            r, _, _ = select.select([s], [], [], 0.02)
            if r:
                break
            s.sendall(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
            sent += len(piece)
        else:
            if chunked:
                s.sendall(b"0\r\n\r\n")
        while parse_response(out, complete_only=True) is None:
            b = s.recv(65536)
            if not b:
                break
            out += b
    except (BrokenPipeError, ConnectionResetError):
        pass
    finally:
        s.close()
    return out


def test_body_over_limit_is_413(start_server):
    srv = start_server("--max-body-mb", "1")
    for chunked in (False, True):
        status, headers, body = parse_response(send_big(srv.port, 2 << 20, chunked))
        json_error(status, headers.get("content-type", ""), body, 413)


def test_max_body_mb_is_megabytes(start_server):
    """--max-body-mb 1 must allow bodies up to 1 MiB: ordinary requests and a 512 KiB one."""
    srv = start_server("--max-body-mb", "1")
    status, _, data = request(srv.port, "POST", "/api/v1/create_session",
                              {"tags": [], "user_metadata": {}, "sdk_version": "0.38.0"})
    assert status == 200, (status, data)
    pad = "x" * (512 << 10)
    status, _, data = request(srv.port, "POST", "/api/v1/create_session",
                              {"tags": [], "user_metadata": {"pad": pad}, "sdk_version": "0.38.0"})
    assert status == 200, (status, data[:200])
    sc = service_client(srv.base_url, KEY)
    tc = new_training_client(sc, rank=4, seed=1)
    tc.forward([counting_datum(0, 8)], "cross_entropy").result(timeout=60)


@pytest.mark.parametrize("body", [b"{bad json", b"{\"tags\": [1,", b"[1, 2]", b"\"str\"", b"\xff\xfe"])
def test_bad_json_is_400(port, body):
    msg = json_error(*request(port, "POST", "/api/v1/create_session", body), 400)
    assert "JSON" in msg or "json" in msg, msg


@pytest.mark.parametrize("body", [b"\xff\xff\xff\xff", b"\x0a\x50abc", b"\x1a\x05\x0a\x03\x0a\x01"])
def test_bad_protobuf_is_400(port, model, body):
    msg = json_error(*request(port, "POST", "/api/v1/forward_backward", body,
                              content_type="application/x-protobuf"), 400)
    assert "protobuf" in msg.lower() or "ForwardBackwardRequest" in msg, msg


WRONG_TYPES = [
    ("optim_step", lambda m: {"model_id": m, "seq_id": "x", "adam_params": {}}, "seq_id"),
    ("optim_step", lambda m: {"model_id": 5, "seq_id": 1}, "model_id"),
    ("save_weights", lambda m: {"model_id": m, "seq_id": 1.5, "path": "x"}, "seq_id"),
    ("create_model", lambda m: {"session_id": "s", "model_seq_id": "x", "base_model": "b"}, "model_seq_id"),
    ("create_model", lambda m: {"session_id": 7, "model_seq_id": 0, "base_model": "b"}, "session_id"),
    ("create_session", lambda m: {"tags": "x", "sdk_version": "0.38.0"}, "tags"),
    ("create_session", lambda m: {"tags": [], "user_metadata": [1]}, "user_metadata"),
    ("retrieve_future", lambda m: {"request_id": 12}, "request_id"),
    ("weights_info", lambda m: {"tinker_path": 3}, "tinker_path"),
    ("session_heartbeat", lambda m: {"session_id": None}, "session_id"),
]


@pytest.mark.parametrize("route,body,field", WRONG_TYPES, ids=[f"{r}-{f}-{i}" for i, (r, _, f) in enumerate(WRONG_TYPES)])
def test_wrong_types_are_400_naming_the_field(port, model, route, body, field):
    msg = json_error(*request(port, "POST", f"/api/v1/{route}", body(model.model_id)), 400)
    assert field in msg, msg


def test_create_model_bad_lora_config_is_400(port, model):
    sess = model.holder.get_session_id()
    base = {"session_id": sess, "model_seq_id": 500, "base_model": "twinkle/tiny-qwen3"}
    msg = json_error(*request(port, "POST", "/api/v1/create_model", {**base, "lora_config": {"rank": "8"}}), 400)
    assert "rank" in msg, msg
    msg = json_error(*request(port, "POST", "/api/v1/create_model", {**base, "lora_config": {"rank": 0}}), 400)
    assert "rank" in msg, msg
    msg = json_error(*request(port, "POST", "/api/v1/create_model",
                              {**base, "model_seq_id": 501, "base_model": "no/such-model", "lora_config": {"rank": 4}}), 400)
    assert "no/such-model" in msg, msg


def fb_proto(model_id: str, seq_id: int, data=None, loss_fn="cross_entropy") -> bytes:
    req = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=data or [counting_datum(0, 8)], loss_fn=loss_fn),
        model_id=model_id, seq_id=seq_id)
    msg = forward_backward_request_to_proto(req)
    msg.forward_only = True
    return msg.SerializeToString()


def test_unknown_model_is_404(port):
    msg = json_error(*request(port, "POST", "/api/v1/get_info", {"model_id": "no-such-model"}), 404)
    assert "no-such-model" in msg
    json_error(*request(port, "POST", "/api/v1/optim_step",
                        {"model_id": "no-such-model", "seq_id": 1, "adam_params": {"learning_rate": 1e-3}}), 404)
    json_error(*request(port, "POST", "/api/v1/save_weights", {"model_id": "no-such-model", "seq_id": 1, "path": "x"}), 404)
    json_error(*request(port, "POST", "/api/v1/forward_backward", fb_proto("no-such-model", 1),
                        content_type="application/x-protobuf"), 404)
    json_error(*request(port, "POST", "/api/v1/weights_info", {"tinker_path": "tinker://no-such-model/weights/x"}), 404)


def test_unknown_request_id_is_404(port, server):
    json_error(*request(port, "POST", "/api/v1/retrieve_future", {"request_id": "req-does-not-exist"}), 404)
    # another tenant's request id is unknown to this tenant
    sc = service_client(server.base_url, "tml-other-tenant")
    tc = new_training_client(sc, rank=4, seed=1)
    status, _, data = request(port, "POST", "/api/v1/forward_backward", fb_proto(tc.model_id, 10_000),
                              content_type="application/x-protobuf", key="tml-other-tenant")
    assert status == 200, data
    rid = json.loads(data)["request_id"]
    json_error(*request(port, "POST", "/api/v1/retrieve_future", {"request_id": rid}), 404)


@pytest.mark.parametrize("key", [None, "", "sk-not-tinker", "TML-upper"])
def test_missing_or_bad_api_key_is_401(port, model, key):
    json_error(*request(port, "POST", "/api/v1/get_info", {"model_id": model.model_id}, key=key), 401)
    json_error(*request(port, "GET", "/api/v1/training_runs", key=key), 401)


def test_unknown_endpoint_is_404_with_json(port):
    json_error(*request(port, "POST", "/api/v1/no_such_thing", {}), 404)
    json_error(*request(port, "GET", "/nothing-here"), 404)


def test_pending_future_long_polls_then_try_again_and_gap_times_out(start_server):
    """retrieve_future holds a pending future for --poll-timeout, then answers try_again;
    ops queued behind a seq_id that never arrives fail after --seq-timeout naming it."""
    srv = start_server("--poll-timeout", "1", "--seq-timeout", "3")
    sc = service_client(srv.base_url, KEY)
    tc = new_training_client(sc, rank=4, seed=2)
    st, _, data = request(srv.port, "POST", "/api/v1/forward_backward", fb_proto(tc.model_id, 2),
                          content_type="application/x-protobuf")
    assert st == 200, data
    rid = json.loads(data)["request_id"]
    t = time.time()
    st, _, data = request(srv.port, "POST", "/api/v1/retrieve_future", {"request_id": rid, "allow_metadata_only": True})
    held = time.time() - t
    assert st in (200, 408) and json.loads(data).get("type") == "try_again", (st, data)
    assert 0.5 <= held <= 5, f"long poll held {held:.2f} s with --poll-timeout 1"
    deadline = time.time() + 15
    body = {}
    while time.time() < deadline:
        st, ct, data = request(srv.port, "POST", "/api/v1/retrieve_future", {"request_id": rid},
                               headers={"Accept": "application/x-protobuf"})
        assert st in (200, 408), (st, data)
        body = json.loads(data) if "json" in ct else {}
        if body.get("type") != "try_again":
            break
    assert "error" in body, body
    assert body.get("category") == "user" and "seq_id 1" in body["error"], body
    # the run goes on after the hole
    st, _, data = request(srv.port, "POST", "/api/v1/forward_backward", fb_proto(tc.model_id, 3),
                          content_type="application/x-protobuf")
    rid3 = json.loads(data)["request_id"]
    st, ct, data = request(srv.port, "POST", "/api/v1/retrieve_future", {"request_id": rid3},
                           headers={"Accept": "application/x-protobuf"})
    assert st == 200 and "application/x-protobuf" in ct, (st, ct, data[:200])


def test_resubmitted_seq_id_gets_same_future(port, server):
    """A retried forward_backward POST (same model_id, seq_id) must not run twice."""
    sc = service_client(server.base_url, KEY)
    tc = new_training_client(sc, rank=4, seed=2)
    body = fb_proto(tc.model_id, 1)
    r1 = request(port, "POST", "/api/v1/forward_backward", body, content_type="application/x-protobuf")
    r2 = request(port, "POST", "/api/v1/forward_backward", body, content_type="application/x-protobuf")
    assert r1[0] == r2[0] == 200
    assert json.loads(r1[2])["request_id"] == json.loads(r2[2])["request_id"]
    # out of order: seq 3 first, then 2; both complete
    r3 = request(port, "POST", "/api/v1/forward_backward", fb_proto(tc.model_id, 3), content_type="application/x-protobuf")
    r2b = request(port, "POST", "/api/v1/forward_backward", fb_proto(tc.model_id, 2), content_type="application/x-protobuf")
    for r in (r1, r2b, r3):
        rid = json.loads(r[2])["request_id"]
        st, ct, data = request(port, "POST", "/api/v1/retrieve_future", {"request_id": rid},
                               headers={"Accept": "application/x-protobuf"})
        assert st == 200 and "application/x-protobuf" in ct, (st, ct, data[:200])


# ---- through the SDK: bad training data fails the future, naming the field ----

GOOD = [counting_datum(3, 8)]

BAD_CASES = [
    ("oov_model_input", lambda: [make_datum([1, 2, 600], [2, 3, 4], [1, 1, 1])], ["tokens", "vocabulary"]),
    ("negative_token", lambda: [make_datum([1, -2, 3], [2, 3, 4], [1, 1, 1])], ["tokens", "vocabulary"]),
    ("oov_target", lambda: [make_datum([1, 2, 3], [2, 3, 4000], [1, 1, 1])], ["target_tokens", "vocabulary"]),
    ("nan_weight", lambda: [make_datum([1, 2, 3], [2, 3, 4], [1, math.nan, 1])], ["weights"]),
    ("inf_weight", lambda: [make_datum([1, 2, 3], [2, 3, 4], [1, math.inf, 1])], ["weights"]),
    ("short_targets", lambda: [make_datum([1, 2, 3], [2, 3], [1, 1])], ["target_tokens"]),
    ("long_targets", lambda: [make_datum([1, 2, 3], [2, 3, 4, 5], [1, 1, 1, 1])], ["target_tokens"]),
    ("short_weights", lambda: [make_datum([1, 2, 3], [2, 3, 4], [1, 1])], ["weights"]),
    ("no_targets", lambda: [types.Datum(model_input=types.ModelInput.from_ints([1, 2, 3]),
                                        loss_fn_inputs={"weights": [1.0, 1.0, 1.0]})], ["target_tokens"]),
    ("second_datum_bad", lambda: [counting_datum(0, 8), make_datum([1, 2, 3], [2, 3, 999], [1, 1, 1])],
     ["data[1]", "target_tokens"]),
]


@pytest.fixture(scope="module")
def sdk_client(server):
    sc = service_client(server.base_url, KEY)
    return new_training_client(sc, rank=4, seed=3)


def assert_still_works(tc, timeout=10):
    t = time.time()
    out = tc.forward(GOOD, "cross_entropy").result(timeout=timeout)
    assert len(out.loss_fn_outputs) == 1
    return time.time() - t


@pytest.mark.parametrize("name,data,words", BAD_CASES, ids=[c[0] for c in BAD_CASES])
@pytest.mark.parametrize("forward_only", [False, True], ids=["fwdbwd", "fwd"])
def test_bad_datum_fails_future_naming_field(sdk_client, name, data, words, forward_only):
    tc = sdk_client
    call = tc.forward if forward_only else tc.forward_backward
    with pytest.raises(tinker.RequestFailedError) as e:
        call(data(), "cross_entropy").result(timeout=30)
    for w in words:
        assert w in str(e.value), f"{name}: {w!r} not in {e.value}"
    assert_still_works(tc)


def test_unknown_loss_fn_fails_future(sdk_client):
    with pytest.raises(tinker.RequestFailedError) as e:
        sdk_client.forward_backward(GOOD, "no_such_loss").result(timeout=30)
    assert "loss_fn" in str(e.value) and "no_such_loss" in str(e.value)
    assert_still_works(sdk_client)


def test_bad_optimizer_params_fail_future(sdk_client):
    for bad in (types.AdamParams(learning_rate=-1.0), types.AdamParams(learning_rate=1e-3, beta1=1.5),
                types.AdamParams(learning_rate=1e-3, eps=0.0)):
        with pytest.raises(tinker.RequestFailedError) as e:
            sdk_client.optim_step(bad).result(timeout=30)
        assert "adam_params" in str(e.value)
        assert_still_works(sdk_client)
    sdk_client.forward_backward(GOOD, "cross_entropy")
    sdk_client.optim_step(adam()).result(timeout=30)


def test_bad_checkpoint_names_and_paths(sdk_client):
    for name in ("a/b", "a b", ".hidden", ""):
        with pytest.raises((tinker.RequestFailedError, ValueError)) as e:
            sdk_client.save_state(name).result(timeout=30)
        assert_still_works(sdk_client)
    with pytest.raises(tinker.RequestFailedError) as e:
        sdk_client.load_state(f"tinker://{sdk_client.model_id}/weights/never-saved").result(timeout=30)
    assert "not found" in str(e.value)
    assert_still_works(sdk_client)
    with pytest.raises(tinker.RequestFailedError) as e:
        sdk_client.load_state("tinker://x/y").result(timeout=30)
    assert "path" in str(e.value)
    assert_still_works(sdk_client)
    sp = sdk_client.save_weights_for_sampler("only-sampler").result(timeout=30).path
    with pytest.raises(tinker.RequestFailedError) as e:
        sdk_client.load_state_with_optimizer(sp).result(timeout=30)
    assert "optimizer" in str(e.value)
    assert_still_works(sdk_client)


def image_datum():
    chunks = [types.EncodedTextChunk(tokens=[1, 2]), types.ImageChunk(data=b"\x89PNG\r\n", format="png", expected_tokens=2)]
    return types.Datum(model_input=types.ModelInput(chunks=chunks),
                       loss_fn_inputs={"target_tokens": [2, 3, 4, 5], "weights": [1.0] * 4})


@pytest.mark.parametrize("name,data,word", [
    ("empty_model_input", lambda: [make_datum([], [], [])], "model_input"),
    ("image_chunk", lambda: [image_datum()], "image"),
], ids=["empty_model_input", "image_chunk"])
def test_unsupported_content_does_not_stall_the_client(server, name, data, word):
    """Content the server can't train on (a datum with no tokens, an image chunk on a text
    model) is a user error: the request fails naming the problem, and the client's next
    request runs at once (no hole in the run's seq_id order until --seq-timeout)."""
    sc = service_client(server.base_url, KEY)
    tc = new_training_client(sc, rank=4, seed=4)
    with pytest.raises((tinker.RequestFailedError, tinker.BadRequestError)) as e:
        tc.forward_backward(data(), "cross_entropy").result(timeout=30)
    assert word in str(e.value)
    assert_still_works(tc, timeout=10)
