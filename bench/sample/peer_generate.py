"""transformers peer of bench_sample_inproc: greedy `generate` (KV cache; and sampling at temperature 1) on the
CPU with the same thread count, the same model (the folder bench_sample_inproc
--save wrote: the same random weights), the same prompts and sizes.

Prints human lines, `TOKENS ...` / `LOGPROBS ...` (the batch-1 greedy
sequence, for the cross-check) and `RESULT <prefill tok/s> <decode b1 tok/s>
<decode bB tok/s> <decode bB at temperature 1>`. Decode tokens/s = batch * (N - 1) / (T(N new) - T(1 new)),
as in bench_sample_inproc."""
import argparse
import resource
import time

import torch
import transformers
from transformers import Qwen3ForCausalLM

ap = argparse.ArgumentParser()
ap.add_argument("--model", required=True)
for name, default in [("threads", 2), ("prompt", 256), ("new", 32), ("prefill", 960), ("batch", 16), ("reps", 2)]:
    ap.add_argument("--" + name, type=int, default=default)
a = ap.parse_args()
torch.set_num_threads(a.threads)

t0 = time.perf_counter()
model = Qwen3ForCausalLM.from_pretrained(a.model, dtype=torch.float32).eval()
load_s = time.perf_counter() - t0
vocab = model.config.vocab_size
model.generation_config.eos_token_id = None
model.generation_config.pad_token_id = 0
model.generation_config.do_sample = False
for k in ("temperature", "top_p", "top_k"):
    setattr(model.generation_config, k, None)

plen = max(a.prefill, a.prompt)
prompt = [(1000 + 7919 * i) % vocab for i in range(plen)]


def generate(n_prompt, batch, new, scores=False, sample=False):
    ids = torch.tensor([prompt[:n_prompt]] * batch, dtype=torch.long)
    kw = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0) if sample else dict(do_sample=False)
    with torch.inference_mode():
        return model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                              min_new_tokens=new, num_beams=1, use_cache=True, output_logits=scores,
                              return_dict_in_generate=scores, **kw)


def best(n_prompt, batch, new, reps=None, sample=False):
    t = 1e30
    for _ in range(reps or a.reps):
        t0 = time.perf_counter()
        out = generate(n_prompt, batch, new, sample=sample)
        t = min(t, time.perf_counter() - t0)
        assert out.shape[1] == n_prompt + new, out.shape
    return t


generate(a.prompt, a.batch, 2)  # warm-up
t_pf = best(a.prefill, 1, 1)
print(f"transformers prefill   {a.prefill / t_pf:9.1f} tokens/s  ({a.prefill}-token prompt, best {t_pf:.3f} s of "
      f"{a.reps}, 1 new token)")
t1, tn = best(a.prompt, 1, 1, reps=a.reps + 2), best(a.prompt, 1, a.new)
d1 = (a.new - 1) / (tn - t1)
print(f"transformers decode b1 {d1:9.1f} tokens/s  ({a.prompt}-token prompt, {a.new} new: {tn:.3f} s; 1 new: "
      f"{t1:.3f} s; {1e3 * (tn - t1) / (a.new - 1):.1f} ms/step)")
t1b, tnb = best(a.prompt, a.batch, 1, reps=a.reps + 2), best(a.prompt, a.batch, a.new)
db = a.batch * (a.new - 1) / (tnb - t1b)
print(f"transformers decode b{a.batch:<2d}{db:9.1f} tokens/s  ({a.prompt}-token prompt, {a.new} new: {tnb:.3f} s; "
      f"1 new: {t1b:.3f} s; {1e3 * (tnb - t1b) / (a.new - 1):.1f} ms/step)")

torch.manual_seed(7)
t1s, tns = best(a.prompt, a.batch, 1, reps=2, sample=True), best(a.prompt, a.batch, a.new, reps=1, sample=True)
ds = a.batch * (a.new - 1) / (tns - t1s)
print(f"transformers decode b{a.batch:<2d}{ds:9.1f} tokens/s  at temperature 1, top_k/top_p off "
      f"({1e3 * (tns - t1s) / (a.new - 1):.1f} ms/step)")

# the batch-1 greedy sequence and its logprobs (log_softmax of the raw logits), untimed
out = generate(a.prompt, 1, a.new, scores=True)
toks = out.sequences[0, a.prompt:].tolist()
lps = [torch.log_softmax(lg[0].float(), -1)[t].item() for lg, t in zip(out.logits, toks)]
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
print(f"transformers peak RSS {rss:.0f} MiB; load {load_s:.1f} s; torch {torch.__version__}, transformers "
      f"{transformers.__version__}, {torch.get_num_threads()} threads, attention {model.config._attn_implementation}")
print("TOKENS " + " ".join(map(str, toks)))
print("LOGPROBS " + " ".join(f"{x:.6f}" for x in lps))
print(f"RESULT {a.prefill / t_pf:.3f} {d1:.3f} {db:.3f} {ds:.3f}")
