"""`twinkle export`: a checkpoint trained through the SDK, written as the PEFT
adapter alone (--peft) or merged into its base model (--merge); the merged
folder, loaded with no adapter, gives the logprobs of base + adapter.

Optional: TWK_TRANSFORMERS_PYTHON names a Python with torch + transformers that
can load Qwen3; the merged folder is then also scored by transformers."""
from __future__ import annotations

import json
import os
import random
import struct
import subprocess
from pathlib import Path

import numpy as np

from conftest import REPO, adam, logprobs_of, make_datum, max_abs_diff, service_client, twinkle_bin

FIXTURE = REPO / "tests/parity/fixtures/qwen3/model"
FIXTURE_NAME = "fixture/qwen3"
TOL = 1e-5  # |logprob| difference, merged model vs base + adapter (float32 both ways), per unit of max(1, |logprob|)


def scaled_diff(want, got) -> float:
    """max over tokens of |want - got| / max(1, |want|): float32 rounding grows with the logits."""
    return max(abs(u - v) / max(1.0, abs(u)) for x, y in zip(want, got, strict=True) for u, v in zip(x, y, strict=True))


def st_read(path: Path) -> tuple[dict, dict]:
    """(header, name -> float64 array) of a safetensors file (F32 / BF16 / F16 / I32)."""
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        a, b = meta["data_offsets"]
        buf = raw[8 + n + a:8 + n + b]
        if meta["dtype"] == "F32":
            x = np.frombuffer(buf, dtype=np.float32)
        elif meta["dtype"] == "F16":
            x = np.frombuffer(buf, dtype=np.float16)
        elif meta["dtype"] == "I32":
            x = np.frombuffer(buf, dtype=np.int32)
        else:
            x = (np.frombuffer(buf, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
        out[name] = x.astype(np.float64).reshape(meta["shape"])
    return header, out


def export(*args):
    return subprocess.run([str(twinkle_bin()), "export", *map(str, args)], capture_output=True, text=True, timeout=300)


def score(model: Path, data: Path, adapter: Path | None = None):
    args = [str(twinkle_bin()), "score", "--model", str(model), "--data", str(data)]
    if adapter:
        args += ["--adapter", str(adapter)]
    r = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return [json.loads(line)["logprobs"] for line in r.stdout.splitlines()]


def sequences(vocab, n=4, length=24, seed=5):
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(length)] for _ in range(n)]


def train(sc, base_model, vocab, **kw):
    tc = sc.create_lora_training_client(base_model=base_model, rank=4, seed=3, **kw)
    tc = tc.result() if hasattr(tc, "result") else tc
    for step in range(4):
        data = [make_datum(s[:-1], s[1:]) for s in sequences(vocab, seed=step)]
        tc.forward_backward(data, "cross_entropy").result()
        tc.optim_step(adam(2e-2)).result()
    return tc


def sdk_logprobs(tc, seqs):
    return logprobs_of(tc.forward([make_datum(s[:-1], s[1:]) for s in seqs], "cross_entropy").result())


def numpy_qwen3_logprobs(model_dir: Path, seqs):
    """Per-token logprobs of a Qwen3 Hugging Face folder by a float64 numpy forward written from
    transformers' Qwen3 (RMSNorm, q/k norms, rotate-half RoPE, grouped-query causal attention,
    SiLU-gated MLP): an independent reader of the merged folder, for where transformers cannot run."""
    cfg = json.loads((model_dir / "config.json").read_text())
    _, w = st_read(model_dir / "model.safetensors")
    H, nh, nkv, hd = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps = cfg["rms_norm_eps"]
    theta = cfg.get("rope_theta") or cfg["rope_parameters"]["rope_theta"]

    def norm(x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g

    def rope(x, pos):  # x [heads, T, hd]
        inv = 1.0 / theta ** (np.arange(0, hd, 2) / hd)
        ang = np.concatenate([np.outer(pos, inv)] * 2, -1)
        rot = np.concatenate([-x[..., hd // 2:], x[..., : hd // 2]], -1)
        return x * np.cos(ang) + rot * np.sin(ang)

    out = []
    for s in seqs:
        T, pos = len(s), np.arange(len(s))
        x = w["model.embed_tokens.weight"][s]
        for i in range(cfg["num_hidden_layers"]):
            p = f"model.layers.{i}."
            h = norm(x, w[p + "input_layernorm.weight"])
            q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(T, nh, hd).transpose(1, 0, 2)
            k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(T, nkv, hd).transpose(1, 0, 2)
            v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(T, nkv, hd).transpose(1, 0, 2)
            q = rope(norm(q, w[p + "self_attn.q_norm.weight"]), pos)
            k = rope(norm(k, w[p + "self_attn.k_norm.weight"]), pos)
            k, v = np.repeat(k, nh // nkv, 0), np.repeat(v, nh // nkv, 0)
            a = q @ k.transpose(0, 2, 1) / np.sqrt(hd) + np.triu(np.full((T, T), -np.inf), 1)
            a = np.exp(a - a.max(-1, keepdims=True))
            a /= a.sum(-1, keepdims=True)
            x = x + (a @ v).transpose(1, 0, 2).reshape(T, nh * hd) @ w[p + "self_attn.o_proj.weight"].T
            h = norm(x, w[p + "post_attention_layernorm.weight"])
            g = h @ w[p + "mlp.gate_proj.weight"].T
            x = x + (g / (1 + np.exp(-g)) * (h @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
        logits = norm(x, w["model.norm.weight"]) @ w.get("lm_head.weight", w["model.embed_tokens.weight"]).T
        m = logits.max(-1, keepdims=True)
        lp = logits - m - np.log(np.exp(logits - m).sum(-1, keepdims=True))
        out.append([float(lp[i, s[i + 1]]) for i in range(T - 1)])
    return out


def transformers_logprobs(model_dir: Path, seqs):
    """Per-token logprobs by transformers, or None (with the reason printed) where it cannot run."""
    py = os.environ.get("TWK_TRANSFORMERS_PYTHON")
    if not py:
        print("transformers check skipped: TWK_TRANSFORMERS_PYTHON is not set")
        return None
    script = (
        "import json, sys, torch, transformers\n"
        "m = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], torch_dtype=torch.float32).eval()\n"
        "out = []\n"
        "for s in json.loads(sys.argv[2]):\n"
        "    with torch.no_grad():\n"
        "        lp = torch.log_softmax(m(torch.tensor([s])).logits[0].double(), -1)\n"
        "    out.append([float(lp[i, s[i + 1]]) for i in range(len(s) - 1)])\n"
        "print(json.dumps(out))\n")
    r = subprocess.run([py, "-c", script, str(model_dir), json.dumps(seqs)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.splitlines()[-1])


def test_export_merge_and_peft_on_the_qwen3_fixture(start_server, tmp_path):
    server = start_server("--model", f"{FIXTURE}={FIXTURE_NAME}")
    sc = service_client(server.base_url)
    tc = train(sc, FIXTURE_NAME, 1000)
    path = tc.save_state("final").result().path
    seqs = sequences(1000, seed=99)
    want = sdk_logprobs(tc, seqs)  # base + adapter, by the server

    merged = tmp_path / "merged"
    r = export("--checkpoint", path, "--data-dir", server.data_dir, "--model", FIXTURE, "--merge", "--out", merged)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in merged.iterdir()) == ["config.json", "generation_config.json", "model.safetensors"]
    assert json.loads((merged / "config.json").read_text()) == json.loads((FIXTURE / "config.json").read_text())
    base_h, base = st_read(FIXTURE / "model.safetensors")
    merged_h, mw = st_read(merged / "model.safetensors")
    assert sorted(base) == sorted(mw)
    assert all(merged_h[k]["dtype"] == base_h[k]["dtype"] for k in base)

    # the merge formula, in float64, on every adapted weight
    ckpt = server.data_dir / "checkpoints" / path.split("/")[2] / "weights" / "final"
    _, ad = st_read(ckpt / "adapter_model.safetensors")
    acfg = json.loads((ckpt / "adapter_config.json").read_text())
    scale = acfg["lora_alpha"] / acfg["r"]
    worst, adapted = 0.0, 0
    for name in base:
        key = "base_model.model." + name[: -len(".weight")]
        if key + ".lora_A.weight" in ad:
            ref = base[name] + scale * ad[key + ".lora_B.weight"] @ ad[key + ".lora_A.weight"]
            worst = max(worst, float(np.abs(mw[name] - ref).max()))
            adapted += 1
        else:
            assert np.array_equal(mw[name], base[name]), name
    print(f"merge: {adapted} adapted weights, max |W' - (W + s·B·A)| {worst:.3g} (float32 rounding)")
    pairs = sum(k.endswith(".lora_A.weight") for k in ad)
    assert adapted == pairs and pairs >= 14 and worst < 1e-6  # 2 layers x 7 modules (+ lm_head)

    # the merged model with no adapter = base + adapter
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"tokens": s}) + "\n" for s in seqs))
    got = score(merged, data)
    err = max_abs_diff(want, got)
    err_cli = max_abs_diff(score(FIXTURE, data, ckpt), got)
    moved = max_abs_diff(score(FIXTURE, data), want)
    print(f"merged vs base+adapter: max |logprob diff| {err:.3g} (server), {err_cli:.3g} (twinkle score --adapter); "
          f"the adapter moves logprobs by up to {moved:.3g}")
    assert err < TOL and err_cli < TOL and moved > 1e-2  # absolute here

    ref = numpy_qwen3_logprobs(merged, seqs)
    ref_base = numpy_qwen3_logprobs(FIXTURE, seqs)
    err_np, err_np_base = max_abs_diff(want, ref), max_abs_diff(score(FIXTURE, data), ref_base)
    print(f"float64 numpy Qwen3 forward of the merged folder vs base+adapter: max |logprob diff| {err_np:.3g} "
          f"(the same reader on the base vs twinkle on the base: {err_np_base:.3g})")
    assert err_np < TOL and err_np_base < TOL

    tf = transformers_logprobs(merged, seqs)
    if tf is not None:
        err_tf = max_abs_diff(want, tf)
        print(f"transformers on the merged folder vs base+adapter: max |logprob diff| {err_tf:.3g}")
        assert err_tf < 1e-4

    # --peft: the adapter alone, as PEFT lays it out
    peft = tmp_path / "peft"
    r = export("--checkpoint", path, "--data-dir", server.data_dir, "--peft", "--out", peft)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in peft.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        assert (peft / name).read_bytes() == (ckpt / name).read_bytes()
    # a checkpoint folder works as well as a tinker:// path
    r = export("--checkpoint", ckpt, "--model", FIXTURE, "--merge", "--out", tmp_path / "merged2")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "merged2" / "model.safetensors").read_bytes() == (merged / "model.safetensors").read_bytes()


def test_export_merge_unties_an_adapted_lm_head(server, tmp_path):
    """The built-in model ties lm_head to the embeddings; an adapter on lm_head gives the merged
    model its own lm_head.weight. The base is found in the data dir without --model."""
    sc = service_client(server.base_url)
    tc = train(sc, "twinkle/tiny-qwen3", 512, train_unembed=True)
    path = tc.save_weights_for_sampler("unembed").result().path
    seqs = sequences(512, seed=7)
    want = sdk_logprobs(tc, seqs)
    merged = tmp_path / "merged"
    r = export("--checkpoint", path, "--data-dir", server.data_dir, "--merge", "--out", merged)
    assert r.returncode == 0, r.stderr
    assert json.loads((merged / "config.json").read_text())["tie_word_embeddings"] is False
    _, mw = st_read(merged / "model.safetensors")
    assert "lm_head.weight" in mw
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"tokens": s}) + "\n" for s in seqs))
    got = score(merged, data)
    err, rel = max_abs_diff(want, got), scaled_diff(want, got)
    big = max(abs(u) for x in want for u in x)
    print(f"untied lm_head: merged vs base+adapter max |logprob diff| {err:.3g}, per max(1, |logprob|) {rel:.3g} "
          f"(logprobs down to {-big:.3g})")
    assert rel < TOL


def test_export_merge_keeps_a_bf16_base_in_bf16(tmp_path):
    """The qwen2 fixture is bf16 on disk: the merged weights are bf16 too, each the float32 sum
    W + s·B·A rounded to nearest even (at most one bf16 step from numpy's rounding of it)."""
    fx = REPO / "tests/parity/fixtures/qwen2"
    merged = tmp_path / "merged"
    r = export("--checkpoint", fx / "peft_adapter", "--model", fx / "model", "--merge", "--out", merged)
    assert r.returncode == 0, r.stderr
    base_h, base = st_read(fx / "model" / "model.safetensors")
    merged_h, mw = st_read(merged / "model.safetensors")
    _, ad = st_read(fx / "peft_adapter" / "adapter_model.safetensors")
    acfg = json.loads((fx / "peft_adapter" / "adapter_config.json").read_text())
    scale = acfg["lora_alpha"] / acfg["r"]
    exact = total = adapted = 0
    worst = 0.0
    for name in base:
        assert merged_h[name]["dtype"] == base_h[name]["dtype"], name
        key = "base_model.model." + name[: -len(".weight")]
        if key + ".lora_A.weight" not in ad:
            assert np.array_equal(mw[name], base[name]), name
            continue
        adapted += 1
        f32 = (base[name] + scale * ad[key + ".lora_B.weight"] @ ad[key + ".lora_A.weight"]).astype(np.float32)
        b = f32.view(np.uint32)
        ref = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16 << 16).astype(np.uint32).view(np.float32).astype(np.float64)
        exact += int((mw[name] == ref).sum())
        total += ref.size
        worst = max(worst, float((np.abs(mw[name] - ref) / np.maximum(np.abs(ref), 1e-30)).max()))
    print(f"bf16 merge: {adapted} adapted weights, {exact}/{total} values equal numpy's rounding, "
          f"max relative difference {worst:.3g} (one bf16 step: 2^-7 = {2 ** -7:.3g})")
    assert adapted > 0 and merged_h[next(iter(base))]["dtype"] == "BF16"
    assert worst <= 2 ** -7 and exact >= 0.999 * total


def st_write_raw(path: Path, header: dict, blobs: dict):
    """A safetensors file of raw tensor bytes (header entries without offsets are filled in)."""
    off, body = 0, b""
    for name in header:
        header[name]["data_offsets"] = [off, off + len(blobs[name])]
        off += len(blobs[name])
        body += blobs[name]
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + body)


def test_export_merge_reads_shards_and_copies_tokenizer_files(tmp_path):
    """A base stored as two shards + model.safetensors.index.json, with tokenizer files: the merge
    equals the one from the single file, and every non-weight file is copied unchanged."""
    fx = REPO / "tests/parity/fixtures/qwen3"
    base = tmp_path / "base"
    base.mkdir()
    raw = (fx / "model" / "model.safetensors").read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = {k: v for k, v in json.loads(raw[8:8 + n]).items() if k != "__metadata__"}
    blobs = {k: raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]] for k, v in header.items()}
    names = sorted(header)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    weight_map = {}
    for shard, keys in shards.items():
        st_write_raw(base / shard, {k: {"dtype": header[k]["dtype"], "shape": header[k]["shape"]} for k in keys}, blobs)
        weight_map.update({k: shard for k in keys})
    (base / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    extras = {"config.json": (fx / "model" / "config.json").read_bytes(),
              "generation_config.json": (fx / "model" / "generation_config.json").read_bytes(),
              "tokenizer.json": b'{"version": "1.0", "model": {"type": "BPE"}}',
              "tokenizer_config.json": b'{"eos_token": "<e>"}', "special_tokens_map.json": b"{}",
              "chat_template.jinja": b"{{ messages }}"}
    for name, data in extras.items():
        (base / name).write_bytes(data)
    one, two = tmp_path / "from-file", tmp_path / "from-shards"
    for src, out in ((fx / "model", one), (base, two)):
        r = export("--checkpoint", fx / "peft_adapter", "--model", src, "--merge", "--out", out)
        assert r.returncode == 0, r.stderr
    _, a = st_read(one / "model.safetensors")
    _, b = st_read(two / "model.safetensors")
    assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)
    assert sorted(p.name for p in two.iterdir()) == sorted([*extras, "model.safetensors"])
    for name, data in extras.items():
        assert (two / name).read_bytes() == data, name


def test_export_refuses_bad_arguments(server, tmp_path):
    r = export("--checkpoint", "tinker://nope/weights/x", "--data-dir", server.data_dir, "--peft", "--out", tmp_path / "o")
    assert r.returncode == 1 and "no adapter" in r.stderr
    r = export("--checkpoint", "tinker://a/../b/c", "--peft", "--out", tmp_path / "o")
    assert r.returncode == 2 and "tinker://" in r.stderr
    r = export("--checkpoint", "tinker://a/weights/b", "--out", tmp_path / "o")
    assert r.returncode == 2 and "--merge" in r.stderr
    r = export("--checkpoint", FIXTURE, "--merge", "--out", tmp_path / "o")  # a model folder is not an adapter
    assert r.returncode == 1
    # an adapter of another model: refused, naming what does not fit, and nothing written
    r = export("--checkpoint", REPO / "tests/parity/fixtures/llama/peft_adapter", "--model", FIXTURE, "--merge",
               "--out", tmp_path / "wrong")
    print(r.stderr.strip())
    assert r.returncode == 1 and "merge:" in r.stderr and not (tmp_path / "wrong").exists()
