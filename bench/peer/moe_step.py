"""PyTorch + PEFT peer for bench_moe_step: the same LoRA step (forward, backward, AdamW) on a
Qwen3-MoE-shaped model with transformers' Qwen3MoeForCausalLM (its experts implementation:
the default unless --experts names one), LoRA on q, k, v, o, on the CPU with the same thread
count. Prints a human line and `RESULT <tokens/s> <peak RSS MiB>`."""
import argparse
import resource
import time

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
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, betas=(0.9, 0.95))
per = a.tokens // a.seqs
ids = torch.randint(0, a.vocab, (a.seqs, per))
tgt = torch.randint(0, a.vocab, (a.seqs, per))


def step():
    opt.zero_grad()
    logits = model(input_ids=ids).logits
    lp = torch.log_softmax(logits.float(), dim=-1).gather(-1, tgt.unsqueeze(-1)).squeeze(-1)
    loss = -lp.sum()
    loss.backward()
    opt.step()
    return loss.item()


t0 = time.perf_counter()
step()
first = time.perf_counter() - t0
best = 1e30
for _ in range(a.steps):
    t0 = time.perf_counter()
    loss = step()
    best = min(best, time.perf_counter() - t0)
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
tps = a.tokens / best
print(f"pytorch  {tps:8.1f} tokens/s  (best step {best:.3f} s of {a.steps}, first {first:.3f} s)  "
      f"peak RSS {rss:.0f} MiB  loss {loss:.3f}  torch {torch.__version__}, {torch.get_num_threads()} threads, "
      f"experts implementation {impl}")
print(f"RESULT {tps} {rss}")
