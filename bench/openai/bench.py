"""/v1/chat/completions against the same load through Tinker sampling (the overhead of the
OpenAI layer): 16 concurrent clients, each sending REQS requests of one chat prompt with
max_tokens MAXTOK at temperature 1 with per-request seeds; the Tinker side samples the same
prompt tokens (transformers' apply_chat_template) with the same seeds, so both decode the same
tokens. Prints latency p50 / p95, requests/s and generated tokens/s for each, and their ratio.
Checks: both sides generate the same token count (exit 1 otherwise).

    TWINKLE_BIN=build/twinkle /work/venv-sdk/bin/python bench/openai/bench.py [--clients 16] [--reqs 4]
"""
import argparse
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "sdk"))
from conftest import Server  # noqa: E402
from test_openai import MODEL, _make_models  # noqa: E402  (the test's model folder)

MESSAGES = [{"role": "user", "content": "Hello, how are you today?"}]


def run(label, clients, reqs, one):
    lat, toks = [], []
    t0 = time.time()

    def worker(c):
        for r in range(reqs):
            t = time.time()
            toks.append(one(c * 1000 + r))
            lat.append(time.time() - t)

    with ThreadPoolExecutor(clients) as ex:
        list(ex.map(worker, range(clients)))
    wall = time.time() - t0
    lat.sort()
    p95 = lat[min(len(lat) - 1, int(0.95 * len(lat)))]
    print(f"{label:8s} requests {len(lat)}  p50 {statistics.median(lat) * 1e3:7.1f} ms  p95 {p95 * 1e3:7.1f} ms  "
          f"{len(lat) / wall:6.2f} req/s  {sum(toks) / wall:7.1f} tok/s  ({sum(toks)} tokens in {wall:.2f} s)")
    return len(lat) / wall, sum(toks)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--reqs", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=32)
    a = ap.parse_args()
    import openai
    import tinker
    from tinker import types
    from transformers import AutoTokenizer

    tmp = Path(tempfile.mkdtemp(prefix="bench-openai-"))
    dirs = _make_models(tmp / "models")
    srv = Server(tmp / "data", ["--model", f"{dirs[MODEL]}={MODEL}"], log_path=tmp / "serve.log")
    url = f"http://127.0.0.1:{srv.port}"
    try:
        oc = openai.OpenAI(base_url=url + "/v1", api_key="tml-bench", max_retries=0, timeout=600)
        sc = tinker.ServiceClient(base_url=url, api_key="tml-bench").create_sampling_client(base_model=MODEL)
        sc = sc.result() if hasattr(sc, "result") else sc
        ids = AutoTokenizer.from_pretrained(str(dirs[MODEL])).apply_chat_template(MESSAGES, add_generation_prompt=True)
        if not isinstance(ids, list):
            ids = ids["input_ids"]
        prompt = types.ModelInput.from_ints(list(ids))

        def via_openai(seed):
            r = oc.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=a.max_tokens, temperature=1.0,
                                           seed=seed)
            return r.usage.completion_tokens

        def via_tinker(seed):
            p = types.SamplingParams(max_tokens=a.max_tokens, temperature=1.0, seed=seed)
            return len(sc.sample(prompt, num_samples=1, sampling_params=p).result().sequences[0].tokens)

        via_openai(0), via_tinker(0)  # warm up (sampler, template)
        print(f"{a.clients} clients x {a.reqs} requests, max_tokens {a.max_tokens}, prompt {len(ids)} tokens")
        rt, nt = run("tinker", a.clients, a.reqs, via_tinker)
        ro, no = run("openai", a.clients, a.reqs, via_openai)
        print(f"SUMMARY openai_over_tinker_req_s={ro / rt:.3f} tokens_openai={no} tokens_tinker={nt}")
        if no != nt:
            print("FAIL: the two sides generated different token counts")
            return 1
        return 0
    finally:
        srv.kill()


if __name__ == "__main__":
    sys.exit(main())
