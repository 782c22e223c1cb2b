"""Service state under hostile seq_ids (issue 18, findings 3 and 7): ops held
ahead of a run's seq order are bounded per run and per tenant (429 naming the
limit, the run keeps working once the gap fills), and seq_id 2147483647 does not
wrap the run's next expected seq_id."""
from __future__ import annotations

import json
import time

from conftest import counting_datum, new_training_client, service_client
from test_bad_input import fb_proto, json_error, request

KEY = "tml-seqlimits"
PROTO = "application/x-protobuf"


def big_fb(model_id: str, seq_id: int) -> bytes:
    # one datum of 2000 tokens: about 32 KB of protobuf
    return fb_proto(model_id, seq_id, data=[counting_datum(seq_id % 32, 2000)])


def result(port, rid, timeout=60):
    """The final answer of a future: (content type, body)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        st, ct, data = request(port, "POST", "/api/v1/retrieve_future", {"request_id": rid}, key=KEY,
                               headers={"Accept": PROTO})
        assert st in (200, 408), (st, data[:300])
        if "json" in ct and json.loads(data).get("type") == "try_again":
            continue
        return ct, data
    raise AssertionError(f"future {rid} did not finish in {timeout} s")


def submit(port, body, key=KEY):
    return request(port, "POST", "/api/v1/forward_backward", body, key=key, content_type=PROTO)


def test_early_ops_bounded_per_run_and_tenant(start_server):
    run_mb, tenant_mb = 0.1, 0.12
    srv = start_server("--max-early-mb-run", str(run_mb), "--max-early-mb-tenant", str(tenant_mb))
    sc = service_client(srv.base_url, KEY)
    a = new_training_client(sc, rank=4, seed=1)
    b = new_training_client(sc, rank=4, seed=2)
    body_len = len(big_fb(a.model_id, 3))
    run_limit = int(run_mb * 1048576)
    assert 2 * body_len < run_limit < 4 * body_len, (body_len, run_limit)

    # run a: seq_ids 3, 4, ... arrive while 1 and 2 never came; the run's bound refuses one of them
    accepted, refused_at, msg = [], None, ""
    for seq in range(3, 10):
        st, ct, data = submit(srv.port, big_fb(a.model_id, seq))
        if st == 429:
            refused_at, msg = seq, json_error(st, ct, data, 429)
            break
        assert st == 200, (st, data[:300])
        accepted.append((seq, json.loads(data)["request_id"]))
    assert refused_at is not None, "ops far ahead of the seq order were buffered without bound"
    held = len(accepted) * body_len
    print(f"run bound {run_limit} B: accepted {len(accepted)} bodies of {body_len} B ahead, refused seq {refused_at}")
    assert held <= run_limit < held + 2 * body_len, (held, run_limit)
    assert "--max-early-mb-run" in msg and a.model_id in msg, msg

    # run b of the same tenant: the tenant's bound (over both runs) refuses sooner
    tenant_limit = int(tenant_mb * 1048576)
    st_b = []
    for seq in range(3, 10):
        st, ct, data = submit(srv.port, big_fb(b.model_id, seq))
        st_b.append(st)
        if st == 429:
            msg = json_error(st, ct, data, 429)
            break
    assert st_b[-1] == 429 and "--max-early-mb-tenant" in msg, (st_b, msg)
    assert (held + (len(st_b) - 1) * body_len) <= tenant_limit, (st_b, tenant_limit)
    # another tenant is not affected
    other = new_training_client(service_client(srv.base_url, "tml-seqlimits-other"), rank=4, seed=3)
    st, _, data = submit(srv.port, big_fb(other.model_id, 3), key="tml-seqlimits-other")
    assert st == 200, (st, data[:300])

    # the gap fills: seq 1 and 2 arrive, everything held runs, the refused seq_id is accepted now
    rids = [json.loads(submit(srv.port, fb_proto(a.model_id, s))[2])["request_id"] for s in (1, 2)]
    rids += [rid for _, rid in accepted]
    st, ct, data = submit(srv.port, big_fb(a.model_id, refused_at))
    assert st == 200, (st, data[:300])
    rids.append(json.loads(data)["request_id"])
    for rid in rids:
        ct, data = result(srv.port, rid)
        assert PROTO in ct, (ct, data[:300])
    # and the SDK's own client on that run still trains
    assert a.forward([counting_datum(0, 8)], "cross_entropy").result(timeout=60).loss_fn_outputs


def test_max_int32_seq_id_does_not_wrap(start_server):
    srv = start_server("--seq-timeout", "1")
    tc = new_training_client(service_client(srv.base_url, KEY), rank=4, seed=4)
    top = 2**31 - 1
    optim = {"model_id": tc.model_id, "adam_params": {"learning_rate": 1e-3}}
    msg = json_error(*request(srv.port, "POST", "/api/v1/optim_step", {**optim, "seq_id": top + 1}, key=KEY), 400)
    assert "seq_id" in msg, msg
    st, _, data = request(srv.port, "POST", "/api/v1/optim_step", {**optim, "seq_id": top}, key=KEY)
    assert st == 200, (st, data)
    ct, data = result(srv.port, json.loads(data)["request_id"])
    err = json.loads(data)
    assert "seq_id 1 " in err.get("error", ""), err  # seq 1 never arrived: the held op failed
    # the run's position is now past 2147483647: a smaller seq_id is old, not a new gap at -2147483648
    st, _, data = request(srv.port, "POST", "/api/v1/optim_step", {**optim, "seq_id": 5}, key=KEY)
    assert st == 200, (st, data)
    ct, data = result(srv.port, json.loads(data)["request_id"])
    err = json.loads(data)
    assert "older" in err.get("error", "") and "-2147483648" not in err["error"], err
