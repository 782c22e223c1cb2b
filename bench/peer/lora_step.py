"""The timed LoRA step the PyTorch + PEFT peers share (train_step.py, moe_step.py): AdamW over the
trainable parameters, a fixed random batch of `seqs` sequences of tokens / seqs targets, the loss
-sum(log_softmax(logits)[target]), one untimed first step, then the best of `steps`. Prints a human
line (ending in `what`) and `RESULT <tokens/s> <peak RSS MiB>`."""
import resource
import time

import torch


def run(model, a, what):
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
          f"{what}")
    print(f"RESULT {tps} {rss}")
