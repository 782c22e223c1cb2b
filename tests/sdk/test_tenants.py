"""Tenants: two API keys train on one base model at the same time without
affecting each other's numbers, and neither can see or touch the other's runs,
checkpoints or sessions. With a keys file, unknown keys get 401 and keys mapped
to the same tenant share visibility."""
from __future__ import annotations

import random
import threading

import pytest
import tinker
from tinker.lib.public_interfaces.training_client import TrainingClient, fetch_training_info

from conftest import (
    adam,
    counting_datum,
    logprobs_of,
    max_abs_diff,
    new_training_client,
    rest_client,
    service_client,
)

STEPS = 6


def tenant_data(tenant_seed: int, step: int):
    rng = random.Random(tenant_seed * 1000 + step)
    return [counting_datum(rng.randrange(32), 10 + rng.randrange(6)) for _ in range(4)]


def train_trace(base_url: str, key: str, tenant_seed: int, barrier: threading.Barrier | None = None):
    """Trains STEPS steps (pipelined) and returns every step's logprobs and loss,
    plus a final forward."""
    sc = service_client(base_url, key)
    tc = new_training_client(sc, rank=8, seed=100 + tenant_seed)
    if barrier is not None:
        barrier.wait(timeout=60)
    futs = []
    for step in range(STEPS):
        futs.append((tc.forward_backward(tenant_data(tenant_seed, step), "cross_entropy"), tc.optim_step(adam(4e-3))))
    trace = []
    for fb, opt in futs:
        r = fb.result(timeout=120)
        opt.result(timeout=120)
        trace.append((logprobs_of(r), r.metrics["loss:sum"]))
    final = logprobs_of(tc.forward(tenant_data(tenant_seed, 99), "cross_entropy").result(timeout=60))
    return trace, final


# 1e-6 (measured 0 on the CPU: a tenant packed with another is bit-identical to alone, its segment at
# a 48-row boundary: TWK_GEMM_ROW_PERIOD); a tenant reading another's adapter or rows moves them by 1e-1
# or more.
TRACE_TOL = 1e-6


def assert_same_trace(a, b, what):
    (ta, fa), (tb, fb) = a, b
    assert len(ta) == len(tb)
    for i, ((lpa, la), (lpb, lb)) in enumerate(zip(ta, tb)):
        assert max_abs_diff(lpa, lpb) <= TRACE_TOL, f"{what}: step {i} logprobs differ"
        assert abs(la - lb) <= TRACE_TOL * max(1.0, abs(la)), f"{what}: step {i} loss {la} vs {lb}"
    assert max_abs_diff(fa, fb) <= TRACE_TOL, f"{what}: final forward differs"


def test_concurrent_tenants_match_solo_runs(server):
    solo_a = train_trace(server.base_url, "tml-solo-a", 1)
    solo_b = train_trace(server.base_url, "tml-solo-b", 2)
    assert solo_a[1] != solo_b[1], "the two tenants should train on different data"

    results: dict[str, object] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def worker(name, key, seed):
        try:
            results[name] = train_trace(server.base_url, key, seed, barrier)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=("a", "tml-conc-a", 1)),
               threading.Thread(target=worker, args=("b", "tml-conc-b", 2))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    assert not errors, errors
    assert_same_trace(results["a"], solo_a, "tenant A together with B vs alone")
    assert_same_trace(results["b"], solo_b, "tenant B together with A vs alone")


@pytest.fixture(scope="module")
def tenant_a(server):
    """Tenant A's run with a saved state and sampler weights."""
    sc = service_client(server.base_url, "tml-tenant-a")
    tc = new_training_client(sc, rank=8, seed=11, user_metadata={"owner": "a"})
    tc.forward_backward(tenant_data(1, 0), "cross_entropy")
    tc.optim_step(adam()).result(timeout=60)
    path = tc.save_state("a-state").result(timeout=60).path
    spath = tc.save_weights_for_sampler("a-sampler").result(timeout=60).path
    return dict(sc=sc, tc=tc, path=path, spath=spath, session=sc.holder.get_session_id())


def not_found(excinfo_value) -> bool:
    return isinstance(excinfo_value, (tinker.NotFoundError, tinker.RequestFailedError))


def test_other_tenant_cannot_use_model(server, tenant_a):
    a_id = tenant_a["tc"].model_id
    sc_b = service_client(server.base_url, "tml-tenant-b")
    own_b = new_training_client(sc_b, rank=8, seed=12)  # B has a session and a run of its own
    holder_b = sc_b.holder

    # get_info of A's model with B's key
    with pytest.raises(tinker.NotFoundError):
        holder_b.run_coroutine_threadsafe(fetch_training_info(holder_b, a_id)).result(timeout=60)

    # a training client of B's bound to A's model id: forward and optim_step are refused
    impostor = TrainingClient(holder_b, model_seq_id=99, model_id=a_id, info=tenant_a["tc"].get_info())
    with pytest.raises(tinker.NotFoundError):
        impostor.forward([counting_datum(0, 8)], "cross_entropy").result(timeout=60)
    with pytest.raises(tinker.NotFoundError):
        impostor.optim_step(adam()).result(timeout=60)

    # B loading A's checkpoint into its own run fails, and B's run still works
    with pytest.raises(tinker.RequestFailedError) as e:
        own_b.load_state(tenant_a["path"]).result(timeout=60)
    assert "not found" in str(e.value)
    own_b.forward([counting_datum(0, 8)], "cross_entropy").result(timeout=60)

    # A's run is untouched and still A's
    a_fwd = tenant_a["tc"].forward([counting_datum(0, 8)], "cross_entropy").result(timeout=60)
    assert len(a_fwd.loss_fn_outputs) == 1


def test_other_tenant_cannot_create_client_from_checkpoint(server, tenant_a):
    sc_b = service_client(server.base_url, "tml-tenant-b")
    with pytest.raises(Exception) as e:
        sc_b.create_training_client_from_state(tenant_a["path"]).result(timeout=60)
    assert not_found(e.value), f"expected NotFoundError/RequestFailedError, got {type(e.value).__name__}: {e.value}"
    with pytest.raises(Exception) as e:
        sc_b.create_training_client_from_state_with_optimizer(tenant_a["path"]).result(timeout=60)
    assert not_found(e.value), f"expected NotFoundError/RequestFailedError, got {type(e.value).__name__}: {e.value}"


def test_other_tenant_rest_is_404_and_listings_are_disjoint(server, tenant_a):
    a_id = tenant_a["tc"].model_id
    rb = rest_client(server.base_url, "tml-tenant-b")
    ra = rest_client(server.base_url, "tml-tenant-a")
    new_training_client(service_client(server.base_url, "tml-tenant-b"), rank=4, seed=3)  # B's own run

    with pytest.raises(tinker.NotFoundError):
        rb.get_training_run(a_id).result(timeout=30)
    with pytest.raises(tinker.NotFoundError):
        rb.get_training_run_by_tinker_path(tenant_a["path"]).result(timeout=30)
    with pytest.raises(tinker.NotFoundError):
        rb.list_checkpoints(a_id).result(timeout=30)
    with pytest.raises(tinker.NotFoundError):
        rb.get_weights_info_by_tinker_path(tenant_a["path"]).result(timeout=30)
    with pytest.raises(tinker.NotFoundError):
        rb.delete_checkpoint(a_id, "weights/a-state").result(timeout=30)
    with pytest.raises(tinker.NotFoundError):
        rb.delete_checkpoint_from_tinker_path(tenant_a["spath"]).result(timeout=30)
    with pytest.raises(tinker.NotFoundError):
        rb.get_session(tenant_a["session"]).result(timeout=30)

    # A still has both checkpoints
    a_cks = {c.tinker_path for c in ra.list_checkpoints(a_id).result(timeout=30).checkpoints}
    assert {tenant_a["path"], tenant_a["spath"]} <= a_cks

    # nothing of A's in B's listings (and B's own things are there)
    b_runs = rb.list_training_runs(limit=1000).result(timeout=30).training_runs
    assert b_runs, "B's own runs are missing"
    assert a_id not in {r.training_run_id for r in b_runs}
    b_cks = {c.tinker_path for c in rb.list_user_checkpoints(limit=1000).result(timeout=30).checkpoints}
    assert not (b_cks & a_cks)
    b_sessions = rb.list_sessions(limit=1000).result(timeout=30).sessions
    assert b_sessions and tenant_a["session"] not in b_sessions
    a_runs = {r.training_run_id for r in ra.list_training_runs(limit=1000).result(timeout=30).training_runs}
    assert a_id in a_runs and not (a_runs & {r.training_run_id for r in b_runs})


# ---- keys file ----

@pytest.fixture
def keyed_server(start_server, tmp_path):
    keys = tmp_path / "keys.txt"
    keys.write_text("# key tenant\ntml-k1 team1\ntml-k2 team1\ntml-k3 team2\n")
    return start_server("--keys", str(keys))


def test_keys_file_unknown_key_is_401(keyed_server):
    with pytest.raises(tinker.AuthenticationError):
        rest_client(keyed_server.base_url, "tml-nobody").list_training_runs().result(timeout=30)
    with pytest.raises(tinker.AuthenticationError):
        new_training_client(service_client(keyed_server.base_url, "tml-nobody"))
    # a known key works
    rest_client(keyed_server.base_url, "tml-k1").list_training_runs().result(timeout=30)


def test_keys_file_shared_tenant(keyed_server):
    sc1 = service_client(keyed_server.base_url, "tml-k1")
    tc = new_training_client(sc1, rank=8, seed=21)
    tc.forward_backward(tenant_data(3, 0), "cross_entropy")
    tc.optim_step(adam()).result(timeout=60)
    path = tc.save_state("shared").result(timeout=60).path
    r2 = rest_client(keyed_server.base_url, "tml-k2")
    r3 = rest_client(keyed_server.base_url, "tml-k3")
    assert tc.model_id in {r.training_run_id for r in r2.list_training_runs(limit=1000).result(timeout=30).training_runs}
    assert r2.get_training_run(tc.model_id).result(timeout=30).training_run_id == tc.model_id
    assert path in {c.tinker_path for c in r2.list_checkpoints(tc.model_id).result(timeout=30).checkpoints}
    assert r2.get_weights_info_by_tinker_path(path).result(timeout=30).lora_rank == 8
    assert sc1.holder.get_session_id() in r2.list_sessions(limit=1000).result(timeout=30).sessions
    # the other team sees none of it
    assert tc.model_id not in {r.training_run_id for r in r3.list_training_runs(limit=1000).result(timeout=30).training_runs}
    with pytest.raises(tinker.NotFoundError):
        r3.get_training_run(tc.model_id).result(timeout=30)
    # a second key of the same tenant can use the first key's model
    sc2 = service_client(keyed_server.base_url, "tml-k2")
    holder2 = sc2.holder
    info = holder2.run_coroutine_threadsafe(fetch_training_info(holder2, tc.model_id)).result(timeout=60)
    assert info.model_id == tc.model_id


def test_keys_file_shared_tenant_loads_checkpoint(keyed_server):
    sc1 = service_client(keyed_server.base_url, "tml-k1")
    tc = new_training_client(sc1, rank=8, seed=22)
    data = tenant_data(4, 0)
    tc.forward_backward(data, "cross_entropy")
    tc.optim_step(adam()).result(timeout=60)
    path = tc.save_state("shared2").result(timeout=60).path
    want = logprobs_of(tc.forward(data, "cross_entropy").result(timeout=60))
    sc2 = service_client(keyed_server.base_url, "tml-k2")
    tc2 = sc2.create_training_client_from_state(path).result(timeout=60)
    assert logprobs_of(tc2.forward(data, "cross_entropy").result(timeout=60)) == want
    sc3 = service_client(keyed_server.base_url, "tml-k3")
    with pytest.raises(Exception) as e:
        sc3.create_training_client_from_state(path).result(timeout=60)
    assert not_found(e.value), f"expected NotFoundError/RequestFailedError, got {type(e.value).__name__}: {e.value}"


def test_other_tenant_cannot_use_session(server, tenant_a):
    """A's session id is unknown to B: create_model in it, heartbeats and finish are 404,
    and A's session keeps working."""
    import http.client
    import json

    def post(path, body, key):
        c = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        c.request("POST", path, body=json.dumps(body), headers={"X-API-Key": key, "Content-Type": "application/json"})
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, data

    sess = tenant_a["session"]
    st, data = post("/api/v1/create_model", {"session_id": sess, "model_seq_id": 77, "base_model": "twinkle/tiny-qwen3",
                                             "lora_config": {"rank": 4}}, "tml-tenant-b")
    assert st == 404, (st, data)
    st, data = post("/api/v1/session_heartbeat", {"session_id": sess}, "tml-tenant-b")
    assert st == 404, (st, data)
    st, data = post(f"/api/v1/sessions/{sess}/finish", {"reason": {"type": "success"}}, "tml-tenant-b")
    assert st == 404, (st, data)
    st, data = post("/api/v1/session_heartbeat", {"session_id": sess}, "tml-tenant-a")
    assert st == 200, (st, data)
