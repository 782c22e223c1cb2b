"""Sampling through the SDK against `twinkle serve`: sampling clients from a
training client's snapshot (save_weights_and_get_sampling_client), from named
sampler weights and from a save_state path (create_sampling_client(model_path=..)),
and on the base model; sample() results (num_samples, logprobs, sequence ids,
stop ids, EOS, seeds, greedy, top_k / top_p); compute_logprobs and prompt /
top-k prompt logprobs equal to the training forward's; snapshot semantics;
bad parameters refused by name; tenants cannot see each other's samplers.

The built-in model has vocab 512, no tokenizer and EOS id 1, so prompts and
stops are token ids."""
from __future__ import annotations

import http.client
import json
import math

import pytest
import tinker
from tinker import types

from conftest import (
    BASE_MODEL,
    VOCAB,
    adam,
    counting_datum,
    make_datum,
    new_training_client,
    service_client,
)

TOL = 1e-4
KEY = "tml-sampler"
PROMPT = [100, 101, 102, 103, 104, 105, 106, 107, 108]


def mi(tokens):
    return types.ModelInput.from_ints(list(tokens))


def params(**kw):
    kw.setdefault("max_tokens", 12)
    return types.SamplingParams(**kw)


def resolve(x, timeout=60):
    """A client or a (backcompat) future of one."""
    return x.result(timeout=timeout) if hasattr(x, "result") else x


def sample(sc_, prompt=PROMPT, n=1, timeout=60, **kw):
    return sc_.sample(mi(prompt), n, params(**kw)).result(timeout=timeout)


def fwd_logprobs(tc, tokens):
    """The training forward's log p(tokens[i] | tokens[:i]) for i >= 1."""
    r = tc.forward([make_datum(tokens[:-1], tokens[1:], [1.0] * (len(tokens) - 1))], "cross_entropy")
    return r.result(timeout=60).loss_fn_outputs[0]["logprobs"].tolist()


def worst(a, b):
    assert len(a) == len(b), f"lengths {len(a)} vs {len(b)}"
    return max((abs(x - y) for x, y in zip(a, b)), default=0.0)


def train(tc, steps, first=0):
    for s in range(steps):
        tc.forward_backward([counting_datum(first + s + i, 12) for i in range(4)], "cross_entropy")
        tc.optim_step(adam(2e-2))
    tc.forward([counting_datum(0, 4)], "cross_entropy").result(timeout=60)


def raw(port, method, path, body=None, key=KEY):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    data = json.dumps(body).encode() if body is not None else None
    headers = {"X-API-Key": key}
    if data is not None:
        headers["Content-Type"] = "application/json"
    c.request(method, path, body=data, headers=headers)
    r = c.getresponse()
    payload = r.read()
    c.close()
    try:
        js = json.loads(payload)
    except ValueError:
        js = None
    return r.status, js, payload


def asample_body(session_id, prompt=PROMPT, **extra):
    body = {"sampling_session_id": session_id, "seq_id": 0, "num_samples": 1,
            "prompt": {"chunks": [{"type": "encoded_text", "tokens": list(prompt)}]},
            "sampling_params": {"max_tokens": 4, "temperature": 1.0, "top_k": -1, "top_p": 1.0},
            "prompt_logprobs": False, "topk_prompt_logprobs": 0, "type": "sample"}
    body.update(extra)
    return body


@pytest.fixture(scope="module")
def ctx(server):
    """A trained rank-8 LoRA client (its adapter is far from zero) and a snapshot sampler of it."""
    sc = service_client(server.base_url, KEY)
    tc = new_training_client(sc, rank=8, seed=4321)
    train(tc, 4)
    samp = resolve(tc.save_weights_and_get_sampling_client())
    return dict(sc=sc, tc=tc, samp=samp, server=server)


@pytest.fixture(scope="module")
def base_sampler(ctx):
    return resolve(ctx["sc"].create_sampling_client(base_model=BASE_MODEL))


# ---- shape of sample() results ----

def test_num_samples_sequences_logprobs_and_ids(ctx):
    # 20 samples: more than the server's 16 sequences per round
    r = sample(ctx["samp"], n=20, max_tokens=10, temperature=1.0, seed=11, stop=[])
    assert len(r.sequences) == 20
    ids = [s.sequence_id for s in r.sequences]
    assert all(ids) and len(set(ids)) == 20, ids
    for s in r.sequences:
        assert s.stop_reason == "length"
        assert len(s.tokens) == 10
        assert s.logprobs is not None and len(s.logprobs) == len(s.tokens)
        assert all(0 <= t < VOCAB for t in s.tokens)
        assert all(math.isfinite(x) and x <= 0 for x in s.logprobs)
    # independent draws (a seeded round must not repeat the previous round)
    assert len({tuple(s.tokens) for s in r.sequences}) == 20
    assert r.prompt_logprobs is None and r.topk_prompt_logprobs is None


def test_sampler_get_base_model_and_rest_info(ctx):
    samp = ctx["samp"]
    assert samp.get_base_model() == BASE_MODEL
    st, js, _ = raw(ctx["server"].port, "GET", f"/api/v1/samplers/{samp._sampling_session_id}")
    assert st == 200, js
    assert js["sampler_id"] == samp._sampling_session_id and js["base_model"] == BASE_MODEL


# ---- logprobs equal the training forward's ----

def test_compute_logprobs_equals_training_forward(ctx):
    tc, samp = ctx["tc"], ctx["samp"]
    for prompt in (PROMPT, [7, 300, 42, 5, 1, 0, 511, 256, 100, 101, 102] * 3):
        lp = samp.compute_logprobs(mi(prompt)).result(timeout=60)
        assert len(lp) == len(prompt)
        assert lp[0] is None and all(x is not None for x in lp[1:])
        assert worst(lp[1:], fwd_logprobs(tc, prompt)) <= TOL


def test_compute_logprobs_in_one_pass_equals_forward_at_every_length(ctx, base_sampler):
    """Prompt scoring (one prefill, every row's logprob) on the LoRA snapshot and on the base
    model: 1 and 2 tokens, and 157 (longer than a decode batch of 16, a multiple of no tile),
    within 1e-5 of the training forward's."""
    fresh = new_training_client(ctx["sc"], rank=4, seed=2)  # B = 0: the base model
    long = [(1000 + 7919 * i) % VOCAB for i in range(157)]
    for samp, tc in ((ctx["samp"], ctx["tc"]), (base_sampler, fresh)):
        assert samp.compute_logprobs(mi([42])).result(timeout=60) == [None]
        for prompt in ([42, 7], long):
            lp = samp.compute_logprobs(mi(prompt)).result(timeout=60)
            assert len(lp) == len(prompt) and lp[0] is None
            err = worst(lp[1:], fwd_logprobs(tc, prompt))
            print(f"compute_logprobs vs forward, {len(prompt)} tokens: max |diff| {err:.2e}")
            assert err <= 1e-5


def test_greedy_logprobs_equal_forward_of_prompt_plus_generation(ctx):
    tc, samp = ctx["tc"], ctx["samp"]
    r = sample(samp, max_tokens=16, temperature=0.0, stop=[])
    s = r.sequences[0]
    assert len(s.tokens) == 16 and s.stop_reason == "length"
    full = PROMPT + s.tokens
    assert worst(s.logprobs, fwd_logprobs(tc, full)[-16:]) <= TOL
    # each greedy token is the most likely next token: the top-1 of the prompt scoring
    k = samp.sample(mi(full), 1, params(max_tokens=1), include_prompt_logprobs=True,
                    topk_prompt_logprobs=1).result(timeout=60)
    top1 = [row[0][0] for row in k.topk_prompt_logprobs[len(PROMPT):]]
    assert top1 == s.tokens
    # and greedy repeats
    assert sample(samp, max_tokens=16, temperature=0.0, stop=[]).sequences[0].tokens == s.tokens


def test_sampled_logprobs_are_raw_logprobs(ctx):
    """At any temperature the reported logprob is log_softmax of the raw logits (the forward's)."""
    tc, samp = ctx["tc"], ctx["samp"]
    for temp in (1.0, 0.7):
        s = sample(samp, max_tokens=10, temperature=temp, seed=3, stop=[]).sequences[0]
        assert worst(s.logprobs, fwd_logprobs(tc, PROMPT + s.tokens)[-10:]) <= TOL, temp


# ---- seeds, greedy, top_k / top_p ----

def test_seeded_sampling_repeats_and_another_seed_differs(ctx):
    samp = ctx["samp"]
    a = sample(samp, n=4, max_tokens=16, temperature=1.0, seed=7, stop=[])
    b = sample(samp, n=4, max_tokens=16, temperature=1.0, seed=7, stop=[])
    c = sample(samp, n=4, max_tokens=16, temperature=1.0, seed=8, stop=[])
    assert [s.tokens for s in a.sequences] == [s.tokens for s in b.sequences]
    assert [s.logprobs for s in a.sequences] == [s.logprobs for s in b.sequences]
    assert [s.tokens for s in a.sequences] != [s.tokens for s in c.sequences]
    # the sequence ids are new per request
    assert {s.sequence_id for s in a.sequences}.isdisjoint({s.sequence_id for s in b.sequences})


def test_top_k_1_and_tiny_top_p_equal_greedy(ctx):
    samp = ctx["samp"]
    g = sample(samp, max_tokens=12, temperature=0.0, stop=[]).sequences[0]
    k1 = sample(samp, n=3, max_tokens=12, temperature=1.0, top_k=1, seed=5, stop=[])
    p0 = sample(samp, n=3, max_tokens=12, temperature=1.0, top_p=1e-6, seed=5, stop=[])
    for s in list(k1.sequences) + list(p0.sequences):
        assert s.tokens == g.tokens
        assert worst(s.logprobs, g.logprobs) <= 1e-4  # batch 3 vs batch 1: the GEMM paths differ (sgemm vs sgemv)


def test_top_k_keeps_to_the_k_most_likely(ctx):
    samp = ctx["samp"]
    r = sample(samp, n=8, max_tokens=1, temperature=1.5, top_k=3, seed=9, stop=[])
    k = samp.sample(mi(PROMPT + [0]), 1, params(max_tokens=1), include_prompt_logprobs=True,
                    topk_prompt_logprobs=3).result(timeout=60)
    allowed = {tok for tok, _ in k.topk_prompt_logprobs[len(PROMPT)]}
    assert {s.tokens[0] for s in r.sequences} <= allowed


# ---- stops ----

def test_stop_token_ends_generation_and_is_included(ctx):
    samp = ctx["samp"]
    free = sample(samp, n=3, max_tokens=16, temperature=1.0, seed=21, stop=[])
    for i, s in enumerate(free.sequences):
        assert s.stop_reason == "length" and len(s.tokens) == 16
        stop_id = s.tokens[6]
        j = s.tokens.index(stop_id)  # its first occurrence
        stopped = sample(samp, n=3, max_tokens=16, temperature=1.0, seed=21, stop=[stop_id]).sequences
        r = stopped[i]
        assert r.tokens == s.tokens[: j + 1], (stop_id, s.tokens, r.tokens)
        # bit-identical while the decode batch holds the same sequences; once another one stopped the
        # batch has fewer rows, and a GEMM over fewer rows may round differently (as batch 3 vs 1 above)
        same = min([len(x.tokens) for k, x in enumerate(stopped) if k != i] + [j + 1])
        assert r.logprobs[:same] == s.logprobs[:same]
        assert worst(r.logprobs, s.logprobs[: j + 1]) <= 1e-4
        assert r.stop_reason == "stop"
    # two stop ids: the earlier one ends it
    s = free.sequences[0]
    a, b = s.tokens[9], s.tokens[4]
    first = min(s.tokens.index(a), s.tokens.index(b))
    r = sample(samp, n=3, max_tokens=16, temperature=1.0, seed=21, stop=[a, b]).sequences[0]
    assert r.tokens == s.tokens[: first + 1] and r.stop_reason == "stop"


def test_greedy_stop_token(ctx):
    samp = ctx["samp"]
    g = sample(samp, max_tokens=12, temperature=0.0, stop=[]).sequences[0]
    j = g.tokens.index(g.tokens[3])
    r = sample(samp, max_tokens=12, temperature=0.0, stop=[g.tokens[3]]).sequences[0]
    assert r.tokens == g.tokens[: j + 1] and r.stop_reason == "stop"


def test_empty_stop_runs_to_max_tokens(ctx, base_sampler):
    for samp in (ctx["samp"], base_sampler):
        r = sample(samp, n=4, max_tokens=24, temperature=1.0, seed=2, stop=[])
        for s in r.sequences:
            assert len(s.tokens) == 24 and s.stop_reason == "length"


def test_no_stop_given_stops_at_eos(base_sampler):
    """stop absent = the model's EOS (id 1): no sequence continues past a 1, a
    sequence ending in 1 is "stop", every other one is max_tokens long. With
    stop=[] the same seed gives sequences of which those are prefixes."""
    free = sample(base_sampler, n=64, max_tokens=32, temperature=1.0, seed=1, stop=[])
    eos = sample(base_sampler, n=64, max_tokens=32, temperature=1.0, seed=1)
    stopped = 0
    for f, e in zip(free.sequences, eos.sequences):
        if 1 in f.tokens:
            j = f.tokens.index(1)
            assert e.tokens == f.tokens[: j + 1] and e.stop_reason == "stop"
            stopped += 1
        else:
            assert e.tokens == f.tokens and e.stop_reason == "length"
        assert 1 not in e.tokens[:-1]
    # ~6% of 32-token draws from a near-uniform 512-way distribution contain a 1
    assert stopped >= 1, "no sequence generated the EOS id; choose another seed"


# ---- prompt logprobs and top-k prompt logprobs ----

def test_prompt_logprobs_and_topk_prompt_logprobs(ctx):
    tc, samp = ctx["tc"], ctx["samp"]
    K = 5
    r = samp.sample(mi(PROMPT), 2, params(max_tokens=3, temperature=1.0, seed=1), include_prompt_logprobs=True,
                    topk_prompt_logprobs=K).result(timeout=60)
    assert len(r.sequences) == 2
    plp = r.prompt_logprobs
    assert len(plp) == len(PROMPT) and plp[0] is None
    assert worst(plp[1:], fwd_logprobs(tc, PROMPT)) <= TOL
    assert worst(plp[1:], samp.compute_logprobs(mi(PROMPT)).result(timeout=60)[1:]) <= 1e-6
    top = r.topk_prompt_logprobs
    assert len(top) == len(PROMPT) and top[0] is None
    for i, row in enumerate(top[1:], start=1):
        assert len(row) == K
        lps = [lp for _, lp in row]
        assert lps == sorted(lps, reverse=True), row
        assert len({tok for tok, _ in row}) == K and all(0 <= tok < VOCAB for tok, _ in row)
        assert sum(math.exp(x) for x in lps) <= 1 + 1e-5
        assert plp[i] <= lps[0] + 1e-6
        for tok, lp in row:
            if tok == PROMPT[i]:
                assert abs(lp - plp[i]) <= 1e-5
        # the K-th is at least every token outside the list, including the prompt token
        if PROMPT[i] not in {tok for tok, _ in row}:
            assert plp[i] <= lps[-1] + 1e-6


def test_prompt_logprobs_of_a_one_token_prompt(ctx):
    lp = ctx["samp"].compute_logprobs(mi([42])).result(timeout=60)
    assert lp == [None]


# ---- where the weights come from ----

def test_named_sampler_weights_and_save_state_paths(ctx):
    sc, tc = ctx["sc"], ctx["tc"]
    ref = fwd_logprobs(tc, PROMPT)
    sp = tc.save_weights_for_sampler("named-1").result(timeout=60).path
    assert sp == f"tinker://{tc.model_id}/sampler_weights/named-1"
    wp = tc.save_state("state-1").result(timeout=60).path
    greedy = sample(ctx["samp"], max_tokens=8, temperature=0.0, stop=[]).sequences[0].tokens
    for path, make in ((sp, lambda p: sc.create_sampling_client(model_path=p)),
                       (sp, lambda p: tc.create_sampling_client(p)),
                       (wp, lambda p: sc.create_sampling_client(model_path=p))):
        samp = resolve(make(path))
        lp = samp.compute_logprobs(mi(PROMPT)).result(timeout=60)
        assert lp[0] is None and worst(lp[1:], ref) <= TOL, path
        assert samp.get_base_model() == BASE_MODEL
        # the same weights as the snapshot taken before (no step since): the same greedy tokens
        assert sample(samp, max_tokens=8, temperature=0.0, stop=[]).sequences[0].tokens == greedy
        st, js, _ = raw(ctx["server"].port, "GET", f"/api/v1/samplers/{samp._sampling_session_id}")
        assert st == 200 and js["model_path"] == path and js["base_model"] == BASE_MODEL, js


def test_base_model_sampler(ctx, base_sampler):
    assert base_sampler.get_base_model() == BASE_MODEL
    # a fresh LoRA client is the base model (B = 0)
    fresh = new_training_client(ctx["sc"], rank=4, seed=1)
    lp = base_sampler.compute_logprobs(mi(PROMPT)).result(timeout=60)
    assert lp[0] is None and worst(lp[1:], fwd_logprobs(fresh, PROMPT)) <= TOL
    # and not the trained adapter
    assert worst(lp[1:], fwd_logprobs(ctx["tc"], PROMPT)) > 1e-2
    s = sample(base_sampler, max_tokens=8, temperature=0.0, stop=[]).sequences[0]
    assert worst(s.logprobs, fwd_logprobs(fresh, PROMPT + s.tokens)[-8:]) <= TOL
    st, js, _ = raw(ctx["server"].port, "GET", f"/api/v1/samplers/{base_sampler._sampling_session_id}")
    assert st == 200 and js["base_model"] == BASE_MODEL and js.get("model_path") is None, js


def test_snapshot_is_unchanged_by_later_training(server):
    sc = service_client(server.base_url, KEY)
    tc = new_training_client(sc, rank=8, seed=99)
    train(tc, 2)
    old = resolve(tc.save_weights_and_get_sampling_client())
    lp_old = old.compute_logprobs(mi(PROMPT)).result(timeout=60)
    g_old = sample(old, n=2, max_tokens=10, temperature=1.0, seed=4, stop=[])
    assert worst(lp_old[1:], fwd_logprobs(tc, PROMPT)) <= TOL
    train(tc, 3, first=50)
    now = fwd_logprobs(tc, PROMPT)
    assert worst(lp_old[1:], now) > 1e-3, "training did not change the model"
    # the old sampler still serves the old weights, exactly
    assert old.compute_logprobs(mi(PROMPT)).result(timeout=60) == lp_old
    g_again = sample(old, n=2, max_tokens=10, temperature=1.0, seed=4, stop=[])
    assert [s.tokens for s in g_again.sequences] == [s.tokens for s in g_old.sequences]
    assert [s.logprobs for s in g_again.sequences] == [s.logprobs for s in g_old.sequences]
    # a new snapshot has the new weights
    new = resolve(tc.save_weights_and_get_sampling_client())
    assert new._sampling_session_id != old._sampling_session_id
    lp_new = new.compute_logprobs(mi(PROMPT)).result(timeout=60)
    assert worst(lp_new[1:], now) <= TOL
    assert worst(lp_new[1:], lp_old[1:]) > 1e-3


# ---- bad input ----

def assert_fails_naming(samp, words, prompt=PROMPT, n=1, **kw):
    with pytest.raises((tinker.RequestFailedError, tinker.APIStatusError)) as e:
        samp.sample(mi(prompt), n, params(**kw)).result(timeout=30)
    msg = str(e.value)
    for w in words:
        assert w in msg, f"{w!r} not in {msg!r}"
    return msg


@pytest.mark.parametrize("prompt,kw,words", [
    (PROMPT + [VOCAB], {}, ["prompt token", str(VOCAB)]),
    ([3, -1, 4], {}, ["prompt token"]),
    (PROMPT, {"temperature": -0.5}, ["temperature"]),
    (PROMPT, {"top_p": 0.0}, ["top_p"]),
    (PROMPT, {"top_p": 1.5}, ["top_p"]),
    (PROMPT, {"top_k": 0}, ["top_k"]),
    (PROMPT, {"max_tokens": 0}, ["max_tokens"]),
    (PROMPT, {"stop": [VOCAB + 3]}, ["stop"]),
    (PROMPT, {"stop": "\n\n"}, ["stop", "token ids"]),
    (PROMPT, {"stop": ["User:"]}, ["stop", "token ids"]),
])
def test_bad_sampling_params_fail_naming_the_field(ctx, prompt, kw, words):
    samp = ctx["samp"]
    assert_fails_naming(samp, words, prompt=prompt, **kw)
    # the client keeps working
    assert len(sample(samp, max_tokens=2).sequences) == 1


def test_unsupported_sample_options_fail_clearly(ctx):
    samp = ctx["samp"]
    with pytest.raises((tinker.RequestFailedError, tinker.APIStatusError)) as e:
        samp.sample(mi(PROMPT), 1, params(max_tokens=2), topk_sample_logprobs=3).result(timeout=30)
    assert "topk_sample_logprobs" in str(e.value)
    # raw: the same through a plain POST, answered with a failed future (or a 4xx)
    st, js, _ = raw(ctx["server"].port, "POST", "/api/v1/asample",
                    asample_body(samp._sampling_session_id, topk_sample_logprobs=2))
    if st == 200:
        rid = js["request_id"]
        st2, js2, _ = raw(ctx["server"].port, "POST", "/api/v1/retrieve_future", {"request_id": rid})
        assert js2 is not None and "topk_sample_logprobs" in json.dumps(js2), (st2, js2)
    else:
        assert 400 <= st < 500 and "topk_sample_logprobs" in json.dumps(js)
    assert len(sample(samp, max_tokens=2).sequences) == 1


def test_max_tokens_past_the_context(start_server):
    srv = start_server("--max-context", "64")
    sc = service_client(srv.base_url, KEY)
    samp = resolve(sc.create_sampling_client(base_model=BASE_MODEL))
    prompt = list(range(100, 140))  # 40 tokens
    msg = assert_fails_naming(samp, ["max_tokens", "64"], prompt=prompt, max_tokens=25, stop=[])
    assert "context" in msg
    assert_fails_naming(samp, ["prompt", "64"], prompt=list(range(100, 164)), max_tokens=1)
    # exactly filling the context works, and runs to the end
    s = sample(samp, prompt=prompt, max_tokens=24, temperature=1.0, seed=1, stop=[]).sequences[0]
    assert len(s.tokens) == 24 and s.stop_reason == "length"
    # max_tokens absent: the server's default is capped by the room left
    r = samp.sample(mi(prompt), 1, types.SamplingParams(stop=[])).result(timeout=60)
    assert 1 <= len(r.sequences[0].tokens) <= 24


def test_unknown_sampling_session_is_404(server):
    st, js, _ = raw(server.port, "POST", "/api/v1/asample", asample_body("no-such-sampler"))
    assert st == 404 and js and "no-such-sampler" in json.dumps(js), (st, js)
    st, js, _ = raw(server.port, "GET", "/api/v1/samplers/no-such-sampler")
    assert st == 404 and js is not None, (st, js)
    st, js, _ = raw(server.port, "POST", "/api/v1/asample", {k: v for k, v in asample_body("x").items()
                                                             if k != "sampling_session_id"})
    assert st == 400 and "sampling_session_id" in json.dumps(js), (st, js)


def test_tenants_cannot_see_each_others_samplers(ctx, base_sampler):
    port = ctx["server"].port
    other = "tml-sampler-other"
    for samp in (ctx["samp"], base_sampler):
        sid = samp._sampling_session_id
        st, _, _ = raw(port, "GET", f"/api/v1/samplers/{sid}", key=KEY)
        assert st == 200
        st, js, _ = raw(port, "GET", f"/api/v1/samplers/{sid}", key=other)
        assert st == 404, (st, js)
        st, js, _ = raw(port, "POST", "/api/v1/asample", asample_body(sid), key=other)
        assert st == 404, (st, js)
    # nor load the other's checkpoints into a sampler
    path = ctx["tc"].save_weights_for_sampler("tenant-a-only").result(timeout=60).path
    sc_b = service_client(ctx["server"].base_url, other)
    with pytest.raises((tinker.NotFoundError, tinker.APIStatusError)):
        resolve(sc_b.create_sampling_client(model_path=path), timeout=30)
    # nor open a sampling session in the other's session
    st, js, _ = raw(port, "POST", "/api/v1/create_sampling_session",
                    {"session_id": ctx["sc"].holder.get_session_id(), "sampling_session_seq_id": 900,
                     "base_model": BASE_MODEL, "type": "create_sampling_session"}, key=other)
    assert st == 404, (st, js)
    # and B's own sampler works and is invisible to A
    samp_b = resolve(sc_b.create_sampling_client(base_model=BASE_MODEL))
    assert len(sample(samp_b, max_tokens=2).sequences) == 1
    st, _, _ = raw(port, "GET", f"/api/v1/samplers/{samp_b._sampling_session_id}", key=KEY)
    assert st == 404


# ---- concurrency, seeds, and SDK options ----

def test_pipelined_samples_equal_sequential(ctx):
    """Many sample / compute_logprobs futures in flight at once give what they give one at a time."""
    samp = ctx["samp"]
    futs = [samp.sample(mi(PROMPT[: 3 + i]), 2, params(max_tokens=8, temperature=1.0, seed=100 + i, stop=[]))
            for i in range(6)]
    lp_fut = samp.compute_logprobs(mi(PROMPT))
    got = [f.result(timeout=60) for f in futs]
    lp = lp_fut.result(timeout=60)
    for i, r in enumerate(got):
        one = sample(samp, prompt=PROMPT[: 3 + i], n=2, max_tokens=8, temperature=1.0, seed=100 + i, stop=[])
        assert [s.tokens for s in r.sequences] == [s.tokens for s in one.sequences]
    assert lp == samp.compute_logprobs(mi(PROMPT)).result(timeout=60)


def test_unseeded_sampling_varies(ctx):
    samp = ctx["samp"]
    a = sample(samp, n=2, max_tokens=16, temperature=1.0, stop=[])
    b = sample(samp, n=2, max_tokens=16, temperature=1.0, stop=[])
    assert [s.tokens for s in a.sequences] != [s.tokens for s in b.sequences]


def test_inflight_kind_serves_the_weights_at_creation(server):
    """kind="inflight" (SDK 0.38): the server may treat it as a snapshot; the SDK's contract
    is "the weights saved when the client was created, or newer"."""
    sc = service_client(server.base_url, KEY)
    tc = new_training_client(sc, rank=8, seed=17)
    train(tc, 1)
    samp = resolve(tc.save_weights_and_get_sampling_client(kind="inflight"))
    lp = samp.compute_logprobs(mi(PROMPT)).result(timeout=60)
    assert worst(lp[1:], fwd_logprobs(tc, PROMPT)) <= TOL


def test_prompt_logprobs_last_n_honoured_or_refused(ctx):
    samp = ctx["samp"]
    full = samp.compute_logprobs(mi(PROMPT)).result(timeout=60)
    try:
        got = samp.compute_logprobs(mi(PROMPT), prompt_logprobs_last_n=3).result(timeout=60)
    except tinker.RequestFailedError as e:
        assert "prompt_logprobs_last_n" in str(e)
        return
    assert len(got) == len(PROMPT)
    assert all(x is None for x in got[:-3])
    assert worst(got[-3:], full[-3:]) <= 1e-6


def test_snapshot_samplers_do_not_grow_memory_without_bound(start_server):
    """Snapshots within one live session: the growth after the first few is bounded. Measured as
    RSS, and as the engine's allocator bytes (GET /metrics) where ASan's quarantine hides RSS."""
    from conftest import engine_mib, is_asan_build, rss_mib
    srv = start_server()
    sc = service_client(srv.base_url, KEY)
    tc = new_training_client(sc, rank=4, seed=3)
    prompt = [(11 * i) % VOCAB for i in range(1000)]
    measure = (lambda: engine_mib(srv.port, KEY)) if is_asan_build() else (lambda: rss_mib(srv.pid))
    mem = []
    for step in range(8):
        samp = resolve(tc.save_weights_and_get_sampling_client())
        sample(samp, prompt=prompt, n=16, max_tokens=4, stop=[])
        mem.append(measure())
    first = mem[1] - mem[0]  # what one more snapshot sampler costs
    later = mem[-1] - mem[2]  # five more snapshots, the earlier ones unused since
    # snapshots share the base model's slotted sampler (a host copy of the adapter each), or,
    # for large ranks, own samplers of which at most 4 stay alive: either way the growth is bounded
    print(f"memory after each snapshot (MiB): {[round(x, 2) for x in mem]}")
    assert later <= max(2 * first, 16.0), f"memory after each snapshot (MiB): {[round(x) for x in mem]}"


def test_checkpoint_sampler_with_its_base_model_named(ctx):
    """create_sampling_client(model_path=..., base_model=...) as the cookbook sends it: the
    checkpoint is loaded (its logprobs, not the base model's); a base_model other than the
    checkpoint's is refused with a 400 naming both."""
    sc, tc = ctx["sc"], ctx["tc"]
    sp = tc.save_weights_for_sampler("named-both").result(timeout=60).path
    ref = fwd_logprobs(tc, PROMPT)
    samp = resolve(sc.create_sampling_client(model_path=sp, base_model=BASE_MODEL))
    lp = samp.compute_logprobs(mi(PROMPT)).result(timeout=60)
    print(f"checkpoint sampler with base_model named: max |logprob - training forward| {worst(lp[1:], ref):.2e}")
    assert lp[0] is None and worst(lp[1:], ref) <= TOL
    st, js, _ = raw(ctx["server"].port, "GET", f"/api/v1/samplers/{samp._sampling_session_id}")
    assert st == 200 and js["model_path"] == sp and js["base_model"] == BASE_MODEL, js
    with pytest.raises(Exception) as e:
        resolve(sc.create_sampling_client(model_path=sp, base_model="Qwen/Qwen3-8B"), timeout=30)
    msg = str(e.value)
    print(msg)
    assert "Qwen/Qwen3-8B" in msg and BASE_MODEL in msg
