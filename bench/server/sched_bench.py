#!/usr/bin/env python3
"""Fair scheduling and bounded memory of `twinkle serve` through the official tinker SDK (not a test).

  flood   one tenant keeps 4 sampling requests of 256 samples x MAX_TOKENS in flight (another
          process), a second tenant trains (forward_backward + optim_step, 2 datums x 6 tokens),
          a third samples small requests (4 samples x 16 tokens); per-tenant latencies alone and
          under the flood, and the wait the flood adds (loaded - solo, p50 / p99).
  memory  per-run resident memory at LoRA rank 8, 32 and 128 (8 runs each, one training step,
          none spilled: RSS growth / 8), then the RSS after 1,000 idle runs (rank 8, one step
          each) with --max-live-runs 8, every 100 runs.

Each mode starts its own server (the built-in model, a fresh data dir) on a free port.

    python bench/server/sched_bench.py flood  [--bin build/twinkle]
    python bench/server/sched_bench.py memory [--bin build/twinkle] [--runs 1000]
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TINKER_TELEMETRY", "0")
BASE = "twinkle/tiny-qwen3"
MAX_TOKENS = 48

FLOOD = """
import os, sys
os.environ["TINKER_TELEMETRY"] = "0"
import tinker
from tinker import types
sc = tinker.ServiceClient(base_url=sys.argv[1], api_key="tml-flooder")
s = sc.create_sampling_client(base_model="twinkle/tiny-qwen3")
s = s.result() if hasattr(s, "result") else s
p = types.ModelInput.from_ints([100, 101, 102, 103])
params = types.SamplingParams(max_tokens=int(sys.argv[2]), temperature=1.0, stop=[])
inflight = [s.sample(p, 256, params) for _ in range(4)]
print("flooding", flush=True)
while True:
    inflight[0].result(timeout=600)
    print("done", flush=True)
    inflight = inflight[1:] + [s.sample(p, 256, params)]
"""


class Server:
    def __init__(self, binary, *args):
        self.dir = tempfile.mkdtemp(prefix="twk-sched-bench-")
        self.proc = subprocess.Popen([binary, "serve", "--port", "0", "--data-dir", self.dir + "/data", "--quiet", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("port "):
            raise SystemExit(f"the server did not start: {line!r}")
        self.url = f"http://127.0.0.1:{int(line.split()[1])}"

    def rss_mib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
        return float("nan")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=120)
        subprocess.run(["rm", "-rf", self.dir])


def pct(xs, p):
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, int(round(p * len(s))) - 1))]


def datums(types, n, length, shift=0):
    out = []
    for d in range(n):
        seq = [100 + (shift + d * 7 + j) % 32 for j in range(length + 1)]
        out.append(types.Datum(model_input=types.ModelInput.from_ints(seq[:-1]),
                               loss_fn_inputs={"target_tokens": seq[1:], "weights": [1.0] * length}))
    return out


def resolve(x):
    return x.result(timeout=120) if hasattr(x, "result") else x


def flood(args):
    import tinker
    from tinker import types

    srv = Server(args.bin)
    adam = types.AdamParams(learning_rate=1e-3)
    tc = resolve(tinker.ServiceClient(base_url=srv.url, api_key="tml-trainer").create_lora_training_client(
        base_model=BASE, rank=8, seed=1))
    small = resolve(tinker.ServiceClient(base_url=srv.url, api_key="tml-small").create_sampling_client(base_model=BASE))
    prompt = types.ModelInput.from_ints([100, 101, 102, 103])

    def measure(n):
        fb, sm = [], []
        for i in range(n):
            t = time.perf_counter()
            tc.forward_backward(datums(types, 2, 6, i), "cross_entropy").result(timeout=600)
            fb.append(time.perf_counter() - t)
            tc.optim_step(adam).result(timeout=600)
            t = time.perf_counter()
            small.sample(prompt, 4, types.SamplingParams(max_tokens=16, stop=[])).result(timeout=600)
            sm.append(time.perf_counter() - t)
        return fb, sm

    measure(3)
    solo_fb, solo_sm = measure(30)
    rounds = []
    for _ in range(5):  # one decode round of the flood (16 sequences), alone
        t = time.perf_counter()
        small.sample(prompt, 16, types.SamplingParams(max_tokens=MAX_TOKENS, stop=[])).result(timeout=600)
        rounds.append(time.perf_counter() - t)
    fl = subprocess.Popen([sys.executable, "-c", FLOOD, srv.url, str(MAX_TOKENS)], stdout=subprocess.PIPE, text=True)
    assert fl.stdout.readline().strip() == "flooding"
    time.sleep(1.0)
    load_fb, load_sm = measure(30)
    fl.terminate()
    out = fl.communicate(timeout=60)[0]
    fl_lat = [x for x in out.splitlines() if x.startswith("done")]
    srv.stop()
    ms = lambda x: x * 1e3
    print(f"flood: tenant 'flooder' keeps 4 x asample(256 samples x {MAX_TOKENS} tokens) in flight; one round "
          f"(16 x {MAX_TOKENS} tokens) alone: p50 {pct(rounds, .5) * 1e3:.0f} ms, max {max(rounds) * 1e3:.0f} ms")
    for name, solo, load in (("trainer forward_backward (2 x 6 tokens)", solo_fb, load_fb),
                             ("small sampler (4 x 16 tokens)", solo_sm, load_sm)):
        print(f"  {name}: alone p50 {ms(pct(solo, .5)):.1f} ms p99 {ms(pct(solo, .99)):.1f} ms | under the flood "
              f"p50 {ms(pct(load, .5)):.1f} ms p99 {ms(pct(load, .99)):.1f} ms | added wait p50 "
              f"{ms(pct(load, .5) - pct(solo, .5)):.1f} ms p99 {ms(pct(load, .99) - pct(solo, .99)):.1f} ms")
    print(f"  flooder: {len(fl_lat)} requests of 256 samples (16 rounds each) finished meanwhile")


def memory(args):
    import tinker
    from tinker import types

    adam = types.AdamParams(learning_rate=1e-3)
    for rank in (8, 32, 128):
        srv = Server(args.bin, "--max-live-runs", "64")
        sc = tinker.ServiceClient(base_url=srv.url, api_key="tml-mem")

        def one(seed):
            tc = resolve(sc.create_lora_training_client(base_model=BASE, rank=rank, seed=seed))
            tc.forward_backward(datums(types, 4, 16, seed), "cross_entropy").result(timeout=600)
            tc.optim_step(adam).result(timeout=600)
            return tc

        keep = [one(0)]
        r0 = srv.rss_mib()
        keep += [one(s) for s in range(1, 9)]
        r1 = srv.rss_mib()
        print(f"rank {rank:3d}: per-run resident memory {(r1 - r0) / 8:.2f} MiB (RSS {r0:.1f} -> {r1:.1f} MiB over 8 runs)")
        srv.stop()
    srv = Server(args.bin, "--max-live-runs", "8")
    sc = tinker.ServiceClient(base_url=srv.url, api_key="tml-mem")
    start = srv.rss_mib()
    t0 = time.time()
    line = []
    for i in range(args.runs):
        tc = resolve(sc.create_lora_training_client(base_model=BASE, rank=8, seed=i))
        tc.forward_backward(datums(types, 4, 16, i), "cross_entropy").result(timeout=600)
        tc.optim_step(adam).result(timeout=600)
        if (i + 1) % 100 == 0:
            line.append(f"{i + 1}: {srv.rss_mib():.1f}")
    print(f"{args.runs} idle runs (rank 8, one step each), --max-live-runs 8: RSS MiB at start {start:.1f}, "
          + ", ".join(line) + f"; {time.time() - t0:.0f} s")
    srv.stop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["flood", "memory"])
    ap.add_argument("--bin", default="build/twinkle")
    ap.add_argument("--runs", type=int, default=1000)
    args = ap.parse_args()
    flood(args) if args.mode == "flood" else memory(args)


if __name__ == "__main__":
    main()
