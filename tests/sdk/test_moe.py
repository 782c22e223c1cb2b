"""A small Qwen3-MoE model through the service (the qwen3_moe parity fixture's folder: 2 layers,
8 experts, top-2, vocab 1000), with the official SDK: a LoRA run (LoRA on attention and, the SDK's
default, lm_head; the experts stay frozen) learns the demo's counting task as the dense model does, its trained adapter samples
(logprobs equal the training client's forward, greedy decoding counts), and snapshots of two MoE
runs and the MoE base model decoded concurrently in shared batches (adapter slots) each get what
they get alone."""
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from tinker import types

from conftest import REPO, Server, adam, counting_datum, logprobs_of, service_client

FIXTURE = REPO / "tests/parity/fixtures/qwen3_moe/model"
NAME = "fixture/qwen3-moe"


@pytest.fixture(scope="module")
def moe_server(tmp_path_factory):
    d = tmp_path_factory.mktemp("moe")
    s = Server(d / "data", ["--model", f"{FIXTURE}={NAME}", "--seq-timeout", "30"], log_path=d / "serve.log")
    yield s
    s.kill()


def _result(x):
    """The client itself from a create_* call (the SDK returns it or a future of it)."""
    return x.result(timeout=120) if hasattr(x, "result") else x


def _client(sc, seed, rank=8):
    """LoRA on the attention and lm_head: the runs that pack and share adapter slots (train_mlp would
    adapt the experts too, whose runs train and sample on their own: tests/sdk/test_moe_serve.py)."""
    return _result(sc.create_lora_training_client(base_model=NAME, rank=rank, seed=seed, train_mlp=False))


def _train(tc, steps, lr=2e-2):
    """Pipelined steps on a quarter of the counting starts each; returns the loss per token of each step."""
    futs = []
    for step in range(steps):
        data = [counting_datum(s) for s in range(step % 4, 32, 4)]
        futs.append((tc.forward_backward(data, "cross_entropy"), sum(len(d.loss_fn_inputs["weights"].tolist())
                                                                     for d in data)))
        futs.append((tc.optim_step(adam(lr)), 0))
    losses = []
    for f, n in futs:
        r = f.result(timeout=300)
        if n:
            losses.append(r.metrics["loss:sum"] / n)
    return losses


def _heldout(tc):
    held = [counting_datum(s, first=100) for s in (3, 17, 29)]
    return float(np.mean([np.mean(lp) for lp in logprobs_of(tc.forward(held, "cross_entropy").result(timeout=120))]))


def test_capabilities_list_the_moe_model(moe_server):
    caps = service_client(moe_server.base_url).get_server_capabilities()
    assert NAME in [m.model_name for m in caps.supported_models]


def test_lora_on_moe_learns_counting_and_samples(moe_server):
    sc = service_client(moe_server.base_url, "tml-moe-a")
    tc = _client(sc, seed=1234)
    assert tc.get_info().model_data.model_name == NAME
    before = _heldout(tc)
    losses = _train(tc, 20)
    after = _heldout(tc)
    print(f"loss per token by step: {[round(x, 3) for x in losses]}; held-out mean logprob {before:.3f} -> {after:.3f}")
    assert all(np.isfinite(losses))
    assert losses[0] > 5.0  # ln(1000) = 6.9 for a random model
    assert losses[-1] < losses[0] / 2, losses
    assert after > before + 2.0, (before, after)

    sampler = _result(tc.save_weights_and_get_sampling_client())
    prompt = [100 + (5 + i) % 32 for i in range(8)]
    # prompt scoring through the sampler equals the training client's forward of the same tokens
    lp = sampler.compute_logprobs(types.ModelInput.from_ints(prompt)).result(timeout=120)
    fwd = logprobs_of(tc.forward([types.Datum(model_input=types.ModelInput.from_ints(prompt[:-1]),
                                              loss_fn_inputs={"target_tokens": prompt[1:]})],
                                 "cross_entropy").result(timeout=120))[0]
    assert lp[0] is None
    diff = max(abs(a - b) for a, b in zip(lp[1:], fwd))
    print(f"compute_logprobs vs forward: max |diff| {diff:.3g}")
    assert diff <= 1e-4
    # greedy decoding continues the count, and its logprobs are the forward's of prompt + generated
    params = types.SamplingParams(max_tokens=8, temperature=0.0, stop=[])
    seq = sampler.sample(types.ModelInput.from_ints(prompt), 1, params).result(timeout=120).sequences[0]
    want = [100 + (5 + 8 + i) % 32 for i in range(8)]
    hits = sum(int(a == b) for a, b in zip(seq.tokens, want))
    print(f"greedy after the prompt: {list(seq.tokens)} (counting: {want}, {hits} of 8)")
    assert hits >= 6, (list(seq.tokens), want)
    full = prompt + list(seq.tokens)
    fwd = logprobs_of(tc.forward([types.Datum(model_input=types.ModelInput.from_ints(full[:-1]),
                                              loss_fn_inputs={"target_tokens": full[1:]})],
                                 "cross_entropy").result(timeout=120))[0]
    diff = max(abs(a - b) for a, b in zip(seq.logprobs, fwd[len(prompt) - 1:]))
    print(f"greedy logprobs vs forward: max |diff| {diff:.3g}")
    assert diff <= 1e-4
    # the base model's sampler is not the trained adapter
    base = _result(sc.create_sampling_client(base_model=NAME))
    seq0 = base.sample(types.ModelInput.from_ints(prompt), 1, params).result(timeout=120).sequences[0]
    assert list(seq0.tokens) != list(seq.tokens)


def _sample(client, prompt, seed, temperature):
    params = types.SamplingParams(max_tokens=10, temperature=temperature, seed=seed, stop=[])
    r = client.sample(prompt=types.ModelInput.from_ints(prompt), num_samples=3, sampling_params=params).result(timeout=300)
    return [(list(s.tokens), list(s.logprobs)) for s in r.sequences]


def test_moe_adapters_share_decode_batches(moe_server):
    """Snapshots of two tenants' MoE runs and the MoE base model sampled concurrently: the server
    decodes them together through its adapter slots; each request gets what it gets alone."""
    samplers = []
    for key, seed in (("tml-moe-b", 11), ("tml-moe-c", 22)):
        tc = _client(service_client(moe_server.base_url, key), seed=seed)
        _train(tc, 2)
        samplers.append(_result(tc.save_weights_and_get_sampling_client()))
    samplers.append(_result(service_client(moe_server.base_url, "tml-moe-d").create_sampling_client(base_model=NAME)))
    jobs = [(samplers[i % 3], ([7 + i, 70 + i, 170 + i], 100 + i, 0.0 if i % 2 else 1.0)) for i in range(9)]
    alone = [_sample(s, *job) for s, job in jobs]
    with ThreadPoolExecutor(max_workers=9) as pool:
        together = list(pool.map(lambda sj: _sample(sj[0], *sj[1]), jobs))
    worst = 0.0
    for a, b in zip(alone, together):
        for (ta, la), (tb, lb) in zip(a, b):
            assert ta == tb
            worst = max(worst, max(abs(x - y) for x, y in zip(la, lb)))
    print(f"shared decode batches vs alone: tokens equal, max |logprob diff| {worst:.3g}")
    assert worst <= 1e-5
    # the adapters matter: the three samplers' greedy draws on one prompt do not all agree
    greedy = {tuple(_sample(s, [7, 70, 170], 1, 0.0)[0][0]) for s in samplers}
    assert len(greedy) > 1


def _train_trace(base_url, key, rank, seed, barrier=None):
    tc = _client(service_client(base_url, key), seed=seed, rank=rank)
    if barrier is not None:
        barrier.wait(timeout=120)
    futs = [(tc.forward_backward([counting_datum((seed + 5 * s + d) % 32, 10 + d) for d in range(3)], "cross_entropy"),
             tc.optim_step(adam(5e-3))) for s in range(3)]
    trace = []
    for fb, opt in futs:
        r = fb.result(timeout=300)
        opt.result(timeout=300)
        trace.append(np.concatenate([np.asarray(x) for x in logprobs_of(r)]))
    return np.concatenate(trace)


def test_moe_runs_packed_equal_each_alone(start_server, monkeypatch):
    """Three MoE runs (ranks 4, 8, 16) trained at once share packed passes (their tokens routed
    through the same experts in one grouped product) and equal each run trained alone within 1e-5
    (measured 1.9e-6). Not 0 as for the dense model: an expert's rows are one sgemm per expert
    (backends/cpu/kern_grouped.c), and where a run's rows fall among the other runs' rows of that
    expert changes which of OpenBLAS's row tiles computes them, and so their last bits.

    Its own server, whose optim_steps each sleep 0.1 s on the worker (TWK_FAULT): three clients in
    one Python process send their requests slower than this small model runs them, so without the
    sleep whether any two runs' forward_backward ever waited at once was up to the machine (a CI
    run on a loaded machine packed none); during an optim_step the other runs' requests queue."""
    import threading

    from test_metrics import scrape, value

    monkeypatch.setenv("TWK_FAULT", "sleep:optim_step:0.1")
    moe_server = start_server("--model", f"{FIXTURE}={NAME}", "--seq-timeout", "30")
    monkeypatch.delenv("TWK_FAULT")

    def packed():
        _, fams = scrape(moe_server.port, "tml-metrics")
        return value(fams, "twinkle_train_passes_total", kind="packed")

    runs = [(4, 31), (8, 32), (16, 33)]
    alone = [_train_trace(moe_server.base_url, f"tml-moe-alone-{i}", r, s) for i, (r, s) in enumerate(runs)]
    p0 = packed()
    together, errors = {}, []
    barrier = threading.Barrier(len(runs))

    def worker(i):
        try:
            together[i] = _train_trace(moe_server.base_url, f"tml-moe-together-{i}", *runs[i], barrier)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(runs))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=600)
    assert not errors, errors
    p1 = packed()
    worst = max(float(np.max(np.abs(alone[i] - together[i]))) for i in range(len(runs)))
    print(f"packed MoE runs vs alone: max |logprob diff| {worst:.3g}; packed passes {p1 - p0:.0f}")
    assert p1 > p0
    assert worst <= 1e-5


def test_moe_memory_pools(start_server):
    """The memory pools of GET /metrics count a MoE model right: the weights pool equals the
    parameters computed from config.json (the router and every expert's gate / up / down, no dense
    MLP), and a rank-8 run adds exactly its adapter (attention and lm_head, the SDK's default
    train_unembed; the experts get no LoRA), gradients and AdamW moments."""
    import json

    from test_metrics import F32, check_sums, scrape

    srv = start_server("--model", f"{FIXTURE}={NAME}")
    c = json.loads((FIXTURE / "config.json").read_text())
    h, v, L, hd = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"], c["head_dim"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    E, f = c.get("num_experts") or c["num_local_experts"], c["moe_intermediate_size"]
    layer = h * q + 2 * h * kv + q * h + E * h + E * 3 * h * f + 2 * h + 2 * hd  # attention, router, experts, norms
    weights = (v * h * (1 if c["tie_word_embeddings"] else 2) + L * layer + h) * F32
    _, m0 = scrape(srv.port, "tml-moe-pools")
    _, dev0 = check_sums(m0)
    print(f"weights pool {dev0['weights']:.0f} bytes, from config.json {weights}")
    assert dev0["weights"] == weights
    rank = 8
    modules = L * [(h, q), (h, kv), (h, kv), (q, h)] + [(h, v)]  # (in, out): attention and the SDK's default lm_head
    tensors = [n for i, o in modules for n in (rank * i, o * rank)]
    run = sum(tensors) * F32 + 3 * sum((n + 63) // 64 * 64 for n in tensors) * F32
    _client(service_client(srv.base_url, "tml-moe-pools"), seed=5, rank=rank)
    _, m1 = scrape(srv.port, "tml-moe-pools")
    _, dev1 = check_sums(m1)
    print(f"a rank-8 run: {dev1['adapters'] - dev0['adapters']:.0f} bytes, expected {run}")
    assert dev1["adapters"] - dev0["adapters"] == run
