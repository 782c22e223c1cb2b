#!/usr/bin/env python3
"""The SDK side of bench/server/run.sh: drives a running `twinkle serve` through
the official tinker SDK (unchanged) and prints figures plus one RESULT line for
run.sh to parse.

  latency  one LoRA training client (rank 8, seed 0, attention + MLP, no
           unembedding: the in-process peer's configuration); times N
           sequential forward_backward(batch, "cross_entropy").result() calls
           after W warm-up calls on a fixed batch of D datums x T tokens (the
           same tokens bench_server_inproc uses); also the time the
           forward_backward() call itself takes to return its future, a
           raw-HTTP floor (GET /api/v1/healthz on one keep-alive connection),
           and --trace more calls with each HTTP request timestamped (httpx's
           transport wrapped; the timed calls above run unwrapped) to show
           which phase of the round trip the time goes to.
  tenants  P processes, tenant i with API key tml-tenant-<i> (open mode: each
           key is its own tenant) and its own run; each does W warm-up steps,
           waits on a barrier, then K steps of forward_backward + optim_step
           (both submitted, then both awaited, as examples/tinker_lora_demo.py
           does). Aggregate steps/s = all steps / (last finish - first start).
           --driver raw: the run is made through the SDK, but the steps are sent
           by a lean client on one keep-alive http.client connection — the same
           requests (forward_backward bodies encoded beforehand by the SDK's own
           protobuf encoder, optim_step JSON, long-polled retrieve_future), at
           ~0.5 ms of Python per step instead of the SDK's ~12 ms, so that on a
           small machine the clients do not take the server's cores.
           Then each tenant's queue waits over the timed steps (job submitted →
           started on the compute worker): GET /metrics before and after them
           (the tenants wait on a second barrier while the first scrape runs),
           twinkle_queue_wait_seconds per tenant and kind, one line each with
           the job count, mean, and p50 / p99 estimated from the histogram's
           buckets (linear within a bucket, as Prometheus' histogram_quantile).
           Per-tenant series need an admin key (--metrics-key, a keys-file line
           ending in `admin`); with any other key the server sums its tenants
           and one line covers them all.

With --server-pid, both modes also print CPU time per call / step: the SDK
client's (process_time), the server loop thread's and the server's other
threads' (compute worker, CPU backend pool, OpenBLAS), read from /proc.

    python bench/server/sdk_bench.py latency --base-url http://127.0.0.1:PORT
    python bench/server/sdk_bench.py tenants --base-url http://127.0.0.1:PORT --tenants 8 --steps 20
"""
import argparse
import http.client
import json
import math
import multiprocessing as mp
import os
import statistics
import sys
import time
import urllib.parse
import warnings

BARRIER_S = 60  # + 15 s per tenant: each imports the SDK and creates its run before the barrier
RESULT_TIMEOUT_S = 60  # a dead server fails the bench instead of hanging it (the SDK retries connections forever)
VOCAB_MOD = 512  # token ids s[j] = (5 + 37 d + 11 j) mod 512, as in bench/server_inproc.c


def pct(xs, p):
    """Nearest-rank percentile (the rule bench_server_inproc uses)."""
    s = sorted(xs)
    k = min(max(math.ceil(p * len(s)) - 1, 0), len(s) - 1)
    return s[k]


def make_batch(types, datums, tokens, shift=0):
    out = []
    for d in range(datums):
        seq = [(5 + 37 * (d + shift) + 11 * j) % VOCAB_MOD for j in range(tokens + 1)]
        out.append(types.Datum(model_input=types.ModelInput.from_ints(seq[:-1]),
                               loss_fn_inputs={"target_tokens": seq[1:], "weights": [1.0] * tokens}))
    return out


def training_client(base_url, key, rank):
    os.environ.setdefault("TINKER_TELEMETRY", "0")
    import tinker
    warnings.filterwarnings("ignore", category=FutureWarning)  # get_server_capabilities, as the demo uses it
    service = tinker.ServiceClient(base_url=base_url, api_key=key)
    base = service.get_server_capabilities().supported_models[0].model_name
    tc = service.create_lora_training_client(base_model=base, rank=rank, seed=0, train_mlp=True, train_attn=True,
                                             train_unembed=False)
    if hasattr(tc, "result"):  # newer SDKs return a future of the client
        tc = tc.result()
    return tinker, tc


def server_cpu(pid):
    """(loop thread, other threads) CPU seconds of the server: the loop thread is the main thread (tid == pid);
    the others are the compute worker and the CPU backend's / BLAS's threads."""
    if not pid:
        return (0.0, 0.0)
    hz = os.sysconf("SC_CLK_TCK")
    loop = rest = 0.0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        cpu = (int(fields[11]) + int(fields[12])) / hz  # utime, stime
        if int(tid) == pid:
            loop += cpu
        else:
            rest += cpu
    return (loop, rest)


def cpu_line(what, count, wall, client_s, s0, s1):
    loop, comp = s1[0] - s0[0], s1[1] - s0[1]
    ms = lambda x: 1e3 * x / count
    return (f"  CPU per {what}: SDK client {ms(client_s):.2f} ms, server loop thread {ms(loop):.2f} ms, "
            f"server compute threads {ms(comp):.2f} ms; all together {(client_s + loop + comp) / wall:.2f} "
            f"of {os.cpu_count()} cores busy (server CPU from /proc, 1/{os.sysconf('SC_CLK_TCK')} s ticks)")


def healthz_floor(base_url, n):
    u = urllib.parse.urlparse(base_url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
    ms = []
    for i in range(n + 10):
        t0 = time.perf_counter()
        conn.request("GET", "/api/v1/healthz")
        r = conn.getresponse()
        r.read()
        if r.status != 200:
            raise SystemExit(f"healthz answered {r.status}")
        if i >= 10:
            ms.append((time.perf_counter() - t0) * 1e3)
    conn.close()
    return ms


def trace_calls(tc, batch, n):
    """Where a round trip's time goes: wraps httpx's transport (the SDK's, over HTTP/1.1 here) to timestamp each
    request, then runs n more forward_backward calls. Returns per-call phase lists in ms."""
    import httpx
    log = []
    orig = httpx.AsyncHTTPTransport.handle_async_request

    async def traced(self, request):
        t = time.perf_counter()
        r = await orig(self, request)
        log.append((request.url.path.rsplit("/", 1)[-1], t, time.perf_counter()))
        return r

    httpx.AsyncHTTPTransport.handle_async_request = traced
    ph = {k: [] for k in ("pre", "fb", "gap", "poll", "post", "polls")}
    try:
        for _ in range(n):
            k = len(log)
            t0 = time.perf_counter()
            tc.forward_backward(batch, "cross_entropy").result(timeout=RESULT_TIMEOUT_S)
            t1 = time.perf_counter()
            fb = [x for x in log[k:] if x[0] == "forward_backward"]
            rf = [x for x in log[k:] if x[0] == "retrieve_future"]
            if len(fb) != 1 or not rf:
                continue
            ph["pre"].append(fb[0][1] - t0)
            ph["fb"].append(fb[0][2] - fb[0][1])
            ph["gap"].append(rf[0][1] - fb[0][2])
            ph["poll"].append(rf[-1][2] - rf[0][1])
            ph["post"].append(t1 - rf[-1][2])
            ph["polls"].append(len(rf) / 1e3)  # a count; scaled back by the 1e3 below
    finally:
        httpx.AsyncHTTPTransport.handle_async_request = orig
    return {k: [1e3 * x for x in v] for k, v in ph.items()}


def cmd_latency(a):
    tinker, tc = training_client(a.base_url, a.key, a.rank)
    types = tinker.types
    batch = make_batch(types, a.datums, a.tokens)
    total, submit, loss = [], [], None
    for i in range(a.warmup + a.n):
        if i == a.warmup:
            c0, s0, w0 = time.process_time(), server_cpu(a.server_pid), time.perf_counter()
        t0 = time.perf_counter()
        fut = tc.forward_backward(batch, "cross_entropy")
        t1 = time.perf_counter()
        res = fut.result(timeout=RESULT_TIMEOUT_S)
        t2 = time.perf_counter()
        if loss is None:
            loss = res.metrics["loss:sum"]
        if i >= a.warmup:
            submit.append((t1 - t0) * 1e3)
            total.append((t2 - t0) * 1e3)
    c1, s1, w1 = time.process_time(), server_cpu(a.server_pid), time.perf_counter()
    if not math.isfinite(loss):
        raise SystemExit(f"sdk_bench: non-finite loss {loss}")
    hz = healthz_floor(a.base_url, a.n)
    tr = trace_calls(tc, batch, a.trace) if a.trace else None
    print(f"SDK forward_backward(...).result(): {a.datums} datums x {a.tokens} tokens, LoRA rank {a.rank}: "
          f"p50 {pct(total, .5):.3f} ms  p99 {pct(total, .99):.3f} ms  mean {statistics.fmean(total):.3f} ms  "
          f"({a.n} calls after {a.warmup} warm-up)  loss:sum {loss:.4f}")
    print(f"  of which forward_backward() returning its future: p50 {pct(submit, .5):.3f} ms  "
          f"p99 {pct(submit, .99):.3f} ms")
    print(cpu_line("call", a.n, w1 - w0, c1 - c0, s0, s1))
    if tr and tr["pre"]:
        m = {k: statistics.median(v) for k, v in tr.items()}
        print(f"  where it goes (median of {len(tr['pre'])} traced calls, ms): SDK before sending {m['pre']:.2f} | "
              f"POST forward_backward -> future id {m['fb']:.2f} | SDK until retrieve_future sent {m['gap']:.2f} | "
              f"retrieve_future long poll -> result {m['poll']:.2f} | SDK decoding, back to caller {m['post']:.2f}; "
              f"retrieve_future requests per call: max {max(tr['polls']):.0f}")
    print(f"  raw HTTP floor, GET /api/v1/healthz keep-alive (http.client): p50 {pct(hz, .5):.3f} ms  "
          f"p99 {pct(hz, .99):.3f} ms")
    print(f"RESULT {pct(total, .5):.6f} {pct(total, .99):.6f} {statistics.fmean(total):.6f} {loss:.6f} "
          f"{pct(submit, .5):.6f} {pct(hz, .5):.6f}", flush=True)


class RawSteps:
    """forward_backward + optim_step of one run sent by hand on one keep-alive connection: the
    requests the SDK sends (its own encoder made the forward_backward bodies), without its client."""

    def __init__(self, tinker, a, key, model_id, batch, n_steps):
        from tinker.proto.request_conv import forward_backward_request_to_proto
        types = tinker.types
        u = urllib.parse.urlparse(a.base_url)
        self.conn = http.client.HTTPConnection(u.hostname, u.port, timeout=RESULT_TIMEOUT_S)
        self.key = key
        self.bodies = []
        adam = {"learning_rate": 1e-4, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8}
        for k in range(n_steps):  # seq_ids 1, 2, ...: the run's first ops
            fb = types.ForwardBackwardRequest(
                forward_backward_input=types.ForwardBackwardInput(data=batch, loss_fn="cross_entropy"),
                model_id=model_id, seq_id=2 * k + 1)
            opt = json.dumps({"model_id": model_id, "seq_id": 2 * k + 2, "adam_params": adam}).encode()
            self.bodies.append((forward_backward_request_to_proto(fb).SerializeToString(), opt))
        self.k = 0

    def post(self, route, body, ctype):
        self.conn.request("POST", "/api/v1/" + route, body=body, headers={"X-API-Key": self.key, "Content-Type": ctype})
        r = self.conn.getresponse()
        data = r.read()
        if r.status != 200:
            raise RuntimeError(f"{route}: HTTP {r.status}: {data[:200]!r}")
        return r.getheader("Content-Type", ""), data

    def result(self, req):
        body = json.dumps({"request_id": req}).encode()
        while True:
            ctype, data = self.post("retrieve_future", body, "application/json")
            if not ctype.startswith("application/json"):
                return data  # the protobuf ForwardBackwardOutput
            j = json.loads(data)
            if j.get("type") == "try_again":
                continue
            if "error" in j:
                raise RuntimeError(f"future {req} failed: {j['error']}")
            return j

    def step(self):
        fb, opt = self.bodies[self.k]
        self.k += 1
        f1 = json.loads(self.post("forward_backward", fb, "application/x-protobuf")[1])["request_id"]
        f2 = json.loads(self.post("optim_step", opt, "application/json")[1])["request_id"]
        out = self.result(f1)
        self.result(f2)
        return out

    @staticmethod
    def loss(out):
        from tinker.proto.response_conv import deserialize_forward_backward_output
        return deserialize_forward_backward_output(out).metrics["loss:sum"]


def queue_waits(a):
    """twinkle_queue_wait_seconds from GET /metrics: {(tenant, kind): {"le": {bound: cumulative count}, "sum", "count"}};
    tenant "" when the key's view sums the tenants (not an admin key)."""
    u = urllib.parse.urlparse(a.base_url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=RESULT_TIMEOUT_S)
    conn.request("GET", "/metrics", headers={"X-API-Key": a.metrics_key or f"tml-tenant-{a.first}"})
    r = conn.getresponse()
    text = r.read().decode()
    conn.close()
    if r.status != 200:
        raise SystemExit(f"sdk_bench: GET /metrics answered {r.status}: {text[:200]}")
    out = {}
    for line in text.splitlines():
        if not line.startswith("twinkle_queue_wait_seconds"):
            continue
        head, value = line.rsplit(" ", 1)
        name, _, labels = head.partition("{")
        lab = dict(kv.split("=", 1) for kv in labels.rstrip("}").split(",") if kv)
        lab = {k: v.strip('"') for k, v in lab.items()}
        h = out.setdefault((lab.get("tenant", ""), lab.get("kind", "")), {"le": {}, "sum": 0.0, "count": 0.0})
        if name.endswith("_bucket"):
            h["le"][float(lab["le"])] = float(value)  # float("+Inf") is inf
        elif name.endswith("_sum"):
            h["sum"] = float(value)
        elif name.endswith("_count"):
            h["count"] = float(value)
    return out


def bucket_quantile(le, count, p):
    """The p-quantile of a histogram's cumulative buckets {bound: count}, linear within its bucket
    (Prometheus' histogram_quantile); the largest finite bound when it falls in the +Inf bucket."""
    rank, lo, below = p * count, 0.0, 0.0
    for bound in sorted(le):
        if le[bound] >= rank and le[bound] > below:
            if math.isinf(bound):
                return lo
            return lo + (bound - lo) * (rank - below) / (le[bound] - below)
        lo, below = (bound if not math.isinf(bound) else lo), le[bound]
    return lo


def wait_lines(w0, w1, a):
    """One line per (tenant, kind) whose jobs moved between the two scrapes: the timed steps' queue waits."""
    if w0 is None or w1 is None:
        return ["  queue waits: not measured (a tenant failed before the barrier)"]
    out = []
    for (tenant, kind), h in sorted(w1.items()):
        b = w0.get((tenant, kind), {"le": {}, "sum": 0.0, "count": 0.0})
        n = h["count"] - b["count"]
        if n <= 0:
            continue
        le = {k: v - b["le"].get(k, 0.0) for k, v in h["le"].items()}
        mean = (h["sum"] - b["sum"]) / n
        who = f"tenant {tenant}" if tenant else "all tenants (summed: /metrics shows tenants to an admin key only)"
        out.append(f"  queue wait {who}, {kind}: {n:.0f} jobs, mean {mean * 1e3:.2f} ms, p50 "
                   f"{bucket_quantile(le, n, .5) * 1e3:.2f} ms, p99 {bucket_quantile(le, n, .99) * 1e3:.2f} ms "
                   f"(p50 / p99 estimated from the histogram's buckets)")
    return out or ["  queue waits: no job of these tenants reached the worker between the scrapes"]


def barrier_s(a):
    """How long the tenants wait for each other at the start (set-up and warm-up steps included)."""
    return a.barrier_s if a.barrier_s else BARRIER_S + 15 * a.tenants


def tenant_main(i, a, barrier, q):
    try:
        tinker, tc = training_client(a.base_url, f"tml-tenant-{i}", a.rank)
        types = tinker.types
        batch = make_batch(types, a.datums, a.tokens, shift=i)
        adam = types.AdamParams(learning_rate=1e-4, beta1=0.9, beta2=0.95, eps=1e-8)

        if a.driver == "raw":
            raw = RawSteps(tinker, a, f"tml-tenant-{i}", tc.model_id, batch, a.warmup + a.steps)
            step_raw, loss_of = raw.step, raw.loss
        else:
            def step_raw():
                fb = tc.forward_backward(batch, "cross_entropy")
                opt = tc.optim_step(adam)
                out = fb.result(timeout=RESULT_TIMEOUT_S)
                opt.result(timeout=RESULT_TIMEOUT_S)
                return out

            def loss_of(out):
                return out.metrics["loss:sum"]

        first = loss_of(step_raw())
        for _ in range(a.warmup - 1):
            step_raw()
        barrier.wait(timeout=barrier_s(a))
        barrier.wait(timeout=barrier_s(a))  # the parent scraped /metrics in between
        t0, c0 = time.monotonic(), time.process_time()
        for _ in range(a.steps):
            out = step_raw()
        t1, c1 = time.monotonic(), time.process_time()
        last = loss_of(out)
        q.put((i, t0, t1, first, last, None, c1 - c0))
    except Exception as e:  # report, don't hang the parent
        try:
            barrier.abort()
        except Exception:
            pass
        q.put((i, 0, 0, 0, 0, f"{type(e).__name__}: {e}", 0))


def cmd_tenants(a):
    ctx = mp.get_context("fork")  # tinker is imported in the children only
    barrier, q = ctx.Barrier(a.tenants + 1), ctx.Queue()  # the parent waits too, to read the server's CPU
    procs = [ctx.Process(target=tenant_main, args=(i + a.first, a, barrier, q)) for i in range(a.tenants)]
    for p in procs:
        p.start()
    waits0 = None
    try:
        barrier.wait(timeout=barrier_s(a) + 30)
        waits0 = queue_waits(a)  # every warm-up job has finished: the tenants wait on the barrier
        barrier.wait(timeout=barrier_s(a) + 30)
    except Exception:
        pass  # a tenant failed before the barrier; its row says why
    s0 = server_cpu(a.server_pid)
    rows = [q.get(timeout=300 + a.tenants * a.steps + (a.barrier_s or 0)) for _ in procs]
    s1 = server_cpu(a.server_pid)
    waits1 = queue_waits(a) if waits0 is not None else None
    for p in procs:
        p.join()
    bad = [r for r in rows if r[5]]
    if bad:
        raise SystemExit("sdk_bench: tenant failed: " + "; ".join(f"tml-tenant-{r[0]}: {r[5]}" for r in bad))
    rows.sort()
    span = max(r[2] for r in rows) - min(r[1] for r in rows)
    agg = a.tenants * a.steps / span
    per = [a.steps / (r[2] - r[1]) for r in rows]
    worse = [r[0] for r in rows if not (math.isfinite(r[4]) and r[4] < r[3])]
    print(f"{a.tenants} tenant(s) x {a.steps} steps (forward_backward + optim_step, {a.datums} datums x {a.tokens} "
          f"tokens, LoRA rank {a.rank}, {a.driver} driver) after {a.warmup} warm-up: aggregate {agg:.2f} steps/s over {span:.2f} s; "
          f"per tenant min {min(per):.2f} median {statistics.median(per):.2f} max {max(per):.2f} steps/s")
    print(cpu_line("step (all tenants)", a.tenants * a.steps, span, sum(r[6] for r in rows), s0, s1))
    for line in wait_lines(waits0, waits1, a):
        print(line)
    if worse:  # lr 1e-4 on a fixed batch: the loss must fall
        raise SystemExit(f"sdk_bench: the loss did not fall for tenants {worse}")
    print(f"RESULT {a.tenants} {agg:.6f} {min(per):.6f} {statistics.median(per):.6f} {max(per):.6f} {span:.6f}",
          flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["latency", "tenants"])
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--datums", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--n", type=int, default=200, help="latency: timed calls")
    ap.add_argument("--warmup", type=int, default=None, help="latency: 10 calls; tenants: 2 steps")
    ap.add_argument("--key", default="tml-bench-latency", help="latency: API key")
    ap.add_argument("--trace", type=int, default=50, help="latency: extra calls with per-request timestamps (0: none)")
    ap.add_argument("--tenants", type=int, default=8)
    ap.add_argument("--first", type=int, default=0, help="tenants: first tenant index (keys tml-tenant-<i>)")
    ap.add_argument("--steps", type=int, default=20, help="tenants: timed steps per tenant")
    ap.add_argument("--barrier-s", type=float, default=0,
                    help="tenants: how long they wait for each other after set-up and warm-up (0: 60 + 15 per tenant)")
    ap.add_argument("--driver", choices=["sdk", "raw"], default="sdk",
                    help="tenants: steps through the SDK's training client, or its requests sent by hand (above)")
    ap.add_argument("--server-pid", type=int, default=0, help="the server's pid: adds its CPU time per call / step")
    ap.add_argument("--metrics-key", default=os.environ.get("TWK_BENCH_METRICS_KEY", ""),
                    help="tenants: the key GET /metrics is read with; an admin key shows each tenant's queue waits "
                         "(default $TWK_BENCH_METRICS_KEY, else the first tenant's key: waits summed over tenants)")
    a = ap.parse_args()
    if a.warmup is None:
        a.warmup = 10 if a.mode == "latency" else 2
    if a.mode == "tenants":
        a.warmup = max(a.warmup, 1)
    (cmd_latency if a.mode == "latency" else cmd_tenants)(a)


if __name__ == "__main__":
    sys.exit(main())
