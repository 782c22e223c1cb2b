"""The official recipes run unchanged against `twinkle serve`: tinker-cookbook 0.6.1's
supervised loop (recipes/sl_loop.py, cross_entropy) and RL loop (recipes/rl_loop.py,
its default loss stable_reinforce: sampling with record_stability_info, datums with
provenance) for a few steps each, offline, on the qwen3 parity model served as
"Qwen/Qwen3-8B" (so the cookbook picks its Qwen3 renderer) with a byte-level BPE
tokenizer this test trains (vocab <= the model's 1000, Qwen's chat special tokens).

Offline stand-ins, nothing else: the loops' Hugging Face datasets (no_robots, gsm8k)
become a few local rows through a small `datasets` module (the real package only
fetches from the hub), the tokenizer is registered under the model's name, and the
RL reward (a \\boxed{} answer a random model never writes) is a fixed function of the
response so that groups have non-zero advantages. Both loops must complete, every
logged metric must be finite, and the server's log must hold no error.

Needs the cookbook in the venv: tests/cookbook/run.sh installs it (pip --no-deps,
tests/cookbook/requirements.txt); skipped when it is not installed."""
from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import sys
import types as pytypes
from pathlib import Path

import pytest

from conftest import REPO

if importlib.util.find_spec("tinker_cookbook") is None or importlib.util.find_spec("chz") is None:
    pytest.skip("tinker-cookbook is not installed (tests/cookbook/run.sh installs it)", allow_module_level=True)

MODEL_NAME = "Qwen/Qwen3-8B"
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
PREFIX = ("How many r's are in strawberry? Provide a numerical answer without units, written inside \\boxed{}. "
          "Let's spell the word out and number all the letters: 1) s 2) t 3) r 4) a 5) w 6) b 7) e 8) r 9) r 10) y. "
          "We have r's at positions 3, 8, and 9. \\boxed{3}")
QUESTIONS = [("Tom has 3 apples and buys 4 more. How many apples does he have?", "3 + 4 = 7\n#### 7"),
             ("A box holds 6 pens. How many pens are in 2 boxes?", "6 * 2 = 12\n#### 12"),
             ("Sara reads 5 pages a day for 3 days. How many pages?", "5 * 3 = 15\n#### 15"),
             ("There are 9 birds and 4 fly away. How many are left?", "9 - 4 = 5\n#### 5")]
CHATS = [[{"role": "user", "content": f"Say the number {i} in words."},
          {"role": "assistant", "content": w}]
         for i, w in enumerate(["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
                                "ten", "eleven"])]


def _make_model(dest: Path) -> None:
    """The parity Qwen3 model plus a tokenizer trained here on the recipes' text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    src = REPO / "tests" / "parity" / "fixtures" / "qwen3" / "model"
    dest.mkdir(parents=True)
    shutil.copy(src / "model.safetensors", dest / "model.safetensors")
    corpus = [PREFIX, *[q + " " + a for q, a in QUESTIONS], *[m["content"] for c in CHATS for m in c],
              "user assistant system\n\n The answer is", "0123456789 + - * / = ( ) . , ?"] * 4
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=900, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    assert tok.get_vocab_size() <= 1000
    tok.save(str(dest / "tokenizer.json"))
    im_end = tok.token_to_id("<|im_end|>")
    (dest / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "bos_token": None, "model_max_length": 4096}))
    cfg = json.loads((src / "config.json").read_text())
    cfg.update(max_position_embeddings=4096, eos_token_id=im_end)
    (dest / "config.json").write_text(json.dumps(cfg))


class _Rows:
    """The part of datasets.Dataset the loops use."""

    def __init__(self, rows):
        self.rows = list(rows)

    def __len__(self):
        return len(self.rows)

    def __iter__(self):
        return iter(self.rows)

    def __getitem__(self, key):
        return [r[key] for r in self.rows] if isinstance(key, str) else self.rows[key]

    def select(self, idx):
        return _Rows(self.rows[i] for i in idx)

    def shuffle(self, seed=0):
        return self


def _offline_datasets():
    mod = pytypes.ModuleType("datasets")

    class DatasetDict(dict):
        pass

    tables = {"HuggingFaceH4/no_robots": [{"messages": c} for c in CHATS],
              "openai/gsm8k": [{"question": q, "answer": a} for q, a in QUESTIONS]}
    mod.DatasetDict = DatasetDict
    mod.load_dataset = lambda name, *a, **k: DatasetDict(train=_Rows(tables[name]))
    mod.__getattr__ = lambda name: type(name, (), {})  # names used only in annotations
    return mod


def _finite_metrics(log_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (log_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert rows, f"no metrics logged in {log_dir}"
    for row in rows:
        for k, v in row.items():
            if isinstance(v, float):
                assert math.isfinite(v), f"{log_dir.name}: metric {k} = {v}"
    return rows


def test_cookbook_sl_and_rl_loops(start_server, tmp_path, monkeypatch):
    model_dir = tmp_path / "qwen3-tiny"
    _make_model(model_dir)
    srv = start_server("--model", f"{model_dir}={MODEL_NAME}")
    monkeypatch.setitem(sys.modules, "datasets", _offline_datasets())
    monkeypatch.setenv("TINKER_API_KEY", "tml-cookbook")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from transformers import PreTrainedTokenizerFast

    from tinker_cookbook import tokenizer_utils
    from tinker_cookbook.recipes import rl_loop, sl_loop

    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(model_dir / "tokenizer.json"), eos_token="<|im_end|>",
                                        pad_token="<|endoftext|>")
    tokenizer_utils.register_tokenizer(MODEL_NAME, lambda: tokenizer)
    # the reward: a fixed function of the response, so a group's advantages are not all zero
    monkeypatch.setattr(rl_loop, "get_reward", lambda response, answer: float(len(response) % 3 == 0))

    sl_dir = tmp_path / "sl"
    sl_loop.main(sl_loop.Config(base_url=srv.base_url, log_path=str(sl_dir), model_name=MODEL_NAME, batch_size=4,
                                max_steps=3, lora_rank=8, learning_rate=1e-3, save_every=0))
    sl = _finite_metrics(sl_dir)
    print(f"sl_loop: {len(sl)} steps, train_mean_nll " + " ".join(f"{r['train_mean_nll']:.3f}" for r in sl))
    assert len(sl) == 3 and all("train_mean_nll" in r for r in sl)

    rl_dir = tmp_path / "rl"
    cfg = rl_loop.Config(base_url=srv.base_url, log_path=str(rl_dir), model_name=MODEL_NAME, batch_size=2,
                         group_size=4, max_tokens=12, max_steps=2, lora_rank=8, save_every=0)
    assert cfg.loss_fn == "stable_reinforce"  # the recipe's default, unchanged
    rl_loop.main(cfg)
    rl = _finite_metrics(rl_dir)
    print(f"rl_loop ({cfg.loss_fn}): {len(rl)} steps, reward " + " ".join(f"{r['reward/total']:.2f}" for r in rl))
    assert len(rl) == 2
    trained = [r for r in rl if "step:max" in r]  # optim_step's metrics: a stable_reinforce step ran
    assert trained, f"no RL step trained (all advantages zero?): {rl}"

    log = srv.log_text()
    bad = [line for line in log.splitlines() if "error" in line.lower() or "fail" in line.lower()]
    assert not bad, "server log:\n" + "\n".join(bad)
    assert srv.alive()
