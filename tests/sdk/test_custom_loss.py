"""forward_backward_custom from the official SDK: the client runs a forward,
differentiates its own torch loss of the returned logprobs, and sends a
cross-entropy backward with weights -dC/dp. The server must return logprobs
the loss can be built from, accept negative weights unclamped, and keep the
reserved request order. Checked: the reported loss equals the same formula in
float64 numpy, and the step equals an explicit cross-entropy step with
weights -dC/dp computed analytically here (not by the code under test).
Also through a traced handle (ServiceClient.create_custom_loss), which runs
client-side because twinkle does not advertise server-side custom losses.
Needs torch in the SDK venv (Debian's python3-torch, seen through
--system-site-packages; see run.sh)."""
import numpy as np
import torch

from conftest import adam, counting_datum, new_training_client, service_client, twin_steps


def _data():
    return [counting_datum(s, length=9 + 2 * s) for s in range(3)]


def _loss(data, logprobs):
    """C = sum_d mean((p_d + 1)^2) + (mean p_0 - mean p_1)^2."""
    per = [((lp + 1.0) ** 2).mean() for lp in logprobs]
    cross = (logprobs[0].mean() - logprobs[1].mean()) ** 2
    total = torch.stack(per).sum() + cross
    return total, {"custom/cross:sum": float(cross.detach())}


def _loss_np(p):
    """float64 value and dC/dp of _loss."""
    m0, m1 = p[0].mean(), p[1].mean()
    value = sum(((x + 1.0) ** 2).mean() for x in p) + (m0 - m1) ** 2
    grads = [2.0 * (x + 1.0) / len(x) for x in p]
    grads[0] = grads[0] + 2.0 * (m0 - m1) / len(p[0])
    grads[1] = grads[1] - 2.0 * (m0 - m1) / len(p[1])
    return value, grads


def _probe(tc):
    out = tc.forward([counting_datum(7)], "cross_entropy").result().loss_fn_outputs[0]
    return np.array(out["logprobs"].tolist())


def _check_step(tc, tc_ce, data, res, before, label):
    p = [np.array(o["logprobs"].tolist(), dtype=np.float64) for o in
         tc_ce.forward(data, "cross_entropy").result().loss_fn_outputs]
    want, grads = _loss_np(p)
    got = res.metrics["loss:sum"]
    print(f"{label}: loss {got:.7f} vs float64 {want:.7f}; cross {res.metrics['custom/cross:sum']:.3e}")
    assert abs(got - want) <= 1e-5 * max(1.0, abs(want))
    assert "surrogate_loss:sum" in res.metrics
    a, b = twin_steps(tc, tc_ce, [-g for g in grads], data)
    moved = np.abs(a - before).max()
    print(f"{label}: step vs cross-entropy step, max |dlogprob| {np.abs(a - b).max():.2e} (moved {moved:.2e})")
    assert moved > 1e-3  # the step did something
    assert np.abs(a - b).max() <= 1e-4


def test_forward_backward_custom_callable(base_url):
    sc = service_client(base_url, "tml-custom-fn")
    tc = new_training_client(sc, seed=31)
    tc_ce = new_training_client(sc, seed=31)
    data = _data()
    before = _probe(tc)
    res = tc.forward_backward_custom(data, _loss).result()
    _check_step(tc, tc_ce, data, res, before, "callable")


def _per_datum(logprobs, weights):
    """A traced per-datum loss: the weighted squared distance of p from -1."""
    loss = (weights * (logprobs + 1.0) ** 2).sum()
    return loss, {"custom/mean_lp:mean": logprobs.mean()}


def test_forward_backward_custom_handle(base_url):
    sc = service_client(base_url, "tml-custom-handle")
    handle = sc.create_custom_loss(_per_datum, {"logprobs": 1, "weights": 1}).result()
    assert handle.loss_id is None  # twinkle runs custom losses client-side
    tc = new_training_client(sc, seed=32)
    tc_ce = new_training_client(sc, seed=32)
    data = _data()
    before = _probe(tc)
    res = tc.forward_backward_custom(data, handle).result()
    p = [np.array(o["logprobs"].tolist(), dtype=np.float64) for o in
         tc_ce.forward(data, "cross_entropy").result().loss_fn_outputs]
    w = [np.array(d.loss_fn_inputs["weights"].tolist(), dtype=np.float64) for d in data]
    want = sum((wi * (pi + 1.0) ** 2).sum() for wi, pi in zip(w, p))
    want_mean = np.mean([pi.mean() for pi in p])
    print(f"handle: loss {res.metrics['loss:sum']:.7f} vs float64 {want:.7f}, "
          f"mean_lp {res.metrics['custom/mean_lp:mean']:.6f} vs {want_mean:.6f}")
    assert abs(res.metrics["loss:sum"] - want) <= 1e-5 * max(1.0, abs(want))
    assert abs(res.metrics["custom/mean_lp:mean"] - want_mean) <= 1e-5
    a, b = twin_steps(tc, tc_ce, [-2.0 * wi * (pi + 1.0) for wi, pi in zip(w, p)], data)
    print(f"handle: step vs cross-entropy step, max |dlogprob| {np.abs(a - b).max():.2e}")
    assert np.abs(a - before).max() > 1e-3
    assert np.abs(a - b).max() <= 1e-4


def test_custom_then_builtin_keeps_order(base_url):
    """A custom step reserves two request ids; plain requests sent right after
    it must wait for both phases (the server orders by seq id)."""
    sc = service_client(base_url, "tml-custom-order")
    tc = new_training_client(sc, seed=33)
    data = _data()
    f1 = tc.forward_backward_custom(data, _loss)
    f2 = tc.optim_step(adam(1e-2))
    f3 = tc.forward(data, "cross_entropy")
    r1, _, r3 = f1.result(), f2.result(), f3.result()
    p = [np.array(o["logprobs"].tolist()) for o in r3.loss_fn_outputs]
    before, _ = _loss_np([np.array(o["logprobs"].tolist()) for o in r1.loss_fn_outputs])
    after, _ = _loss_np(p)
    print(f"order: custom loss {before:.4f} -> {after:.4f} after the queued step")
    assert after < before
