"""The sliding-window and Gemma families through the service: the Mistral parity fixture served with
--model, sampled greedily through the official SDK, equals transformers' generate (the fixture's
greedy_base tokens, window 5 shorter than the decoded sequences)."""
import numpy as np
from tinker import types

from conftest import REPO, service_client
from test_export import st_read

FIXTURE = REPO / "tests/parity/fixtures/mistral"
NAME = "fixture/mistral"


def test_mistral_fixture_served_and_sampled_greedily(start_server):
    server = start_server("--model", f"{FIXTURE / 'model'}={NAME}")
    sc = service_client(server.base_url)
    samp = sc.create_sampling_client(base_model=NAME)
    samp = samp.result(timeout=60) if hasattr(samp, "result") else samp
    _, g = st_read(FIXTURE / "generate.safetensors")
    prompts, lens = g["prompt_tokens"].astype(np.int64), g["prompt_lens"].astype(np.int64)
    want = g["greedy_base"].astype(np.int64)
    off = 0
    for p, n in enumerate(lens):
        prompt = [int(t) for t in prompts[off:off + n]]
        off += n
        params = types.SamplingParams(max_tokens=int(want.shape[1]), temperature=0.0, stop=[])
        r = samp.sample(types.ModelInput.from_ints(prompt), 1, params).result(timeout=120)
        got = list(r.sequences[0].tokens)
        print(f"prompt {p} ({n} tokens): {got}")
        assert got == [int(t) for t in want[p]], (p, got, want[p].tolist())
