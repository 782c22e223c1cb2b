#!/usr/bin/env python3
"""Writes the seed corpora of tests/fuzz (corpus/NAME/*): small valid inputs of each
format plus the regression inputs of bugs found (those are added by hand, named
regress-*, and kept when this script is rerun). Only the standard library."""
from __future__ import annotations

import json
import struct
from pathlib import Path

HERE = Path(__file__).resolve().parent


def put(name: str, file: str, data: bytes | str):
    d = HERE / "corpus" / name
    d.mkdir(parents=True, exist_ok=True)
    (d / file).write_bytes(data.encode() if isinstance(data, str) else data)


# ---- HTTP: byte 0 = how the stream is split (>= 0x80: in one piece) ----
def http_seeds():
    one, split = b"\x80", b"\x07"
    seeds = {
        "get": one + b"GET /x?a=1 HTTP/1.1\r\nHost: x\r\n\r\n",
        "post": split + b"POST /echo HTTP/1.1\r\nHost: x\r\nX-API-Key: tml-fuzz\r\nContent-Length: 5\r\n\r\nhello",
        "chunked-trailer": split + b"POST /c HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n"
                                   b"6;ext=1\r\n world\r\n0\r\nX-Trailer: t\r\nX-API-Key: tml-fuzz\r\n\r\n",
        "pipeline-park": one + b"GET /park HTTP/1.1\r\n\r\nGET /zombie HTTP/1.1\r\n\r\nGET /a HTTP/1.1\r\n\r\n"
                               b"POST /never HTTP/1.1\r\nContent-Length: 2\r\n\r\nhiGET /b HTTP/1.1\r\n\r\n",
        "keepalive-leak": one + b"GET /api/v1/sessions HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"p" * 40 +
                          b"\r\nX-API-Key: tml-alice-secret-7f3a\r\n\r\nGET /api/v1/sessions?" + b"b" * 26 +
                          b" HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX-API-Key: tml-\r\n\r\n",
        "trailer-crash": one + b"POST /\nTransfer-Encoding:chunked\n\n0\r\nT:\n\n",
        "trailer-crash-11": one + b"POST / HTTP/1.1\nTransfer-Encoding:chunked\n\n0\r\nT:\n\n",
        "http10": split + b"GET /a HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /b HTTP/1.0\r\n\r\n",
        "expect-head": split + b"POST /e HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\ndata"
                               b"HEAD /h HTTP/1.1\r\n\r\nDELETE /empty HTTP/1.1\r\n\r\n",
        "close": one + b"GET /last HTTP/1.1\r\nConnection: close\r\n\r\nGET /never HTTP/1.1\r\n\r\n",
        "traversal": one + b"GET /whatever/../x/api/v1/training_runs HTTP/1.1\r\n\r\n",
        "encoded": one + b"GET /a/%2e%2E/b%2fc HTTP/1.1\r\n\r\n",
        "version": one + b"GET /x HTTP/9.9\r\n\r\n",
        "chunk-huge": one + b"POST /c HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n8000000000000000\r\n",
        "empty-value": split + b"GET /x HTTP/1.1\r\nX-A:\r\nX-B: \r\nX-API-Key: tml-fuzz\r\n\r\n",
        "upgrade": one + b"GET /x HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
    }
    for k, v in seeds.items():
        put("http", k, v)


# ---- protobuf (server/tinker.proto) ----
def varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        out += bytes([b | (0x80 if n else 0)])
        if not n:
            return out


def field(num: int, wire: int, payload: bytes) -> bytes:
    key = varint((num << 3) | wire)
    return key + (varint(len(payload)) + payload if wire == 2 else payload)


def ld(num, payload):
    return field(num, 2, payload)


def vi(num, n):
    return field(num, 0, varint(n))


def f64(num, x):
    return field(num, 1, struct.pack("<d", x))


def tensor_dense(vals, dtype, shape=None):
    fmt = "<%d%s" % (len(vals), "f" if dtype == 1 else "q")
    t = ld(1, struct.pack(fmt, *vals)) + vi(3, dtype)
    for s in shape or []:
        t += vi(4, s)
    return t


def tensor_csr(rows, cols, entries, dtype=1):
    # entries: {(r, c): v} with increasing columns per row
    vals, crow, col = [], [0], []
    for r in range(rows):
        for c in sorted(c for (rr, c) in entries if rr == r):
            vals.append(entries[(r, c)])
            col.append(c)
        crow.append(len(col))
    fmt = "f" if dtype == 1 else "q"
    csr = ld(1, struct.pack("<%d%s" % (len(vals), fmt), *vals)) + ld(2, struct.pack("<%dq" % len(crow), *crow)) + \
        ld(3, struct.pack("<%dq" % len(col), *col))
    return ld(2, csr) + vi(3, dtype) + vi(4, rows) + vi(4, cols)


def datum(tokens, inputs):
    d = ld(1, ld(1, ld(1, struct.pack("<%di" % len(tokens), *tokens))))
    for k, t in inputs.items():
        d += ld(2, ld(1, k.encode()) + ld(2, t))
    return d


def fb_request(data, loss="cross_entropy", cfg=None, cfg2=None, forward_only=False, model="run-1", seq=1):
    m = ld(1, model.encode()) + vi(2, seq) + ld(4, loss.encode())
    for d in data:
        m += ld(3, d)
    for k, v in (cfg or {}).items():
        m += ld(5, ld(1, k.encode()) + f64(2, v))
    if forward_only:
        m += vi(6, 1)
    for k, v in (cfg2 or {}).items():
        val = f64(1, v) if isinstance(v, float) else ld(2, v.encode())
        m += ld(7, ld(1, k.encode()) + ld(2, val))
    return m


def wire_seeds():
    toks = [5, 6, 7, 8]
    ce = datum(toks, {"target_tokens": tensor_dense([6, 7, 8, 9], 2), "weights": tensor_dense([0, 1, 1, 1], 1)})
    put("wire", "ce", fb_request([ce, ce]))
    rl = datum(toks, {"target_tokens": tensor_dense([6, 7, 8, 9], 2), "logprobs": tensor_dense([-1, -2, -3, -4], 1),
                      "advantages": tensor_dense([1, 1, -1, 0.5], 1)})
    put("wire", "ppo-config", fb_request([rl], "ppo", cfg={"clip_low_threshold": 0.8}, cfg2={"kl_beta": 0.04,
                                                                                             "mode": "x"}))
    topk = datum(toks, {"target_tokens": tensor_dense([6, 7, 8, 9, 1, 2, 3, 4], 2, [4, 2]),
                        "weights": tensor_dense([1] * 8, 1, [4, 2])})
    put("wire", "topk-2d", fb_request([topk], forward_only=True))
    sparse = datum(toks, {"target_tokens": tensor_csr(4, 3, {(0, 0): 6, (1, 2): 7, (3, 1): 9}, 2),
                          "weights": tensor_csr(4, 3, {(0, 0): 1.0, (2, 2): 0.5})})
    put("wire", "sparse", fb_request([sparse], "cross_entropy"))
    put("wire", "image-chunk", ld(1, b"m") + ld(4, b"cross_entropy") + ld(3, ld(1, ld(2, ld(1, b"\x89PNG") +
                                                                                      ld(2, b"png")))))


# ---- JSON endpoints: byte 0 picks the endpoint (fuzz_json.c's tables) ----
POST = ["create_session", "session_heartbeat", "create_model", "get_info", "unload_model", "optim_step",
        "save_weights", "save_weights_for_sampler", "load_weights", "weights_info", "retrieve_future",
        "create_sampling_session", "asample", "forward_backward", "telemetry", "client/config",
        "create_training_client_from_state"]
REST = ["GET training_runs", "GET training_runs/$M", "GET training_runs/$M/checkpoints", "GET sessions",
        "GET sessions/$S", "GET checkpoints", "GET samplers/$P", "GET get_server_capabilities",
        "DELETE training_runs/$M/checkpoints/", "PUT training_runs/$M/checkpoints/",
        "POST training_runs/$M/checkpoints/", "POST sessions/$S/"]


def json_seeds():
    def post(route, body):
        put("json", "post-" + route.replace("/", "_"), bytes([POST.index(route)]) + json.dumps(body).encode())

    post("create_session", {"tags": ["a"], "user_metadata": {"k": "v"}, "sdk_version": "0.38.0",
                            "type": "create_session"})
    post("session_heartbeat", {"session_id": "$S", "type": "session_heartbeat"})
    post("create_model", {"session_id": "$S", "model_seq_id": 3, "base_model": "twinkle/tiny-qwen3",
                          "lora_config": {"rank": 2, "seed": 1, "train_mlp": False, "train_unembed": True},
                          "user_metadata": {"x": 1}})
    post("get_info", {"model_id": "$M", "type": "get_info"})
    post("unload_model", {"model_id": "nope", "type": "unload_model"})
    post("optim_step", {"model_id": "$M", "seq_id": 1, "adam_params": {"learning_rate": 0.001, "beta1": 0.9,
                                                                       "beta2": 0.95, "eps": 1e-12,
                                                                       "weight_decay": 0.0, "grad_clip_norm": 1.0}})
    post("save_weights", {"model_id": "$M", "seq_id": 2, "path": "step-1", "ttl_seconds": 60})
    post("save_weights_for_sampler", {"model_id": "$M", "seq_id": 3, "sampling_session_seq_id": 1})
    post("load_weights", {"model_id": "$M", "seq_id": 4, "path": "tinker://$M/weights/step-1", "optimizer": True})
    post("weights_info", {"tinker_path": "tinker://$M/weights/step-1"})
    post("retrieve_future", {"request_id": "1"})
    post("create_sampling_session", {"session_id": "$S", "sampling_session_seq_id": 2,
                                     "model_path": "tinker://$M/sampler_weights/s"})
    post("asample", {"sampling_session_id": "$P", "seq_id": 1, "num_samples": 2,
                     "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 2, 3]}]},
                     "sampling_params": {"max_tokens": 4, "temperature": 0.7, "top_k": 5, "top_p": 0.9,
                                         "stop": [3], "seed": 1},
                     "prompt_logprobs": True, "topk_prompt_logprobs": 2})
    post("asample", {"sampling_session_id": "$P", "num_samples": 1,
                     "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1]}]},
                     "sampling_params": {"max_tokens": 2, "stop": ["ab", "c"]}})
    post("telemetry", {"events": []})
    post("create_training_client_from_state", {"session_id": "$S", "model_seq_id": 9,
                                               "path": "tinker://$M/weights/step-1"})
    for i, r in enumerate(REST):
        tail = {"PUT": "weights/step-1/ttl\n{\"ttl_seconds\": 10}",
                "DELETE": "weights/step-1\n", "POST": "publish\n"}.get(r.split()[0], "?limit=5&offset=0\n")
        if r.endswith("sessions/$S/"):
            tail = "finish\n{}"
        put("json", "rest-%02d" % i, bytes([len(POST) + i]) + tail.encode())


# ---- safetensors ----
def st_file(tensors: dict, meta=None, pad=0) -> bytes:
    h, data = {}, b""
    for name, (dtype, shape, raw) in tensors.items():
        h[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    if meta is not None:
        h["__metadata__"] = meta
    hj = json.dumps(h).encode() + b" " * pad
    return struct.pack("<Q", len(hj)) + hj + data


def safetensors_seeds():
    put("safetensors", "f32", st_file({"a": ("F32", [2, 2], struct.pack("<4f", 1, 2, 3, 4))}, {"format": "pt"}))
    put("safetensors", "mixed", st_file({"w": ("BF16", [3], b"\x80\x3f\x00\x40\x40\x40"),
                                         "h": ("F16", [1, 2], b"\x00\x3c\x00\xc0"),
                                         "i": ("I64", [1], struct.pack("<q", 7)),
                                         "j": ("I32", [2], struct.pack("<2i", 1, 2)),
                                         "b": ("BOOL", [1], b"\x01"), "e": ("F32", [0], b"")}))
    put("safetensors", "scalar-padded", st_file({"s": ("F32", [], struct.pack("<f", 3))}, pad=6))


# ---- config.json (+ NUL + generation_config.json) ----
def hf_config_seeds():
    base = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 512, "hidden_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
            "intermediate_size": 384, "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
            "max_position_embeddings": 4096, "eos_token_id": 1}
    put("hf_config", "qwen3", json.dumps(base))
    llama = dict(base, architectures=["LlamaForCausalLM"], model_type="llama", attention_bias=True,
                 eos_token_id=[1, 2], rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                    "high_freq_factor": 4.0,
                                                    "original_max_position_embeddings": 64})
    put("hf_config", "llama3-gen", json.dumps(llama).encode() + b"\0" + json.dumps({"eos_token_id": [2, 3]}).encode())
    qwen2 = dict(base, architectures=["Qwen2ForCausalLM"], model_type="qwen2", rope_scaling=None,
                 tie_word_embeddings=False, rope_parameters={"rope_type": "linear", "factor": 2.0,
                                                             "rope_theta": 1e6})
    put("hf_config", "qwen2", json.dumps(qwen2))


# ---- tokenizer.json ----
def tokenizer_seeds():
    bytelevel = {"version": "1.0", "added_tokens": [{"id": 6, "content": "<|end|>", "special": True,
                                                     "single_word": False, "lstrip": False, "rstrip": False,
                                                     "normalized": False}],
                 "normalizer": None, "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False,
                                                       "trim_offsets": True, "use_regex": False},
                 "decoder": {"type": "ByteLevel"},
                 "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "Ġ": 2, "ab": 3, "Ġab": 4, "é": 5},
                           "merges": ["a b", "Ġ ab"]}}
    put("tokenizer", "bytelevel", json.dumps(bytelevel))
    sp = {"version": "1.0", "added_tokens": [{"id": 0, "content": "<unk>", "special": True}],
          "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"},
                                                              {"type": "Replace", "pattern": {"String": " "},
                                                               "content": "▁"}]},
          "decoder": {"type": "Sequence", "decoders": [
              {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"},
              {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
          "model": {"type": "BPE", "byte_fallback": True, "vocab": {"<unk>": 0, "<0x41>": 1, "▁": 2, "h": 3,
                                                                     "i": 4, "hi": 5, "▁hi": 6},
                    "merges": [["h", "i"], ["▁", "hi"]]}}
    put("tokenizer", "sentencepiece", json.dumps(sp))
    meta = {"version": "1.0", "added_tokens": [],
            "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": True},
            "decoder": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True},
            "model": {"type": "BPE", "vocab": {"▁": 0, "x": 1, "▁x": 2}, "merges": ["▁ x"]}}
    put("tokenizer", "metaspace", json.dumps(meta))


# ---- adapter folder: adapter_config.json NUL adapter_model.safetensors (fuzz_adapter.c's model) ----
def adapter_seeds():
    hidden, q, kv, ffn, r = 32, 32, 16, 64, 4
    dims = {"self_attn.q_proj": (hidden, q), "self_attn.k_proj": (hidden, kv), "self_attn.v_proj": (hidden, kv),
            "self_attn.o_proj": (q, hidden), "mlp.gate_proj": (hidden, ffn), "mlp.up_proj": (hidden, ffn),
            "mlp.down_proj": (ffn, hidden)}
    tensors = {}
    for mod, (din, dout) in dims.items():
        p = "base_model.model.model.layers.0.%s." % mod
        tensors[p + "lora_A.weight"] = ("F32", [r, din], struct.pack("<%df" % (r * din), *([0.01] * (r * din))))
        tensors[p + "lora_B.weight"] = ("F32", [dout, r], struct.pack("<%df" % (r * dout), *([0.0] * (r * dout))))
    cfg = {"peft_type": "LORA", "r": r, "lora_alpha": 32, "target_modules": [m.split(".")[1] for m in dims],
           "base_model_name_or_path": "tiny", "bias": "none", "task_type": "CAUSAL_LM"}
    put("adapter", "full", json.dumps(cfg).encode() + b"\0" + st_file(tensors, {"format": "pt"}))
    attn = {k: v for k, v in tensors.items() if "self_attn" in k}
    cfg2 = dict(cfg, target_modules="all-linear")
    put("adapter", "attn-only", json.dumps(cfg2).encode() + b"\0" + st_file(attn))


if __name__ == "__main__":
    http_seeds()
    wire_seeds()
    json_seeds()
    safetensors_seeds()
    hf_config_seeds()
    tokenizer_seeds()
    adapter_seeds()
