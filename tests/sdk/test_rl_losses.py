"""Tinker's RL losses through the SDK (importance_sampling, ppo, cispo, dro):
loss:sum equals the formula (docs/wire.md, "Loss functions") evaluated with numpy on the
returned logprobs, and a step with the RL loss moves the adapter exactly as a
cross-entropy step whose weights are -dL/dp (computed on the client)."""
import numpy as np
import pytest
from tinker import types

from conftest import adam, counting_datum, new_training_client, service_client, twin_steps


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



def _step_equals_ce(tc, tc_ce, data, weights):
    a, b = twin_steps(tc, tc_ce, weights, data)
    return np.abs(a - b).max()

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
    assert _step_equals_ce(tc_rl, tc_ce, [d for d, _, _ in data], weights) <= 1e-4


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
    assert _step_equals_ce(tc, tc_ce, [d for d, _, _ in data], weights) <= 1e-4


@pytest.mark.parametrize("mask_by", ["weights", "sequence_ratio_mask", "both"])
def test_gspo_sequence_ratio(base_url, mask_by):
    """gspo: s_i = exp(mean over the sequence's masked tokens of p - q), one
    advantage per sequence, -min(s A, clip(s, lo, hi) A) averaged over
    sequences; bounds from loss_fn_config. Some sequences clip, some do not.
    The mask is `sequence_ratio_mask` when given (with weights all 1 in "both"),
    else `weights`; prompt positions carry sampler logprob 0 (as the cookbook
    pads them), so a mask that were ignored would change the ratio."""
    sc = service_client(base_url, "tml-gspo-" + mask_by)
    tc = new_training_client(sc, seed=14)
    tc_ce = new_training_client(sc, seed=14)
    base = [counting_datum(d, length=10 + d) for d in range(4)]
    p = [np.array(o["logprobs"].tolist()) for o in tc.forward(base, "cross_entropy").result().loss_fn_outputs]
    shifts, advs = [0.05, -0.05, 0.001, -0.08], [1.0, 1.0, -0.5, -1.0]  # ratios e^-0.05.. on both sides
    masks = [np.array([0.0] * 3 + [1.0] * (len(pd) - 3)) for pd in p]
    qs = [np.where(m > 0, pd - s, 0.0).astype(np.float32) for pd, s, m in zip(p, shifts, masks)]

    def inputs(d, q, a, m):
        x = {"target_tokens": d.loss_fn_inputs["target_tokens"], "logprobs": q.tolist(), "advantages": [a] * len(q)}
        if mask_by != "sequence_ratio_mask":
            x["weights"] = (m if mask_by == "weights" else np.ones_like(m)).astype(np.float32).tolist()
        if mask_by != "weights":
            x["sequence_ratio_mask"] = np.asarray(m, dtype=np.float32)  # not typed by the SDK: a numpy array
        return x

    sent = [types.Datum(model_input=d.model_input, loss_fn_inputs=inputs(d, q, a, m))
            for d, q, a, m in zip(base, qs, advs, masks)]
    lo, hi = 0.97, 1.02
    res = tc.forward_backward(sent, "gspo", loss_fn_config={"clip_low_threshold": lo, "clip_high_threshold": hi}).result()
    want, weights, clipped = 0.0, [], 0
    n = len(base)
    for pd, q, a, m in zip(p, qs, advs, masks):
        s = np.exp(((pd - q.astype(np.float64)) * m).sum() / m.sum())
        sc_ = np.clip(s, lo, hi)
        if s * a <= sc_ * a:
            want += -s * a / n
            weights.append(s * a * m / (m.sum() * n))  # -dL/dp
        else:
            want += -sc_ * a / n
            weights.append(np.zeros_like(pd))
            clipped += 1
    got = res.metrics["loss:sum"]
    print(f"gspo ({mask_by}): loss {got:.7f} vs numpy {want:.7f}, ratio mean {res.metrics['ratio:mean']:.4f}, "
          f"clipped {res.metrics['clip_fraction:mean']:.2f} (numpy {clipped / n:.2f})")
    assert 0 < clipped < n
    assert abs(got - want) <= 1e-5 * max(1.0, abs(want))
    assert abs(res.metrics["clip_fraction:mean"] - clipped / n) < 1e-9
    diff = _step_equals_ce(tc, tc_ce, base, weights)
    print(f"gspo: step vs cross-entropy step, max |dlogprob| {diff:.2e}")
    assert diff <= 1e-4


@pytest.mark.parametrize("given_ref", [True, False])
def test_grpo_kl_penalty(base_url, given_ref):
    """grpo with loss_fn_config kl_beta: + kl_beta * sum_t c_t k3(p_t, ref_t), c_t the
    grpo token weighting, k3 = exp(r - p) - (r - p) - 1. The reference is the
    per-datum ref_logprobs, or the base model (adapter off) when none are sent."""
    sc = service_client(base_url, "tml-grpo-kl-%d" % given_ref)
    tc = new_training_client(sc, seed=15)
    tc_ce = new_training_client(sc, seed=15)
    base = [counting_datum(d, length=12) for d in range(3)]
    # move the adapter off the base model first, so the server's reference differs from p
    tc.forward_backward(base, "cross_entropy").result()
    tc.optim_step(adam(2e-2)).result()
    tc_ce.forward_backward(base, "cross_entropy").result()
    tc_ce.optim_step(adam(2e-2)).result()
    p = [np.array(o["logprobs"].tolist()) for o in tc.forward(base, "cross_entropy").result().loss_fn_outputs]
    fresh = new_training_client(sc, seed=99)  # B = 0: exactly the base model
    base_lp = [np.array(o["logprobs"].tolist()) for o in fresh.forward(base, "cross_entropy").result().loss_fn_outputs]
    rng = np.random.default_rng(4)
    refs = [(pd - 0.2 * rng.standard_normal(len(pd))).astype(np.float32) for pd in p] if given_ref else \
        [b.astype(np.float32) for b in base_lp]
    advs = [rng.standard_normal(len(pd)).astype(np.float32) for pd in p]
    qs = [(pd - 0.1 * rng.standard_normal(len(pd))).astype(np.float32) for pd in p]
    kl_beta = 0.7
    sent = []
    for d, q, a, r in zip(base, qs, advs, refs):
        inputs = {"target_tokens": d.loss_fn_inputs["target_tokens"], "logprobs": q.tolist(), "advantages": a.tolist()}
        if given_ref:
            inputs["ref_logprobs"] = r  # an ndarray: the SDK types only its own keys
        sent.append(types.Datum(model_input=d.model_input, loss_fn_inputs=inputs))
    res = tc.forward_backward(sent, "grpo", loss_fn_config={"kl_beta": kl_beta}).result()
    want, weights, kls = 0.0, [], []
    for pd, q, a, r in zip(p, qs, advs, refs):
        c = 1.0 / (len(base) * len(pd))
        l, g = _ref("ppo", pd, q.astype(np.float64), (a * np.float32(c)).astype(np.float64), 0.8, 1.2, 0)
        d = r.astype(np.float64) - pd
        k3 = np.exp(d) - d - 1
        want += l + kl_beta * c * k3.sum()
        weights.append(-(g + kl_beta * c * (1 - np.exp(d))))
        kls.append(k3)
    kl_mean = np.concatenate(kls).mean()
    got = res.metrics["loss:sum"]
    print(f"grpo+kl ({'ref_logprobs' if given_ref else 'base model'}): loss {got:.7f} vs numpy {want:.7f}, "
          f"kl {res.metrics['kl:mean']:.5f} vs {kl_mean:.5f}")
    assert kl_mean > 1e-3
    assert abs(got - want) <= 1e-5 * max(1.0, abs(want))
    assert abs(res.metrics["kl:mean"] - kl_mean) <= 1e-4 * max(1.0, kl_mean)
    diff = _step_equals_ce(tc, tc_ce, base, weights)
    print(f"grpo+kl: step vs cross-entropy step, max |dlogprob| {diff:.2e}")
    assert diff <= 1e-4


def test_kl_beta_refused_where_it_means_nothing(base_url):
    import tinker
    sc = service_client(base_url, "tml-kl-bad")
    tc = new_training_client(sc)
    with pytest.raises(tinker.RequestFailedError) as err:
        tc.forward_backward([counting_datum(0)], "cross_entropy", loss_fn_config={"kl_beta": 0.1}).result()
    assert "kl_beta" in str(err.value)
    d = counting_datum(0)
    rl = types.Datum(model_input=d.model_input, loss_fn_inputs={
        "target_tokens": d.loss_fn_inputs["target_tokens"], "logprobs": [-1.0] * 16, "advantages": [1.0] * 16})
    with pytest.raises(tinker.RequestFailedError) as err:
        tc.forward_backward([rl], "grpo", loss_fn_config={"kl_beta": -1.0}).result()
    assert "kl_beta" in str(err.value)
    tc.forward_backward([rl], "grpo", loss_fn_config={"kl_beta": 0.1}).result()  # still serving


def test_unread_input_key_refused(base_url):
    """A loss_fn_inputs key the chosen loss does not read is a user error naming
    the key and the keys that loss reads (the registry's), never ignored."""
    import tinker

    sc = service_client(base_url, "tml-unread")
    tc = new_training_client(sc, seed=3)
    d = counting_datum(0)
    n = len(d.loss_fn_inputs["target_tokens"].tolist())
    bad = types.Datum(model_input=d.model_input, loss_fn_inputs={
        "target_tokens": d.loss_fn_inputs["target_tokens"], "logprobs": [-1.0] * n, "advantages": [1.0] * n,
        "mask": np.ones(n, dtype=np.float32)})
    with pytest.raises(tinker.RequestFailedError) as err:
        tc.forward_backward([bad], "importance_sampling").result()
    msg = str(err.value)
    print(msg)
    assert "mask" in msg and "importance_sampling" in msg and "advantages" in msg and "weights" in msg
    gspo_only = types.Datum(model_input=d.model_input, loss_fn_inputs={
        "target_tokens": d.loss_fn_inputs["target_tokens"], "sequence_ratio_mask": np.ones(n, dtype=np.float32)})
    with pytest.raises(tinker.RequestFailedError) as err:
        tc.forward_backward([gspo_only], "cross_entropy").result()
    assert "sequence_ratio_mask" in str(err.value)
    tc.forward_backward([d], "cross_entropy").result()  # the client still works
