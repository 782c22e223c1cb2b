"""Failures are visible in the server's log (issue 20, item 4): every 4xx/5xx
answer and every failed future is one line with the request id (where there is
one), tenant, route, status or error category and the message — never the
request body."""
from __future__ import annotations

import re
import time

import pytest
import tinker

from conftest import VOCAB, make_datum, new_training_client, service_client
from test_bad_input import json_error, parse_response, raw_exchange, request

KEY = "tml-faillog"
LINE = re.compile(r'^twinkle serve: failed request_id=(\S+) tenant=(\S+) route=(\S+) (status=\d+|category=\w+) '
                  r'msg="(.*)"$')


def failure_lines(srv, want, timeout=10):
    """The parsed failure lines of srv's log once at least `want` are there."""
    deadline = time.time() + timeout
    while True:
        lines = [LINE.match(l) for l in srv.log_path.read_text(errors="replace").splitlines()
                 if l.startswith("twinkle serve: failed")]
        assert all(lines), [l for l in srv.log_path.read_text().splitlines() if "failed" in l]
        if len(lines) >= want or time.time() > deadline:
            return [m.groups() for m in lines]
        time.sleep(0.1)


def test_4xx_and_failed_futures_are_logged(start_server):
    srv = start_server()
    marker = "body-marker-8c1f"
    # a 404 from an endpoint (tenant known), with a marker in the body that must not be logged
    json_error(*request(srv.port, "POST", "/api/v1/get_info", {"model_id": "no-such-model", "x": marker}, key=KEY), 404)
    # a 401 (no tenant yet) and a 400 from the HTTP layer (no route yet)
    json_error(*request(srv.port, "POST", "/api/v1/get_info", {"model_id": "m", "x": marker}, key=None), 401)
    status, headers, body = parse_response(raw_exchange(srv.port, b"GARBAGE " + marker.encode() + b"\r\n\r\n"))
    assert status == 400
    # a 404 for an unknown future: its request id is on the line
    json_error(*request(srv.port, "POST", "/api/v1/retrieve_future", {"request_id": "req-" + "0" * 32}, key=KEY), 404)
    # a failed future: a token id past the vocabulary
    tc = new_training_client(service_client(srv.base_url, KEY), rank=4, seed=1)
    fut = tc.forward_backward([make_datum([1, VOCAB + 7, 3], [2, 3, 4])], "cross_entropy")
    with pytest.raises(tinker.RequestFailedError):
        fut.result(timeout=60)

    lines = failure_lines(srv, 5)
    print("\n".join(" | ".join(l) for l in lines))
    assert not any(marker in " ".join(l) for l in lines), "a request body reached the log"
    by_what = {}
    for rid, tenant, route, what, msg in lines:
        by_what.setdefault(what, []).append((rid, tenant, route, msg))
    # open mode: the tenant is a name derived from the key, never the key itself
    tenants = {t for _, t, r, m in by_what["status=404"] if r == "get_info" and m == "model 'no-such-model' not found"}
    assert len(tenants) == 1, by_what["status=404"]
    tenant = tenants.pop()
    assert tenant != "-" and KEY not in tenant, tenant
    assert not any(KEY in " ".join(l) for l in lines), "an API key reached the log"
    assert any(t == "-" and r == "get_info" and "API key" in m for _, t, r, m in by_what["status=401"])
    assert any(t == "-" and r == "-" for _, t, r, _ in by_what["status=400"])
    assert ("req-" + "0" * 32, tenant, "retrieve_future", "unknown request_id") in by_what["status=404"]
    user = by_what.get("category=user", [])
    assert any(re.fullmatch(r"req-[0-9a-f]{32}", rid) and t == tenant and r == "forward_backward" and str(VOCAB + 7) in m
               for rid, t, r, m in user), user
