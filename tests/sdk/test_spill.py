"""Bounded memory and live state across restarts (server/spill.c), through the official SDK:

- a run spilled to the data dir (least recently used past --max-live-runs, also in the middle of
  a gradient accumulation) resumes bit-identically: its losses and logprobs equal a never-spilled
  twin's on another server exactly;
- 100 runs left idle with --max-live-runs 8: the server's RSS stays flat (bound below);
- 200 save_weights_and_get_sampling_client() snapshots across 20 finished sessions: RSS returns
  to within 8 MiB of its start, and a freed snapshot's sampler answers 404 naming it;
- snapshots idle past --sampler-idle-s, or past --max-sampler-host-mb, are freed the same way;
- restart: a clean shutdown (SIGTERM) spills every run and kill -9 after a spill keeps it: the
  SDK client continues with its next seq_id and reaches the same loss as an uninterrupted run;
  kill -9 after ops that were never spilled: the run says which step it was restored at.

Bounds are relative to figures measured in the same test, never absolute times."""
from __future__ import annotations

import os
import signal
import time

import pytest
import tinker
from tinker import types

from conftest import (BASE_MODEL, adam, counting_datum, engine_mib, is_asan_build, logprobs_of, metric_sum, new_training_client, post_json,
                      rss_mib, service_client)


def batch(step, n=4):
    return [counting_datum((step * 5 + i * 7) % 32, 12) for i in range(n)]


PROBE = [counting_datum(3, 12), counting_datum(20, 12)]


def resolve(x, timeout=60):
    return x.result(timeout=timeout) if hasattr(x, "result") else x


@pytest.fixture(autouse=True)
def no_telemetry(monkeypatch):
    monkeypatch.setenv("TINKER_TELEMETRY", "0")


def get_sampler(port, sid, key):
    """GET samplers/{id} over raw HTTP: (status, body text)."""
    import http.client

    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", f"/api/v1/samplers/{sid}", headers={"X-API-Key": key})
    r = c.getresponse()
    body = r.read().decode()
    c.close()
    return r.status, body


def spill_dirs(data_dir):
    d = data_dir / "spill"
    return sorted(p.name for p in d.iterdir() if not p.name.startswith(".")) if d.exists() else []


def test_spilled_run_resumes_bit_identically(start_server, tmp_path):
    """Two runs on a server that keeps one resident: every switch spills the other, one of them
    between its forward_backward and its optim_step (gradients pending). A twin pair trains the
    same ops on a server that never spills; every loss and logprob must be equal (tolerance 0)."""
    spilling = start_server("--max-live-runs", "1", data_dir=tmp_path / "spilling")
    plain = start_server(data_dir=tmp_path / "plain")
    results = {}
    for name, srv in (("spilling", spilling), ("plain", plain)):
        sc = service_client(srv.base_url, "tml-spill")
        a = new_training_client(sc, rank=8, seed=5)
        b = new_training_client(sc, rank=8, seed=6)
        out = []
        for step in range(3):
            fa = a.forward_backward(batch(step), "cross_entropy").result(timeout=60)
            fb = b.forward_backward(batch(step + 7), "cross_entropy").result(timeout=60)  # spills a (grads pending)
            a.optim_step(adam()).result(timeout=60)  # a back from disk, its gradients with it
            b.optim_step(adam()).result(timeout=60)
            out.append((fa.metrics["loss:sum"], fb.metrics["loss:sum"]))
        out.append(logprobs_of(a.forward(PROBE, "cross_entropy").result(timeout=60)))
        out.append(logprobs_of(b.forward(PROBE, "cross_entropy").result(timeout=60)))
        results[name] = out
    assert len(spill_dirs(tmp_path / "spilling")) == 2, "both runs were spilled"
    assert spill_dirs(tmp_path / "plain") == []
    worst = max(
        abs(x - y)
        for p, q in zip(results["spilling"][-2:], results["plain"][-2:])
        for u, v in zip(p, q)
        for x, y in zip(u, v)
    )
    print(f"spilled vs never spilled: losses {results['spilling'][:3]} vs {results['plain'][:3]}, "
          f"worst logprob difference {worst}")
    assert results["spilling"] == results["plain"], "a spilled run must resume bit-identically"


def test_idle_runs_keep_rss_flat(start_server, tmp_path):
    """100 runs, each trained one step and left idle, with --max-live-runs 8. Per-run resident
    memory m is measured in the same server (RSS growth over the first 8 runs, which all stay
    resident, / 8); the RSS growth over the next 92 runs must stay under 92 x m / 4 — a quarter
    of what keeping them resident would cost. Under ASan, whose quarantine keeps up to 256 MiB of
    freed memory resident (measured: +281 MiB of RSS for the 93 spilled runs, +14 MiB with
    ASAN_OPTIONS=quarantine_size_mb=16), memory is the engine's allocator bytes from /metrics."""
    srv = start_server("--max-live-runs", "8")
    asan = is_asan_build()
    what = "engine allocators" if asan else "RSS"
    other = []  # the host allocator's `other` pool: run records (run_state and its seq_id ring)

    def mem():
        return engine_mib(srv.port, "tml-idle") if asan else rss_mib(srv.pid)

    sc = service_client(srv.base_url, "tml-idle")
    warm = new_training_client(sc, rank=32, seed=1)  # the first trainer's one-off allocations
    warm.forward_backward(batch(0), "cross_entropy").result(timeout=60)
    warm.optim_step(adam()).result(timeout=60)
    rss = [mem()]
    clients = []
    for i in range(100):
        tc = new_training_client(sc, rank=32, seed=100 + i)
        tc.forward_backward(batch(i), "cross_entropy").result(timeout=60)
        tc.optim_step(adam()).result(timeout=60)
        clients.append(tc)
        if i in (6, 99):  # 7 new + the warm one: 8 resident, nothing spilled yet
            rss.append(mem())
            other.append(pool_bytes(srv.port, "tml-idle", "other"))
    per_run = (rss[1] - rss[0]) / 7
    growth = rss[2] - rss[1]
    print(f"{what}: start {rss[0]:.1f} MiB, after 8 resident runs {rss[1]:.1f} MiB ({per_run * 1024:.0f} KiB per run), "
          f"after 100 runs {rss[2]:.1f} MiB (+{growth:.1f} MiB for 93 more; resident would be "
          f"+{93 * per_run:.1f} MiB); spilled: {len(spill_dirs(srv.data_dir))}")
    assert len(spill_dirs(srv.data_dir)) >= 92
    live = metric_sum(srv.port, "tml-idle", "twinkle_runs_live")
    spilled = metric_sum(srv.port, "tml-idle", "twinkle_runs_spilled")
    print(f"/metrics: runs live {live:.0f}, spilled {spilled:.0f}")
    assert live == 101 and spilled == 101 - 8, (live, spilled)  # resident: at most --max-live-runs
    assert per_run > 0
    assert growth < 93 * per_run / 4, "idle runs must not stay resident"
    # what a spilled run still holds, exactly (the host allocator's count, under ASan too): its
    # run record, store and session bookkeeping, its seq_id ring packed to the few ops it had.
    # Measured 4.1 KiB; 40.9 KiB when every run kept a 512-slot ring of 64-byte ids
    kept = (other[1] - other[0]) / 93
    print(f"host `other` pool: +{kept / 1024:.2f} KiB per spilled run (bound 8 KiB)")
    assert kept < 8 * 1024, "a spilled run must not keep its full seq_id ring resident"
    # a spilled one still trains
    clients[0].forward_backward(batch(1), "cross_entropy").result(timeout=60)


def raw_json(port, route, body, key):
    """POST /api/v1/<route> with a JSON body: (status, parsed answer)."""
    import json

    st, text = post_json(port, route, body, key)
    return st, json.loads(text)


def test_resubmits_deduplicated_across_a_spill(start_server):
    """A spilled run keeps its seq_id ring packed (seq_ring.c): a resubmitted optim_step
    (same model_id, seq_id) of an op from before the spill gets its original request id, and
    after its next op (which unpacks the ring and restores the run) old and new seq_ids still
    do; the new op succeeds."""
    key = "tml-dedupe"
    srv = start_server("--max-live-runs", "1")
    sc = service_client(srv.base_url, key)
    a = new_training_client(sc, rank=4, seed=1)
    b = new_training_client(sc, rank=4, seed=2)
    adam_json = {"learning_rate": 1e-3, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8}

    def optim(model, seq):
        st, j = raw_json(srv.port, "optim_step", {"model_id": model, "seq_id": seq, "adam_params": adam_json}, key)
        assert st == 200, (st, j)
        return j["request_id"]

    def wait(rid):
        for _ in range(600):
            st, j = raw_json(srv.port, "retrieve_future", {"request_id": rid}, key)
            if j.get("type") != "try_again":
                assert st == 200 and "error" not in j, (st, j)
                return j
        raise AssertionError(f"{rid} did not finish")

    rids = {seq: optim(a.model_id, seq) for seq in (1, 2)}
    for r in rids.values():
        wait(r)
    wait(optim(b.model_id, 1))  # b takes the one resident place: a is spilled
    for _ in range(100):
        if a.model_id.replace("/", "_") in spill_dirs(srv.data_dir):
            break
        time.sleep(0.05)
    assert a.model_id.replace("/", "_") in spill_dirs(srv.data_dir), spill_dirs(srv.data_dir)
    assert optim(a.model_id, 1) == rids[1] and optim(a.model_id, 2) == rids[2], "resubmit of a spilled run's op"
    rids[3] = optim(a.model_id, 3)  # restores a
    assert len(set(rids.values())) == 3, rids  # a new op, a new future
    assert [optim(a.model_id, q) for q in (1, 2, 3)] == [rids[1], rids[2], rids[3]]
    wait(rids[3])
    print("request ids of seq_ids 1-3, the same before and after the spill:", rids)


def test_snapshots_freed_with_their_sessions(start_server):
    """20 sessions x 10 save_weights_and_get_sampling_client() each, every session closed
    (ServiceClient.close → sessions/{id}/finish): the memory held through the engine's allocators
    returns to within 2 MiB of its figure after a first warm-up session, and RSS to within 8 MiB
    (RSS only without ASan, whose quarantine keeps freed memory resident); a freed snapshot's
    sampler is a 404 naming it."""
    srv = start_server()

    def one_session(n):
        sc = service_client(srv.base_url, "tml-snap")
        tc = new_training_client(sc, rank=8, seed=9)
        samplers = []
        for i in range(n):
            tc.forward_backward(batch(i), "cross_entropy").result(timeout=60)
            tc.optim_step(adam()).result(timeout=60)
            samp = resolve(tc.save_weights_and_get_sampling_client())
            samp.sample(types.ModelInput.from_ints([100, 101, 102]), 1,
                        types.SamplingParams(max_tokens=4, temperature=0.0)).result(timeout=60)
            samplers.append(samp)
        sc.close("success").result(timeout=60)
        return samplers

    one_session(10)  # warm-up: first trainer, first sampler, the allocator's arenas
    time.sleep(0.5)
    start, eng0 = rss_mib(srv.pid), engine_mib(srv.port, "tml-snap")
    peak, eng_peak = start, eng0
    last = None
    for _ in range(19):
        last = one_session(10)
        peak = max(peak, rss_mib(srv.pid))
        eng_peak = max(eng_peak, engine_mib(srv.port, "tml-snap"))
    time.sleep(1.0)  # the free jobs run on the worker
    end, eng1 = rss_mib(srv.pid), engine_mib(srv.port, "tml-snap")
    print(f"200 snapshots in 20 finished sessions: RSS start {start:.1f} MiB, peak {peak:.1f}, end {end:.1f} "
          f"(+{end - start:.2f} MiB); engine allocators start {eng0:.2f} MiB, peak {eng_peak:.2f}, "
          f"end {eng1:.2f} (+{eng1 - eng0:.3f} MiB)")
    assert eng1 - eng0 < 2, "unnamed snapshots of finished sessions must be freed"
    if not is_asan_build():
        assert end - start < 8, "unnamed snapshots of finished sessions must be freed (RSS)"
    sid = last[-1]._sampling_session_id
    status, body = get_sampler(srv.port, sid, "tml-snap")
    print("after the session finished:", status, body[:300])
    assert status == 404 and sid in body and "freed" in body and "its training session finished" in body


def assert_freed_404(srv, key, samp, option):
    """A freed unnamed snapshot: the SDK's next sample() fails with a 404 (tinker.NotFoundError)
    whose message names the snapshot and the option that freed it, and GET samplers/{id} answers
    the same 404."""
    sid = samp._sampling_session_id
    p = types.ModelInput.from_ints([100, 101, 102])
    with pytest.raises(tinker.NotFoundError) as e:
        samp.sample(p, 1, types.SamplingParams(max_tokens=2)).result(timeout=30)
    print(f"{option}: sample() -> {e.value.status_code}: {str(e.value)[:240]}")
    assert e.value.status_code == 404, e.value
    assert sid in str(e.value) and "freed" in str(e.value) and option in str(e.value), str(e.value)
    status, body = get_sampler(srv.port, sid, key)
    print(f"{option}: GET samplers/{{id}} -> {status}: {body[:240]}")
    assert status == 404 and sid in body and option in body, (status, body)


def test_snapshot_idle_and_host_cap(start_server):
    """--sampler-idle-s frees a snapshot nobody uses; --max-sampler-host-mb keeps only the most
    recently used snapshots' host copies (the older one goes first). Either way a later request
    for the freed snapshot is a 404 naming it and the option (assert_freed_404)."""
    srv = start_server("--sampler-idle-s", "1")
    sc = service_client(srv.base_url, "tml-idle-snap")
    tc = new_training_client(sc, rank=8, seed=3)
    samp = resolve(tc.save_weights_and_get_sampling_client())
    p = types.ModelInput.from_ints([100, 101, 102])
    samp.sample(p, 1, types.SamplingParams(max_tokens=2)).result(timeout=60)
    time.sleep(3)
    assert_freed_404(srv, "tml-idle-snap", samp, "--sampler-idle-s")

    # the tiny model's rank-8 adapter is a few KiB: a cap of 0.01 MiB holds about one
    srv2 = start_server("--max-sampler-host-mb", "0.01")
    sc2 = service_client(srv2.base_url, "tml-cap")
    tc2 = new_training_client(sc2, rank=8, seed=3)
    first = resolve(tc2.save_weights_and_get_sampling_client())
    second = resolve(tc2.save_weights_and_get_sampling_client())
    second.sample(p, 1, types.SamplingParams(max_tokens=2)).result(timeout=60)
    assert_freed_404(srv2, "tml-cap", first, "--max-sampler-host-mb")
    second.sample(p, 1, types.SamplingParams(max_tokens=2)).result(timeout=60)  # the newer one is kept


def pool_bytes(port, key, pool):
    """twinkle_host_memory_pool_bytes{pool=POOL} on GET /metrics."""
    import http.client

    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/metrics", headers={"X-API-Key": key})
    text = c.getresponse().read().decode()
    c.close()
    for line in text.splitlines():
        if line.startswith("twinkle_host_memory_pool_bytes{") and f'pool="{pool}"' in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no host pool {pool} on /metrics")


def test_evicted_checkpoint_sampler_keeps_no_host_copy(start_server):
    """With --live-samplers 1 every switch between samplers evicts the other one. A sampler made
    from a checkpoint (save_weights_for_sampler + create_sampling_client(model_path)) is reloaded
    from disk: evicted, it keeps no host copy — the host's adapter_copies pool on /metrics is back
    at its figure before (exactly), and its greedy samples after the reload equal those before.
    The control, an unnamed snapshot's sampler on its own unit (rank 8 > --slot-rank 4, so not an
    adapter slot), has nothing on disk: evicted the same way, it does keep its copy (the pool
    grows), which shows the eviction happened and the pool sees a kept copy."""
    key = "tml-evict"
    srv = start_server("--live-samplers", "1", "--slot-rank", "4")
    sc = service_client(srv.base_url, key)
    tc = new_training_client(sc, rank=8, seed=12)
    for step in range(2):
        tc.forward_backward(batch(step), "cross_entropy").result(timeout=60)
        tc.optim_step(adam()).result(timeout=60)
    path = tc.save_weights_for_sampler("evict-ckpt").result(timeout=60).path
    ckpt = resolve(sc.create_sampling_client(model_path=path))
    base = resolve(sc.create_sampling_client(base_model=BASE_MODEL))
    p = types.ModelInput.from_ints([100, 101, 102, 103])
    greedy = types.SamplingParams(max_tokens=8, temperature=0.0)

    def sample(c):
        r = c.sample(p, 1, greedy).result(timeout=60)
        return list(r.sequences[0].tokens)

    sample(base)
    pool0 = pool_bytes(srv.port, key, "adapter_copies")
    first = sample(ckpt)  # evicts the base sampler (no adapter: nothing to copy)
    pools = []
    for _ in range(3):
        sample(base)  # evicts the checkpoint's sampler
        pools.append(pool_bytes(srv.port, key, "adapter_copies"))
        again = sample(ckpt)  # reloaded from disk
        assert again == first, (again, first)
    sample(base)
    pools.append(pool_bytes(srv.port, key, "adapter_copies"))
    print(f"adapter_copies pool: {pool0:.0f} bytes before, after each eviction of the checkpoint's sampler {pools}")
    assert all(x == pool0 for x in pools), "an evicted sampler that can be reloaded from disk must not keep a host copy"

    snap = resolve(tc.save_weights_and_get_sampling_client())  # its own unit: nothing on disk
    assert sample(snap) == first  # the same weights as the checkpoint
    before = pool_bytes(srv.port, key, "adapter_copies")
    sample(base)  # evicts the snapshot's sampler: its adapter goes to the host
    kept = pool_bytes(srv.port, key, "adapter_copies")
    print(f"control, the unnamed snapshot's sampler evicted: adapter_copies {before:.0f} -> {kept:.0f} bytes")
    assert kept > before, "the control eviction must keep a host copy (else the pool could not show one)"
    assert sample(snap) == first  # restored from its host copy


def train(tc, steps, start=0):
    losses = []
    for step in range(start, start + steps):
        r = tc.forward_backward(batch(step), "cross_entropy").result(timeout=60)
        tc.optim_step(adam()).result(timeout=60)
        losses.append(r.metrics["loss:sum"])
    return losses


def test_restart_continues_spilled_runs(start_server, tmp_path):
    """An uninterrupted run trains 6 steps. The same run (same seed) on a server that is stopped
    cleanly (SIGTERM) after step 2 and killed with SIGKILL after step 4 — once its idle spill was
    written (--run-idle-s 0.5) — continues with its next seq_id each time, and its 6 losses and
    final logprobs equal the uninterrupted run's exactly."""
    ref_srv = start_server()
    ref = new_training_client(service_client(ref_srv.base_url, "tml-restart"), rank=8, seed=21)
    want = train(ref, 6)
    want_lp = logprobs_of(ref.forward(PROBE, "cross_entropy").result(timeout=60))

    d = tmp_path / "restarting"
    s1 = start_server("--run-idle-s", "0.5", data_dir=d)
    port = s1.port
    sc = service_client(s1.base_url, "tml-restart")
    tc = new_training_client(sc, rank=8, seed=21)
    got = train(tc, 2)
    s1.stop()  # clean: the run's state is spilled
    assert spill_dirs(d) == [tc.model_id]
    s2 = start_server("--run-idle-s", "0.5", data_dir=d, port=port)
    got += train(tc, 2, 2)
    time.sleep(2.0)  # idle past --run-idle-s: spilled
    s2.kill()  # SIGKILL
    s3 = start_server("--run-idle-s", "0.5", data_dir=d, port=port)
    got += train(tc, 2, 4)
    got_lp = logprobs_of(tc.forward(PROBE, "cross_entropy").result(timeout=60))
    print(f"uninterrupted losses {want}\nrestarted twice      {got}")
    assert got == want and got_lp == want_lp
    s3.stop()


def test_restart_after_lost_ops_names_the_step(start_server, tmp_path):
    """kill -9 after ops that no spill holds: the run's next op (its seq_id is past the spilled
    position) fails after --seq-timeout with a message naming the step it was restored at."""
    d = tmp_path / "lost"
    s1 = start_server("--run-idle-s", "0.5", data_dir=d)
    port = s1.port
    sc = service_client(s1.base_url, "tml-lost")
    tc = new_training_client(sc, rank=8, seed=4)
    train(tc, 2)
    time.sleep(2.0)  # spilled at step 2
    s1_dirs = spill_dirs(d)
    assert s1_dirs == [tc.model_id]
    train(tc, 1, 2)  # step 3: restored, never spilled again before the kill
    s1.kill()
    start_server("--run-idle-s", "600", "--seq-timeout", "1", data_dir=d, port=port)
    with pytest.raises(Exception) as e:
        tc.forward_backward(batch(5), "cross_entropy").result(timeout=60)
    msg = str(e.value)
    print("lost ops:", msg[:400])
    assert "optimizer step 2" in msg and "lost" in msg
