"""The multi-rank service (`mpirun -np 2 twinkle serve`) against the one-process server:
the same requests give the same results within float reordering, bad input on one rank's
share fails with the one-process message (and leaves no gradient behind), and a rank killed
with SIGKILL ends the service at once, its checkpoints loading after a restart.

Runs when TWK_SERVE_MPIRUN names the launcher (ctest sdk_mpi_np2 sets "mpirun -np 2", sdk_mpi_np3
"mpirun -np 3": uneven shares).

Tolerances (u = 2^-24, float32):
- Forward (logprobs, loss:sum): each datum runs through the same kernels in either server, only
  in another pass (the shares are packed apart), so a GEMM may block its rows differently. Each
  logit is the end of a chain of C = 3 L + 1 float32 reductions (L layers: attention, the MLP's
  two products; the unembedding) over at most K = max(hidden, intermediate, vocab) terms, each
  re-rounded by at most 2 K u relative: |d logprob| <= 2 C K u (1 + |logprob|); loss:sum, a sum
  of weighted logprobs, by the same relative bound over sum |w logprob|. Means are exact
  functions of those sums.
- Training: a gradient element is a float32 sum over the batch's T tokens, in another order
  across ranks: mpi_train.sh's bound, ||w_2 - w_1|| / ||w_1 - w_0|| <= S 2 T u after S steps
  (tests/mpi_params.py checks it on the saved adapters).
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from tinker import types

from conftest import BASE_MODEL, REPO, Server, adam, counting_datum, logprobs_of, new_training_client, service_client

MPIRUN = os.environ.get("TWK_SERVE_MPIRUN", "")
_np = re.search(r"-np\s+(\d+)", MPIRUN)
NP = int(_np.group(1)) if _np else 2  # the launcher's rank count
pytestmark = pytest.mark.skipif(not MPIRUN, reason="TWK_SERVE_MPIRUN is not set (the multi-rank service)")
U = 2.0 ** -24
# the built-in model: 2 layers, K = max(128 hidden, 384 intermediate, 512 vocab)
CHAIN, K = 3 * 2 + 1, 512
FWD_REL = 2 * CHAIN * K * U


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("mpi")
    one = Server(d / "one", ["--seq-timeout", "30"], log_path=d / "one.log", launcher="")
    many = Server(d / "many", ["--seq-timeout", "30"], log_path=d / "many.log", launcher=MPIRUN)
    yield one, many
    many.stop()
    one.stop()


def clients(pair, seed=7, rank=8):
    out = []
    for srv in pair:
        out.append(new_training_client(service_client(srv.base_url), rank=rank, seed=seed))
    return out


def uneven_data(n=7):
    """Datums of different lengths and weights: the token split puts several on each rank."""
    out = []
    for i in range(n):
        d = counting_datum(3 * i, length=6 + 5 * i)
        w = [0.5 + (j % 3) * 0.25 for j in range(6 + 5 * i)]
        out.append(types.Datum(model_input=d.model_input,
                               loss_fn_inputs={"target_tokens": d.loss_fn_inputs["target_tokens"], "weights": w}))
    return out


def rl_data(n=6, bad=None):
    rng = np.random.default_rng(5)
    out = []
    for i in range(n):
        d = counting_datum(i, length=8 + 3 * i)
        m = 8 + 3 * i
        q = (-3.0 - rng.random(m)).astype(np.float32)
        if i == bad:
            q[:] = -1e30  # the ratio exp(p - q) overflows: the gradient is not finite
        a = rng.standard_normal(m).astype(np.float32)
        out.append(types.Datum(model_input=d.model_input, loss_fn_inputs={
            "target_tokens": d.loss_fn_inputs["target_tokens"], "logprobs": q.tolist(), "advantages": a.tolist()}))
    return out


def compare(label, r1, r2, exact_keys=()):
    """Metrics and logprobs of two ForwardBackwardOutputs within the forward bound; prints the errors."""
    lp1, lp2 = logprobs_of(r1), logprobs_of(r2)
    worst, allowed = 0.0, 0.0
    for a, b in zip(lp1, lp2):
        a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
        assert a.shape == b.shape
        err = np.abs(a - b)
        worst = max(worst, float(err.max()))
        assert (err <= FWD_REL * (1 + np.abs(a))).all(), f"{label}: logprobs differ by {err.max():.3e}"
    assert set(r1.metrics) == set(r2.metrics), f"{label}: metric keys {sorted(r1.metrics)} vs {sorted(r2.metrics)}"
    scale = sum(float(np.abs(np.asarray(a)).sum()) for a in lp1) + 1.0
    for k, v in r1.metrics.items():
        w = r2.metrics[k]
        if k in exact_keys:
            assert v == w, f"{label}: {k} {v} vs {w}"
            continue
        allowed = FWD_REL * scale if k.startswith("loss") else FWD_REL * (1 + abs(v))
        assert abs(v - w) <= allowed, f"{label}: {k} {v} vs {w} (tolerance {allowed:.3e})"
    print(f"{label}: max |logprob diff| {worst:.2e} (tolerance {FWD_REL:.2e} (1 + |lp|)); metrics "
          + ", ".join(f"{k} {r1.metrics[k]:.6g}/{r2.metrics[k]:.6g}" for k in sorted(r1.metrics)))


def both(tcs, fn):
    return [fn(tc).result(timeout=120) for tc in tcs]


def test_losses_equal_the_one_process_server(pair):
    tcs = clients(pair)
    ce = uneven_data()
    compare("cross_entropy", *both(tcs, lambda tc: tc.forward_backward(ce, "cross_entropy")),
            exact_keys=("num_tokens:sum", "weight_sum:sum"))
    compare("forward only", *both(tcs, lambda tc: tc.forward(ce, "cross_entropy")), exact_keys=("num_tokens:sum",))
    one = uneven_data(1)  # fewer datums than ranks: the others have no share
    compare("one datum", *both(tcs, lambda tc: tc.forward_backward(one, "cross_entropy")), exact_keys=("num_tokens:sum",))
    rl = rl_data()
    compare("importance_sampling", *both(tcs, lambda tc: tc.forward_backward(rl, "importance_sampling")),
            exact_keys=("num_tokens:sum",))
    # pairs stay whole on one rank; the reference is the base model (adapter off) on each rank
    pairs = [counting_datum(i, length=6 + 4 * (i // 2), first=100 + 7 * (i % 2)) for i in range(8)]
    compare("dpo", *both(tcs, lambda tc: tc.forward_backward(pairs, "dpo", loss_fn_config={"beta": 0.1})),
            exact_keys=("pairs:sum", "num_tokens:sum"))


def rl_masked_data(n=6):
    """rl_data with weights masking each datum's first tokens (prompt-like), and a GSPO sequence mask."""
    out = []
    for i, d in enumerate(rl_data(n)):
        m = len(d.loss_fn_inputs["advantages"].data)
        w = [0.0] * (2 + i % 3) + [1.0] * (m - 2 - i % 3)
        out.append(types.Datum(model_input=d.model_input, loss_fn_inputs={**d.loss_fn_inputs, "weights": w}))
    return out


# the RL losses that normalise by the whole batch (sequences, masked tokens, the longest sequence,
# the KL term's counted tokens): every rank normalises its share by the whole batch's numbers
WHOLE_BATCH_LOSSES = [("grpo", {}), ("dapo", {}), ("dr_grpo", {}), ("dr_grpo", {"max_tokens": 20.0}), ("gspo", {}),
                      ("importance_sampling", {"kl_beta": 0.05}), ("grpo", {"kl_beta": 0.05})]


def test_whole_batch_rl_losses_split_across_the_ranks(pair):
    """The GRPO family, GSPO and the KL term split like the other losses: the forward's metrics equal
    one process's within the forward bound, and the gradient's norm (after the shares' sum over the
    ranks) within the training bound 2 T u — a share normalised by its own numbers would be off by
    about the rank count."""
    data = rl_masked_data()
    rng = np.random.default_rng(9)  # a reference away from the fresh adapter's policy: kl:mean is not 0
    with_ref = [types.Datum(model_input=d.model_input, loss_fn_inputs={
        **d.loss_fn_inputs, "ref_logprobs": (-6.5 + rng.random(d.model_input.length)).astype(np.float32)})  # an ndarray (test_dpo.py)
        for d in data]
    tokens = sum(len(d.loss_fn_inputs["target_tokens"].data) for d in data)
    for loss, cfg in WHOLE_BATCH_LOSSES:
        batch = with_ref if "kl_beta" in cfg else data
        tcs = clients(pair, seed=23)
        label = f"{loss} {cfg}" if cfg else loss
        fb = lambda tc: tc.forward_backward(batch, loss, loss_fn_config=cfg or None)  # noqa: E731
        compare(label, *both(tcs, fb), exact_keys=("num_tokens:sum", "advantage_tokens:sum"))
        o1, o2 = both(tcs, lambda tc: tc.optim_step(adam(1e-2)))
        g1, g2 = o1.metrics["grad_norm:mean"], o2.metrics["grad_norm:mean"]
        tol = 2 * tokens * U * g1 + FWD_REL * g1  # the gradient's sum order, and the forward's rounding in dL/dp
        print(f"{label}: grad norm {g1:.6g} (1 rank) vs {g2:.6g} ({NP} ranks), |diff| {abs(g1 - g2):.2e} "
              f"(tolerance {tol:.2e})")
        assert g1 > 0 and abs(g1 - g2) <= tol, (label, g1, g2)


def test_packed_passes_over_the_ranks_equal_the_one_process_server(pair):
    """Several runs' requests at once: every rank runs its shares of all of them packed into shared
    passes (twinkle_train_passes_total{kind="packed"} grows on the multi-rank service too) and each
    run's results equal the one-process server's (packed alike) within the forward bound."""
    from test_metrics import scrape, value

    runs = [("cross_entropy", None, uneven_data(5)), ("grpo", None, rl_masked_data(4)),
            ("importance_sampling", None, rl_data(5)),
            ("dpo", {"beta": 0.1}, [counting_datum(i, length=6 + 2 * (i // 2), first=100 + 7 * (i % 2)) for i in range(6)])]
    results = []
    for srv in pair:
        tcs = [new_training_client(service_client(srv.base_url, f"tml-pack-{i}"), rank=4 + 4 * i, seed=31 + i)
               for i in range(len(runs))]
        _, fams = scrape(srv.port, "tml-metrics")
        before = value(fams, "twinkle_train_passes_total", kind="packed")
        barrier = threading.Barrier(len(runs))
        out = [None] * len(runs)

        def go(i):
            loss, cfg, data = runs[i]
            barrier.wait(timeout=60)
            futs = [tcs[i].forward_backward(data, loss, loss_fn_config=cfg) for _ in range(3)]
            out[i] = [f.result(timeout=120) for f in futs]

        threads = [threading.Thread(target=go, args=(i,)) for i in range(len(runs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        _, fams = scrape(srv.port, "tml-metrics")
        packed = value(fams, "twinkle_train_passes_total", kind="packed") - before
        print(f"{'one process' if srv is pair[0] else f'{NP} ranks'}: {packed:.0f} packed passes (rank 0's)")
        assert packed > 0, "the concurrent requests did not share a pass"
        results.append(out)
    for i, (loss, _, _) in enumerate(runs):
        for step, (a, b) in enumerate(zip(results[0][i], results[1][i])):
            compare(f"packed {loss} request {step}", a, b, exact_keys=("num_tokens:sum",))


def test_training_steps_equal_the_one_process_server(pair):
    tcs = clients(pair, seed=11)
    data = uneven_data(6)
    tokens = sum(len(d.loss_fn_inputs["target_tokens"].data) for d in data)
    paths = []
    for tc, srv in zip(tcs, pair):
        p0 = tc.save_weights_for_sampler("init").result(timeout=60).path
        losses = []
        for _ in range(5):
            losses.append(tc.forward_backward(data, "cross_entropy").result(timeout=120).metrics["loss:sum"])
            tc.optim_step(adam(1e-2)).result(timeout=60)
        p5 = tc.save_weights_for_sampler("step5").result(timeout=60).path
        paths.append([srv.data_dir / "checkpoints" / p.removeprefix("tinker://") / "adapter_model.safetensors"
                      for p in (p0, p5)])
        srv.losses = losses
    l1, l2 = pair[0].losses, pair[1].losses
    print("loss curve 1 rank:", [f"{x:.6f}" for x in l1])
    print(f"loss curve {NP} ranks:", [f"{x:.6f}" for x in l2])
    assert l1[0] != l1[-1], "the loss did not move"
    tol = 5 * 2 * tokens * U
    r = subprocess.run([sys.executable, str(REPO / "tests" / "mpi_params.py"), str(paths[0][1]), str(paths[1][1]),
                        str(paths[0][0]), f"{tol:.6e}", f"adapter after 5 steps, 1 vs {NP} ranks"],
                       capture_output=True, text=True)
    print(r.stdout.strip(), r.stderr.strip())
    assert r.returncode == 0
    # both servers started from the same adapter (the seed), saved once, by rank 0
    assert paths[0][0].read_bytes()[-4096:] == paths[1][0].read_bytes()[-4096:]


def health(srv):
    with urllib.request.urlopen(srv.base_url + "/api/v1/healthz", timeout=30) as r:
        return json.loads(r.read())


def ready(x):
    return x.result(timeout=60) if hasattr(x, "result") else x


def test_sampling_spreads_over_the_ranks(pair):
    """Decode batches go to the ranks in turn: seeded samples from the base model, a snapshot of a
    run and a checkpoint equal one process's, and the other ranks did part of the decoding."""
    tcs = clients(pair, seed=17)
    data = uneven_data(4)
    both(tcs, lambda tc: tc.forward_backward(data, "cross_entropy"))
    both(tcs, lambda tc: tc.optim_step(adam(1e-2)))
    samplers = []
    for tc, srv in zip(tcs, pair):
        sc = service_client(srv.base_url)
        path = tc.save_weights_for_sampler("spread").result(timeout=60).path
        samplers.append([ready(sc.create_sampling_client(base_model=BASE_MODEL)),
                         ready(tc.save_weights_and_get_sampling_client()),
                         ready(sc.create_sampling_client(model_path=path))])
    prompt = types.ModelInput.from_ints([100 + i for i in range(6)])
    sent_before = sum(health(pair[1])["decode_batches_sent"])
    outs = []
    for trio in samplers:
        futs = [s.sample(prompt, 2, types.SamplingParams(max_tokens=24, temperature=1.0, seed=100 + i))
                for i in range(6) for s in trio]
        outs.append([f.result(timeout=120) for f in futs])
    h = health(pair[1])
    sent = sum(h["decode_batches_sent"]) - sent_before
    worst = 0.0
    for a, b in zip(*outs):
        for x, y in zip(a.sequences, b.sequences):
            assert x.tokens == y.tokens, f"a seeded sample differs between 1 and {NP} ranks"
            err = np.abs(np.asarray(x.logprobs) - np.asarray(y.logprobs))
            assert (err <= FWD_REL * (1 + np.abs(np.asarray(x.logprobs)))).all(), err.max()
            worst = max(worst, float(err.max()))
    print(f"18 requests x 2 samples x 24 tokens (base, snapshot, checkpoint): tokens equal, max |logprob diff| "
          f"{worst:.2e}; decode batches sent to the other ranks: {sent}; /healthz {h}")
    assert h["status"] == "ok" and h["ranks"] == NP and len(h["decode_batches_sent"]) == NP - 1
    assert sent >= 1, "no other rank decoded"
    assert health(pair[0]) == {"status": "ok"}


def test_bad_input_on_one_share_fails_with_the_one_process_message(pair):
    tcs = clients(pair, seed=13)
    bad = rl_data(bad=5)  # the last datum: on the last rank's share
    msgs = []
    for tc in tcs:
        with pytest.raises(Exception) as e:
            tc.forward_backward(bad, "importance_sampling").result(timeout=120)
        msgs.append(str(e.value))
    print("one process:", msgs[0])
    print(f"{NP} ranks:    ", msgs[1])
    # the server's message (the SDK appends the request id): datum 5 starts at token 70, on the last
    # rank's share (2 ranks: rank 0 gets datums 0-3, 50 of the 93 tokens; 3 ranks: rank 2 gets datum 5)
    m = [x.split(" for self.request_id")[0] for x in msgs]
    assert m[0] == m[1] and re.search(r"gradient at token 70 is not finite", m[0]), msgs
    # nothing of the failed request stays in any rank's gradients: the next step matches
    good = rl_data()
    compare("importance_sampling after the failure", *both(tcs, lambda tc: tc.forward_backward(good, "importance_sampling")),
            exact_keys=("num_tokens:sum",))
    o1, o2 = both(tcs, lambda tc: tc.optim_step(adam(1e-2)))
    g1, g2 = o1.metrics["grad_norm:mean"], o2.metrics["grad_norm:mean"]
    assert abs(g1 - g2) <= 2 * sum(len(d.loss_fn_inputs["target_tokens"].data) for d in good) * U * g1, (g1, g2)
    print(f"grad norm after the failed request: {g1:.6f} (1 rank) vs {g2:.6f} ({NP} ranks)")


def test_killed_rank_ends_the_service_and_checkpoints_survive(tmp_path):
    srv = Server(tmp_path / "data", ["--seq-timeout", "30"], log_path=tmp_path / "serve.log", launcher=MPIRUN)
    try:
        tc = new_training_client(service_client(srv.base_url), seed=3)
        data = uneven_data(4)
        tc.forward_backward(data, "cross_entropy").result(timeout=120)
        tc.optim_step(adam(1e-2)).result(timeout=60)
        saved = tc.save_state("before").result(timeout=60).path
        ranks = srv.rank_pids()
        assert sorted(ranks) == list(range(NP)), ranks
        stop = threading.Event()
        outcome = {}

        def train():  # in flight when the rank dies
            try:
                while not stop.is_set():
                    tc.forward_backward(data, "cross_entropy").result(timeout=120)
            except Exception as e:  # noqa: BLE001 - any failure is the expected outcome
                outcome["error"] = f"{type(e).__name__}: {e}"

        t = threading.Thread(target=train, daemon=True)
        t.start()
        time.sleep(1.0)
        killed_at = time.time()
        os.kill(ranks[NP - 1], signal.SIGKILL)
        try:
            rc = srv.proc.wait(timeout=30)  # bounded: a hang fails here
        except subprocess.TimeoutExpired:
            pytest.fail(f"the service did not end within 30 s of losing rank {NP - 1}")
        took = time.time() - killed_at
        stop.set()
        log = srv.log_text() + srv.proc.stdout.read().decode(errors="replace")  # hydra reports on stdout
        print(f"rank {NP - 1} (pid {ranks[NP - 1]}) killed: the service ended after {took:.2f} s, mpirun exit {rc}")
        assert rc != 0
        # hydra names a rank that ended badly: the killed one, or (more than 2 ranks) one its cleanup ended first
        named = re.search(r"BAD TERMINATION.*?PID (\d+) RUNNING", log, re.S)
        assert named and int(named.group(1)) in ranks.values(), log
        for pid in ranks.values():  # no rank left behind
            assert not Path(f"/proc/{pid}").exists() or b"zombie" in Path(f"/proc/{pid}/status").read_bytes().lower()
    finally:
        srv.kill()
    # restarted, the store and the checkpoint written before the loss are intact
    again = Server(tmp_path / "data", [], log_path=tmp_path / "serve2.log", launcher=MPIRUN)
    try:
        tc2 = service_client(again.base_url).create_training_client_from_state(saved)
        r = tc2.forward(uneven_data(2), "cross_entropy").result(timeout=120)
        assert np.isfinite(r.metrics["loss:sum"])
        print(f"restarted under {MPIRUN}: checkpoint {saved} loads, loss:sum {r.metrics['loss:sum']:.4f}")
    finally:
        again.stop()
