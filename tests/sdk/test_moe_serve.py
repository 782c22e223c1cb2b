"""LoRA on a mixture of experts' experts through the service: the `mixtral` parity fixture's model
(tokenizer-less, 4 experts, top-2) served with --model, trained by the official SDK with
`train_mlp=True` (Tinker's flag: the routed experts' fused stacks, PEFT's target_parameters; the
router stays off). Checked against the in-process trainer (`twinkle train --resume` from the
service's own initial state, the same batch and AdamW): the loss of every step and the adapter
after every step equal the in-process run's, and so do the gradients — AdamW with beta1 = beta2 = 0
makes each step u = lr * g / (|g| + eps), so g = u * eps / (lr - |u|) with lr = eps, read back from
the saved states. The run's passes are counted as own_trainer (never packed); sampling from the
trained adapter (snapshot and saved sampler weights) has its own sampler and agrees with the
training client's forward; save_state / create_training_client_from_state / save_weights_for_sampler
round-trip the expert adapter in PEFT's layout."""
import http.client
import json
import subprocess

import numpy as np
from tinker import types

from conftest import REPO, make_datum, server_env, service_client, twinkle_bin
from test_export import st_read

FIXTURE = REPO / "tests/parity/fixtures/mixtral"
NAME = "fixture/mixtral"
RANK, SEED = 4, 11
LR = EPS = 1e-2  # beta1 = beta2 = 0: each step is lr * g / (|g| + eps), invertible
LOSS_TOL = 1e-6  # relative, per step (twinkle train prints 9 digits)
GRAD_TOL = 1e-4  # relative L2 per tensor of the gradients read back (f32 rounding of w + u)
EXPERT_KEYS = ("mlp.experts.base_layer.lora_A.weight", "mlp.experts.base_layer.lora_B.weight",
               "mlp.experts.lora_A.weight", "mlp.experts.lora_B.weight")

SEQS = [[(7 * i + 3 * s + 1) % 256 for i in range(n)] for s, n in enumerate((9, 14, 6))]


def datums():
    return [make_datum(q[:-1], q[1:], [1.0] * (len(q) - 1)) for q in SEQS]


def adam():
    return types.AdamParams(learning_rate=LR, beta1=0.0, beta2=0.0, eps=EPS, weight_decay=0.0, grad_clip_norm=0.0)


def adapter(folder):
    return st_read(folder / "adapter_model.safetensors")[1]


def implied_grads(before, after):
    """name -> the gradient of the step from `before` to `after` (u = lr g / (|g| + eps), lr = eps)."""
    out = {}
    for k, w0 in before.items():
        u = after[k] - w0
        out[k] = u * EPS / (LR - np.abs(u))
    return out


def rel_l2(a, b):
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def test_moe_train_mlp_trains_experts_like_in_process(start_server, tmp_path):
    server = start_server("--model", f"{FIXTURE / 'model'}={NAME}")
    sc = service_client(server.base_url)
    tc = sc.create_lora_training_client(base_model=NAME, rank=RANK, seed=SEED, train_mlp=True, train_attn=True)
    tc = tc.result(timeout=60) if hasattr(tc, "result") else tc
    ck = lambda name: next((server.data_dir / "checkpoints").glob(f"*/weights/{name}"))  # noqa: E731

    # the initial state, in PEFT's layout: the experts' fused stacks as target_parameters, no router
    tc.save_state("init").result(timeout=120)
    init = ck("init")
    cfg = json.loads((init / "adapter_config.json").read_text())
    print("adapter_config target_parameters", cfg.get("target_parameters"), "target_modules", cfg["target_modules"])
    assert sorted(cfg.get("target_parameters") or []) == ["mlp.experts.down_proj", "mlp.experts.gate_up_proj"], cfg.get("target_parameters")
    w = {0: adapter(init)}
    for layer in range(2):
        for key in EXPERT_KEYS:
            assert f"base_model.model.model.layers.{layer}.{key}" in w[0], (layer, key, sorted(w[0])[:6])
    assert not any("mlp.gate." in k for k in w[0]), "router LoRA must stay off"

    # two steps through the service, each beside an attention-only run of the same model (packable)
    ta = sc.create_lora_training_client(base_model=NAME, rank=RANK, seed=SEED, train_mlp=False, train_attn=True)
    ta = ta.result(timeout=60) if hasattr(ta, "result") else ta
    svc_loss = []
    for step in (1, 2):
        fb_other = ta.forward_backward(datums(), "cross_entropy")
        fb = tc.forward_backward(datums(), "cross_entropy")
        fb, _ = fb.result(timeout=300), fb_other.result(timeout=300)
        tc.optim_step(adam()).result(timeout=120)
        svc_loss.append(fb.metrics["loss:sum"])
        tc.save_state(f"step{step}").result(timeout=120)
        w[step] = adapter(ck(f"step{step}"))
    print("service losses", svc_loss)

    # the same two steps in-process, from the service's initial state
    data = tmp_path / "batch.jsonl"
    data.write_text("".join(json.dumps({"tokens": q, "weights": [1.0] * (len(q) - 1)}) + "\n" for q in SEQS))
    out = tmp_path / "inproc"
    cmd = [str(twinkle_bin()), "train", "--model", str(FIXTURE / "model"), "--data", str(data), "--resume", str(init),
           "--steps", "2", "--save-every", "1", "--batch-tokens", "4096", "--rank", str(RANK), "--alpha", "32",
           "--lr", str(LR), "--beta1", "0", "--beta2", "0", "--eps", str(EPS), "--weight-decay", "0",
           "--grad-clip", "0", "--train-unembed", "--out", str(out)]  # Tinker's train_unembed defaults to on
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=server_env())
    assert r.returncode == 0, r.stderr[-3000:]
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    cli_loss = [x["loss"] for x in lines if "loss" in x][:2]
    print("in-process losses", cli_loss)
    assert len(cli_loss) == 2
    n_w = sum(len(q) - 1 for q in SEQS)  # twinkle train prints the loss per weighted token; the service's loss:sum
    for a, b in zip(svc_loss, cli_loss):
        assert abs(a / n_w - b) <= LOSS_TOL * abs(b), (svc_loss, cli_loss)

    for step in (1, 2):
        ref = adapter(out / (f"step-{step}" if step < 2 else "final"))  # the last step is `final`
        assert sorted(ref) == sorted(w[step])
        worst_w = max(float(np.max(np.abs(w[step][k] - ref[k]))) for k in ref)
        g_svc = implied_grads(w[step - 1], w[step])
        g_ref = implied_grads(w[step - 1] if step == 1 else adapter(out / "step-1"), ref)
        worst_g, expert_norm = 0.0, 0.0
        for k in ref:
            if np.linalg.norm(g_ref[k]) > 0:
                worst_g = max(worst_g, rel_l2(g_svc[k], g_ref[k]))
            if ".mlp.experts." in k:
                expert_norm += float(np.linalg.norm(g_svc[k]))
        print(f"step {step}: adapter max |svc - in-process| {worst_w:.2e}, gradients rel L2 {worst_g:.2e} "
              f"(tol {GRAD_TOL:.0e}), expert gradient norm {expert_norm:.3e}")
        assert worst_w <= 1e-6 and worst_g <= GRAD_TOL
        assert expert_norm > 0, "the experts' LoRA got no gradient"
    # step 2: the lora_A of the expert stacks move too (their B is no longer zero)
    moved = [k for k in w[2] if ".mlp.experts." in k and "lora_A" in k and np.any(w[2][k] != w[1][k])]
    assert len(moved) == 4, moved

    # never packed: every pass of this model ran on the run's own trainer
    c = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    c.request("GET", "/metrics", headers={"X-API-Key": "tml-alice"})
    text = c.getresponse().read().decode()
    c.close()
    own_line = [x for x in text.splitlines() if x.startswith("twinkle_train_passes_total") and "own_trainer" in x]
    packed = [x for x in text.splitlines() if x.startswith("twinkle_train_passes_total") and "kind=\"packed\"" in x]
    print(own_line, packed)
    assert own_line and float(own_line[0].rsplit(" ", 1)[1]) == 2, own_line
    alone = [x for x in text.splitlines() if x.startswith("twinkle_train_passes_total") and "kind=\"alone\"" in x]
    print(alone)
    assert all(float(x.rsplit(" ", 1)[1]) == 0 for x in packed)  # the attention-only run's passes: alone
    assert alone and float(alone[0].rsplit(" ", 1)[1]) == 2, alone

    # sampling from the trained adapter: its own sampler, greedy tokens' logprobs = the forward's
    prompt = SEQS[0][:5]
    params = types.SamplingParams(max_tokens=6, temperature=0.0, stop=[])
    samplers = {"snapshot": tc.save_weights_and_get_sampling_client()}
    samplers = {k: (v.result(timeout=120) if hasattr(v, "result") else v) for k, v in samplers.items()}
    sw = tc.save_weights_for_sampler("sw2").result(timeout=120)
    sw_dir = next((server.data_dir / "checkpoints").glob("*/sampler_weights/sw2"))
    assert sorted(json.loads((sw_dir / "adapter_config.json").read_text())["target_parameters"]) == \
        ["mlp.experts.down_proj", "mlp.experts.gate_up_proj"]
    samplers["saved"] = sc.create_sampling_client(model_path=sw.path)
    base = sc.create_sampling_client(base_model=NAME)
    got = {}
    for kind, s in {**samplers, "base": base}.items():
        s = s.result(timeout=60) if hasattr(s, "result") else s
        res = s.sample(types.ModelInput.from_ints(prompt), 1, params).result(timeout=120)
        got[kind] = (list(res.sequences[0].tokens), list(res.sequences[0].logprobs))
        print(kind, got[kind][0])
    assert got["snapshot"] == got["saved"], (got["snapshot"], got["saved"])
    toks = got["snapshot"][0]
    seq = prompt + toks
    fw = tc.forward([make_datum(seq[:-1], seq[1:])], "cross_entropy").result(timeout=120)
    lp = fw.loss_fn_outputs[0]["logprobs"].tolist()[len(prompt) - 1:]
    diff = max(abs(a - b) for a, b in zip(lp, got["snapshot"][1]))
    print(f"sampled logprobs vs training forward: max |d| {diff:.2e}")
    assert diff <= 1e-4
    assert got["base"] != got["snapshot"], "the adapter changed nothing"

    # a new run from the saved state holds the same expert adapter (same forward)
    tc2 = sc.create_training_client_from_state(tc.save_state("step2b").result(timeout=120).path)
    tc2 = tc2.result(timeout=60) if hasattr(tc2, "result") else tc2
    fw2 = tc2.forward([make_datum(seq[:-1], seq[1:])], "cross_entropy").result(timeout=120)
    assert fw2.loss_fn_outputs[0]["logprobs"].tolist() == fw.loss_fn_outputs[0]["logprobs"].tolist()
