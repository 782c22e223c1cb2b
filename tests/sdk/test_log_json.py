"""Structured logs (issue 17, item 8): with --log-format json every stderr line is
one JSON object; every answered request has a line with its level, request id,
tenant, route, method, status and duration; failed futures and the server's own
messages are lines too. Request bodies never appear."""
from __future__ import annotations

import json
import time

from tinker import types

from conftest import counting_datum, new_training_client, service_client
from test_bad_input import json_error, parse_response, raw_exchange, request

KEY = "tml-jsonlog"
MARKER = "body-marker-77e2"


def json_lines(srv, until, limit=30.0):
    """Every line of srv's log parsed as JSON (each must parse) once until(lines) holds."""
    end = time.time() + limit
    while True:
        text = srv.log_path.read_text(errors="strict")
        lines = [json.loads(l) for l in text.splitlines() if l.strip()]
        if until(lines) or time.time() > end:
            return lines
        time.sleep(0.1)


def requests_of(lines, route=None):
    return [l for l in lines if l["event"] == "request" and (route is None or l["route"] == route)]


def test_every_request_is_one_json_line(start_server):
    srv = start_server("--log-format", "json")
    n_health = 7
    for _ in range(n_health):
        assert request(srv.port, "GET", "/api/v1/healthz", key=None)[0] == 200
    json_error(*request(srv.port, "POST", "/api/v1/get_info", {"model_id": "nope", "x": MARKER}, key=KEY), 404)
    json_error(*request(srv.port, "POST", "/api/v1/get_info", {"model_id": "m", "x": MARKER}, key=None), 401)
    status, headers, body = parse_response(raw_exchange(srv.port, b"GARBAGE " + MARKER.encode() + b"\r\n\r\n"))
    assert status == 400
    sc = service_client(srv.base_url, KEY)
    tc = new_training_client(sc, rank=4, seed=2)
    fb = tc.forward_backward([counting_datum(0)], "cross_entropy")
    fb.result(timeout=60)
    try:
        tc.optim_step(types.DimuonParams(learning_rate=1e-3)).result(timeout=60)
    except Exception:
        pass
    else:
        raise AssertionError("the Dimuon step should have failed")

    lines = json_lines(srv, lambda ls: any(l["event"] == "future_failed" for l in ls)
                       and len(requests_of(ls, "optim_step")) >= 1)
    text = srv.log_path.read_text()
    assert MARKER not in text, "a request body reached the log"
    for l in lines:
        assert l["level"] in ("info", "warn", "error") and l["ts"].endswith("Z"), l
    reqs = requests_of(lines)
    for r in reqs:
        for k in ("request_id", "tenant", "route", "method", "status", "duration_ms"):
            assert k in r, r
        assert r["duration_ms"] >= 0
        assert r["level"] == ("error" if r["status"] >= 500 else "warn" if r["status"] >= 400 else "info"), r
    # counts move by exactly what this test sent
    health = requests_of(lines, "healthz")
    assert len(health) == n_health and all(h["status"] == 200 and h["tenant"] is None for h in health), health
    nf = [r for r in requests_of(lines, "get_info") if r["status"] == 404]
    assert len(nf) == 1 and nf[0]["tenant"].startswith("open-"), nf  # open mode: a name derived from the key
    assert "nope" in nf[0]["error"], nf
    unauth = [r for r in requests_of(lines, "get_info") if r["status"] == 401]
    assert len(unauth) == 1 and unauth[0]["tenant"] is None and "API key" in unauth[0]["error"], unauth
    garbage = [r for r in reqs if r["status"] == 400 and r["route"] is None]
    assert len(garbage) == 1, garbage
    # a training op's line names its future; the poll that answered it names the same id
    fbs = [r for r in requests_of(lines, "forward_backward") if r["status"] == 200]
    assert fbs and all(r["request_id"].startswith("req-") for r in fbs), fbs
    polled = {r["request_id"] for r in requests_of(lines, "retrieve_future")}
    assert fbs[0]["request_id"] in polled, (fbs[0], polled)
    failed = [l for l in lines if l["event"] == "future_failed"]
    assert any(f["route"] == "optim_step" and f["category"] == "user" and f["level"] == "warn"
               and "optimizer_params" in f["error"] for f in failed), failed
    msgs = [l for l in lines if l["event"] == "message"]
    assert any(m["msg"].startswith("listening on ") for m in msgs), msgs
    print(f"{len(lines)} JSON lines: {len(reqs)} requests, {len(failed)} failed futures, {len(msgs)} messages")
