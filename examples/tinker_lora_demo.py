"""twinkle's main job, client side: LoRA-train the served model through the
official Tinker SDK (unchanged) and show that it learns.

The task: continue counting on a clock of 32 "digits" (token ids 100..131):
each example is a run d, d+1, ..., d+16 (mod 32) from a random start. The
base model (random weights) has no idea; after a few dozen steps the adapter
predicts the next digit.

    TINKER_API_KEY=tml-demo python examples/tinker_lora_demo.py --base-url http://127.0.0.1:8000
"""
import argparse
import math
import os
import random
import sys
import time

import tinker
from tinker import types


DIGITS, FIRST = 32, 100


def counting_datum(start: int, length: int) -> types.Datum:
    seq = [FIRST + (start + i) % DIGITS for i in range(length + 1)]
    return types.Datum(
        model_input=types.ModelInput.from_ints(seq[:-1]),
        loss_fn_inputs={"target_tokens": seq[1:], "weights": [1.0] * length},
    )


def mean_logprob(fb_result) -> float:
    lps = [lp for out in fb_result.loss_fn_outputs for lp in out["logprobs"].tolist()]
    return sum(lps) / len(lps)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", default=os.environ.get("TINKER_BASE_URL", "http://127.0.0.1:8000"))
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--lr", type=float, default=5e-3)
    args = ap.parse_args()
    os.environ.setdefault("TINKER_API_KEY", "tml-demo")
    os.environ.setdefault("TINKER_TELEMETRY", "0")

    service = tinker.ServiceClient(base_url=args.base_url)
    caps = service.get_server_capabilities()
    base = caps.supported_models[0].model_name
    print(f"server offers: {[m.model_name for m in caps.supported_models]}; training a rank-{args.rank} LoRA on {base}")
    training = service.create_lora_training_client(base_model=base, rank=args.rank)
    if hasattr(training, "result"):  # newer SDKs return a future of the client
        training = training.result()
    rng = random.Random(0)
    held_out = [counting_datum(rng.randrange(DIGITS), 16) for _ in range(8)]
    before = mean_logprob(training.forward(held_out, "cross_entropy").result())
    print(f"held-out mean logprob of the next number before training: {before:.3f} "
          f"(uniform over the 512-token vocabulary: {-math.log(512):.3f})")
    adam = types.AdamParams(learning_rate=args.lr, beta1=0.9, beta2=0.95, eps=1e-8)
    t0 = time.time()
    for step in range(1, args.steps + 1):
        batch = [counting_datum(rng.randrange(DIGITS), 16) for _ in range(args.batch)]
        fb = training.forward_backward(batch, "cross_entropy")
        opt = training.optim_step(adam)
        result = fb.result()
        opt.result()
        n_tokens = sum(len(d.loss_fn_inputs["weights"].data) for d in batch)
        print(f"step {step:3d}  loss/token {result.metrics['loss:sum'] / n_tokens:7.4f}  ({time.time() - t0:5.1f} s)",
              flush=True)
    after = mean_logprob(training.forward(held_out, "cross_entropy").result())
    path = training.save_state("demo-final").result().path
    print(f"held-out mean logprob after training: {after:.3f} (before {before:.3f}); saved {path}")
    print(f"the adapter predicts the next number with p = {math.exp(after):.2f} on average "
          f"(base model: {math.exp(before):.4f})")
    return 0 if after > before + 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
