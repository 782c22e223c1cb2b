"""The OpenAI-compatible routes of `twinkle serve` (/v1/models, /v1/completions,
/v1/chat/completions), driven by the official `openai` Python client, and
TrainingClient.get_tokenizer() offline (get_info's tokenizer_id: the model folder).

The model folder is assembled here: the parity Qwen3 model (vocab 1000), a byte-level
BPE tokenizer trained by this test with `tokenizers` (vocab <= 1000, Qwen's chat special
tokens) and the committed Qwen2.5 chat template (tests/chat/templates) in
tokenizer_config.json. Two more folders lack the chat template and the tokenizer.

Checked: the model list (base models and the caller's sampler checkpoints only);
completion and chat completion (the chat's prompt tokens are transformers'
apply_chat_template + encode); streaming chunks concatenate to the non-streamed text
with the same seed, leave while decoding (the first content chunk arrives well before
the last: not all at once) and a client leaving mid-stream leaves the server healthy; a LoRA sampler checkpoint as the model; logprobs equal Tinker's
compute_logprobs on the same tokens (|diff| <= 1e-4, the same sampler on the same
device); bad requests are OpenAI-shaped 400s naming the param; tenant B gets 404 on
tenant A's checkpoint."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from conftest import REPO, Server, service_client

openai = pytest.importorskip("openai")

MODEL = "twinkle/oai-qwen3"
PLAIN = "twinkle/oai-no-template"
NOTOK = "twinkle/oai-no-tokenizer"
NOEOS = "twinkle/oai-no-eos"  # MODEL without an eos_token_id: it decodes until max_tokens
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = ["The quick brown fox jumps over the lazy dog.", "Say the number three in words: three.",
          "user assistant system\n\n You are a helpful assistant.", "0123456789 + - * / = ( ) . , ? !",
          "Hello, how are you today? I am fine, thank you."] * 8
LP_TOL = 1e-4


def _make_models(root: Path) -> dict[str, Path]:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    src = REPO / "tests" / "parity" / "fixtures" / "qwen3" / "model"
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    assert tok.get_vocab_size() <= 1000
    im_end = tok.token_to_id("<|im_end|>")
    template = (REPO / "tests" / "chat" / "templates" / "qwen2.5.jinja").read_text()
    out = {}
    for name, with_template, with_tok in ((MODEL, True, True), (PLAIN, False, True), (NOTOK, False, False),
                                          (NOEOS, True, True)):
        d = root / name.split("/")[1]
        d.mkdir(parents=True)
        shutil.copy(src / "model.safetensors", d / "model.safetensors")
        if with_tok:
            tok.save(str(d / "tokenizer.json"))
        tc = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
              "bos_token": None, "model_max_length": 4096}
        if with_template:
            tc["chat_template"] = template
        (d / "tokenizer_config.json").write_text(json.dumps(tc))
        cfg = json.loads((src / "config.json").read_text())
        cfg.update(max_position_embeddings=4096, eos_token_id=im_end)
        if name == NOEOS:
            del cfg["eos_token_id"]  # and no generation_config.json: no stop token at all
        (d / "config.json").write_text(json.dumps(cfg))
        out[name] = d
    return out


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    root = tmp_path_factory.mktemp("oai")
    dirs = _make_models(root / "models")
    args = ["--seq-timeout", "30"]
    for name, d in dirs.items():
        args += ["--model", f"{d}={name}"]
    srv = Server(root / "data", args, log_path=root / "serve.log")
    url = f"http://127.0.0.1:{srv.port}"
    # tenant A trains a LoRA adapter a little and saves it for sampling
    from tinker import types

    sc = service_client(url, key="tml-alice")
    tc = sc.create_lora_training_client(base_model=MODEL, rank=8, seed=3)
    ids = list(range(10, 60))
    datum = types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                        loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)})
    for _ in range(3):
        tc.forward_backward([datum], "cross_entropy").result(timeout=120)
        tc.optim_step(types.AdamParams(learning_rate=5e-2)).result(timeout=120)
    path = tc.save_weights_for_sampler("oai-ckpt").result(timeout=120).path
    yield {"url": url, "srv": srv, "dirs": dirs, "sc": sc, "tc": tc, "path": path}
    srv.stop()  # SIGTERM: a clean shutdown (the sanitizer build checks for leaks here)
    assert srv.proc.returncode == 0, srv.log_text()[-3000:]


def client(ctx, key="tml-alice"):
    return openai.OpenAI(base_url=ctx["url"] + "/v1", api_key=key, max_retries=0, timeout=120)


def err_body(e) -> dict:
    body = e.body if isinstance(e.body, dict) else {}
    return body.get("error", body)


def test_models_list_base_and_own_checkpoints(ctx):
    ids = [m.id for m in client(ctx).models.list()]
    assert MODEL in ids and PLAIN in ids and NOTOK in ids
    assert ctx["path"] in ids, ids
    other = [m.id for m in client(ctx, "tml-bob").models.list()]
    assert ctx["path"] not in other and MODEL in other


def test_completion(ctx):
    from tokenizers import Tokenizer

    r = client(ctx).completions.create(model=MODEL, prompt="The quick brown", max_tokens=12, temperature=0)
    ch = r.choices[0]
    assert isinstance(ch.text, str) and ch.finish_reason in ("stop", "length")
    tok = Tokenizer.from_file(str(ctx["dirs"][MODEL] / "tokenizer.json"))
    prompt_ids = tok.encode("The quick brown").ids
    assert r.usage.prompt_tokens == len(prompt_ids)
    gen = ch.model_extra["token_ids"]
    assert r.usage.completion_tokens == len(gen) and 1 <= len(gen) <= 12
    assert ch.text == tok.decode(gen, skip_special_tokens=True)
    # greedy: the same request gives the same text
    again = client(ctx).completions.create(model=MODEL, prompt="The quick brown", max_tokens=12, temperature=0)
    assert again.choices[0].text == ch.text


def test_chat_completion_applies_the_template(ctx):
    from transformers import AutoTokenizer

    msgs = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Say the number three in words."}]
    r = client(ctx).chat.completions.create(model=MODEL, messages=msgs, max_tokens=10, temperature=0)
    hf = AutoTokenizer.from_pretrained(str(ctx["dirs"][MODEL]))
    want = hf.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
    if isinstance(want, dict) or hasattr(want, "input_ids"):
        want = want["input_ids"]
    assert r.usage.prompt_tokens == len(want)
    assert r.choices[0].message.role == "assistant" and isinstance(r.choices[0].message.content, str)
    # content given as text parts is the same prompt
    parts = [{"role": m["role"], "content": [{"type": "text", "text": m["content"]}]} for m in msgs]
    r2 = client(ctx).chat.completions.create(model=MODEL, messages=parts, max_tokens=10, temperature=0)
    assert r2.choices[0].message.content == r.choices[0].message.content


def test_streaming_equals_whole(ctx):
    msgs = [{"role": "user", "content": "Hello, how are you today?"}]
    c = client(ctx)
    whole = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=24, temperature=1.0, seed=7, n=2)
    stream = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=24, temperature=1.0, seed=7, n=2,
                                       stream=True, stream_options={"include_usage": True})
    texts, finish, n_chunks, usage = {0: "", 1: ""}, {}, 0, None
    for ev in stream:
        if ev.usage:
            usage = ev.usage
        for ch in ev.choices:
            n_chunks += 1
            texts[ch.index] += ch.delta.content or ""
            if ch.finish_reason:
                finish[ch.index] = ch.finish_reason
    for i in (0, 1):
        assert texts[i] == whole.choices[i].message.content
        assert finish[i] == whole.choices[i].finish_reason
    assert n_chunks > 4 and usage.completion_tokens == whole.usage.completion_tokens
    print(f"stream: {n_chunks} chunks, texts {[len(t) for t in texts.values()]} chars")
    # completions stream too
    w = c.completions.create(model=MODEL, prompt="Hello", max_tokens=16, seed=5, temperature=1.0)
    s = "".join(ev.choices[0].text for ev in c.completions.create(model=MODEL, prompt="Hello", max_tokens=16, seed=5,
                                                                temperature=1.0, stream=True) if ev.choices)
    assert s == w.choices[0].text


def test_streaming_is_incremental(ctx):
    """Events leave while decoding: the first content chunk arrives well before the stream ends
    (when all events were built at the end, they arrived together), and the chunks still
    concatenate to the non-streamed text. The model has no stop token (NOEOS) and the request no
    stop string, so it always decodes all max_tokens: there is always a spread to see."""
    import time

    c = client(ctx)
    msgs = [{"role": "user", "content": "Tell me a long story."}]
    kw = dict(model=NOEOS, messages=msgs, max_tokens=400, temperature=1.0, seed=13)
    whole = c.chat.completions.create(**kw)
    t0 = time.monotonic()
    arrivals, text = [], ""
    for ev in c.chat.completions.create(stream=True, **kw):
        for ch in ev.choices:
            if ch.delta.content:
                arrivals.append(time.monotonic() - t0)
                text += ch.delta.content
    assert text == whole.choices[0].message.content
    n_gen = whole.usage.completion_tokens
    print(f"incremental: {len(arrivals)} content chunks for {n_gen} tokens; first at {arrivals[0]:.3f} s, "
          f"last at {arrivals[-1]:.3f} s")
    assert n_gen == 400 and whole.choices[0].finish_reason == "length", (n_gen, whole.choices[0].finish_reason)
    assert len(arrivals) >= 2
    assert arrivals[0] < 0.75 * arrivals[-1], arrivals[:3] + arrivals[-3:]  # together (ratio ~1) before


def test_client_leaving_mid_stream_leaves_the_server_healthy(ctx):
    c = client(ctx)
    msgs = [{"role": "user", "content": "Tell me a long story."}]
    for _ in range(3):
        stream = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=400, temperature=1.0, stream=True)
        next(iter(stream))
        stream.close()  # the connection goes away while the server still decodes
    r = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=8, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length")
    assert ctx["srv"].proc.poll() is None


def test_stop_string_cuts_the_text(ctx):
    c = client(ctx)
    base = c.completions.create(model=MODEL, prompt="The", max_tokens=30, temperature=0)
    text = base.choices[0].text
    if len(text.strip()) < 3:
        pytest.skip(f"greedy text too short to pick a stop string: {text!r}")
    stop = text.strip()[1:3]
    r = c.completions.create(model=MODEL, prompt="The", max_tokens=30, temperature=0, stop=[stop])
    assert r.choices[0].text == text[:text.index(stop)] and r.choices[0].finish_reason == "stop"


def _logprob_check(ctx, model, sampling_client):
    from tinker import types

    c = client(ctx)
    prompt = [11, 12, 13, 14, 15, 16, 17]
    r = c.completions.create(model=model, prompt=prompt, max_tokens=12, temperature=1.0, seed=11, logprobs=3)
    ch = r.choices[0]
    gen = ch.model_extra["token_ids"]
    got = ch.logprobs.token_logprobs
    assert len(got) == len(gen)
    ref = sampling_client.compute_logprobs(types.ModelInput.from_ints(prompt + gen)).result(timeout=120)
    ref = ref[len(prompt):]
    err = max(abs(a - b) for a, b in zip(got, ref))
    print(f"{model}: {len(gen)} tokens, max |openai logprob - compute_logprobs| = {err:.2e} (tol {LP_TOL})")
    assert err <= LP_TOL
    for k, tops in enumerate(ch.logprobs.top_logprobs):  # the sampled token never beats the best alternative
        assert len(tops) >= 1 and max(tops.values()) >= got[k] - LP_TOL
    # chat's logprobs: entries per token with sorted top_logprobs
    rc = c.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=6,
                                   temperature=1.0, seed=2, logprobs=True, top_logprobs=4)
    content = rc.choices[0].logprobs.content
    assert len(content) == rc.usage.completion_tokens
    for e in content:
        lps = [t.logprob for t in e.top_logprobs]
        assert len(lps) == 4 and lps == sorted(lps, reverse=True) and lps[0] >= e.logprob - LP_TOL
    return gen


def test_logprobs_equal_compute_logprobs_base(ctx):
    _logprob_check(ctx, MODEL, ctx["sc"].create_sampling_client(base_model=MODEL))


def test_lora_checkpoint_as_the_model(ctx):
    path = ctx["path"]
    gen_lora = _logprob_check(ctx, path, ctx["sc"].create_sampling_client(model_path=path))
    # the adapter changes the model: greedy continuations of the trained sequence differ from the base's
    c = client(ctx)
    prompt = list(range(10, 30))
    a = c.completions.create(model=path, prompt=prompt, max_tokens=8, temperature=0).choices[0].model_extra["token_ids"]
    b = c.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0).choices[0].model_extra["token_ids"]
    print(f"greedy after the trained prefix: lora {a}, base {b}; sampled {len(gen_lora)} tokens")
    assert a != b
    r = c.chat.completions.create(model=path, messages=[{"role": "user", "content": "Hello"}], max_tokens=5)
    assert r.model == path and r.choices[0].message.content is not None


@pytest.mark.parametrize("kw,param", [
    ({"temperature": 5}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"n": 0}, "n"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 1 << 20}, "max_tokens"),
    ({"top_logprobs": 3}, "top_logprobs"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"presence_penalty": 0.5}, "presence_penalty"),
    ({"messages": []}, "messages"),
    ({"messages": [{"content": "no role"}]}, "messages"),
])
def test_bad_chat_requests_are_openai_400s(ctx, kw, param):
    args = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, **kw}
    with pytest.raises(openai.BadRequestError) as ei:
        client(ctx).chat.completions.create(**args)
    e = err_body(ei.value)
    assert e["param"] == param and e["type"] == "invalid_request_error" and e["message"], e
    assert set(e) >= {"message", "type", "param", "code"}


def test_bad_completion_requests(ctx):
    c = client(ctx)
    for kw, param in (({"prompt": [5, 99999]}, "prompt"), ({"prompt": {"x": 1}}, "prompt"),
                      ({"prompt": "x", "logprobs": 9}, "logprobs"), ({"prompt": "x", "echo": True}, "echo")):
        with pytest.raises(openai.BadRequestError) as ei:
            c.completions.create(model=MODEL, max_tokens=2, **kw)
        assert err_body(ei.value)["param"] == param, (kw, err_body(ei.value))
    with pytest.raises(openai.NotFoundError) as ei:
        c.completions.create(model="no/such-model", prompt="x", max_tokens=2)
    e = err_body(ei.value)
    assert e["param"] == "model" and e["code"] == "model_not_found", e


def test_missing_template_or_tokenizer_is_named(ctx):
    c = client(ctx)
    with pytest.raises(openai.BadRequestError) as ei:
        c.chat.completions.create(model=PLAIN, messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
    assert "chat_template" in err_body(ei.value)["message"] and err_body(ei.value)["param"] == "model"
    assert c.completions.create(model=PLAIN, prompt="Hi", max_tokens=2).choices[0].text is not None
    for call in (lambda: c.completions.create(model=NOTOK, prompt="Hi", max_tokens=2),
                 lambda: c.chat.completions.create(model=NOTOK, messages=[{"role": "user", "content": "Hi"}])):
        with pytest.raises(openai.BadRequestError) as ei:
            call()
        assert "tokenizer.json" in err_body(ei.value)["message"], err_body(ei.value)


def test_tenant_b_cannot_use_tenant_a_checkpoint(ctx):
    with pytest.raises(openai.NotFoundError) as ei:
        client(ctx, "tml-bob").chat.completions.create(model=ctx["path"], messages=[{"role": "user", "content": "Hi"}],
                                                       max_tokens=2)
    e = err_body(ei.value)
    assert e["param"] == "model" and e["type"] == "not_found_error", e
    with pytest.raises(openai.AuthenticationError):
        client(ctx, "not-a-key").models.list()


def test_get_tokenizer_offline(ctx, monkeypatch):
    from tokenizers import Tokenizer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    info = ctx["tc"].get_info()
    assert Path(info.model_data.tokenizer_id) == ctx["dirs"][MODEL].resolve()
    hf = ctx["tc"].get_tokenizer()
    ref = Tokenizer.from_file(str(ctx["dirs"][MODEL] / "tokenizer.json"))
    text = "Hello, how are you today? <|im_end|>"
    assert hf.encode(text, add_special_tokens=False) == ref.encode(text, add_special_tokens=False).ids


def test_raw_http_errors_are_openai_shaped(ctx):
    import urllib.error
    import urllib.request

    def call(method, path, body=None, key="tml-alice"):
        req = urllib.request.Request(ctx["url"] + path, data=body, method=method,
                                     headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    for method, path, body, status in (("POST", "/v1/chat/completions", b"{not json", 400),
                                       ("POST", "/v1/completions", b'{"model": 5}', 400),
                                       ("GET", "/v1/chat/completions", None, 405),
                                       ("POST", "/v1/embeddings", b"{}", 404)):
        got, j = call(method, path, body)
        assert got == status, (path, got, j)
        assert set(j["error"]) == {"message", "type", "param", "code"} and j["error"]["message"], j
    got, j = call("GET", "/v1/models", key="nope")
    assert got == 401 and j["error"]["type"] == "authentication_error"
