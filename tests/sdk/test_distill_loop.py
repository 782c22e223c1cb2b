"""On-policy distillation through the SDK: a teacher (an adapter SFT-trained
to count) scores the student's own samples with compute_logprobs; the
student takes importance_sampling steps with per-token advantages
teacher_logprob - student_logprob (the negative reverse-KL estimate). The
student's reverse KL to the teacher, measured on fresh samples, must fall
to at most half of its starting value."""
import numpy as np
from tinker import types

from conftest import adam, counting_teacher, new_training_client, service_client

PROMPTS = [[100, 101, 102], [110, 111], [120, 121, 122, 123], [105]]


def _sampler(tc):
    s = tc.save_weights_and_get_sampling_client()
    return s.result() if hasattr(s, "result") else s


def _rollouts(student, teacher, seed, group=6, max_tokens=6):
    """(data for an importance_sampling step, mean reverse-KL estimate per token)."""
    data, kl = [], []
    for pi, prompt in enumerate(PROMPTS):
        params = types.SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=seed * 100 + pi, stop=[])
        res = student.sample(prompt=types.ModelInput.from_ints(prompt), num_samples=group,
                             sampling_params=params).result()
        for seq in res.sequences:
            full = prompt + list(seq.tokens)
            t_lp = teacher.compute_logprobs(types.ModelInput.from_ints(full)).result()[len(prompt):]
            s_lp = list(seq.logprobs)
            diff = np.array(t_lp) - np.array(s_lp)  # log p_teacher - log p_student per sampled token
            kl.extend((-diff).tolist())
            n_prompt = len(prompt) - 1
            data.append(types.Datum(model_input=types.ModelInput.from_ints(full[:-1]), loss_fn_inputs={
                "target_tokens": full[1:], "logprobs": [0.0] * n_prompt + s_lp,
                "advantages": [0.0] * n_prompt + diff.astype(np.float32).tolist()}))
    return data, float(np.mean(kl))


def test_on_policy_distillation_reduces_reverse_kl(base_url):
    sc = service_client(base_url, "tml-distill")
    teacher_tc = counting_teacher(sc, seed=1, steps=20)
    teacher = _sampler(teacher_tc)
    student_tc = new_training_client(sc, rank=16, seed=2)
    curve = []
    for step in range(12):
        data, kl = _rollouts(_sampler(student_tc), teacher, step)
        curve.append(kl)
        student_tc.forward_backward(data, "importance_sampling").result()
        student_tc.optim_step(adam(2e-2)).result()
    _, final = _rollouts(_sampler(student_tc), teacher, 99)
    print("reverse KL per step:", np.round(curve, 3).tolist(), "final", round(final, 3))
    assert curve[0] > 0.5, "the student starts far from the teacher"
    assert final <= 0.5 * curve[0], f"reverse KL {curve[0]:.3f} -> {final:.3f}"
