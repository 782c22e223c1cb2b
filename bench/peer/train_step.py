"""PyTorch + PEFT peer for bench_train_step: the same LoRA step (forward,
backward, AdamW) on the same shapes, on the CPU with the same thread count.
Prints a human line and `RESULT <tokens/s> <peak RSS MiB>`."""
import argparse
import lora_step  # bench/peer/lora_step.py: the timed step both peers share
import torch
from peft import LoraConfig, get_peft_model
from transformers import Qwen3Config, Qwen3ForCausalLM

ap = argparse.ArgumentParser()
for name, default in [("layers", 4), ("tokens", 1024), ("seqs", 4), ("rank", 16), ("steps", 3),
                      ("vocab", 151936), ("threads", 2)]:
    ap.add_argument("--" + name, type=int, default=default)
ap.add_argument("--dtype", choices=["f32", "bf16", "f16"], default="f32")  # the base weights; LoRA stays float32
ap.add_argument("--widths", choices=["0.6b", "8b"], default="0.6b")  # Qwen3-0.6B's (tied) or Qwen3-8B's (untied)
a = ap.parse_args()
W = {"0.6b": dict(hidden_size=1024, intermediate_size=3072, num_attention_heads=16, tie_word_embeddings=True),
     "8b": dict(hidden_size=4096, intermediate_size=12288, num_attention_heads=32, tie_word_embeddings=False)}[a.widths]
torch.set_num_threads(a.threads)
torch.manual_seed(1)
cfg = Qwen3Config(vocab_size=a.vocab, num_hidden_layers=a.layers, num_key_value_heads=8, head_dim=128,
                  rms_norm_eps=1e-6, rope_theta=1e6, max_position_embeddings=40960, **W)
model = Qwen3ForCausalLM(cfg).to({"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[a.dtype])
# PEFT's autocast_adapter_dtype (default True) keeps the LoRA tensors float32 over a bf16 / f16 base
model = get_peft_model(model, LoraConfig(r=a.rank, lora_alpha=32, lora_dropout=0.0,
                                         target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                                         "gate_proj", "up_proj", "down_proj"]))
lora_step.run(model, a, f"weights {a.dtype}")
