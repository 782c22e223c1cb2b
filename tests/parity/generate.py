#!/usr/bin/env python3
"""Generate (or verify against) the Hugging Face / PEFT parity fixtures for twinkle.

Generate mode (default)
-----------------------
    /work/venvs/parity/bin/python tests/parity/generate.py [--out DIR] [--only NAME ...]

Builds the tiny random Hugging Face causal LMs of MODELS on the CPU in float32 with fixed
seeds (llama: sharded f32, llama3 rope scaling; qwen2: bf16 on disk, tied
embeddings, q/k/v biases; qwen3: f32, q_norm/k_norm, head_dim != hidden/heads,
LoRA on lm_head; mistral, gemma2, gemma3: sliding windows, soft-caps; the mixtures of
experts qwen3_moe, mixtral, qwen2_moe: LoRA on the experts as PEFT's target_parameters,
the router, a shared expert; all through the one generate_one path), saves each as an HF
folder plus a PEFT LoRA adapter, and records
reference numbers (logprobs, loss, LoRA gradients, full-model gradients for qwen3,
and LoRA tensors after 3 clipped-AdamW steps) in
``tests/parity/fixtures/<model>/expected.safetensors`` and ``expected.json``.
The reference numbers are float64 computations (model, PEFT, softmax, RoPE cos/sin,
loss, backward, clipping, AdamW) from the float32 weights and LoRA values cast
exactly to float64 (rope inv_freq keeps the float32 values transformers computes),
rounded once to float32 for storage; ``float64_compute`` checks op by op that no
float32 tensor is involved.
It also records decoding references for the sampler in
``tests/parity/fixtures/<model>/generate.safetensors`` (section "generate" of
``expected.json``): greedy KV-cache decoding with ``model.generate`` of 3 prompts (1, 6
and 11 tokens, seed chosen so that no top-1/top-2 logit gap is below 1e-3), the
per-step logprobs and gaps, and prompt logprobs with top-4 rows, for the float32 model
as transformers loads it from ``model/`` with and without ``peft_adapter/`` (float32
computations, log_softmax in float64).
The output is deterministic: re-running it produces byte-identical files.

Verify mode
-----------
    /work/venvs/parity/bin/python tests/parity/generate.py --verify MODEL ADAPTER_DIR [LOGPROBS_FILE]

MODEL is a fixture name (llama, qwen2, qwen3) or the path of a fixture folder
(the one holding ``model/`` and ``expected.safetensors``). The model in
``MODEL/model`` is loaded with transformers in float32, the adapter in
ADAPTER_DIR is applied with ``peft.PeftModel.from_pretrained``, and the logprobs of
the fixture's packed batch (``tokens``/``targets``/``positions``/``seg_start``
from ``expected.safetensors``) are computed, one sequence at a time.
They are compared with LOGPROBS_FILE when given, else with the fixture's
``logprobs`` tensor (which belongs to the fixture's own initial adapter,
``MODEL/peft_adapter``; like every reference number it is a float64 computation, which a float32
PEFT run reproduces to ~2e-6). LOGPROBS_FILE may be a ``.safetensors`` file (tensor
``logprobs``), a ``.npy`` file, or raw little-endian float32 values. The max abs
difference is printed; the exit status is 1 when it exceeds 1e-4 (``--tol``), 0
otherwise. It also fails when the LoRA keys of the file are not exactly the names
PEFT itself writes for the modules that adapter_config.json targets (a misnamed
key is at best remapped, at worst skipped by PEFT with only a warning, leaving
lora_B at zero). Only ``adapter_model.safetensors`` is checked
for keys; the adapter's ``adapter_config.json`` decides which modules get LoRA.
This is how an adapter written by twinkle is checked in PEFT.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import hashlib
import json
import math
import os
import shutil
import sys
import warnings
from pathlib import Path

import numpy as np
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "fixtures"

# --------------------------------------------------------------------------------------
# Fixture definitions
# --------------------------------------------------------------------------------------

LORA_R = 4
LORA_ALPHA = 8
LORA_BASE_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
LORA_B_STD = 0.05

ADAMW = {"lr": 1e-2, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}
# Clipping is active on every step (norms ~30-60) but clipped gradients stay far
# above AdamW eps, so tiny float32 differences in near-zero gradient entries are
# not amplified by the per-element normalisation (with 0.05 they were ~eps).
MAX_NORM = 2.0
ADAM_STEPS = 3

MODELS = {
    "llama": {
        "hf_class": "LlamaForCausalLM",
        "seed": 1001,
        "seq_lens": [7, 12, 5],
        "config": dict(
            vocab_size=1000,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            max_position_embeddings=256,
            rms_norm_eps=1e-5,
            rope_theta=500000.0,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
            tie_word_embeddings=False,
            attention_bias=False,
            mlp_bias=False,
            hidden_act="silu",
        ),
        "disk_dtype": "float32",
        "max_shard_size": "300KB",
        "lora_lm_head": False,
        "full_grad": False,
        "init": {"embed": 1.0, "lm_head": 0.2, "proj": 0.1, "bias": 0.1, "norm": 0.2},
    },
    "qwen2": {
        "hf_class": "Qwen2ForCausalLM",
        "seed": 2002,
        "seq_lens": [9, 4, 11],
        "config": dict(
            vocab_size=1031,
            hidden_size=64,
            intermediate_size=160,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
            rms_norm_eps=1e-6,
            rope_theta=1000000.0,
            tie_word_embeddings=True,
            use_sliding_window=False,
            hidden_act="silu",
        ),
        "disk_dtype": "bfloat16",
        "max_shard_size": None,
        "lora_lm_head": False,
        "full_grad": False,
        # tied: embed == lm_head, so the embedding std also sets the logit scale
        "init": {"embed": 0.25, "lm_head": None, "proj": 0.1, "bias": 0.1, "norm": 0.2},
    },
    "qwen3": {
        "hf_class": "Qwen3ForCausalLM",
        "seed": 3003,
        "seq_lens": [6, 13, 1, 8],
        "config": dict(
            vocab_size=1000,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=24,
            max_position_embeddings=256,
            rms_norm_eps=1e-6,
            rope_theta=1000000.0,
            tie_word_embeddings=False,
            attention_bias=False,
            use_sliding_window=False,
            hidden_act="silu",
        ),
        "disk_dtype": "float32",
        "max_shard_size": None,
        "lora_lm_head": True,
        "full_grad": True,
        "init": {"embed": 1.0, "lm_head": 0.2, "proj": 0.1, "bias": 0.1, "norm": 0.2},
    },
    # Mistral: Llama with a sliding window (5) shorter than two of the sequences and than the decoded ones
    "mistral": {
        "hf_class": "MistralForCausalLM",
        "seed": 4005,  # 4004: float32 transformers itself landed 3.5e-4 from its adam3 (near-zero gradient entries)
        "seq_lens": [7, 12, 5],
        "config": dict(
            vocab_size=1000,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            max_position_embeddings=256,
            rms_norm_eps=1e-5,
            rope_theta=10000.0,
            sliding_window=5,
            tie_word_embeddings=False,
            hidden_act="silu",
        ),
        "disk_dtype": "float32",
        "max_shard_size": None,
        "lora_lm_head": False,
        "full_grad": False,
        "init": {"embed": 1.0, "lm_head": 0.2, "proj": 0.1, "bias": 0.1, "norm": 0.2},
    },
    # Gemma 2: layer 0 local (window 4), layer 1 global; both soft-caps biting; query_pre_attn_scalar != head_dim
    "gemma2": {
        "hf_class": "Gemma2ForCausalLM",
        "seed": 5005,
        "seq_lens": [9, 4, 11],
        "config": dict(
            vocab_size=1000,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            max_position_embeddings=256,
            rms_norm_eps=1e-6,
            rope_theta=10000.0,
            sliding_window=4,
            query_pre_attn_scalar=24,
            attn_logit_softcapping=1.5,
            final_logit_softcapping=6.0,
            tie_word_embeddings=True,
            hidden_activation="gelu_pytorch_tanh",
        ),
        "disk_dtype": "float32",
        "max_shard_size": None,
        "lora_lm_head": False,
        "full_grad": False,
        # Gemma's norms scale by (1 + w): centred at 0; embeddings are multiplied by sqrt(64) = 8
        "init": {"embed": 0.25, "lm_head": None, "proj": 0.1, "bias": 0.1, "norm": 0.2, "norm_center": 0.0},
    },
    # Gemma 3 text: layers 0, 1 local (window 4, RoPE base 10000), layer 2 global (base 1e6, linear scaling x4)
    "gemma3": {
        "hf_class": "Gemma3ForCausalLM",
        "config_class": "Gemma3TextConfig",
        "seed": 6007,  # 6006: float32 transformers itself landed 4.9e-5 from its adam3 (near-zero gradient entries)
        "seq_lens": [6, 13, 1, 8],
        "config": dict(
            vocab_size=1000,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            max_position_embeddings=256,
            rms_norm_eps=1e-6,
            rope_parameters={
                "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1000000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            },
            sliding_window=4,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"],
            query_pre_attn_scalar=16,
            attn_logit_softcapping=None,
            final_logit_softcapping=None,
            tie_word_embeddings=True,
            hidden_activation="gelu_pytorch_tanh",
        ),
        "disk_dtype": "float32",
        "max_shard_size": None,
        "lora_lm_head": False,
        "full_grad": False,
        "init": {"embed": 0.25, "lm_head": None, "proj": 0.1, "bias": 0.1, "norm": 0.2, "norm_center": 0.0},
    },
    # Qwen3-MoE: 8 experts, top-2 renormalised, 2 layers; LoRA on the attention (lora_targets)
    "qwen3_moe": {
        "hf_class": "Qwen3MoeForCausalLM",
        "seed": 7007,
        "seq_lens": [7, 12, 5],
        "config": dict(
            vocab_size=1000,
            hidden_size=64,
            intermediate_size=128,
            moe_intermediate_size=48,
            num_experts=8,
            num_experts_per_tok=2,
            norm_topk_prob=True,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            max_position_embeddings=256,
            rms_norm_eps=1e-6,
            rope_theta=1000000.0,
            tie_word_embeddings=False,
            attention_bias=False,
            use_sliding_window=False,
            hidden_act="silu",
        ),
        "disk_dtype": "float32",
        "max_shard_size": None,
        "lora_lm_head": False,
        "lora_targets": ["q_proj", "k_proj", "v_proj", "o_proj"],
        "full_grad": False,
        "init": {"embed": 1.0, "lm_head": 0.2, "proj": 0.1, "bias": 0.1, "norm": 0.2, "router": 1.0},
    },
    # Mixtral: 4 experts, top-2 (always renormalised), experts' w1 / w3 / w2 and the router targeted by name:
    # PEFT turns them into target_parameters gate_up_proj (rank and alpha doubled) / down_proj / gate.weight
    "mixtral": {
        "hf_class": "MixtralForCausalLM",
        "seed": 8008,
        "seq_lens": [7, 12, 5],
        "config": dict(
            vocab_size=256,
            hidden_size=32,
            intermediate_size=16,
            num_local_experts=4,
            num_experts_per_tok=2,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=8,
            max_position_embeddings=256,
            rms_norm_eps=1e-5,
            rope_theta=1000000.0,
            sliding_window=None,
            tie_word_embeddings=False,
            hidden_act="silu",
        ),
        "disk_dtype": "float32",
        "max_shard_size": None,
        "lora_lm_head": False,
        "lora_targets": ["q_proj", "k_proj", "v_proj", "o_proj", "w1", "w2", "w3", "gate"],
        "full_grad": False,
        "init": {"embed": 1.0, "lm_head": 0.2, "proj": 0.1, "bias": 0.1, "norm": 0.2, "router": 1.0},
    },
    # Qwen2-MoE: 6 experts, top-2 not renormalised, a shared expert behind sigmoid(shared_expert_gate), layer 1
    # dense (mlp_only_layers). PEFT 0.21.2 does not convert qwen2_moe's target_modules (gate_proj / up_proj /
    # down_proj name only the shared expert and the dense MLP), so the experts are target_parameters, with
    # gate_up_proj at twice the rank and alpha as PEFT's own conversion writes it for Qwen3-MoE and Mixtral; the router as
    # target_parameters mlp.gate.weight (PEFT refuses target_modules "gate" on qwen2_moe)
    "qwen2_moe": {
        "hf_class": "Qwen2MoeForCausalLM",
        "seed": 9010,  # 9009: with the router adapted, the LoRA init put a top-2 router gap at 1.1e-4
        "seq_lens": [9, 4, 11],
        "config": dict(
            vocab_size=256,
            hidden_size=32,
            intermediate_size=32,
            moe_intermediate_size=16,
            shared_expert_intermediate_size=24,
            num_experts=6,
            num_experts_per_tok=2,
            norm_topk_prob=False,
            decoder_sparse_step=1,
            mlp_only_layers=[1],
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
            rms_norm_eps=1e-6,
            rope_theta=1000000.0,
            tie_word_embeddings=False,
            use_sliding_window=False,
            hidden_act="silu",
        ),
        "disk_dtype": "float32",
        "max_shard_size": None,
        "lora_lm_head": False,
        "lora_targets": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        "lora_target_parameters": ["mlp.experts.gate_up_proj", "mlp.experts.down_proj", "mlp.gate.weight"],
        "lora_rank_pattern": {r".*\.gate_up_proj": 2 * LORA_R},
        "lora_alpha_pattern": {r".*\.gate_up_proj": 2 * LORA_ALPHA},
        "full_grad": False,
        "init": {"embed": 1.0, "lm_head": 0.2, "proj": 0.1, "bias": 0.1, "norm": 0.2, "router": 1.0},
    },
}


# --------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------


def setup_torch():
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.set_default_dtype(torch.float32)


class _Float32RequestsToFloat64(TorchFunctionMode):
    """Turns every request for float32 made by the model code into float64: ``Tensor.float()``,
    ``.to(torch.float32)``, ``softmax(..., dtype=torch.float32)`` and so on. transformers upcasts to
    float32 in RMSNorm, RoPE (angles, cos, sin) and the eager attention softmax; with this mode active
    those run in float64 on a float64 model instead of rounding back to float32."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.float:
            func = torch.Tensor.double
        args = tuple(torch.float64 if a is torch.float32 else a for a in args)
        kwargs = {k: (torch.float64 if v is torch.float32 else v) for k, v in kwargs.items()}
        return func(*args, **kwargs)


class _Float64Audit(TorchDispatchMode):
    """Records every aten op (forward and backward) that reads or writes a floating tensor that is
    not float64."""

    def __init__(self):
        super().__init__()
        self.ops = 0
        self.bad = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.ops += 1
        for t in tree_leaves((args, kwargs, out)):
            if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64:
                key = f"{func} {t.dtype}"
                self.bad[key] = self.bad.get(key, 0) + 1
        return out


@contextlib.contextmanager
def float64_compute(what):
    """Everything inside runs in float64: float32 requests are promoted, the default dtype is float64
    (so e.g. the optimizer's step counter is float64 too), and it fails if any op touched a floating
    tensor of another dtype. Convert results to float32 only after leaving the block (inside it,
    ``.float()`` is a no-op)."""
    prev = torch.get_default_dtype()
    audit = _Float64Audit()
    torch.set_default_dtype(torch.float64)
    try:
        with _Float32RequestsToFloat64(), audit:
            yield
    finally:
        torch.set_default_dtype(prev)
    if audit.bad or audit.ops == 0:
        raise RuntimeError(f"{what}: not a pure float64 computation ({audit.ops} ops; "
                           f"non-float64 floating tensors: {audit.bad})")


def float64_copy(module):
    """Deep copy with every floating parameter and buffer cast to float64 (exact: float32 -> float64)."""
    return copy.deepcopy(module).double()


def worst_rel(a, b):
    """max over the keys of ||a[k] - b[k]|| / ||b[k]||, in float64."""
    return max(((a[k].double() - b[k].double()).norm() / b[k].double().norm()).item() for k in b)


def versions():
    import peft
    import safetensors
    import transformers

    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
        "safetensors": safetensors.__version__,
        "numpy": np.__version__,
    }


def hf_class(name):
    import transformers

    return getattr(transformers, name)


def config_class(spec):
    import transformers

    return getattr(transformers, spec.get("config_class") or spec["hf_class"].replace("ForCausalLM", "Config"))


def rotary_inv_freq(model, local=False):
    """The rotary inv_freq buffer: Gemma 3 keeps one per layer type (full / sliding attention)."""
    rot = model.model.rotary_emb
    if hasattr(rot, "full_attention_inv_freq"):
        return rot.sliding_attention_inv_freq if local else rot.full_attention_inv_freq
    assert not local
    return rot.inv_freq


@torch.no_grad()
def init_weights(model, gen, init):
    """Overwrite every parameter deterministically (named_parameters order)."""
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):  # all RMSNorms incl. q_norm/k_norm, final norm
            v = init.get("norm_center", 1.0) + init["norm"] * torch.randn(p.shape, generator=gen)
        elif name.endswith(".bias"):
            v = init["bias"] * torch.randn(p.shape, generator=gen)
        elif name == "model.embed_tokens.weight":
            v = init["embed"] * torch.randn(p.shape, generator=gen)
        elif name == "lm_head.weight":
            v = init["lm_head"] * torch.randn(p.shape, generator=gen)
        elif name.endswith("proj.weight") or name.endswith((".experts.gate_up_proj", ".experts.down_proj")):
            v = init["proj"] * torch.randn(p.shape, generator=gen)
        elif name.endswith((".mlp.gate.weight", ".block_sparse_moe.gate.weight", ".shared_expert_gate.weight")):
            v = init["router"] * torch.randn(p.shape, generator=gen)  # the router: spread logits, clear top-k gaps
        else:
            raise RuntimeError(f"no init rule for {name}")
        p.copy_(v)


def make_batch(seq_lens, vocab, gen):
    tokens, targets, positions, seg_start = [], [], [], []
    off = 0
    for L in seq_lens:
        seq = torch.randint(0, vocab, (L + 1,), generator=gen)
        tokens.append(seq[:-1])
        targets.append(seq[1:])
        positions.append(torch.arange(L))
        seg_start.append(torch.full((L,), off))
        off += L
    T = off
    w = torch.randn(T, generator=gen) * 0.8 + 0.5
    zero = torch.rand(T, generator=gen) < 0.2
    w[zero] = 0.0
    # guarantee both edge cases exist regardless of the draw
    w[1] = 0.0
    w[T - 2] = -abs(w[T - 2].item()) - 0.25
    assert (w == 0).any() and (w < 0).any() and (w > 0).any()
    cat = lambda xs: torch.cat(xs).to(torch.int32)
    return {
        "tokens": cat(tokens),
        "targets": cat(targets),
        "positions": cat(positions),
        "seg_start": cat(seg_start),
        "weights": w.to(torch.float32),
    }


def segments(batch):
    """(start, length) of each packed sequence, derived from seg_start."""
    ss = batch["seg_start"].tolist()
    starts = sorted(set(ss))
    T = len(ss)
    out = []
    for i, s in enumerate(starts):
        e = starts[i + 1] if i + 1 < len(starts) else T
        out.append((s, e - s))
    return out


def seq_logits(model, batch):
    """Per-sequence forward (batch 1, no padding, no mask); concatenated logits [T, V]."""
    outs = []
    for s, L in segments(batch):
        ids = batch["tokens"][s : s + L].long()[None]
        pos = batch["positions"][s : s + L].long()[None]
        out = model(input_ids=ids, position_ids=pos, use_cache=False)
        outs.append(out.logits[0])  # the model's dtype: float32, or float64 for a float64 copy
    return torch.cat(outs, 0)


def seq_logprobs(model, batch):
    logits = seq_logits(model, batch)
    lp = torch.log_softmax(logits, dim=-1)
    return lp.gather(-1, batch["targets"].long()[:, None])[:, 0]


def weighted_loss(logprobs, batch):
    # Tinker cross-entropy semantics: a SUM, weights never clamped.
    return -(batch["weights"].to(logprobs.dtype) * logprobs).sum()


ROUTING_MIN_GAP = 1e-4  # every token's k-th minus (k+1)-th router logit, every layer


@contextlib.contextmanager
def routing_gaps(model, k):
    """Inside: every router call of model (Qwen's mlp.gate, Mixtral's mlp.gate in transformers 5) appends the
    smallest gap between a token's k-th and (k+1)-th router logit to the yielded list."""
    gaps = []

    def hook(mod, inp, out):
        with torch.no_grad():
            if out[0].shape[-1] > k:
                gaps.append(torch.topk(out[0].double(), k + 1, dim=-1).values.diff(dim=-1)[:, -1].abs().min().item())

    hooks = [m.register_forward_hook(hook) for n, m in model.named_modules()
             if n.endswith((".mlp.gate", ".block_sparse_moe.gate"))]
    try:
        yield gaps
    finally:
        for h in hooks:
            h.remove()


def check_routing_gap(what, gaps, k):
    """Fails when a token's top-k choice is a near tie (a rounding could flip it): the smallest gap
    between the k-th and (k+1)-th router logit over tokens and layers must exceed ROUTING_MIN_GAP."""
    print(f"  routing ({what}): smallest top-{k} gap in router logits {min(gaps):.3g} over {len(gaps)} router calls")
    assert min(gaps) > ROUTING_MIN_GAP, (what, min(gaps))
    return min(gaps)


@torch.no_grad()
def routing_gap(model, batch, k, what="base model"):
    with routing_gaps(model, k) as gaps:
        seq_logits(model, batch)
    return check_routing_gap(what, gaps, k)


def routing_choices(model, batch, k):
    """The sorted top-k expert ids of every token at every router call of a forward and each token's gap
    between its k-th and (k+1)-th router logit: one ([T_seq, k], [T_seq]) pair per call (same order for
    any dtype of the same model)."""
    calls = []

    def hook(mod, inp, out):
        top = torch.topk(out[0].double(), k + 1, dim=-1)
        calls.append((top.indices[:, :k].sort(-1).values, (top.values[:, k - 1] - top.values[:, k]).abs()))

    hooks = [m.register_forward_hook(hook) for n, m in model.named_modules()
             if n.endswith((".mlp.gate", ".block_sparse_moe.gate"))]
    try:
        seq_logits(model, batch)
    finally:
        for h in hooks:
            h.remove()
    return calls


def peft_saved_name(param_name):
    """In-memory PEFT parameter name -> name in adapter_model.safetensors."""
    return param_name.replace(".lora_A.default.", ".lora_A.").replace(".lora_B.default.", ".lora_B.")


def lora_params(peft_model):
    return [(n, p) for n, p in peft_model.named_parameters() if "lora_" in n]



def run_adamw(pm, init_state, batch, max_norm):
    """ADAM_STEPS x (zero grads, loss, backward, clip_grad_norm_, AdamW step) on a copy of pm, in pm's
    dtype (float64 pm: params, grads, clipping, moments and step counter all float64, checked).
    Returns the losses, the pre-clip norms and the LoRA tensors after the last step (pm's dtype)."""
    am = copy.deepcopy(pm)
    aparams = lora_params(am)
    with torch.no_grad():
        for n, p in aparams:
            p.grad = None
            p.copy_(init_state[peft_saved_name(n)])  # float32 -> float64 is exact
    params = [p for _, p in aparams]
    f64 = params[0].dtype == torch.float64
    assert all(p.dtype == params[0].dtype for p in am.parameters())
    with float64_compute("AdamW") if f64 else contextlib.nullcontext():
        opt = torch.optim.AdamW(
            params,
            lr=ADAMW["lr"],
            betas=tuple(ADAMW["betas"]),
            eps=ADAMW["eps"],
            weight_decay=ADAMW["weight_decay"],
        )
        losses, norms = [], []
        k = getattr(am.config, "num_experts_per_tok", None)
        for step in range(ADAM_STEPS):
            opt.zero_grad(set_to_none=True)
            with routing_gaps(am, k) if k else contextlib.nullcontext([]) as gaps:
                loss = weighted_loss(seq_logprobs(am, batch), batch)
            if gaps:
                check_routing_gap(f"AdamW step {step} ({params[0].dtype})", gaps, k)
            loss.backward()
            if max_norm is not None:
                norm = torch.nn.utils.clip_grad_norm_(params, max_norm=max_norm)
            else:
                norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in params))
            losses.append(loss.item())
            norms.append(norm.item())
            opt.step()
    if f64:
        for p in params:
            st = opt.state[p]
            assert all(st[k].dtype == torch.float64 for k in ("exp_avg", "exp_avg_sq", "step")), st
    return losses, norms, {peft_saved_name(n): p.detach().clone().contiguous() for n, p in aparams}


def load_fixture_model(model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager"
    )
    model.eval()
    return model


def sha256(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# --------------------------------------------------------------------------------------
# Generation
# --------------------------------------------------------------------------------------


def rope_report(name, model, spec):
    inv = rotary_inv_freq(model).detach().clone()
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    rp = cfg.rope_parameters.get("full_attention", cfg.rope_parameters)
    theta = rp["rope_theta"]
    plain = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    changed = int((inv != plain).sum())
    print(f"  [{name}] rope head_dim={head_dim} theta={theta:g} inv_freq ({changed} of {len(inv)} entries differ from unscaled):")
    for i, (a, b) in enumerate(zip(plain.tolist(), inv.tolist())):
        tag = "" if a == b else f"  scaled x{b / a:.6f}"
        print(f"     i={i}: unscaled={a:.9g} used={b:.9g}{tag}")
    if spec["config"].get("rope_scaling"):
        assert changed > 0, "rope scaling did not change any inv_freq entry"
        assert changed < len(inv), "rope scaling changed every entry (high-freq branch untested)"
    if rp.get("rope_type") == "linear":
        assert torch.equal(inv, plain / rp["factor"]), "linear rope scaling is not inv_freq / factor"
    return inv


# --------------------------------------------------------------------------------------
# Generation references (KV-cache decoding / the sampler): generate.safetensors
# --------------------------------------------------------------------------------------

GEN_PROMPT_LENS = [1, 6, 11]
GEN_NEW_TOKENS = 16
GEN_TOPK = 4
GEN_MIN_GAP = 1e-3          # every greedy top-1 minus top-2 logit gap (and top-k neighbour gap) must exceed this
GEN_EMPTY_LOGPROB = -99999.0  # top-k cell of position 0 (nothing to predict from), like Tinker's empty cell
GEN_SEED_OFFSET = 500       # first prompt seed = model seed + 500; the next one is tried until the gaps hold
GEN_MAX_SEED_TRIES = 200


def gen_prompts(seed, vocab):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (L,), generator=g) for L in GEN_PROMPT_LENS]


@torch.no_grad()
def greedy_generate(model, prompts):
    """HF greedy decoding (KV cache) of each prompt on its own (batch 1, no padding, mask all ones), float32.
    Returns new tokens [P, N] (int64), the raw float32 logits of every step [P, N, V], and the float32
    logits of a no-cache forward over prompt + new tokens at the same positions (diagnostic)."""
    toks, step_logits, nocache_logits = [], [], []
    for p in prompts:
        ids = p.long()[None]
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=GEN_NEW_TOKENS,
            min_new_tokens=GEN_NEW_TOKENS,
            eos_token_id=None,
            pad_token_id=0,
            output_logits=True,
            output_scores=True,
            return_dict_in_generate=True,
        )
        seq = out.sequences[0]
        L = ids.shape[1]
        assert seq.shape[0] == L + GEN_NEW_TOKENS and torch.equal(seq[:L], ids[0]), seq
        new = seq[L:]
        logits = torch.stack(out.logits)[:, 0]  # raw logits [N, V]
        scores = torch.stack(out.scores)[:, 0]  # processed logits
        assert logits.dtype == torch.float32 and logits.shape[0] == GEN_NEW_TOKENS
        # no logits processor changed anything (no eos masking, no penalties), and greedy = raw argmax
        assert torch.equal(scores, logits), "generate processed the logits"
        assert torch.equal(logits.argmax(-1), new), "greedy token is not the argmax of the raw logits"
        full = model(input_ids=seq[None, :-1], use_cache=False).logits[0]
        toks.append(new)
        step_logits.append(logits)
        nocache_logits.append(full[L - 1:])
    return torch.stack(toks), torch.stack(step_logits), torch.stack(nocache_logits)


def top2_gap(logits):
    """top-1 minus top-2 logit, computed in float64 from the given values."""
    t = logits.double().topk(2, dim=-1).values
    return t[..., 0] - t[..., 1]


@torch.no_grad()
def prompt_logprob_refs(model, prompts):
    """Per prompt: float32 forward (batch 1, no cache); float64 log_softmax of those float32 logits.
    Returns the per-position log p(prompt[i] | prompt[:i]) (NaN at i = 0), concatenated, and the
    float64 log-probabilities of every next token at every position [sum L, V] (row 0 of each
    prompt: NaN, nothing predicts position 0)."""
    lps, rows = [], []
    for p in prompts:
        ids = p.long()[None]
        logits = model(input_ids=ids, use_cache=False).logits[0]
        assert logits.dtype == torch.float32
        full = torch.log_softmax(logits.double(), dim=-1)  # [L, V]: row j predicts position j + 1
        V = full.shape[1]
        shifted = torch.cat([torch.full((1, V), float("nan"), dtype=torch.float64), full[:-1]], 0)
        lp = torch.full((p.numel(),), float("nan"), dtype=torch.float64)
        if p.numel() > 1:
            lp[1:] = full[:-1].gather(-1, p.long()[1:, None])[:, 0]
        lps.append(lp)
        rows.append(shifted)
    return torch.cat(lps), torch.cat(rows)


def load_fixture_peft(model_dir, adapter_dir):
    from peft import PeftModel

    pm = PeftModel.from_pretrained(load_fixture_model(model_dir), str(adapter_dir))
    pm.eval()
    return pm


def generation_refs(name, spec, model_dir, adapter_dir, out, vocab):
    """Greedy KV-cache decoding references with the float32 model as transformers loads it from model/
    (base) and with peft_adapter/ applied through PeftModel.from_pretrained (lora), exactly the way
    verify mode loads them. Writes out/generate.safetensors and returns the 'generate' section of
    expected.json."""
    from safetensors.torch import save_file

    models = {"base": load_fixture_model(model_dir), "lora": load_fixture_peft(model_dir, adapter_dir)}
    seed = spec["seed"] + GEN_SEED_OFFSET
    rejected = []
    for _ in range(GEN_MAX_SEED_TRIES):
        prompts = gen_prompts(seed, vocab)
        greedy = {k: greedy_generate(m, prompts) for k, m in models.items()}
        gaps = {k: top2_gap(g[1]) for k, g in greedy.items()}
        prompt_lp = {k: prompt_logprob_refs(m, prompts) for k, m in models.items()}
        # top-k of the lora prompt logprobs: ranks 1..k+1 pairwise separated, so the ids and their order
        # are stable across implementations (position 0 of each prompt has no prediction)
        rows = prompt_lp["lora"][1]
        valid = ~torch.isnan(rows[:, 0])
        topk_next = rows[valid].topk(GEN_TOPK + 1, dim=-1).values
        topk_gap = (topk_next[:, :-1] - topk_next[:, 1:]).min().item() if valid.any() else math.inf
        min_gap = min(g.min().item() for g in gaps.values())
        if min_gap > GEN_MIN_GAP and topk_gap > GEN_MIN_GAP:
            break
        rejected.append({"seed": seed, "min_greedy_gap": min_gap, "min_topk_neighbour_gap": topk_gap})
        seed += 1
    else:
        raise RuntimeError(f"{name}: no prompt seed with all gaps > {GEN_MIN_GAP} in {GEN_MAX_SEED_TRIES} tries")
    top_k = spec["config"].get("num_experts_per_tok")
    for key, m in models.items() if top_k else ():  # MoE: no near tie in the routing of any decoding step either
        with routing_gaps(m, top_k) as rgaps:
            greedy_generate(m, prompts)
            prompt_logprob_refs(m, prompts)
        check_routing_gap(f"decoding, {key}", rgaps, top_k)

    tensors = {
        "prompt_tokens": torch.cat(prompts).to(torch.int32),
        "prompt_lens": torch.tensor(GEN_PROMPT_LENS, dtype=torch.int32),
    }
    diag = {}
    for k in ("base", "lora"):
        new, logits, nocache = greedy[k]
        lp = torch.log_softmax(logits.double(), dim=-1).gather(-1, new[..., None])[..., 0]
        tensors[f"greedy_{k}"] = new.to(torch.int32)
        tensors[f"greedy_{k}_logprobs"] = lp.float()
        tensors[f"greedy_{k}_gap"] = gaps[k].float()
        tensors[f"prompt_logprobs_{k}"] = prompt_lp[k][0].float()
        # diagnostics: KV-cache steps vs a no-cache forward (both float32), and vs a float64 computation
        lp_nc = torch.log_softmax(nocache.double(), dim=-1).gather(-1, new[..., None])[..., 0]
        m64 = float64_copy(models[k])
        lp64, pl64 = [], []
        with torch.no_grad(), float64_compute(f"{k} generation diagnostic"):
            for p, t in zip(prompts, new):
                seq = torch.cat([p.long(), t])
                lg = torch.log_softmax(m64(input_ids=seq[None, :-1], use_cache=False).logits[0], dim=-1)
                L = p.numel()
                step = lg[L - 1:]
                assert torch.equal(step.argmax(-1), t), f"{k}: float64 argmax differs from the float32 greedy token"
                lp64.append(step.gather(-1, t[:, None])[:, 0])
                pl = torch.full((L,), float("nan"), dtype=torch.float64)
                if L > 1:
                    pl[1:] = lg[: L - 1].gather(-1, p.long()[1:, None])[:, 0]
                pl64.append(pl)
        del m64
        lp64 = torch.stack(lp64)
        pl64 = torch.cat(pl64)
        pl32 = prompt_lp[k][0]
        nn = ~torch.isnan(pl32)
        assert torch.equal(nn, ~torch.isnan(pl64))
        diag[k] = {
            "min_greedy_gap": gaps[k].min().item(),
            "greedy_logits_kv_cache_vs_no_cache_max_abs": (logits - nocache).abs().max().item(),
            "greedy_logprobs_kv_cache_vs_no_cache_max_abs": (lp - lp_nc).abs().max().item(),
            "greedy_logprobs_vs_float64_max_abs": (lp - lp64).abs().max().item(),
            "prompt_logprobs_vs_float64_max_abs": (pl32[nn] - pl64[nn]).abs().max().item(),
            "greedy_logprob_range": [lp.min().item(), lp.max().item()],
        }
    rows = prompt_lp["lora"][1]
    valid = ~torch.isnan(rows[:, 0])
    top = rows.nan_to_num(nan=-math.inf).topk(GEN_TOPK, dim=-1)
    ids = top.indices.to(torch.int32)
    lps = top.values.float()
    ids[~valid] = 0
    lps[~valid] = GEN_EMPTY_LOGPROB
    tensors["topk_prompt_logprobs_lora_ids"] = ids.contiguous()
    tensors["topk_prompt_logprobs_lora_lps"] = lps.contiguous()
    diag["lora"]["min_topk_neighbour_gap"] = topk_gap
    # the stored prompt logprob of the actual token is consistent with the top-k rows
    pl = tensors["prompt_logprobs_lora"]
    for i in torch.nonzero(valid)[:, 0].tolist():
        tok = tensors["prompt_tokens"][i].item()
        hit = (ids[i] == tok).nonzero()
        if hit.numel():
            assert lps[i, hit[0, 0]] == pl[i], i
        else:
            assert pl[i] < lps[i, -1], i

    for k, v in tensors.items():
        assert v.dtype in (torch.float32, torch.int32) and v.is_contiguous(), (k, v.dtype)
    path = out / "generate.safetensors"
    save_file(tensors, str(path))
    print(f"  generate: prompt seed {seed} (rejected {[r['seed'] for r in rejected]}), prompt lens "
          f"{GEN_PROMPT_LENS}, min greedy gap base {diag['base']['min_greedy_gap']:.4g} lora "
          f"{diag['lora']['min_greedy_gap']:.4g}, min top-{GEN_TOPK} neighbour gap (lora prompts) {topk_gap:.4g}")
    for k in ("base", "lora"):
        print(f"    {k}: greedy {tensors[f'greedy_{k}'].tolist()}")
        print(f"    {k}: " + ", ".join(f"{a}={b:.3g}" for a, b in diag[k].items() if not isinstance(b, list)))
    print(f"  wrote {path.name} ({len(tensors)} tensors, {path.stat().st_size} bytes) sha256={sha256(path)[:16]}")

    P = len(GEN_PROMPT_LENS)
    return {
        "file": "generate.safetensors",
        "what": "greedy KV-cache decoding and prompt logprob references for the sampler, computed with the "
                "float32 model exactly as transformers loads it from model/ (AutoModelForCausalLM.from_pretrained, "
                "dtype float32, eager attention; for qwen2 the bf16 disk weights upcast) = 'base', and with "
                "peft_adapter/ applied by PeftModel.from_pretrained = 'lora' (the way --verify loads them). "
                "Unlike expected.safetensors these are float32 computations (transformers' own decoding); only "
                "the log_softmax is done in float64 from the float32 logits.",
        "prompt_seed": seed,
        "prompt_seed_rule": f"first seed = model seed + {GEN_SEED_OFFSET}; prompts = torch.randint(0, vocab, (L,)) "
                            f"for L in prompt_lens from torch.Generator().manual_seed(seed); the next seed is "
                            f"tried until every greedy gap (base and lora) and every top-{GEN_TOPK + 1} "
                            f"neighbour gap of the lora prompt logprobs exceeds {GEN_MIN_GAP}",
        "rejected_seeds": rejected,
        "prompt_lens": GEN_PROMPT_LENS,
        "new_tokens": GEN_NEW_TOKENS,
        "generate_call": "model.generate(input_ids [1, L], attention_mask=ones, do_sample=False, "
                         f"max_new_tokens={GEN_NEW_TOKENS}, min_new_tokens={GEN_NEW_TOKENS}, eos_token_id=None, "
                         "pad_token_id=0, output_logits=True, return_dict_in_generate=True), one prompt at a time "
                         "(batch 1, no padding), positions 0.. (KV cache, DynamicCache)",
        "greedy_rule": "token = argmax of the raw float32 logits (checked: generate's processed scores equal the "
                       "raw logits at every step, so no eos masking or penalty was applied; the float64 "
                       "computation picks the same tokens)",
        "min_gap_required": GEN_MIN_GAP,
        "topk": GEN_TOPK,
        "topk_empty_cell": {"id": 0, "logprob": GEN_EMPTY_LOGPROB},
        "tensors": {
            "prompt_tokens": {"dtype": "int32", "shape": [sum(GEN_PROMPT_LENS)],
                              "meaning": "the prompts, concatenated"},
            "prompt_lens": {"dtype": "int32", "shape": [P], "meaning": "length of each prompt"},
            **{f"greedy_{k}": {"dtype": "int32", "shape": [P, GEN_NEW_TOKENS],
                               "meaning": f"the {GEN_NEW_TOKENS} greedy tokens after each prompt ({k})"}
               for k in ("base", "lora")},
            **{f"greedy_{k}_logprobs": {"dtype": "float32", "shape": [P, GEN_NEW_TOKENS],
                                        "meaning": "log_softmax (float64, temperature 1) of the raw float32 logits of "
                                                   "that decoding step, at the generated token"}
               for k in ("base", "lora")},
            **{f"greedy_{k}_gap": {"dtype": "float32", "shape": [P, GEN_NEW_TOKENS],
                                   "meaning": "top-1 minus top-2 raw logit at that step (float64 difference of "
                                              "the float32 logits)"}
               for k in ("base", "lora")},
            **{f"prompt_logprobs_{k}": {"dtype": "float32", "shape": [sum(GEN_PROMPT_LENS)],
                                        "meaning": "concatenated over prompts: element 0 of each prompt NaN, element i "
                                                   "= log p(prompt[i] | prompt[:i]), float64 log_softmax of the float32 "
                                                   "forward's logits (batch 1, no cache)"}
               for k in ("base", "lora")},
            "topk_prompt_logprobs_lora_ids": {"dtype": "int32", "shape": [sum(GEN_PROMPT_LENS), GEN_TOPK],
                                              "meaning": f"top-{GEN_TOPK} next-token ids predicting position i from "
                                                         "prompt[:i] (lora), by descending logprob; row of position 0 "
                                                         "of each prompt: all 0"},
            "topk_prompt_logprobs_lora_lps": {"dtype": "float32", "shape": [sum(GEN_PROMPT_LENS), GEN_TOPK],
                                              "meaning": "their logprobs (same computation as prompt_logprobs_lora); "
                                                         f"row of position 0 of each prompt: all {GEN_EMPTY_LOGPROB}"},
        },
        "diagnostics": {
            "what": "min gaps; how far transformers' float32 KV-cache steps are from a no-cache float32 forward "
                    "over prompt + generated tokens, and the float32 logprobs from a float64 computation "
                    "(float64 copy of the same loaded model, no cache)",
            **diag,
        },
    }


# the config fields that must change the fixture's numbers: with the value here instead (no cap; a window
# longer than every sequence, as Gemma's configs cannot go without one) the logprobs must move
BITES = {"sliding_window": 4096, "attn_logit_softcapping": None, "final_logit_softcapping": None}


@torch.no_grad()
def feature_bites(spec, model, batch, lp_base32):
    """For every field of BITES the spec sets: max |logprobs change| (float32) with BITES' value
    instead; fails below 1e-3 (a window as long as the sequences, or a cap that never bites, would
    leave the feature untested)."""
    out = {}
    for field, off in BITES.items():
        if spec["config"].get(field) is None:
            continue
        cfg = config_class(spec)(**dict(spec["config"], **{field: off}))
        cfg._attn_implementation = "eager"
        cfg._experts_implementation = "eager"  # MoE: the per-expert loop (grouped_mm has no float64)
        other = hf_class(spec["hf_class"])(cfg).to(torch.float32)
        other.load_state_dict(model.state_dict())
        other.eval()
        d = (seq_logprobs(other, batch) - lp_base32).abs().max().item()
        print(f"  {field}={spec['config'][field]} bites: max |logprobs change| with {field}={off}: {d:.4g}")
        assert d > 1e-3, f"{field} does not change the logprobs ({d})"
        out[field] = d
    return out


def generate_one(name, spec, out_root):
    from peft import LoraConfig, get_peft_model
    from safetensors import safe_open
    from safetensors.torch import save_file

    print(f"=== {name} ({spec['hf_class']}) ===")
    out = out_root / name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)

    seed = spec["seed"]
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)

    cfg = config_class(spec)(**spec["config"])
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "eager"  # MoE: the per-expert loop (grouped_mm has no float64)
    model = hf_class(spec["hf_class"])(cfg).to(torch.float32)
    init_weights(model, gen, spec["init"])
    if spec["disk_dtype"] == "bfloat16":
        # references are computed from the bf16-rounded weights, seen as f32
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(torch.bfloat16).to(torch.float32))
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)

    print(f"  config: layers={cfg.num_hidden_layers} hidden={cfg.hidden_size} inter={cfg.intermediate_size} "
          f"heads={cfg.num_attention_heads} kv={cfg.num_key_value_heads} head_dim={getattr(cfg, 'head_dim', None)} "
          f"vocab={cfg.vocab_size} eps={cfg.rms_norm_eps} tied={cfg.tie_word_embeddings} rope={cfg.rope_parameters}")
    inv_freq = rope_report(name, model, spec)

    # ---- save the HF folder
    model_dir = out / "model"
    if spec["disk_dtype"] == "bfloat16":
        to_save = copy.deepcopy(model).to(torch.bfloat16)
    else:
        to_save = model
    save_kw = {}
    if spec["max_shard_size"]:
        save_kw["max_shard_size"] = spec["max_shard_size"]
    to_save.save_pretrained(model_dir, **save_kw)
    del to_save
    files = sorted(os.listdir(model_dir))
    print(f"  saved {model_dir.relative_to(out_root.parent)}: {files}")
    if spec["max_shard_size"]:
        shards = [f for f in files if f.endswith(".safetensors")]
        assert "model.safetensors.index.json" in files and len(shards) >= 2, files
    for f in files:
        if f.endswith(".safetensors"):
            with safe_open(model_dir / f, "pt") as sf:
                keys = list(sf.keys())
                dts = {str(sf.get_slice(k).get_dtype()) for k in keys}
            print(f"    {f}: {len(keys)} tensors, dtypes {sorted(dts)}")

    # ---- batch
    batch = make_batch(spec["seq_lens"], cfg.vocab_size, gen)
    T = batch["tokens"].numel()

    # ---- float64 copy of the model. Every reference number below is computed from it: the float32
    # weights (for qwen2 the bf16-rounded ones, i.e. the disk values) cast exactly to float64.
    # rotary_emb.inv_freq stays the float32 values transformers computed (cast to float64): the
    # angles pos * inv_freq, their cos/sin, RMSNorm, softmax, log_softmax, loss, backward and AdamW
    # all run in float64 (float64_compute checks that no op touches a float32 tensor).
    model64 = float64_copy(model)
    inv64 = rotary_inv_freq(model64)
    assert inv64.dtype == torch.float64 and torch.equal(inv64, inv_freq.double())
    assert all(p.dtype == torch.float64 for p in model64.parameters())
    batch64 = dict(batch, weights=batch["weights"].double())

    # ---- base logprobs (float64 reference; float32 only for the diagnostics and the reload check)
    with torch.no_grad():
        base_logits = seq_logits(model, batch)
        lp_base32 = torch.log_softmax(base_logits, -1).gather(-1, batch["targets"].long()[:, None])[:, 0]
        with float64_compute("base logprobs"):
            lp_base = seq_logprobs(model64, batch64)
            loss_base = weighted_loss(lp_base, batch64)
    assert lp_base.dtype == torch.float64 and torch.isfinite(lp_base).all()
    assert torch.equal(rotary_inv_freq(model64), inv_freq.double())  # not recomputed in forward
    print(f"  T={T} seq_lens={spec['seq_lens']} logprobs_base: min={lp_base.min():.4f} max={lp_base.max():.4f} "
          f"mean={lp_base.mean():.4f} std={lp_base.std():.4f} (-log V = {-math.log(cfg.vocab_size):.4f}) "
          f"loss_base={loss_base.item():.6f}")
    assert lp_base.std() > 0.5, "logprobs are too uniform: logits degenerate"
    f32_err = {"logprobs_base_max_abs": (lp_base32.double() - lp_base).abs().max().item()}
    if "num_experts_per_tok" in spec["config"]:
        routing_gap(model, batch, spec["config"]["num_experts_per_tok"])
    bites = feature_bites(spec, model, batch, lp_base32)

    # ---- reload check (sharded / bf16 round trip): logits must match exactly
    with torch.no_grad():
        reloaded = load_fixture_model(model_dir)
        d = (seq_logits(reloaded, batch) - base_logits).abs().max().item()
    print(f"  reload {model_dir.name}/ with from_pretrained: max |logits diff| = {d:.3g}")
    # not always exactly 0: weights loaded from an mmap'd file may sit at other alignments, and the CPU
    # GEMV for 1-token sequences then rounds differently (seen on qwen3: 1.4e-6 on the length-1 sequence)
    assert d <= 1e-5, d
    del reloaded

    tensors = {k: v.contiguous() for k, v in batch.items()}
    tensors["logprobs_base"] = lp_base.float()
    tensors["loss_base"] = loss_base.detach().reshape(1).float()
    tensors["rope_inv_freq"] = inv_freq.float()
    if hasattr(model.model.rotary_emb, "sliding_attention_inv_freq"):  # Gemma 3's local layers
        tensors["rope_inv_freq_local"] = rotary_inv_freq(model, local=True).detach().float().clone()

    # ---- full-model gradients (base, no LoRA, all params trainable), float64
    if spec["full_grad"]:
        fm = float64_copy(model)
        for p in fm.parameters():
            p.requires_grad_(True)
            p.grad = None
        with float64_compute("full-model gradients"):
            loss = weighted_loss(seq_logprobs(fm, batch64), batch64)
            loss.backward()
        assert loss.item() == loss_base.item(), (loss.item(), loss_base.item())
        with safe_open(model_dir / "model.safetensors", "pt") as sf:
            disk_names = set(sf.keys())
        names = []
        full64 = {}
        for n, p in fm.named_parameters():
            assert p.grad is not None and p.grad.dtype == torch.float64, n
            full64[n] = p.grad.detach().clone()
            tensors[f"full_grad.{n}"] = p.grad.detach().float().contiguous()
            names.append(n)
        assert set(names) == disk_names, (set(names) ^ disk_names)
        print(f"  full_grad: {len(names)} params, loss={loss.item():.6f}, "
              f"total grad norm={torch.sqrt(sum((p.grad ** 2).sum() for p in fm.parameters())).item():.6f}")
        del fm
        # diagnostic: the same in float32
        fm32 = copy.deepcopy(model)
        for p in fm32.parameters():
            p.requires_grad_(True)
        weighted_loss(seq_logprobs(fm32, batch), batch).backward()
        f32_err["full_grad_worst_rel"] = worst_rel({n: p.grad for n, p in fm32.named_parameters()}, full64)
        del fm32, full64

    # ---- LoRA
    targets = list(spec.get("lora_targets", LORA_BASE_TARGETS)) + (["lm_head"] if spec["lora_lm_head"] else [])
    lcfg = LoraConfig(
        r=LORA_R,
        lora_alpha=LORA_ALPHA,
        lora_dropout=0.0,
        target_modules=targets,
        target_parameters=spec.get("lora_target_parameters"),
        rank_pattern=dict(spec.get("lora_rank_pattern", {})),
        alpha_pattern=dict(spec.get("lora_alpha_pattern", {})),
        bias="none",
        task_type="CAUSAL_LM",
    )
    torch.manual_seed(seed + 1)  # PEFT's lora_A init (kaiming_uniform) uses the global RNG
    pm = get_peft_model(copy.deepcopy(model), lcfg)
    pm.eval()
    with torch.no_grad():
        for n, p in lora_params(pm):
            if ".lora_B." in n:
                p.copy_(LORA_B_STD * torch.randn(p.shape, generator=gen))
    lparams = lora_params(pm)
    assert all(p.requires_grad for _, p in lparams)
    assert all(not p.requires_grad for n, p in pm.named_parameters() if "lora_" not in n)
    init_state = {peft_saved_name(n): p.detach().clone().contiguous() for n, p in lparams}

    adapter_dir = out / "peft_adapter"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pm.save_pretrained(adapter_dir)
    for w in caught:
        print(f"  peft save warning: {w.message}")
    with safe_open(adapter_dir / "adapter_model.safetensors", "pt") as sf:
        saved_keys = list(sf.keys())
        saved = {k: sf.get_tensor(k) for k in saved_keys}
    lora_keys = [k for k in saved_keys if ".lora_" in k]
    extra_keys = [k for k in saved_keys if ".lora_" not in k]
    assert set(lora_keys) == set(init_state), set(lora_keys) ^ set(init_state)
    for k in lora_keys:
        assert torch.equal(saved[k], init_state[k]), k
    print(f"  peft_adapter: {len(lora_keys)} LoRA tensors" + (f", plus non-LoRA keys {extra_keys}" if extra_keys else ""))

    # float64 copy of the PEFT model: base weights and LoRA tensors are the float32 values cast exactly
    pm64 = float64_copy(pm)
    lparams64 = lora_params(pm64)
    assert all(p.dtype == torch.float64 for p in pm64.parameters())
    assert [n for n, _ in lparams64] == [n for n, _ in lparams]
    assert all(p.requires_grad for _, p in lparams64)
    assert all(not p.requires_grad for n, p in pm64.named_parameters() if "lora_" not in n)
    for n, p in lparams64:
        assert torch.equal(p.detach(), init_state[peft_saved_name(n)].double()), n
    with float64_compute("LoRA logprobs and gradients"):
        lp = seq_logprobs(pm64, batch64)
        loss = weighted_loss(lp, batch64)
        loss.backward()
    assert lp.dtype == torch.float64 and torch.isfinite(lp).all()
    print(f"  logprobs (LoRA): max |lp - lp_base| = {(lp - lp_base).abs().max().item():.4f}, loss={loss.item():.6f}")
    tensors["logprobs"] = lp.detach().float()
    tensors["loss"] = loss.detach().reshape(1).float()
    grad64 = {}
    for n, p in lparams64:
        k = peft_saved_name(n)
        tensors[f"lora_init.{k}"] = init_state[k]
        assert p.grad is not None and p.grad.dtype == torch.float64 and p.grad.abs().sum() > 0, n
        grad64[k] = p.grad.detach().clone()
        tensors[f"lora_grad.{k}"] = p.grad.detach().float().contiguous()

    # diagnostic: the same in float32 (the float32 logprobs also anchor the PEFT round trip below)
    lp32 = seq_logprobs(pm, batch)
    weighted_loss(lp32, batch).backward()
    lp32 = lp32.detach()
    f32_err["logprobs_max_abs"] = (lp32.double() - lp.detach()).abs().max().item()
    f32_err["lora_grad_worst_rel"] = worst_rel({peft_saved_name(n): p.grad for n, p in lparams}, grad64)

    # ---- 3 x (zero grad, loss, backward, clip, AdamW), float64
    step_losses, pre_norms, adam64 = run_adamw(pm64, init_state, batch64, MAX_NORM)
    for step, (l, n) in enumerate(zip(step_losses, pre_norms)):
        print(f"  adam step {step}: loss={l:.6f} pre-clip grad norm={n:.6f} "
              f"{'(clipped, coef %.3g)' % (MAX_NORM / (n + 1e-6)) if n > MAX_NORM else '(not clipped)'}")
    assert pre_norms[0] > MAX_NORM, "clipping not active on the first step"
    assert step_losses[0] == loss.item(), (step_losses[0], loss.item())
    # diagnostic only: how much would adam3 change if clipping were skipped?
    _, _, noclip64 = run_adamw(pm64, init_state, batch64, None)
    noclip_diff = max((adam64[k] - noclip64[k]).abs().max().item() for k in adam64)
    upd = max((adam64[k] - init_state[k].double()).abs().max().item() for k in adam64)
    print(f"  adam3: max |update| = {upd:.4g}; max |adam3(clip) - adam3(no clip)| = {noclip_diff:.4g}")
    tensors["adam3_loss"] = torch.tensor(step_losses, dtype=torch.float64).float()
    tensors["adam3_pre_clip_norm"] = torch.tensor(pre_norms, dtype=torch.float64).float()
    for k, v in adam64.items():
        tensors[f"adam3.{k}"] = v.float().contiguous()
    # diagnostic: the same 3 steps in float32
    _, _, adam32 = run_adamw(pm, init_state, batch, MAX_NORM)
    f32_err["adam3_worst_rel"] = worst_rel(adam32, adam64)
    worst_k = max(adam64, key=lambda k: worst_rel({k: adam32[k]}, {k: adam64[k]}))
    print(f"  float32 computation vs the float64 references: " +
          ", ".join(f"{k}={v:.3g}" for k, v in f32_err.items()) + f" (worst adam3 tensor: {worst_k})")
    # the float32 rounding of the stored references themselves
    store_err = max(worst_rel({k: tensors[f"adam3.{k}"]}, {k: adam64[k]}) for k in adam64)
    print(f"  rounding the float64 adam3 to float32 for storage: worst rel err {store_err:.3g}")
    del adam32, noclip64

    # ---- round trip: saved model + saved adapter through PeftModel.from_pretrained (float32 pipeline)
    problems = []
    d = verify_logprobs(model_dir, adapter_dir, batch, lp32, problems)
    d64 = verify_logprobs(model_dir, adapter_dir, batch, lp.detach())
    print(f"  PeftModel.from_pretrained(model/, peft_adapter/) logprobs (float32): max |diff| = {d:.3g} "
          f"vs the in-memory float32 model, {d64:.3g} vs the float64 reference")
    assert d <= 1e-5 and not problems, (d, problems)

    # ---- write
    for k, v in tensors.items():
        assert v.dtype in (torch.float32, torch.int32), (k, v.dtype)
        assert torch.isfinite(v.float()).all(), k
    exp_path = out / "expected.safetensors"
    save_file(tensors, str(exp_path))

    # ---- generation references (greedy KV-cache decoding, prompt logprobs): generate.safetensors
    gen_meta = generation_refs(name, spec, model_dir, adapter_dir, out, cfg.vocab_size)

    one_layer = sorted(k for k in lora_keys if ".layers.0." in k)
    meta = {
        "model": name,
        "hf_class": spec["hf_class"],
        "model_dir": "model",
        "adapter_dir": "peft_adapter",
        "disk_dtype": spec["disk_dtype"],
        "sharded": bool(spec["max_shard_size"]),
        "max_shard_size": spec["max_shard_size"],
        "references_computed_from": (
            "float64 computation from the weights rounded to bfloat16 (the disk values, exactly what a "
            "bf16->f32 loader sees), cast exactly to float64"
            if spec["disk_dtype"] == "bfloat16" else
            "float64 computation from the float32 weights (identical to disk), cast exactly to float64"
        ),
        "reference_precision": (
            "Every reference number (logprobs_base, loss_base, logprobs, loss, lora_grad.*, full_grad.*, "
            "adam3.*, adam3_loss, adam3_pre_clip_norm) is computed in float64 from the float32 weights and "
            "the float32 lora_init values, each cast exactly to float64: matmuls, RMSNorm, RoPE angles "
            "pos * inv_freq and their cos/sin, eager attention softmax, log_softmax, loss, backward, "
            "gradient clipping and AdamW (params, grads, moments). The float64 results are rounded once "
            "to float32 for storage. Exceptions: rope_inv_freq is the float32 inv_freq transformers "
            "computes (llama3 scaling in float32), used as is (cast to float64) for the angles; the batch "
            "and lora_init.* are inputs, stored exactly."
        ),
        "config": {
            k: (v if not isinstance(v, float) else float(v)) for k, v in spec["config"].items()
        },
        "head_dim": getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads,
        "rope_parameters_as_saved": cfg.rope_parameters,
        "seed": seed,
        "init_std": spec["init"],
        "batch": {
            "seq_lens": spec["seq_lens"],
            "num_tokens": T,
            "layout": "packed end to end; targets[i] = next token of the same sequence; positions restart at 0; "
                      "seg_start[i] = packed index of the first token of i's sequence",
            "reference_method": "each sequence run separately (batch 1, no padding, no mask, eager attention, "
                                "float64), logits concatenated",
        },
        "loss": "loss = -sum_i weights[i] * logprobs[i]  (sum, weights not clamped; "
                "logprobs[i] = log_softmax(logits[i])[targets[i]])",
        "lora": {
            "r": LORA_R,
            "alpha": LORA_ALPHA,
            "scale": LORA_ALPHA / LORA_R,
            "dropout": 0.0,
            "use_rslora": False,
            "bias": "none",
            "target_modules": targets,
            "lm_head_targeted": spec["lora_lm_head"],
            "init": f"lora_A: PEFT default (kaiming_uniform a=sqrt(5), torch.manual_seed({seed + 1}) before "
                    f"get_peft_model); lora_B: normal(0, {LORA_B_STD}). Exact values in lora_init.*",
            "num_tensors": len(lora_keys),
            "tensor_names": sorted(lora_keys),
            "adapter_non_lora_keys": extra_keys,
            "names_layer0": one_layer,
        },
        "optimizer": {
            "steps": ADAM_STEPS,
            "per_step": "zero grads; loss on the same batch; backward; "
                        "clip_grad_norm_(all LoRA params, max_norm, norm_type=2); AdamW step",
            "clip": {
                "max_norm": MAX_NORM,
                "norm_type": 2.0,
                "formula": "total = ||(||g_1||_2, ..., ||g_n||_2)||_2 over all LoRA grads (float64 in the "
                           "reference); coef = min(1, max_norm / (total + 1e-6)); every g *= coef",
                "pre_clip_norms": pre_norms,
            },
            "adamw": {
                **ADAMW,
                "amsgrad": False,
                "param_groups": "one group, all LoRA tensors (A and B) decayed",
                "formula": "torch single-tensor AdamW (CPU default), run in float64 (params, grads, m, v) "
                           "from the float32 lora_init values: t += 1; p *= (1 - lr*wd); "
                           "m = m + (1-b1)*(g - m)  [m.lerp_(g, 1-b1)]; v = b2*v + (1-b2)*g*g; "
                           "bc1 = 1 - b1^t, bc2 = 1 - b2^t (host float64); "
                           "p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps); m, v start at 0",
            },
            "losses_before_each_step": step_losses,
            "diagnostic_max_abs_adam3_change_if_clipping_skipped": noclip_diff,
            "diagnostic_max_abs_adam3_minus_init": upd,
        },
        "diagnostic_logprobs_change_without_feature": bites,
        "diagnostic_float32_computation_vs_references": {
            "what": "the same computation done in float32 by torch/transformers/PEFT, compared with the "
                    "float64 references: how far a correct float32 implementation can land (rel = "
                    "||a - ref|| / ||ref|| per tensor, worst tensor)",
            **f32_err,
        },
        "tensors": {k: {"dtype": str(v.dtype).replace("torch.", ""), "shape": list(v.shape)}
                    for k, v in sorted(tensors.items()) if not k.startswith(("lora_init.", "lora_grad.", "adam3.", "full_grad."))},
        "tensor_groups": {
            "lora_init.": "initial LoRA tensors (== peft_adapter/adapter_model.safetensors)",
            "lora_grad.": "d loss / d LoRA tensor at lora_init (base frozen), float64 computation",
            "adam3.": "LoRA tensors after 3 clipped AdamW steps from lora_init, float64 computation",
            "full_grad.": "d loss_base / d base parameter, HF names, model without LoRA (qwen3 only), "
                          "float64 computation"
                          if spec["full_grad"] else None,
        },
        "versions": versions(),
        "generate": gen_meta,
    }
    if not spec["full_grad"]:
        del meta["tensor_groups"]["full_grad."]
    (out / "expected.json").write_text(json.dumps(meta, indent=2, sort_keys=False) + "\n")
    print(f"  wrote {exp_path.relative_to(out_root.parent)} ({len(tensors)} tensors, "
          f"{exp_path.stat().st_size} bytes) sha256={sha256(exp_path)[:16]}")
    print(f"  PEFT names, layer 0: {one_layer}")
    return pre_norms


# --------------------------------------------------------------------------------------
# Verification
# --------------------------------------------------------------------------------------


def check_adapter_keys(pm, adapter_dir):
    """The file's LoRA keys must be exactly the names PEFT itself writes for the PEFT model built from
    adapter_config.json, and hold the values PEFT loaded. Returns a list of problems (empty when fine)."""
    from safetensors.torch import load_file

    path = Path(adapter_dir) / "adapter_model.safetensors"
    if not path.exists():
        return [f"{path} not found (only safetensors adapters are checked)"]
    on_disk = {k: v for k, v in load_file(str(path)).items() if ".lora_" in k}
    in_model = {peft_saved_name(n): p.detach() for n, p in pm.named_parameters() if "lora_" in n}
    problems = []
    for k in sorted(set(on_disk) - set(in_model)):
        problems.append(f"key not in PEFT's canonical naming (PEFT may skip or remap it): {k}")
    for k in sorted(set(in_model) - set(on_disk)):
        problems.append(f"LoRA tensor of the PEFT model has no key of that name in the file: {k}")
    for k in sorted(set(in_model) & set(on_disk)):
        if not torch.equal(in_model[k].float(), on_disk[k].float()):
            problems.append(f"loaded value differs from the file: {k}")
    return problems


def verify_logprobs(model_dir, adapter_dir, batch, reference, problems=None):
    from peft import PeftModel

    base = load_fixture_model(model_dir)
    pm = PeftModel.from_pretrained(base, str(adapter_dir))
    pm.eval()
    if problems is not None:
        problems.extend(check_adapter_keys(pm, adapter_dir))
    with torch.no_grad():
        lp = seq_logprobs(pm, batch)
    assert torch.isfinite(lp).all()
    return (lp - reference.float()).abs().max().item()


def load_logprobs_file(path, T):
    path = Path(path)
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))["logprobs"].float()
    if path.suffix == ".npy":
        return torch.from_numpy(np.load(path).astype(np.float32)).reshape(-1)
    arr = np.fromfile(path, dtype="<f4")
    if arr.size != T:
        raise SystemExit(f"{path}: {arr.size} float32 values, expected {T}")
    return torch.from_numpy(arr)


# --------------------------------------------------------------------------------------
# bf16 references (--bf16): the committed fixture's model with its matrices rounded to bf16


def sort_safetensors_metadata(path):
    """Rewrites a safetensors header with its __metadata__ keys sorted: save_file writes them in a
    hash map's order, which changes from run to run (the bytes would differ with the same content).
    The header keeps its length (the same JSON, reordered), so the data offsets stay valid."""
    raw = bytearray(Path(path).read_bytes())
    n = int.from_bytes(raw[:8], "little")
    text = raw[8 : 8 + n].decode()
    header = json.loads(text)
    meta = header.pop("__metadata__", None)
    if meta is None:
        return
    body = json.dumps(header, separators=(",", ":"))[1:-1]
    new = ('{"__metadata__":' + json.dumps(dict(sorted(meta.items())), separators=(",", ":")) + "," + body + "}")
    new = new.ljust(n).encode()
    assert len(new) == n and json.loads(new) == dict(header, __metadata__=meta), path
    raw[8 : 8 + n] = new
    Path(path).write_bytes(bytes(raw))


def bf16_refs(name, out_root):
    """fixtures/<name>/bf16.safetensors from the committed fixture (model/, peft_adapter/ and the batch
    in expected.safetensors): the model's weights of 2 or more dimensions (embedding, projections,
    lm_head, expert stacks, routers) rounded to bf16 (round to nearest even, as twinkle's --dtype bf16
    does; norms and biases keep their values), with the fixture's LoRA adapter, and
      logprobs, loss, lora_grad.*              float64 computations from those values (twinkle holds
                                               exactly them and computes in f32);
      torch_logprobs, torch_loss, torch_lora_grad.*
                                               transformers + PEFT running the model in bf16
                                               (every base tensor bf16, the adapter float32: PEFT's
                                               autocast_adapter_dtype), log_softmax in float32;
      torch_routing_flips [2] I32              mixtures of experts only: how many (token, layer) top-k
                                               expert choices transformers' bf16 run makes differently
                                               from the float64 one, of how many.
    Prints transformers' bf16 error against the float64 values; a mixture of experts must have no
    near tie (ROUTING_MIN_GAP) in the float64 routing of the rounded weights."""
    from peft import PeftModel
    from safetensors.torch import load_file, save_file

    fx = out_root / name
    exp = load_file(str(fx / "expected.safetensors"))
    batch = {k: exp[k] for k in ("tokens", "targets", "positions", "seg_start", "weights")}
    batch64 = dict(batch, weights=batch["weights"].double())

    def lora_pass(pm, b, compute):
        """Logprobs (log_softmax in the logits' dtype, at least float32), loss and LoRA gradients."""
        for n, p in pm.named_parameters():
            p.requires_grad_("lora_" in n)
        with compute:
            logits = seq_logits(pm, b)
            if logits.dtype == torch.bfloat16:
                logits = logits.float()
            lp = torch.log_softmax(logits, -1).gather(-1, b["targets"].long()[:, None])[:, 0]
            loss = weighted_loss(lp, b)
            loss.backward()
        grads = {peft_saved_name(n): p.grad.detach().float().contiguous() for n, p in lora_params(pm)}
        return lp.detach().float(), loss.detach().float().reshape(1), grads

    # float32 (qwen2's bf16 disk values widened exactly); rounded after PEFT has loaded the adapter,
    # which for a targeted lm_head also holds a copy of its base weight (base_layer.weight). Every
    # tensor of 2 or more dimensions is rounded, as twinkle does: the MoE fixtures' expert stacks
    # (transformers 5 fuses them into 3-D gate_up_proj / down_proj), routers and shared_expert_gate too.
    pm = PeftModel.from_pretrained(load_fixture_model(fx / "model"), str(fx / "peft_adapter"))
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if p.ndim >= 2 and "lora_" not in n:
                p.copy_(p.to(torch.bfloat16).to(torch.float32))
    pm64 = float64_copy(pm)
    k = getattr(pm.config, "num_experts_per_tok", None)
    meta, extra = {}, {}
    if k:  # no near tie in the routing of the bf16-rounded weights (float64), which twinkle must reproduce
        with torch.no_grad(), float64_compute(f"{name} bf16 routing"):
            meta["routing_min_gap_float64"] = f"{routing_gap(pm64, batch64, k, 'bf16 weights, float64'):.6e}"
    lp64, loss64, g64 = lora_pass(pm64, batch64, float64_compute(f"{name} bf16 references"))

    tb = load_fixture_model(fx / "model").to(torch.bfloat16)  # transformers' own bf16 model
    tpm = PeftModel.from_pretrained(tb, str(fx / "peft_adapter"))
    assert all(p.dtype == torch.float32 for n, p in tpm.named_parameters() if "lora_" in n)
    assert all(p.dtype == torch.bfloat16 for n, p in tpm.named_parameters() if "lora_" not in n)
    if k:  # how many (token, layer) expert choices transformers' bf16 run makes differently
        with torch.no_grad(), float64_compute(f"{name} bf16 routing"):
            c64 = routing_choices(pm64, batch64, k)
        with torch.no_grad():
            ct = routing_choices(tpm, batch, k)
        flipped = [(a != b).any(-1) for (a, _), (b, _) in zip(c64, ct)]
        flips = sum(int(f.sum()) for f in flipped)
        total = sum(a.shape[0] for a, _ in c64)
        gaps = [g[f] for (_, g), f in zip(c64, flipped) if f.any()]
        gap = torch.cat(gaps).max().item() if gaps else 0.0
        print(f"  {name} bf16: transformers bf16 routes {flips} of {total} (token, layer) top-{k} choices "
              f"differently from float64" + (f" (their float64 top-{k} gaps: at most {gap:.3g})" if flips else ""))
        meta["torch_routing_flips"] = f"{flips} of {total}"
        meta["torch_routing_flips_max_float64_gap"] = f"{gap:.6e}"
        extra["torch_routing_flips"] = torch.tensor([flips, total], dtype=torch.int32)
    lpt, losst, gt = lora_pass(tpm, batch, contextlib.nullcontext())
    assert set(gt) == set(g64)
    d_lp = (lpt.double() - lp64.double()).abs().max().item()
    d_g = worst_rel(gt, g64)
    print(f"  {name} bf16: transformers bf16 vs float64 of the same weights: logprobs max |diff| {d_lp:.3e}, "
          f"LoRA grads worst rel {d_g:.3e}, loss {losst.item():.6f} vs {loss64.item():.6f}")
    out = {"logprobs": lp64, "loss": loss64, "torch_logprobs": lpt, "torch_loss": losst}
    out.update({"lora_grad." + k: v for k, v in g64.items()})
    out.update({"torch_lora_grad." + k: v for k, v in gt.items()})
    out.update(extra)
    save_file({k: v.contiguous() for k, v in out.items()}, str(fx / "bf16.safetensors"),
              metadata={"torch_vs_float64_logprobs_max_abs": f"{d_lp:.6e}", "torch_vs_float64_grads_worst_rel": f"{d_g:.6e}",
                        "versions": json.dumps(versions(), sort_keys=True), **meta})
    sort_safetensors_metadata(fx / "bf16.safetensors")
    return {"torch_logprobs_max_abs": d_lp, "torch_grads_worst_rel": d_g}



def verify_main(args):
    from safetensors.torch import load_file

    fx = Path(args.verify[0])
    if not (fx / "expected.safetensors").exists():
        fx = DEFAULT_OUT / args.verify[0]
    exp = load_file(str(fx / "expected.safetensors"))
    batch = {k: exp[k] for k in ("tokens", "targets", "positions", "seg_start", "weights")}
    T = batch["tokens"].numel()
    if args.verify[2:]:
        ref = load_logprobs_file(args.verify[2], T)
        src = args.verify[2]
    else:
        ref = exp["logprobs"]
        src = f"{fx}/expected.safetensors:logprobs"
    if ref.numel() != T:
        raise SystemExit(f"reference has {ref.numel()} values, batch has {T} tokens")
    problems = []
    d = verify_logprobs(fx / "model", args.verify[1], batch, ref, problems)
    for msg in problems:
        print(f"adapter key problem: {msg}")
    ok = d <= args.tol and not problems
    print(f"verify {fx.name}: adapter {args.verify[1]} vs {src}: max |logprobs diff| = {d:.3g} "
          f"({'OK' if ok else 'FAIL'}, tol {args.tol:g})")
    return 0 if ok else 1


# --------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------
# The router's load-balancing loss (output_router_logits): fixtures/router_aux/
# --------------------------------------------------------------------------------------

ROUTER_AUX_COEF = 0.1  # router_aux_loss_coef of the fixture's config (transformers' default 0.001 would hide it)


def router_aux_refs(out_root):
    """From the committed qwen3_moe fixture (weights, batch, lora_init): transformers 5.24's aux_loss
    (load_balancing_loss_func over both sparse layers) for the packed batch given to transformers the
    way a padded batch is (right padding, attention_mask), and float64 gradients of
    -sum(w lp) + coef * aux_loss (LoRA on the attention) and of coef * aux_loss alone (LoRA; the
    full model's router weights). Writes router_aux/{model/config.json, expected.safetensors, expected.json}."""
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file, save_file
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    src = out_root / "qwen3_moe"
    out = out_root / "router_aux"
    (out / "model").mkdir(parents=True, exist_ok=True)
    exp = load_file(src / "expected.safetensors")
    meta = json.loads((src / "expected.json").read_text())
    model = load_fixture_model(src / "model")
    cfg_json = json.loads((src / "model" / "config.json").read_text())
    cfg_json.update(output_router_logits=True, router_aux_loss_coef=ROUTER_AUX_COEF)
    (out / "model" / "config.json").write_text(json.dumps(cfg_json, indent=2, sort_keys=True) + "\n")
    E, K = model.config.num_experts, model.config.num_experts_per_tok

    # the packed batch as transformers' padded one: one row per sequence, right padding, attention_mask
    seq_lens = meta["batch"]["seq_lens"]
    S = max(seq_lens)
    ids = torch.zeros(len(seq_lens), S, dtype=torch.long)
    mask = torch.zeros(len(seq_lens), S, dtype=torch.long)
    off = 0
    for b, L in enumerate(seq_lens):
        ids[b, :L] = exp["tokens"][off:off + L].long()
        mask[b, :L] = 1
        off += L
    real = mask.reshape(-1).bool()
    targets, w = exp["targets"].long(), exp["weights"].double()

    def objective(m, weights):
        out_ = m(input_ids=ids, attention_mask=mask, output_router_logits=True, use_cache=False)
        lp = torch.log_softmax(out_.logits.reshape(-1, out_.logits.shape[-1])[real], -1)
        lp = lp.gather(-1, targets[:, None])[:, 0]
        ce = -(weights * lp).sum()
        return ce, out_.aux_loss, out_.router_logits

    model64 = float64_copy(model)
    for p in model64.parameters():
        p.requires_grad_(False)
    lcfg = LoraConfig(r=meta["lora"]["r"], lora_alpha=meta["lora"]["alpha"], lora_dropout=0.0,
                      target_modules=meta["lora"]["target_modules"], bias="none", task_type="CAUSAL_LM")
    pm = get_peft_model(copy.deepcopy(model64), lcfg)
    pm.eval()
    with torch.no_grad():
        for n, p in lora_params(pm):
            p.copy_(exp["lora_init." + peft_saved_name(n)].double())
    tensors = {}
    for what, weights in (("objective_grad", w), ("aux_grad", torch.zeros_like(w))):
        for _, p in lora_params(pm):
            p.grad = None
        ce, aux, router_logits = objective(pm, weights)
        (ce + ROUTER_AUX_COEF * aux).backward()
        for n, p in lora_params(pm):
            tensors[f"{what}.{peft_saved_name(n)}"] = p.grad.float().contiguous()
        if what == "objective_grad":
            tensors["loss"] = ce.detach().reshape(1).float()
            tensors["router_aux_loss"] = aux.detach().reshape(1).float()
            # the packed rows with no mask give the same value (what twinkle computes over a packed batch)
            packed = load_balancing_loss_func(tuple(r.detach()[real] for r in router_logits), E, K, None)
            # and the formula spelled out in float64: E * sum_e f_e P_e over the layers' rows pooled
            probs = torch.cat([torch.softmax(r.detach()[real].double(), -1) for r in router_logits])
            chosen = torch.topk(probs, K, dim=-1).indices
            f = torch.zeros(E, dtype=torch.float64).scatter_add_(0, chosen.reshape(-1), torch.ones(chosen.numel(), dtype=torch.float64))
            own = E * (f / probs.shape[0] * probs.mean(0)).sum()
            print(f"  router_aux_loss {aux.item():.9f}; packed, no mask {packed.item():.9f}; float64 formula {own.item():.9f}")
            assert abs(packed.item() - aux.item()) < 1e-6 and abs(own.item() - aux.item()) < 1e-6
            gaps = [torch.topk(r.detach()[real], K + 1, -1).values.diff(dim=-1)[:, -1].abs().min().item() for r in router_logits]
            assert min(gaps) > ROUTING_MIN_GAP, gaps
    # the full model's router weights: d (coef * aux) / d W_router
    fm = float64_copy(model)
    for n, p in fm.named_parameters():
        p.requires_grad_(n.endswith(".mlp.gate.weight"))
    _, aux, _ = objective(fm, torch.zeros_like(w))
    (ROUTER_AUX_COEF * aux).backward()
    for n, p in fm.named_parameters():
        if p.requires_grad:
            tensors[f"aux_router_grad.{n}"] = p.grad.float().contiguous()
    save_file(tensors, out / "expected.safetensors")
    (out / "expected.json").write_text(json.dumps({
        "from": "qwen3_moe (model/model.safetensors, expected.safetensors' batch and lora_init.*)",
        "qwen3_moe_model_sha256": sha256(src / "model" / "model.safetensors"),
        "router_aux_loss_coef": ROUTER_AUX_COEF,
        "batch": "the qwen3_moe batch packed; for transformers one row per sequence, right-padded to "
                 f"{S}, attention_mask marking the real tokens (the aux loss's mask: padding rows excluded)",
        "loss": "-sum(weights * logprobs) (loss), router_aux_loss = outputs.aux_loss; "
                "objective_grad.* = d(loss + coef * aux) / d LoRA at lora_init; aux_grad.* = d(coef * aux) / d LoRA; "
                "aux_router_grad.* = d(coef * aux) / d router weight of the base model; float64 computation, "
                "except the sums inside load_balancing_loss_func, which transformers keeps in float32 "
                "(routing_weights.float(), float32 accumulators; 1.2e-7 relative off the float64 formula)",
        "versions": versions(),
    }, indent=2, sort_keys=True) + "\n")
    print(f"  wrote {out}: {sorted(tensors)[:3]}... ({len(tensors)} tensors)")


def main():
    # PEFT writes target_modules from a Python set into adapter_config.json: pin the string hash seed so
    # its order (and so the file's bytes) is the same on every run.
    if os.environ.get("PYTHONHASHSEED") != "0":
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable, os.path.abspath(__file__)] + sys.argv[1:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--verify", nargs="+", metavar="ARG",
                    help="MODEL ADAPTER_DIR [LOGPROBS_FILE]: check an adapter with PEFT")
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--only", nargs="*", choices=sorted(MODELS))
    ap.add_argument("--router-aux", action="store_true",
                    help="write fixtures/router_aux/ from the committed qwen3_moe fixture (the load-balancing loss)")
    ap.add_argument("--bf16", action="store_true",
                    help="write fixtures/<model>/bf16.safetensors from the committed fixtures (bf16 references)")
    args = ap.parse_args()

    setup_torch()
    warnings.filterwarnings("ignore", category=FutureWarning)  # transformers deprecation chatter
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()

    if args.verify:
        if len(args.verify) not in (2, 3):
            ap.error("--verify takes MODEL ADAPTER_DIR [LOGPROBS_FILE]")
        return verify_main(args)

    print("versions:", versions())
    if args.router_aux:
        router_aux_refs(args.out)
        return 0
    if args.bf16:
        print({name: bf16_refs(name, args.out) for name in args.only or list(MODELS)})
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    summary = {}
    for name in args.only or list(MODELS):
        summary[name] = generate_one(name, MODELS[name], args.out)
    print("pre-clip grad norms per model:", summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
