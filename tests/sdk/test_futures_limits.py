"""Finished futures (issue 18, findings 4 and 9): request ids are random, a
retrieved result is freed after --result-keep (a re-poll before then still gets
it), and a tenant's unretrieved results are bounded in bytes: past
--max-results-mb-tenant the oldest become an error naming the limit."""
from __future__ import annotations

import json
import re
import time

from conftest import counting_datum, new_training_client, service_client
from test_bad_input import fb_proto, json_error, request

KEY = "tml-futures"
PROTO = "application/x-protobuf"


def poll(port, rid, key=KEY):
    """One retrieve_future: (status, content type, body); a try_again is polled again."""
    while True:
        st, ct, data = request(port, "POST", "/api/v1/retrieve_future", {"request_id": rid}, key=key,
                               headers={"Accept": PROTO})
        if st in (200, 408) and "json" in ct and json.loads(data).get("type") == "try_again":
            continue
        return st, ct, data


def submit_forward(port, model_id, seq, length=2000):
    st, _, data = request(port, "POST", "/api/v1/forward_backward",
                          fb_proto(model_id, seq, data=[counting_datum(seq % 32, length)]), key=KEY,
                          content_type=PROTO)
    assert st == 200, (st, data[:300])
    return json.loads(data)["request_id"]


def test_request_ids_are_random(server):
    tc = new_training_client(service_client(server.base_url, KEY), rank=4, seed=1)
    ids = [submit_forward(server.port, tc.model_id, s, 8) for s in (1, 2, 3)]
    for rid in ids:
        assert re.fullmatch(r"req-[0-9a-f]{32}", rid), rid
        assert poll(server.port, rid)[0] == 200
    # no shared structure between consecutive ids (a counter would keep most hex digits)
    a, b = ids[0][4:], ids[1][4:]
    same = sum(x == y for x, y in zip(a, b))
    assert same < 16, (a, b)


def test_retrieved_result_is_freed_after_keep(start_server):
    srv = start_server("--result-keep", "1")
    tc = new_training_client(service_client(srv.base_url, KEY), rank=4, seed=2)
    rid = submit_forward(srv.port, tc.model_id, 1, 8)
    st, ct, first = poll(srv.port, rid)
    assert st == 200 and PROTO in ct, (st, ct, first[:200])
    # a re-poll (the SDK's, after a lost answer) right away gets the same result
    st, ct, again = poll(srv.port, rid)
    assert st == 200 and again == first
    deadline = time.time() + 30
    while time.time() < deadline:
        st, ct, data = poll(srv.port, rid)
        if st == 404:
            break
        time.sleep(0.5)
    assert st == 404, "a retrieved result was never freed"
    json_error(st, ct, data, 404)


def test_unretrieved_results_bounded_per_tenant(start_server):
    limit_mb = 0.03
    srv = start_server("--max-results-mb-tenant", str(limit_mb))
    tc = new_training_client(service_client(srv.base_url, KEY), rank=4, seed=3)
    other = new_training_client(service_client(srv.base_url, "tml-futures-other"), rank=4, seed=3)
    other_rid = json.loads(request(srv.port, "POST", "/api/v1/forward_backward",
                                   fb_proto(other.model_id, 1, data=[counting_datum(0, 2000)]),
                                   key="tml-futures-other", content_type=PROTO)[2])["request_id"]
    n = 10
    rids = [submit_forward(srv.port, tc.model_id, s) for s in range(1, n + 1)]
    st, ct, last = poll(srv.port, rids[-1])  # waits for the last (in seq order: all are done then)
    assert st == 200 and PROTO in ct, (st, ct, last[:200])
    size = len(last)
    limit = int(limit_mb * 1048576)
    assert n * size > 2 * limit, (size, limit)
    outcome = []
    for rid in rids[:-1]:
        st, ct, data = poll(srv.port, rid)
        assert st == 200, (st, data[:200])
        if PROTO in ct:
            outcome.append("ok")
        else:
            err = json.loads(data)
            assert err.get("category") == "user" and "--max-results-mb-tenant" in err["error"], err
            outcome.append("dropped")
    print(f"results of {size} B, limit {limit} B: {outcome}")
    kept = outcome.count("ok")
    assert "dropped" in outcome and outcome == sorted(outcome, key=lambda o: o == "ok"), outcome  # oldest first
    assert kept * size <= limit, (kept, size, limit)
    assert kept >= 1
    # the other tenant's result was not dropped for this tenant's backlog
    st, ct, data = poll(srv.port, other_rid, key="tml-futures-other")
    assert st == 200 and PROTO in ct, (st, ct, data[:200])
