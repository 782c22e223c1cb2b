"""twinkle's preference losses over the Tinker wire: loss_fn "dpo" (sigmoid)
and "ipo" on pairs of datums (2i chosen, 2i+1 rejected) with per-token
"ref_logprobs". The value matches numpy's formula on the returned logprobs, a
step equals the cross-entropy step with weights -dL/dp, training raises the
margin, and bad input is refused with a message naming the field."""
import numpy as np
import pytest
from tinker import types

from conftest import adam, counting_datum, make_datum, new_training_client, service_client, twin_steps


def _pairs():
    """Chosen: counting continuations; rejected: the same prompts, scrambled targets."""
    rng = np.random.default_rng(11)
    out = []
    for s in range(3):
        c = counting_datum(s, length=12)
        toks = c.model_input.to_ints()
        bad = rng.integers(100, 132, size=len(toks)).tolist()
        w = [0.0] * 4 + [1.0] * (len(toks) - 4)  # the first 4 positions are "prompt"
        out.append(make_datum(toks, c.loss_fn_inputs["target_tokens"].tolist(), w))
        out.append(make_datum(toks, bad, w))
    return out


def _with_ref(data, refs):
    return [types.Datum(model_input=d.model_input, loss_fn_inputs={
        "target_tokens": d.loss_fn_inputs["target_tokens"], "weights": d.loss_fn_inputs["weights"],
        "ref_logprobs": r.astype(np.float32)}) for d, r in zip(data, refs)]  # an ndarray: the SDK types only its own keys


def _ref_loss(p, ref, w, beta, ipo):
    """float64 loss and dL/dp per datum."""
    loss, grads = 0.0, []
    for i in range(0, len(p), 2):
        h = (w[i] * (p[i] - ref[i])).sum() - (w[i + 1] * (p[i + 1] - ref[i + 1])).sum()
        if ipo:
            loss += (h - 1 / (2 * beta)) ** 2
            dh = 2 * (h - 1 / (2 * beta))
        else:
            loss += np.logaddexp(0.0, -beta * h)
            dh = -beta / (1 + np.exp(beta * h))
        grads += [dh * w[i], -dh * w[i + 1]]
    return loss, grads


@pytest.mark.parametrize("loss", ["dpo", "ipo"])
def test_preference_loss_value_and_step(base_url, loss):
    sc = service_client(base_url, "tml-pref-" + loss)
    tc = new_training_client(sc, seed=21)
    tc_ce = new_training_client(sc, seed=21)
    data = _pairs()
    p = [np.array(o["logprobs"].tolist()) for o in tc.forward(data, "cross_entropy").result().loss_fn_outputs]
    rng = np.random.default_rng(5)
    refs = [x - 0.3 * rng.standard_normal(len(x)) for x in p]
    w = [np.array(d.loss_fn_inputs["weights"].tolist()) for d in data]
    beta = 0.5
    res = tc.forward_backward(_with_ref(data, refs), loss, loss_fn_config={"beta": beta}).result()
    refs64 = [r.astype(np.float32).astype(np.float64) for r in refs]
    want, grads = _ref_loss(p, refs64, w, beta, loss == "ipo")
    got = res.metrics["loss:sum"]
    print(f"{loss}: loss {got:.6f} vs float64 {want:.6f}")
    assert abs(got - want) <= 1e-4 * max(1.0, abs(want))
    assert res.metrics["pairs:sum"] == 3
    a, b = twin_steps(tc, tc_ce, [-g for g in grads], data)
    print(f"{loss}: step vs cross-entropy step, max |dlogprob| {np.abs(a - b).max():.2e}")
    assert np.abs(a - b).max() <= 1e-4


def test_dpo_training_raises_the_margin(base_url):
    sc = service_client(base_url, "tml-pref-train")
    tc = new_training_client(sc, seed=3)
    data = _pairs()
    ref = [np.array(o["logprobs"].tolist()) for o in tc.forward(data, "cross_entropy").result().loss_fn_outputs]
    batch = _with_ref(data, ref)
    margins = []
    for _ in range(8):
        res = tc.forward_backward(batch, "dpo", loss_fn_config={"beta": 0.1}).result()
        margins.append(res.metrics["margin:mean"])
        tc.optim_step(adam(2e-2)).result()
    final = tc.forward(batch, "dpo", loss_fn_config={"beta": 0.1}).result().metrics
    print("dpo margins:", [round(m, 3) for m in margins], "final", final["margin:mean"], "acc", final["accuracy:mean"])
    assert abs(margins[0]) <= 1e-4  # the policy starts at the reference
    assert final["margin:mean"] > 1.0 and final["accuracy:mean"] == 1.0


def test_server_computes_the_reference(base_url):
    """Without ref_logprobs the reference is the base model (the adapter off):
    after training, the value equals the one with ref_logprobs from a fresh
    adapter (B = 0, so exactly the base model), and the adapter is unchanged."""
    sc = service_client(base_url, "tml-pref-ref")
    tc = new_training_client(sc, seed=8)
    fresh = new_training_client(sc, seed=99)
    data = _pairs()
    tc.forward_backward(data, "cross_entropy").result()
    tc.optim_step(adam(2e-2)).result()
    before = np.array(tc.forward(data[:1], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].tolist())
    base = [np.array(o["logprobs"].tolist()) for o in fresh.forward(data, "cross_entropy").result().loss_fn_outputs]
    implicit = tc.forward(data, "dpo", loss_fn_config={"beta": 0.3}).result().metrics
    explicit = tc.forward(_with_ref(data, base), "dpo", loss_fn_config={"beta": 0.3}).result().metrics
    after = np.array(tc.forward(data[:1], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].tolist())
    print("server reference: margin", implicit["margin:mean"], "vs", explicit["margin:mean"])
    assert abs(implicit["margin:mean"]) > 1e-3  # the adapter moved the policy off the base
    assert abs(implicit["loss:sum"] - explicit["loss:sum"]) <= 1e-5 * max(1.0, abs(explicit["loss:sum"]))
    assert abs(implicit["margin:mean"] - explicit["margin:mean"]) <= 1e-4
    assert np.abs(before - after).max() == 0.0


def test_preference_bad_input(base_url):
    import tinker
    sc = service_client(base_url, "tml-pref-bad")
    tc = new_training_client(sc)
    data = _pairs()
    ref = [np.zeros(len(d.loss_fn_inputs["target_tokens"].tolist())) for d in data]
    mixed = _with_ref(data, ref)[:2] + data[2:]
    with pytest.raises(tinker.RequestFailedError) as err:  # ref_logprobs on some datums only
        tc.forward_backward(mixed, "dpo").result()
    assert "ref_logprobs" in str(err.value)
    with pytest.raises(tinker.RequestFailedError) as err:  # an odd count
        tc.forward_backward(_with_ref(data, ref)[:3], "dpo").result()
    assert "pairs" in str(err.value)
    with pytest.raises(tinker.RequestFailedError) as err:  # beta must be positive
        tc.forward_backward(_with_ref(data, ref), "dpo", loss_fn_config={"beta": -1.0}).result()
    assert "beta" in str(err.value)
    tc.forward_backward(_with_ref(data, ref), "dpo").result()  # the client still works
