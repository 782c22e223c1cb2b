"""Concurrent sampling: requests from two tenants on the base model, and
several requests on one snapshot, are decoded in shared batches on the server
(server/sampling.c); their results must equal the same requests made one at a
time."""
from concurrent.futures import ThreadPoolExecutor

from tinker import types

from conftest import BASE_MODEL, new_training_client, service_client, counting_datum, adam


def _sample(client, prompt, seed, temperature):
    params = types.SamplingParams(max_tokens=10, temperature=temperature, seed=seed, stop=[])
    r = client.sample(prompt=types.ModelInput.from_ints(prompt), num_samples=3, sampling_params=params).result()
    return [(list(s.tokens), list(s.logprobs)) for s in r.sequences]


def _jobs():
    return [([7 + i, 70 + i, 170 + i], 100 + i, 0.0 if i % 2 else 1.0) for i in range(8)]


def _check_same(alone, together):
    for a, b in zip(alone, together):
        for (ta, la), (tb, lb) in zip(a, b):
            assert ta == tb
            assert max(abs(x - y) for x, y in zip(la, lb)) <= 1e-5


def test_two_tenants_share_the_base_model_batch(base_url):
    clients = [service_client(base_url, key).create_sampling_client(base_model=BASE_MODEL)
               for key in ("tml-batch-a", "tml-batch-b")]
    clients = [c.result() if hasattr(c, "result") and not hasattr(c, "sample") else c for c in clients]
    jobs = _jobs()
    alone = [_sample(clients[i % 2], *job) for i, job in enumerate(jobs)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        together = list(pool.map(lambda ij: _sample(clients[ij[0] % 2], *ij[1]), enumerate(jobs)))
    _check_same(alone, together)


def test_concurrent_requests_on_one_snapshot(base_url):
    sc = service_client(base_url, "tml-batch-c")
    tc = new_training_client(sc)
    tc.forward_backward([counting_datum(d) for d in range(4)], "cross_entropy").result()
    tc.optim_step(adam()).result()
    sampler = tc.save_weights_and_get_sampling_client()
    sampler = sampler.result() if hasattr(sampler, "result") else sampler
    jobs = _jobs()
    alone = [_sample(sampler, *job) for job in jobs]
    with ThreadPoolExecutor(max_workers=8) as pool:
        together = list(pool.map(lambda job: _sample(sampler, *job), jobs))
    _check_same(alone, together)


def test_different_adapters_share_a_batch(base_url):
    """Snapshots of two tenants' runs and the base model, sampled concurrently:
    the server decodes them together through adapter slots (server/sampling.c);
    each must get what it gets alone."""
    samplers = []
    for key, seed in (("tml-mix-a", 11), ("tml-mix-b", 22)):
        sc = service_client(base_url, key)
        tc = new_training_client(sc, seed=seed)
        tc.forward_backward([counting_datum(d) for d in range(4)], "cross_entropy").result()
        tc.optim_step(adam()).result()
        s = tc.save_weights_and_get_sampling_client()
        samplers.append(s.result() if hasattr(s, "result") and not hasattr(s, "sample") else s)
    base = service_client(base_url, "tml-mix-c").create_sampling_client(base_model=BASE_MODEL)
    samplers.append(base.result() if hasattr(base, "result") and not hasattr(base, "sample") else base)
    jobs = [(samplers[i % 3], job) for i, job in enumerate(_jobs())]
    alone = [_sample(s, *job) for s, job in jobs]
    with ThreadPoolExecutor(max_workers=8) as pool:
        together = list(pool.map(lambda sj: _sample(sj[0], *sj[1]), jobs))
    _check_same(alone, together)
    # the adapters matter: the two snapshots and the base model do not all agree
    firsts = {tuple(alone[i][0][0]) for i in range(3)}
    assert len(firsts) > 1
