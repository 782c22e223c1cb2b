"""Tinker's RL losses through the SDK (importance_sampling, ppo, cispo, dro):
loss:sum equals the formula (tinker-wire.md §10) evaluated with numpy on the
returned logprobs, and a step with the RL loss moves the adapter exactly as a
cross-entropy step whose weights are -dL/dp (computed on the client)."""
import numpy as np
import pytest
from tinker import types

from conftest import adam, counting_datum, new_training_client, service_client


def _data(tc, shift, seed):
    rng = np.random.default_rng(seed)
    base = [counting_datum(d) for d in range(3)]
    p = [np.array(o["logprobs"].tolist()) for o in tc.forward(base, "cross_entropy").result().loss_fn_outputs]
    out = []
    for d, pd in zip(base, p):
        n = len(pd)
        q = pd - shift * rng.standard_normal(n)  # ratios on both sides of the clip bounds
        a = rng.standard_normal(n)
        out.append((d, q.astype(np.float32), a.astype(np.float32)))
    return out, p


def _rl_datum(d, q, a):
    return types.Datum(model_input=d.model_input, loss_fn_inputs={
        "target_tokens": d.loss_fn_inputs["target_tokens"], "logprobs": q.tolist(), "advantages": a.tolist()})


def _ref(loss, p, q, a, lo, hi, beta):
    r = np.exp(p - q)
    if loss == "importance_sampling":
        return -(r * a).sum(), -r * a
    if loss == "ppo":
        rc = np.clip(r, lo, hi)
        unclipped = r * a <= rc * a
        return -np.minimum(r * a, rc * a).sum(), np.where(unclipped, -r * a, 0.0)
    if loss == "cispo":
        rc = np.clip(r, lo, hi)
        return -(rc * p * a).sum(), -rc * a
    return -(p * a - 0.5 * beta * (p - q) ** 2).sum(), -(a - beta * (p - q))


@pytest.mark.parametrize("loss,lo,hi", [("importance_sampling", 0, 0), ("ppo", 0.8, 1.2), ("cispo", 0.0, 4.0),
                                        ("dro", 0, 0)])
def test_rl_loss_value_and_step(base_url, loss, lo, hi):
    sc = service_client(base_url, "tml-rl-" + loss)
    tc_rl = new_training_client(sc, seed=5)
    tc_ce = new_training_client(sc, seed=5)
    data, p = _data(tc_rl, 0.4, 3)
    beta = 0.05
    config = {"beta": beta} if loss == "dro" else None
    res = tc_rl.forward_backward([_rl_datum(*x) for x in data], loss, loss_fn_config=config).result()
    ref_loss, weights = 0.0, []
    for (d, q, a), pd in zip(data, p):
        l, g = _ref(loss, pd, q.astype(np.float64), a.astype(np.float64), lo, hi, beta)
        ref_loss += l
        weights.append(-g)
    assert abs(res.metrics["loss:sum"] - ref_loss) <= 1e-4 * max(1.0, abs(ref_loss))
    got_p = [np.array(o["logprobs"].tolist()) for o in res.loss_fn_outputs]
    assert max(np.abs(x - y).max() for x, y in zip(got_p, p)) <= 1e-6
    # the same step as cross-entropy with weights -dL/dp
    ce = [types.Datum(model_input=d.model_input, loss_fn_inputs={
        "target_tokens": d.loss_fn_inputs["target_tokens"], "weights": w.astype(np.float32).tolist()})
        for (d, _, _), w in zip(data, weights)]
    tc_ce.forward_backward(ce, "cross_entropy").result()
    tc_rl.optim_step(adam(1e-2)).result()
    tc_ce.optim_step(adam(1e-2)).result()
    probe = [counting_datum(7)]
    a_lp = np.array(tc_rl.forward(probe, "cross_entropy").result().loss_fn_outputs[0]["logprobs"].tolist())
    b_lp = np.array(tc_ce.forward(probe, "cross_entropy").result().loss_fn_outputs[0]["logprobs"].tolist())
    assert np.abs(a_lp - b_lp).max() <= 1e-4


def test_rl_loss_needs_its_inputs(base_url):
    import tinker
    sc = service_client(base_url, "tml-rl-bad")
    tc = new_training_client(sc)
    d = counting_datum(1)
    bad = types.Datum(model_input=d.model_input, loss_fn_inputs={"target_tokens": d.loss_fn_inputs["target_tokens"]})
    with pytest.raises(tinker.RequestFailedError) as err:
        tc.forward_backward([bad], "ppo").result()
    assert "logprobs" in str(err.value)
    tc.forward_backward([d], "cross_entropy").result()  # the client still works


def test_top_k_cross_entropy(base_url):
    """(N, K) target_tokens + weights: loss = -sum_i sum_k w_ik log p(t_ik); the logprobs
    come back (N, K) and equal the 1-D forward's for each column."""
    sc = service_client(base_url, "tml-topk")
    tc = new_training_client(sc, seed=9)
    rng = np.random.default_rng(4)
    d = counting_datum(2)
    n = len(d.loss_fn_inputs["target_tokens"].data)
    K = 3
    targets = rng.integers(0, 512, size=(n, K)).astype(np.int64)
    weights = rng.random((n, K)).astype(np.float32)
    cols = []
    for k in range(K):
        dk = types.Datum(model_input=d.model_input, loss_fn_inputs={
            "target_tokens": targets[:, k].tolist(), "weights": weights[:, k].tolist()})
        cols.append(np.array(tc.forward([dk], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].tolist()))
    ref = np.stack(cols, axis=1)
    d2 = types.Datum(model_input=d.model_input, loss_fn_inputs={
        "target_tokens": types.TensorData.from_numpy(targets), "weights": types.TensorData.from_numpy(weights)})
    res = tc.forward_backward([d2], "cross_entropy").result()
    got = res.loss_fn_outputs[0]["logprobs"].to_numpy()
    assert got.shape == (n, K)
    assert np.abs(got - ref).max() <= 1e-5
    assert abs(res.metrics["loss:sum"] - float(-(weights * ref).sum())) <= 1e-4 * max(1.0, abs(float((weights * ref).sum())))


@pytest.mark.parametrize("loss", ["grpo", "dapo", "dr_grpo"])
def test_grpo_family_aggregation(base_url, loss):
    """ppo's clipped surrogate aggregated over tokens: grpo = mean over sequences of
    each sequence's token mean; dapo = mean over all masked tokens (clip 0.8 / 1.28);
    dr_grpo = mean over sequences of token sums / max_tokens. A "weights" mask
    excludes prompt tokens from the counts. Checked against numpy, and the step
    against a cross-entropy step with weights -dL/dp."""
    sc = service_client(base_url, "tml-agg-" + loss)
    tc = new_training_client(sc, seed=12)
    tc_ce = new_training_client(sc, seed=12)
    data, p = _data(tc, 0.3, 8)
    masks = [np.array([0.0] * (2 + i) + [1.0] * (len(pd) - 2 - i)) for i, pd in enumerate(p)]
    hi = 1.28 if loss == "dapo" else 1.2
    config = {"max_tokens": 20.0} if loss == "dr_grpo" else None
    sent = [types.Datum(model_input=d.model_input, loss_fn_inputs={
        "target_tokens": d.loss_fn_inputs["target_tokens"], "logprobs": q.tolist(), "advantages": a.tolist(),
        "weights": m.astype(np.float32).tolist()}) for (d, q, a), m in zip(data, masks)]
    res = tc.forward_backward(sent, loss, loss_fn_config=config).result()
    total_masked = sum(m.sum() for m in masks)
    want, weights = 0.0, []
    for (d, q, a), pd, m in zip(data, p, masks):
        c = {"grpo": 1 / (len(data) * m.sum()), "dapo": 1 / total_masked, "dr_grpo": 1 / (len(data) * 20.0)}[loss]
        a_scaled = (a.astype(np.float32) * np.float32(c)).astype(np.float64) * m
        l, g = _ref("ppo", pd, q.astype(np.float64), a_scaled, 0.8, hi, 0)
        want += l
        weights.append(-g)
    got = res.metrics["loss:sum"]
    print(f"{loss}: loss {got:.7f} vs numpy {want:.7f}")
    assert abs(got - want) <= 1e-5 * max(1.0, abs(want))
    ce = [types.Datum(model_input=d.model_input, loss_fn_inputs={
        "target_tokens": d.loss_fn_inputs["target_tokens"], "weights": w.astype(np.float32).tolist()})
        for (d, _, _), w in zip(data, weights)]
    tc_ce.forward_backward(ce, "cross_entropy").result()
    tc.optim_step(adam(1e-2)).result()
    tc_ce.optim_step(adam(1e-2)).result()
    probe = [counting_datum(7)]
    a_lp = np.array(tc.forward(probe, "cross_entropy").result().loss_fn_outputs[0]["logprobs"].tolist())
    b_lp = np.array(tc_ce.forward(probe, "cross_entropy").result().loss_fn_outputs[0]["logprobs"].tolist())
    assert np.abs(a_lp - b_lp).max() <= 1e-4
