"""loss_fn="stable_reinforce" through the SDK: sample with record_stability_info=True,
train on the recorded sequences named by Datum.with_provenance (as the cookbook's RL
loop builds them). The value equals the float64 objective
L = -sum_t sg(min(r_t, C)) A_t p_t over the sampled tokens, r_t = exp(p_t - q_t) with q
the sampler's recorded logprob and C = clip_high_threshold; the step equals a
cross-entropy step with weights min(r, C) A. Sequences from another session, unknown
or expired ones, and advantages on prompt tokens are refused naming the problem."""
import time

import numpy as np
import pytest
import tinker
from tinker import types

from conftest import adam, counting_datum, new_training_client, service_client, twin_steps

PROMPT = [100, 101, 102, 103, 104]


def _resolve(x):
    return x.result(timeout=60) if hasattr(x, "result") else x


def _sample(tc, n=3, max_tokens=6):
    samp = _resolve(tc.save_weights_and_get_sampling_client(record_stability_info=True))
    params = types.SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=11, stop=[])
    res = samp.sample(types.ModelInput.from_ints(PROMPT), n, params).result(timeout=60)
    return res.sequences


def _datum(seq, adv):
    """The cookbook's layout (recipes/rl_loop.py): prompt + all but the last sampled
    token in, targets shifted by one, logprobs / advantages padded on the prompt."""
    toks, lps = list(seq.tokens), list(seq.logprobs)
    ob = len(PROMPT) - 1
    d = types.Datum(
        model_input=types.ModelInput.from_ints(PROMPT + toks[:-1]),
        loss_fn_inputs={"target_tokens": PROMPT[1:] + toks, "logprobs": [0.0] * ob + lps,
                        "advantages": [0.0] * ob + [adv] * len(toks)})
    sid = seq.sequence_id
    return d.with_provenance(
        model_input=[types.PromptProvenanceSpan(sequence_id=sid, length=len(PROMPT)),
                     types.SampledProvenanceSpan(sequence_id=sid, length=len(toks) - 1)],
        loss_fn_inputs=[types.PromptProvenanceSpan(sequence_id=sid, offset=1, length=len(PROMPT) - 1),
                        types.SampledProvenanceSpan(sequence_id=sid, length=len(toks))])


def test_value_and_step_equal_float64_reference(base_url):
    sc = service_client(base_url, "tml-stable")
    tc = new_training_client(sc, seed=21)
    tc_ce = new_training_client(sc, seed=21)
    seqs = _sample(tc)
    assert all(s.sequence_id for s in seqs)
    # move both policies away from the sampler's, the same way: ratios != 1
    for c in (tc, tc_ce):
        c.forward_backward([counting_datum(1)], "cross_entropy").result()
        c.optim_step(adam(2e-2)).result()
    advs = [1.0, -0.5, 0.75]
    data = [_datum(s, a) for s, a in zip(seqs, advs)]
    ob = len(PROMPT) - 1
    plain = [types.Datum(model_input=d.model_input, loss_fn_inputs={"target_tokens": d.loss_fn_inputs["target_tokens"]})
             for d in data]
    p = [np.array(o["logprobs"].tolist())[ob:] for o in tc.forward(plain, "cross_entropy").result().loss_fn_outputs]
    q = [np.asarray(s.logprobs, dtype=np.float32).astype(np.float64) for s in seqs]
    ratios = np.concatenate([np.exp(pi - qi) for pi, qi in zip(p, q)])
    C = float(np.median(ratios))  # truncation on both sides of some tokens
    res = tc.forward_backward(data, "stable_reinforce", loss_fn_config={"clip_high_threshold": C}).result()
    want, weights, clipped = 0.0, [], 0
    for pi, qi, a in zip(p, q, advs):
        r = np.exp(pi - qi)
        rc = np.minimum(r, C)
        clipped += int((r > C).sum())
        want += -(rc * a * pi).sum()
        weights.append(np.concatenate([np.zeros(ob), rc * a]))  # -dL/dp
    got = res.metrics["loss:sum"]
    print(f"stable_reinforce: loss {got:.7f} vs float64 {want:.7f} (C = {C:.4f}, {clipped}/{ratios.size} truncated, "
          f"clip_fraction {res.metrics['clip_fraction:mean']:.3f})")
    assert 0 < clipped < ratios.size
    assert abs(res.metrics["clip_fraction:mean"] * res.metrics["num_tokens:sum"] - clipped) < 1e-6
    assert abs(got - want) <= 1e-5 * max(1.0, abs(want))
    a, b = twin_steps(tc, tc_ce, weights, data)
    diff = np.abs(a - b).max()
    print(f"stable_reinforce: step vs cross-entropy step with weights min(r, C) A, max |dlogprob| {diff:.2e}")
    assert diff <= 1e-4


def test_refusals_name_the_problem(base_url):
    sc = service_client(base_url, "tml-stable-bad")
    tc = new_training_client(sc, seed=22)
    seqs = _sample(tc, n=1)
    good = _datum(seqs[0], 1.0)

    def fails(datum, *words, client=tc):
        with pytest.raises(tinker.RequestFailedError) as e:
            client.forward_backward([datum], "stable_reinforce").result(timeout=30)
        msg = str(e.value)
        print(msg)
        for w in words:
            assert w in msg, (w, msg)

    # another session (same tenant): its own training client cannot name the sequence
    other = new_training_client(service_client(base_url, "tml-stable-bad"), seed=22)
    fails(good, seqs[0].sequence_id, "own session", client=other)
    # no provenance, an unknown sequence, advantages on a prompt token, a wrong token
    plain = types.Datum(model_input=good.model_input, loss_fn_inputs=good.loss_fn_inputs)
    fails(plain, "loss_fn_input_spans")
    bad_id = good.with_provenance(
        model_input=good.model_input_spans,
        loss_fn_inputs=[types.PromptProvenanceSpan(sequence_id="req-nope:0", offset=1, length=len(PROMPT) - 1),
                        types.SampledProvenanceSpan(sequence_id="req-nope:0", length=len(seqs[0].tokens))])
    fails(bad_id, "req-nope:0", "record_stability_info")
    adv = np.asarray(good.loss_fn_inputs["advantages"].tolist(), dtype=np.float32)
    adv[0] = 1.0
    on_prompt = types.Datum(model_input=good.model_input,
                            loss_fn_inputs={**good.loss_fn_inputs, "advantages": adv.tolist()}).with_provenance(
        model_input=good.model_input_spans, loss_fn_inputs=good.loss_fn_input_spans)
    fails(on_prompt, "advantages", "prompt")
    tgt = np.asarray(good.loss_fn_inputs["target_tokens"].tolist())
    tgt[-1] = (tgt[-1] + 1) % 512
    wrong = types.Datum(model_input=good.model_input,
                        loss_fn_inputs={**good.loss_fn_inputs, "target_tokens": tgt.tolist()}).with_provenance(
        model_input=good.model_input_spans, loss_fn_inputs=good.loss_fn_input_spans)
    fails(wrong, "token", seqs[0].sequence_id)
    tc.forward_backward([good], "stable_reinforce").result(timeout=30)  # the good datum still trains
    other_seqs = _sample(other, n=1)
    fails(_datum(other_seqs[0], 1.0), "own session")  # and the other session's sequences are not ours


def test_expired_sequence_refused(start_server):
    srv = start_server("--stability-ttl", "1")
    sc = service_client(srv.base_url, "tml-stable-ttl")
    tc = new_training_client(sc, seed=23)
    seqs = _sample(tc, n=1)
    time.sleep(2.5)  # past the 1 s the server keeps an unused sequence
    with pytest.raises(tinker.RequestFailedError) as e:
        tc.forward_backward([_datum(seqs[0], 1.0)], "stable_reinforce").result(timeout=30)
    print(e.value)
    assert "expired" in str(e.value) and seqs[0].sequence_id in str(e.value)
