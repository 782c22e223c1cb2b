"""PyTorch + PEFT peer for bench_moe_step: the same LoRA step (forward, backward, AdamW) on a
Qwen3-MoE-shaped model with transformers' Qwen3MoeForCausalLM (its experts implementation:
the default unless --experts names one), LoRA on q, k, v, o, on the CPU with the same thread
count. Prints a human line and `RESULT <tokens/s> <peak RSS MiB>`."""
import argparse
import lora_step  # bench/peer/lora_step.py: the timed step both peers share
import torch
from peft import LoraConfig, get_peft_model
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

ap = argparse.ArgumentParser()
for name, default in [("layers", 4), ("tokens", 1024), ("seqs", 4), ("rank", 16), ("steps", 3), ("vocab", 8192),
                      ("threads", 2), ("hidden", 1024), ("heads", 16), ("kv_heads", 2), ("experts", 16),
                      ("top_k", 4), ("moe_ffn", 384)]:
    ap.add_argument("--" + name.replace("_", "-"), dest=name, type=int, default=default)
ap.add_argument("--impl", default=None, help="transformers' experts implementation (eager, grouped_mm, batched_mm)")
a = ap.parse_args()
torch.set_num_threads(a.threads)
torch.manual_seed(1)
cfg = Qwen3MoeConfig(vocab_size=a.vocab, hidden_size=a.hidden, num_hidden_layers=a.layers, num_attention_heads=a.heads,
                     num_key_value_heads=a.kv_heads, head_dim=128, moe_intermediate_size=a.moe_ffn,
                     intermediate_size=3 * a.hidden, num_experts=a.experts, num_experts_per_tok=a.top_k,
                     norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=False,
                     rms_norm_eps=1e-6, rope_theta=1e6, max_position_embeddings=40960, output_router_logits=False)
if a.impl:
    cfg._experts_implementation = a.impl
model = Qwen3MoeForCausalLM(cfg)
impl = getattr(model.config, "_experts_implementation", None) or "eager"
model = get_peft_model(model, LoraConfig(r=a.rank, lora_alpha=32, lora_dropout=0.0,
                                         target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
lora_step.run(model, a, f"experts implementation {impl}")
