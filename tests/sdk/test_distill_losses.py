"""twinkle's distillation losses over the Tinker wire: loss_fn "forward_kl",
"reverse_kl" and "jsd" (beta) against a teacher's top-K: (N, K) target_tokens
and (N, K) "teacher_logprobs", both renormalized over the K tokens, with an
optional per-token "weights" mask. The value matches float64 numpy on the
returned (N, K) logprobs, a step equals the top-K cross-entropy step with
weights -dL/dp, distilling a counting teacher drives the loss down, and bad
input is refused naming the field."""
import numpy as np
import pytest
from tinker import types

from conftest import adam, counting_datum, counting_teacher, new_training_client, service_client

K = 4


def _topk_data(seed, n_datums=3):
    """Datums whose (N, K) targets hold the true next token and K-1 random ones."""
    rng = np.random.default_rng(seed)
    out = []
    for s in range(n_datums):
        d = counting_datum(s, length=10)
        true = np.array(d.loss_fn_inputs["target_tokens"].tolist())
        t = np.concatenate([true[:, None], rng.integers(100, 132, size=(len(true), K - 1))], axis=1)
        mask = np.array([0.0, 0.0] + [1.0] * (len(true) - 2), dtype=np.float32)
        out.append((d.model_input, t.astype(np.int64), mask))
    return out


def _datums(data, teacher):
    return [types.Datum(model_input=mi, loss_fn_inputs={"target_tokens": t, "weights": m, "teacher_logprobs":
                                                       tl.astype(np.float32)}) for (mi, t, m), tl in zip(data, teacher)]


def _student_lp(tc, data):
    ce = [types.Datum(model_input=mi, loss_fn_inputs={"target_tokens": t}) for mi, t, _ in data]
    return [np.array(o["logprobs"].tolist()).reshape(-1, K) for o in tc.forward(ce, "cross_entropy").result().loss_fn_outputs]


def _ref(kind, p, t, w, beta):
    a = p - np.log(np.exp(p).sum(1, keepdims=True))
    b = t - np.log(np.exp(t).sum(1, keepdims=True))
    s, q = np.exp(a), np.exp(b)
    if kind == "forward_kl":
        per, g = (q * (b - a)).sum(1), -q
    elif kind == "reverse_kl":
        per, g = (s * (a - b)).sum(1), s * (a - b + 1)
    else:
        lm = np.log(beta * q + (1 - beta) * s)
        per, g = (beta * q * (b - lm) + (1 - beta) * s * (a - lm)).sum(1), (1 - beta) * s * (a - lm)
    grad = g - s * g.sum(1, keepdims=True)
    return (w * per).sum(), w[:, None] * grad


@pytest.mark.parametrize("kind", ["forward_kl", "reverse_kl", "jsd"])
def test_distill_loss_value_and_step(base_url, kind):
    sc = service_client(base_url, "tml-distill-" + kind)
    tc = new_training_client(sc, seed=31)
    tc_ce = new_training_client(sc, seed=31)
    data = _topk_data(1)
    rng = np.random.default_rng(2)
    teacher = [-2.0 * rng.random((len(t), K)) for _, t, _ in data]
    p = _student_lp(tc, data)
    beta = 0.3
    res = tc.forward_backward(_datums(data, teacher), kind, loss_fn_config={"beta": beta}).result()
    want, grads = 0.0, []
    for (_, _, m), pd, tl in zip(data, p, teacher):
        l, g = _ref(kind, pd, tl.astype(np.float32).astype(np.float64), m.astype(np.float64), beta)
        want += l
        grads.append(g)
    got = res.metrics["loss:sum"]
    print(f"{kind}: loss {got:.7f} vs float64 {want:.7f}")
    assert abs(got - want) <= 1e-5 * max(1.0, abs(want))
    back = [np.array(o["logprobs"].tolist()).reshape(-1, K) for o in res.loss_fn_outputs]
    assert max(np.abs(x - y).max() for x, y in zip(back, p)) <= 1e-6
    ce = [types.Datum(model_input=mi, loss_fn_inputs={"target_tokens": t, "weights": (-g).astype(np.float32)})
          for (mi, t, _), g in zip(data, grads)]
    tc_ce.forward_backward(ce, "cross_entropy").result()
    tc.optim_step(adam(1e-2)).result()
    tc_ce.optim_step(adam(1e-2)).result()
    a, b = _student_lp(tc, data[:1])[0], _student_lp(tc_ce, data[:1])[0]
    print(f"{kind}: step vs top-K cross-entropy step, max |dlogprob| {np.abs(a - b).max():.2e}")
    assert np.abs(a - b).max() <= 1e-4


def test_distilling_a_teacher_lowers_the_loss(base_url):
    sc = service_client(base_url, "tml-distill-train")
    teacher_tc = counting_teacher(sc, seed=4, steps=15)
    data = _topk_data(5, n_datums=4)
    teacher = _student_lp(teacher_tc, data)
    student = new_training_client(sc, rank=16, seed=6)
    batch = _datums(data, teacher)
    curve = []
    for _ in range(10):
        curve.append(student.forward_backward(batch, "reverse_kl").result().metrics["loss:sum"])
        student.optim_step(adam(1e-2)).result()
    final = student.forward(batch, "reverse_kl").result().metrics["loss:sum"]
    print("reverse_kl loss per step:", np.round(curve, 3).tolist(), "final", round(final, 3))
    assert final <= 0.3 * curve[0]


def test_distill_bad_input(base_url):
    import tinker
    sc = service_client(base_url, "tml-distill-bad")
    tc = new_training_client(sc)
    data = _topk_data(3, n_datums=1)
    mi, t, m = data[0]
    no_teacher = types.Datum(model_input=mi, loss_fn_inputs={"target_tokens": t})
    with pytest.raises(tinker.RequestFailedError) as err:
        tc.forward_backward([no_teacher], "reverse_kl").result()
    assert "teacher_logprobs" in str(err.value)
    wrong = types.Datum(model_input=mi, loss_fn_inputs={"target_tokens": t,
                                                        "teacher_logprobs": np.zeros((len(t), K - 1), np.float32)})
    with pytest.raises(tinker.RequestFailedError) as err:
        tc.forward_backward([wrong], "forward_kl").result()
    assert "teacher_logprobs" in str(err.value)
    good = _datums(data, [np.zeros((len(t), K))])
    with pytest.raises(tinker.RequestFailedError) as err:
        tc.forward_backward(good, "jsd", loss_fn_config={"beta": 1.5}).result()
    assert "beta" in str(err.value)
    tc.forward_backward(good, "jsd").result()  # the client still works
