"""bf16 weights through the SDK: the same LoRA run on a server holding the base model in bf16
(`--dtype bf16`) and on one holding it in f32 learns the demo task (counting on a clock of 32
tokens) to the same held-out logprob, and the bf16 server really holds half the weight bytes.

Tolerance. bf16 keeps 8 significant bits: each weight matrix entry moves by at most 2^-9
relative (round to nearest even); over the tiny model's random weights the errors largely
cancel in the mean logprob (measured 1.9e-4 nats; bounded at 5e-3, the size of one rounding
step of a logit of magnitude ~2). Training then follows gradients of that slightly
different function from the same adapter initialisation and the same batches; what must agree
is what was learned. The held-out mean logprob after training is compared against the gain
over the base model: |after_bf16 - after_f32| <= 1% of the f32 gain (measured: 4.4e-4 nats of a
6.08-nat gain, 0.007%), and both runs must gain more than 1 nat (the demo's own bar)."""
from __future__ import annotations

import random
import re

from conftest import adam, counting_datum, new_training_client, service_client

STEPS = 25
BATCH = 8
RANK = 16
LR = 5e-3


def held_out():
    rng = random.Random(0)
    return [counting_datum(rng.randrange(32), 16) for _ in range(8)]


def mean_logprob(result) -> float:
    lps = [x for out in result.loss_fn_outputs for x in out["logprobs"].tolist()]
    return sum(lps) / len(lps)


def train_demo(server) -> tuple[float, float]:
    """Held-out mean logprob before and after STEPS pipelined demo steps (fixed seeds)."""
    sc = service_client(server.base_url, "tml-bf16")
    tc = new_training_client(sc, rank=RANK, seed=7)
    before = mean_logprob(tc.forward(held_out(), "cross_entropy").result(timeout=60))
    rng = random.Random(1)
    futures = []
    for _ in range(STEPS):
        batch = [counting_datum(rng.randrange(32), 16) for _ in range(BATCH)]
        futures.append((tc.forward_backward(batch, "cross_entropy"), tc.optim_step(adam(LR))))
    for fb, opt in futures:
        fb.result(timeout=120)
        opt.result(timeout=120)
    after = mean_logprob(tc.forward(held_out(), "cross_entropy").result(timeout=60))
    return before, after


def weight_bytes(server) -> float:
    """The device's weights pool on GET /metrics, in bytes."""
    import http.client

    c = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    c.request("GET", "/metrics", headers={"X-API-Key": "tml-bf16"})
    text = c.getresponse().read().decode()
    c.close()
    return sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines()
               if l.startswith("twinkle_device_memory_pool_bytes") and 'pool="weights"' in l)


def startup_weights_kib(server) -> float:
    """The weights figure of serve's start-up line (the memory plan), in KiB."""
    m = re.search(r"weights ([0-9.]+) (KiB|MiB)", server.log_text())
    assert m, f"no weights figure in the start-up line: {server.log_text()[:400]}"
    return float(m.group(1)) * (1024.0 if m.group(2) == "MiB" else 1.0)


def test_bf16_learns_the_demo_like_f32(start_server):
    f32 = start_server("--dtype", "f32")
    bf16 = start_server("--dtype", "bf16")
    w32, w16 = weight_bytes(f32), weight_bytes(bf16)
    print(f"weights pool: f32 {w32:.0f} bytes, bf16 {w16:.0f} bytes")
    # matrices halve; the norms (f32 in both) keep the bf16 pool a little above half
    assert 0.5 * w32 <= w16 < 0.52 * w32, (w32, w16)
    # the start-up line's plan counts the weights in the dtype the load holds: within 1% of the
    # pool (the plan adds the RoPE tables) plus half the printed figure's last digit
    for s, w in ((f32, w32), (bf16, w16)):
        got = startup_weights_kib(s)
        unit = 1024.0 * (1024.0 if got >= 1024.0 else 1.0)
        assert abs(got * 1024.0 - w) <= 0.01 * w + 0.05 * unit, (got, w)

    b32, a32 = train_demo(f32)
    b16, a16 = train_demo(bf16)
    gain = a32 - b32
    print(f"held-out mean logprob: f32 {b32:.4f} -> {a32:.4f}; bf16 {b16:.4f} -> {a16:.4f}; "
          f"|before diff| {abs(b16 - b32):.2e}, |after diff| {abs(a16 - a32):.2e} "
          f"({abs(a16 - a32) / gain:.2%} of the f32 gain {gain:.3f})")
    assert abs(b16 - b32) <= 5e-3, (b16, b32)
    assert gain > 1.0 and a16 - b16 > 1.0, (b32, a32, b16, a16)
    assert abs(a16 - a32) <= 0.01 * gain, (a16, a32, gain)
