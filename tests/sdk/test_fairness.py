"""The compute worker's fair scheduler (server/scheduler.c) through the official SDK:

- one tenant floods sampling (requests of 256 samples, decoded 16 at a time, a round per turn)
  while another trains: over 200 forward_backward calls, the trainer's p99 (nearest rank: the
  198th of 200, so two stalls of a loaded 2-core machine are forgiven) stays under
  2 x its solo p99 (100 calls) + 2 x one sampling round, all measured in this test. Fair
  scheduling makes a forward_backward wait for at most the round in progress; the bound allows
  two and twice the solo figure. Under the old FIFO it waited for every queued round (4 requests
  x 16 rounds): the bound is missed by ~10x, and the measurement stops as soon as more calls
  missed it than p99 forgives;
- a tenant past --max-queue-per-tenant gets 429 naming the option, while another tenant's
  request is accepted at the same moment."""
from __future__ import annotations

import math
import subprocess
import sys
import time

import pytest
from tinker import types

from conftest import BASE_MODEL, adam, counting_datum, new_training_client, post_json, service_client

MAX_TOKENS = 24
PROMPT = [100, 101, 102, 103]


@pytest.fixture(autouse=True)
def no_telemetry(monkeypatch):
    monkeypatch.setenv("TINKER_TELEMETRY", "0")


# one tenant keeping 4 sampling requests of 256 samples in flight until it is terminated
FLOOD = """
import os, sys, time
os.environ["TINKER_TELEMETRY"] = "0"
import tinker
from tinker import types
url, max_tokens = sys.argv[1], int(sys.argv[2])
sc = tinker.ServiceClient(base_url=url, api_key="tml-flooder")
s = sc.create_sampling_client(base_model="twinkle/tiny-qwen3")
s = s.result() if hasattr(s, "result") else s
p = types.ModelInput.from_ints([100, 101, 102, 103])
params = types.SamplingParams(max_tokens=max_tokens, temperature=1.0, stop=[])
inflight = [s.sample(p, 256, params) for _ in range(4)]
print("flooding", flush=True)
while True:
    inflight[0].result(timeout=600)
    inflight = inflight[1:] + [s.sample(p, 256, params)]
"""


def resolve(x, timeout=60):
    return x.result(timeout=timeout) if hasattr(x, "result") else x


SOLO_N, LOADED_N = 100, 200


def p99(xs):
    """Nearest-rank p99: the ceil(0.99 n)-th smallest."""
    xs = sorted(xs)
    return xs[max(0, math.ceil(0.99 * len(xs)) - 1)]


def fb_latency(tc, i):
    t = time.perf_counter()
    tc.forward_backward([counting_datum((i * 3 + k) % 32, 6) for k in range(2)], "cross_entropy").result(timeout=300)
    return time.perf_counter() - t


def test_training_keeps_its_latency_under_a_sampling_flood(start_server):
    srv = start_server()
    trainer = new_training_client(service_client(srv.base_url, "tml-trainer"), rank=8, seed=2)
    sampler = resolve(service_client(srv.base_url, "tml-flooder").create_sampling_client(base_model=BASE_MODEL))
    prompt = types.ModelInput.from_ints(PROMPT)
    params = types.SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0, stop=[])

    # forward_backward only (gradients accumulate), so that each sample is one queued job
    for i in range(3):  # warm-up
        fb_latency(trainer, i)
    trainer.optim_step(adam()).result(timeout=300)
    solo = [fb_latency(trainer, i) for i in range(SOLO_N)]
    rounds = []
    for _ in range(3):  # one round: a batch of 16 samples alone
        t = time.perf_counter()
        sampler.sample(prompt, 16, params).result(timeout=300)
        rounds.append(time.perf_counter() - t)
    one_round = max(rounds)
    bound = 2 * p99(solo) + 2 * one_round
    forgiven = LOADED_N - math.ceil(0.99 * LOADED_N)  # calls above the p99 (2 of 200)

    # the flood runs in another process, so that decoding its answers in Python does not hold
    # this process's GIL while the trainer's latencies are measured
    flood = subprocess.Popen([sys.executable, "-c", FLOOD, srv.base_url, str(MAX_TOKENS)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    loaded, over = [], 0
    try:
        assert flood.stdout.readline().strip() == "flooding"
        time.sleep(max(0.5, 2 * one_round))  # the flood's rounds are running
        t0 = time.perf_counter()
        for i in range(LOADED_N):
            loaded.append(fb_latency(trainer, i))
            over += loaded[-1] >= bound
            if over > forgiven:  # the p99 is over the bound already (a FIFO): stop waiting
                break
        span = time.perf_counter() - t0
        alive = flood.poll() is None
    finally:
        flood.terminate()
        out, err = flood.communicate(timeout=60)
    srt = sorted(loaded)
    print(f"trainer forward_backward: solo p99 {p99(solo) * 1e3:.1f} ms (median {sorted(solo)[SOLO_N // 2] * 1e3:.1f} ms, "
          f"{SOLO_N} calls); under the flood p99 {p99(loaded) * 1e3:.1f} ms, median {srt[len(srt) // 2] * 1e3:.1f} ms, "
          f"max {srt[-1] * 1e3:.1f} ms ({len(loaded)} calls in {span:.1f} s, {over} over the bound); one sampling round "
          f"{one_round * 1e3:.1f} ms; bound 2 x solo p99 + 2 rounds = {bound * 1e3:.1f} ms; a queued 256-sample request "
          f"is 16 rounds; flood process: {(out.strip() + err.strip())[-200:]}")
    assert alive, "the flooding process died: " + err[-500:]
    assert len(loaded) == LOADED_N and p99(loaded) < bound, (
        f"forward_backward p99 {p99(loaded) * 1e3:.1f} ms over the bound {bound * 1e3:.1f} ms")


def test_tenant_over_its_queue_share_gets_429(start_server):
    srv = start_server("--max-queue-per-tenant", "2")
    a = resolve(service_client(srv.base_url, "tml-greedy").create_sampling_client(base_model=BASE_MODEL))
    b = resolve(service_client(srv.base_url, "tml-polite").create_sampling_client(base_model=BASE_MODEL))

    def body(sid, n):
        return {"sampling_session_id": sid, "seq_id": 1, "num_samples": n,
                "prompt": {"chunks": [{"type": "encoded_text", "tokens": PROMPT}]},
                "sampling_params": {"max_tokens": MAX_TOKENS, "stop": []}}

    statuses, refused = [], None
    for _ in range(8):  # the first runs, two wait, the rest are over the share
        st, text = post_json(srv.port, "asample", body(a._sampling_session_id, 256), "tml-greedy")
        statuses.append(st)
        if st == 429 and refused is None:
            refused = text
    other, _ = post_json(srv.port, "asample", body(b._sampling_session_id, 1), "tml-polite")
    print("greedy tenant:", statuses, "| polite tenant:", other, "|", (refused or "")[:200])
    assert 429 in statuses and statuses[0] == 200
    assert "--max-queue-per-tenant" in refused
    assert other == 200
