"""Prometheus metrics at GET /metrics (issue 17, item 1): the page parses with prometheus_client's
parser, its counters move by exactly what the test sent, an admin key sees tenant labels and a
tenant key sees service-wide sums without any tenant's name, and --metrics-auth decides who may
read it."""
from __future__ import annotations

import http.client
import os
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tinker import types

from conftest import adam, counting_datum, new_training_client, service_client
from test_bad_input import request

KEYS = "tml-alice-key alice\ntml-bob-key bob\ntml-ops-key ops admin\n"
ALICE, BOB, ADMIN = "tml-alice-key", "tml-bob-key", "tml-ops-key"


def scrape_raw(port, key=None, bearer=False):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    h = {}
    if key:
        h["Authorization" if bearer else "X-API-Key"] = f"Bearer {key}" if bearer else key
    c.request("GET", "/metrics", headers=h)
    r = c.getresponse()
    body = r.read().decode()
    c.close()
    return r.status, r.getheader("Content-Type") or "", body


def scrape(port, key=None, bearer=False):
    status, ctype, text = scrape_raw(port, key, bearer)
    assert status == 200, (status, text[:300])
    assert ctype.startswith("text/plain; version=0.0.4"), ctype
    return text, list(text_string_to_metric_families(text))


def value(fams, sample, **labels):
    """The sum of the samples named `sample` whose labels include `labels` (0 when none)."""
    total = 0.0
    for f in fams:
        for s in f.samples:
            if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def labelled(fams, label):
    return [s for f in fams for s in f.samples if label in s.labels]


def keys_file(tmp_path) -> Path:
    p = tmp_path / "keys"
    p.write_text(KEYS)
    return p


def test_counters_views_and_gauges(start_server, tmp_path):
    srv = start_server("--keys", str(keys_file(tmp_path)))
    port = srv.port
    assert scrape_raw(port)[0] == 401  # the default --metrics-auth key: a key is needed
    assert scrape_raw(port, "tml-nobody")[0] == 401
    _, before = scrape(port, ALICE)
    _, admin_before = scrape(port, ADMIN, bearer=True)  # Prometheus' bearer_token works too

    n_alice, n_bob, n_bob_404 = 5, 3, 2
    for _ in range(n_alice):
        assert request(port, "GET", "/api/v1/get_server_capabilities", key=ALICE)[0] == 200
    for _ in range(n_bob):
        assert request(port, "GET", "/api/v1/get_server_capabilities", key=BOB)[0] == 200
    for _ in range(n_bob_404):
        assert request(port, "POST", "/api/v1/no_such_route", {}, key=BOB)[0] == 404

    text, after = scrape(port, ALICE)
    caps = dict(method="GET", route="get_server_capabilities", status="200")
    d = value(after, "twinkle_http_requests_total", **caps) - value(before, "twinkle_http_requests_total", **caps)
    assert d == n_alice + n_bob, d  # service-wide: both tenants' requests
    other = dict(route="other", status="404")
    assert value(after, "twinkle_http_requests_total", **other) - value(before, "twinkle_http_requests_total", **other) == n_bob_404
    # the scrapes in between: alice's first one and the admin's
    m200 = dict(route="/metrics", status="200")
    assert value(after, "twinkle_http_requests_total", **m200) - value(before, "twinkle_http_requests_total", **m200) == 2
    h = dict(route="get_server_capabilities", status="200")
    assert (value(after, "twinkle_http_request_duration_seconds_count", **h)
            - value(before, "twinkle_http_request_duration_seconds_count", **h)) == n_alice + n_bob
    assert value(after, "twinkle_http_request_duration_seconds_bucket", le="+Inf", **h) == value(
        after, "twinkle_http_request_duration_seconds_count", **h)
    # a tenant's view: no tenant label anywhere, and no other tenant's name
    assert labelled(after, "tenant") == []
    assert "bob" not in text and "alice" not in text

    _, admin = scrape(port, ADMIN)
    for tenant, n in (("alice", n_alice), ("bob", n_bob)):
        got = value(admin, "twinkle_http_requests_total", tenant=tenant, **caps) - value(
            admin_before, "twinkle_http_requests_total", tenant=tenant, **caps)
        assert got == n, (tenant, got)
    e = dict(category="user", source="answer")
    assert value(admin, "twinkle_errors_total", tenant="bob", **e) - value(admin_before, "twinkle_errors_total", tenant="bob", **e) == n_bob_404
    assert value(admin, "twinkle_errors_total", tenant="alice", **e) == value(admin_before, "twinkle_errors_total", tenant="alice", **e)

    # training and sampling: tokens, queue, runs, sessions, checkpoints
    sc = service_client(srv.base_url, ALICE)
    tc = new_training_client(sc, rank=4, seed=3)
    _, t0 = scrape(port, ADMIN)
    steps, length = 3, 16
    for i in range(steps):
        tc.forward_backward([counting_datum(i, length)], "cross_entropy").result(timeout=60)
        tc.optim_step(adam()).result(timeout=60)
    tc.forward([counting_datum(0, length), counting_datum(1, length)], "cross_entropy").result(timeout=60)
    # a bad datum (token past the vocabulary) fails its future with category user
    with pytest.raises(Exception):
        tc.forward([types.Datum(model_input=types.ModelInput.from_ints([100000, 1]),
                                loss_fn_inputs={"target_tokens": np.array([1, 2], dtype=np.int64)})],
                   "cross_entropy").result(timeout=60)
    tc.save_state("m1").result(timeout=60)
    sampler = tc.save_weights_and_get_sampling_client().result(timeout=60)  # a snapshot: no disk write
    res = sampler.sample(types.ModelInput.from_ints([100, 101, 102]), num_samples=2,
                         sampling_params=types.SamplingParams(max_tokens=4, temperature=1.0, seed=5)).result(timeout=60)
    generated = sum(len(s.tokens) for s in res.sequences)
    _, t1 = scrape(port, ADMIN)

    def moved(name, **lb):
        return value(t1, name, **lb) - value(t0, name, **lb)

    assert moved("twinkle_tokens_total", tenant="alice", op="forward_backward") == steps * length
    assert moved("twinkle_tokens_total", tenant="alice", op="forward") == 2 * length
    assert moved("twinkle_tokens_total", tenant="alice", op="sample") == generated > 0
    assert value(t1, "twinkle_tokens_per_second", op="forward_backward") >= 0
    assert moved("twinkle_errors_total", tenant="alice", category="user", source="future") == 1
    # the training ops that reached the worker: fb and optim per step, the good forward, save_state and
    # the snapshot (the bad forward failed validation in its seq slot, never queued)
    ops = 2 * steps + 1 + 2
    assert moved("twinkle_queue_wait_seconds_count", tenant="alice", kind="train") == ops
    assert moved("twinkle_queue_wait_seconds_count", tenant="alice", kind="sample") == 1
    assert value(t1, "twinkle_queue_depth", tenant="alice") == 0
    assert value(t1, "twinkle_runs_live", tenant="alice") == 1
    assert value(t1, "twinkle_runs_spilled", tenant="alice") == 0
    assert value(t1, "twinkle_sessions_live", tenant="alice") >= 1
    assert value(t1, "twinkle_samplers_live", tenant="alice") == 1
    # checkpoint bytes equal the files on disk
    on_disk = sum(f.stat().st_size for f in (srv.data_dir / "checkpoints").rglob("*") if f.is_file())
    assert value(t1, "twinkle_checkpoints", tenant="alice") == 1
    assert value(t1, "twinkle_checkpoint_bytes", tenant="alice") == on_disk > 0
    assert value(t1, "twinkle_host_memory_bytes") > 0 and value(t1, "process_resident_memory_bytes") > 0
    assert value(t1, "twinkle_device_memory_bytes", device="cpu:0") > 0
    assert value(t1, "twinkle_worker_stall_seconds") == 0
    # bob's view sums alice's numbers in without naming her
    btext, bob = scrape(port, BOB)
    assert value(bob, "twinkle_tokens_total", op="forward_backward") == value(t1, "twinkle_tokens_total", op="forward_backward")
    assert "alice" not in btext and labelled(bob, "tenant") == []


def test_metrics_auth_modes(start_server, tmp_path):
    keys = str(keys_file(tmp_path))
    srv = start_server("--keys", keys, "--metrics-auth", "admin")
    assert scrape_raw(srv.port)[0] == 401
    assert scrape_raw(srv.port, ALICE)[0] == 403
    text, fams = scrape(srv.port, ADMIN)
    assert labelled(fams, "tenant"), "the admin view labels series with tenants"
    srv2 = start_server("--keys", keys, "--metrics-auth", "open")
    request(srv2.port, "GET", "/api/v1/get_server_capabilities", key=ALICE)
    text, fams = scrape(srv2.port)  # no key at all
    assert labelled(fams, "tenant") == [] and "alice" not in text
    assert value(fams, "twinkle_http_requests_total", route="get_server_capabilities") == 1


def test_route_labels_are_bounded(start_server):
    """Ids in paths never become label values: a tenant's run ids stay out of the page."""
    srv = start_server()
    key = "tml-routes"
    request(srv.port, "GET", "/api/v1/training_runs/secret-run-id-123/checkpoints", key=key)
    request(srv.port, "GET", "/api/v1/samplers/secret-sampler-456", key=key)
    request(srv.port, "GET", "/api/v1/made-up-route-789", key=key)
    text, fams = scrape(srv.port, key)
    assert "secret" not in text and "made-up" not in text
    assert value(fams, "twinkle_http_requests_total", route="training_runs/{id}/checkpoints") == 1
    assert value(fams, "twinkle_http_requests_total", route="samplers/{id}") == 1
    assert value(fams, "twinkle_http_requests_total", route="other") == 1


# ---- memory per pool (issue 17, item 1: "host and device memory in use per pool") ----

F32 = 4


def model_config(srv) -> dict:
    """The served model's config.json (the built-in model, written to the data dir)."""
    import json

    return json.loads((srv.data_dir / "models" / "tiny" / "config.json").read_text())


def param_bytes(c: dict) -> int:
    """Bytes of a Qwen3 model's parameters at f32, from its config alone."""
    h, v, f, L = c["hidden_size"], c["vocab_size"], c["intermediate_size"], c["num_hidden_layers"]
    hd = c.get("head_dim") or h // c["num_attention_heads"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    layer = h * q + 2 * h * kv + q * h + 3 * h * f + 2 * h + 2 * hd  # q k v o, gate up down, 2 norms, q/k norms
    n = v * h + L * layer + h + (0 if c.get("tie_word_embeddings") else v * h)
    return n * F32


def run_bytes(c: dict, rank: int) -> int:
    """A LoRA run's device bytes at rank r over attention, MLP and unembedding: the adapter (A is
    r x in, B is out x r per module, f32) plus its gradient accumulator and two AdamW moments, each
    a flat f32 buffer with every tensor padded to a multiple of 64 floats."""
    h, v, f, L = c["hidden_size"], c["vocab_size"], c["intermediate_size"], c["num_hidden_layers"]
    hd = c.get("head_dim") or h // c["num_attention_heads"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    modules = L * [(h, q), (h, kv), (h, kv), (q, h), (h, f), (h, f), (f, h)] + [(h, v)]  # (in, out)
    tensors = [n for i, o in modules for n in (rank * i, o * rank)]
    padded = sum((n + 63) // 64 * 64 for n in tensors)
    return sum(tensors) * F32 + 3 * padded * F32


def pools(fams, family):
    return {s.labels["pool"]: s.value for f in fams for s in f.samples if s.name == family}


def check_sums(fams):
    """The pools add up to the totals exactly, on the host and on the device."""
    host = pools(fams, "twinkle_host_memory_pool_bytes")
    dev = pools(fams, "twinkle_device_memory_pool_bytes")
    assert {"other", "adapter_copies", "requests", "device_buffers"} <= set(host), host
    assert {"other", "weights", "adapters", "activations", "kv_cache", "sampler_adapters"} <= set(dev), dev
    assert sum(host.values()) == value(fams, "twinkle_host_memory_bytes") > 0, host
    assert sum(dev.values()) == value(fams, "twinkle_device_memory_bytes") > 0, dev
    return host, dev


def test_memory_per_pool(start_server):
    srv = start_server("--max-live-runs", "1")
    key = "tml-pools"
    c = model_config(srv)
    _, m0 = scrape(srv.port, key)
    host0, dev0 = check_sums(m0)
    assert dev0["weights"] == param_bytes(c), (dev0["weights"], param_bytes(c))
    assert dev0["adapters"] == 0 and dev0["activations"] > 0
    # on the CPU the device's buffers are host memory: counted in the host's device_buffers pool
    assert host0["device_buffers"] >= sum(dev0.values())

    sc = service_client(srv.base_url, key)
    a = new_training_client(sc, rank=4, seed=1)
    _, m1 = scrape(srv.port, key)
    _, dev1 = check_sums(m1)
    print(f"run of rank 4: {dev1['adapters'] - dev0['adapters']:.0f} bytes, expected {run_bytes(c, 4)}")
    assert dev1["adapters"] - dev0["adapters"] == run_bytes(c, 4)
    assert dev1["weights"] == dev0["weights"]
    a.forward_backward([counting_datum(0)], "cross_entropy").result(timeout=60)

    # a second run with --max-live-runs 1: the first one is spilled to disk, its bytes leave the pool
    b = new_training_client(sc, rank=8, seed=2)
    b.forward_backward([counting_datum(1)], "cross_entropy").result(timeout=60)
    _, m2 = scrape(srv.port, key)
    _, dev2 = check_sums(m2)
    assert [p for p in (srv.data_dir / "spill").iterdir() if not p.name.startswith(".")], "a run was spilled"
    assert dev2["adapters"] - dev0["adapters"] == run_bytes(c, 8), (dev2["adapters"], run_bytes(c, 8))

    # unloaded: nothing of it stays
    st, body = request(srv.port, "POST", "/api/v1/unload_model", {"model_id": b.model_id}, key=key)[:2]
    assert st == 200, body
    for _ in range(200):
        _, m3 = scrape(srv.port, key)
        _, dev3 = check_sums(m3)
        if dev3["adapters"] == dev0["adapters"]:
            break
    assert dev3["adapters"] == dev0["adapters"], dev3

    # a sampler: its KV cache and adapter in their pools; the sums still exact
    sampler = a.save_weights_and_get_sampling_client()
    sampler = sampler.result(timeout=60) if hasattr(sampler, "result") else sampler
    sampler.sample(types.ModelInput.from_ints([100, 101, 102]), num_samples=1,
                   sampling_params=types.SamplingParams(max_tokens=3, temperature=1.0, seed=1)).result(timeout=60)
    _, m4 = scrape(srv.port, key)
    host4, dev4 = check_sums(m4)
    assert dev4["kv_cache"] > 0 and dev4["sampler_adapters"] > 0, dev4
    assert dev4["adapters"] - dev0["adapters"] == run_bytes(c, 4)  # a came back from disk for its snapshot
    print("device pools:", dev4, "host pools:", host4)
