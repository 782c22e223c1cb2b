"""A GRPO-style loop through the SDK learns: sample a group per prompt from a
snapshot of the current adapter, score each completion with a programmatic
reward (the fraction of its tokens that are "digits", ids 100..131), use
group-normalized advantages, and update with importance_sampling (then ppo).
The mean reward of the last steps must exceed the first steps' by 0.25."""
import numpy as np
import pytest
from tinker import types

from conftest import adam, new_training_client, service_client

DIGITS = range(100, 132)
PROMPTS = [[7, 8, 9], [200, 201], [40, 41, 42, 43], [300]]


def _reward(tokens):
    return float(np.mean([t in DIGITS for t in tokens]))


def _step(tc, loss, step, group=8, max_tokens=6):
    s = tc.save_weights_and_get_sampling_client()
    sampler = s.result() if hasattr(s, "result") else s
    data, rewards = [], []
    for pi, prompt in enumerate(PROMPTS):
        params = types.SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=1000 * step + pi, stop=[])
        res = sampler.sample(prompt=types.ModelInput.from_ints(prompt), num_samples=group, sampling_params=params).result()
        r = np.array([_reward(seq.tokens) for seq in res.sequences])
        rewards.extend(r.tolist())
        adv = (r - r.mean()) / (r.std() + 1e-6)
        for seq, a in zip(res.sequences, adv):
            full = prompt + list(seq.tokens)
            n_prompt = len(prompt) - 1  # positions that predict prompt tokens
            q = [0.0] * n_prompt + list(seq.logprobs)
            advs = [0.0] * n_prompt + [float(a)] * len(seq.tokens)
            data.append(types.Datum(model_input=types.ModelInput.from_ints(full[:-1]),
                                    loss_fn_inputs={"target_tokens": full[1:], "logprobs": q, "advantages": advs}))
    tc.forward_backward(data, loss).result()
    tc.optim_step(adam(2e-2)).result()
    return float(np.mean(rewards))


@pytest.mark.parametrize("loss", ["importance_sampling", "ppo"])
def test_grpo_style_loop_learns(base_url, loss):
    sc = service_client(base_url, "tml-grpo-" + loss)
    tc = new_training_client(sc, rank=16, seed=3)
    curve = [_step(tc, loss, step) for step in range(14)]
    first, last = np.mean(curve[:3]), np.mean(curve[-3:])
    print(f"{loss}: mean reward per step {np.round(curve, 3).tolist()}")
    assert last >= first + 0.25, f"reward {first:.3f} -> {last:.3f}: {np.round(curve, 3).tolist()}"
