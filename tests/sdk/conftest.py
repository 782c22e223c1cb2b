"""Shared fixtures for the SDK compatibility suite: `twinkle serve` processes
driven by the official `tinker` SDK (unchanged) and by raw HTTP.

Environment:
  TWINKLE_BIN       the twinkle binary (default: <repo>/build/twinkle)
  TWK_SERVE_DEVICE  --device for the shared server (default: the CPU)
  TWK_SERVE_MPIRUN  a launcher prefix, e.g. "mpirun -np 2": every server the suite starts is the
                    multi-rank service (rank 0 answers HTTP; tests/sdk/test_mpi_serve.py)
"""
from __future__ import annotations

import os
import select
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BASE_MODEL = "twinkle/tiny-qwen3"  # the built-in model served when no --model is given
VOCAB = 512


def twinkle_bin() -> Path:
    env = os.environ.get("TWINKLE_BIN")
    if env:
        p = Path(env)
        if not p.is_absolute():
            # relative to the cwd first (ctest, run.sh), then to the repo root
            p = Path.cwd() / p if (Path.cwd() / p).exists() else REPO / p
        return p
    return REPO / "build" / "twinkle"


def is_asan_build(binary: Path | None = None) -> bool:
    """True when the twinkle binary is built with AddressSanitizer, whose quarantine keeps freed
    memory resident (RSS then cannot show a release; measure engine_mib instead)."""
    with open(binary or twinkle_bin(), "rb") as f:
        return b"__asan_init" in f.read()


def rss_mib(pid: int) -> float:
    """The resident set of process pid, in MiB (VmRSS)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    raise AssertionError("no VmRSS")


def post_json(port: int, route: str, body, key: str):
    """POST /api/v1/<route> with a JSON body and an API key: (status, the answer's text)."""
    import http.client
    import json

    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("POST", f"/api/v1/{route}", body=json.dumps(body), headers={"Content-Type": "application/json", "X-API-Key": key})
    r = c.getresponse()
    data = r.read().decode()
    c.close()
    return r.status, data


def metric_sum(port: int, key: str, *names: str) -> float:
    """The sum of every sample of the named series on GET /metrics (read with a tenant key)."""
    import http.client

    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/metrics", headers={"X-API-Key": key})
    r = c.getresponse()
    text = r.read().decode()
    c.close()
    assert r.status == 200, (r.status, text[:300])
    total = 0.0
    for line in text.splitlines():
        if line.split("{", 1)[0].split(" ", 1)[0] in names:
            total += float(line.rsplit(" ", 1)[1])
    return total


def engine_mib(port: int, key: str) -> float:
    """MiB the server holds through the engine's allocators, read from GET /metrics: the host
    allocator (twk_host_alloc: adapters, moments, snapshots, requests, cJSON trees) plus the
    device buffers of the HAL. Exact under any malloc, so it measures releases under ASan too."""
    return metric_sum(port, key, "twinkle_host_memory_bytes", "twinkle_device_memory_bytes") / (1024.0 * 1024.0)


def pytest_configure(config):
    # The suite calls a few SDK methods that 0.38 marks deprecated on purpose
    # (get_server_capabilities, load_state): they are still part of the API.
    config.addinivalue_line("filterwarnings", "ignore:DEPRECATED:FutureWarning")



def server_env() -> dict:
    """The server's environment: the tests' own, but on an AVX-512 CPU where OpenBLAS is pinned to
    (or picked) its AVX2 Haswell / Zen kernels, SkylakeX's instead. The packed-training tests want a
    run packed with others bit-identical to the run alone, which needs a BLAS that gives a row the
    same bits whatever the row count: SkylakeX's sgemm did on the AMD EPYC VM where Haswell's did
    not (OPENBLAS_CORETYPE=Haswell set machine-wide there; DPO runs then drifted by 1e-3)."""
    env = os.environ.copy()
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        flags = []
    if "avx512bw" in flags and env.get("OPENBLAS_CORETYPE", "Haswell").lower() in ("haswell", "zen"):
        env["OPENBLAS_CORETYPE"] = "SkylakeX"
    return env

class Server:
    """One `twinkle serve` process on a free port with its own data dir."""

    def __init__(self, data_dir: Path, extra_args=(), log_path: Path | None = None, port: int = 0,
                 launcher: str | None = None):
        # launcher: a prefix such as "mpirun -np 2" (default $TWK_SERVE_MPIRUN; "" = one process)
        self.launcher = shlex.split(os.environ.get("TWK_SERVE_MPIRUN", "") if launcher is None else launcher)
        self.data_dir = Path(data_dir)
        self.extra_args = list(extra_args)
        self.log_path = Path(log_path) if log_path else self.data_dir.parent / (self.data_dir.name + ".log")
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None
        self._start(port)

    def _start(self, port: int):
        binary = twinkle_bin()
        if not binary.exists():
            pytest.fail(f"twinkle binary not found at {binary} (build it, or set TWINKLE_BIN)")
        cmd = [*self.launcher, str(binary), "serve", "--port", str(port), "--data-dir", str(self.data_dir),
               *self.extra_args]
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.log, stdin=subprocess.DEVNULL,
                                     env=server_env())
        deadline = time.time() + 60
        line = b""
        while time.time() < deadline:
            r, _, _ = select.select([self.proc.stdout], [], [], 0.2)
            if r:
                line = self.proc.stdout.readline()
                if line.startswith(b"port "):
                    self.port = int(line.split()[1])
                    return
                if not line:  # EOF: the process exited
                    break
            elif self.proc.poll() is not None:
                break
        rc = self.proc.poll()
        self.kill()
        pytest.fail(f"twinkle serve did not start (rc={rc}, last stdout {line!r}); log:\n{self.log_text()}")

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self, sig=signal.SIGKILL):
        if self.proc is not None and self.proc.poll() is None:
            if self.launcher and sig == signal.SIGKILL:  # every rank, then the launcher: one crash
                self._kill_ranks()
            os.kill(self.proc.pid, sig)  # mpirun forwards SIGTERM; rank 0 shuts down and stops the others
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self._kill_ranks()
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=20)
        if self.launcher and self.proc is not None:  # none outlives its launcher
            self._kill_ranks()
        if self.proc is not None and self.proc.stdout:
            self.proc.stdout.close()
        if getattr(self, "log", None):
            self.log.close()

    def rank_pids(self) -> dict[int, int]:
        """Under a launcher: {rank: pid} of this server's rank processes (each in its own session, so
        found by their --data-dir and PMI_RANK)."""
        ranks = {}
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                args = (d / "cmdline").read_bytes().split(b"\0")
                if b"serve" not in args or str(self.data_dir).encode() not in args:
                    continue
                env = dict(e.split(b"=", 1) for e in (d / "environ").read_bytes().split(b"\0") if b"=" in e)
            except (OSError, ValueError):
                continue
            if b"PMI_RANK" in env:
                ranks[int(env[b"PMI_RANK"])] = int(d.name)
        return ranks

    def _kill_ranks(self):
        for pid in self.rank_pids().values():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def stop(self):
        """Graceful shutdown (SIGTERM), SIGKILL if it hangs."""
        self.kill(signal.SIGTERM)


@pytest.fixture
def start_server(tmp_path):
    """Factory: start_server(data_dir=None, *args) -> Server; killed at the end of the test."""
    started: list[Server] = []
    counter = [0]

    def _start(*extra_args, data_dir: Path | None = None, port: int = 0) -> Server:
        counter[0] += 1
        d = Path(data_dir) if data_dir else tmp_path / f"data{counter[0]}"
        s = Server(d, extra_args, log_path=tmp_path / f"serve{counter[0]}.log", port=port)
        started.append(s)
        return s

    yield _start
    for s in started:
        s.kill()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One server shared by the tests of a module (open mode, default options)."""
    d = tmp_path_factory.mktemp("serve")
    device = os.environ.get("TWK_SERVE_DEVICE")  # e.g. opencl: the same suite on another backend
    s = Server(d / "data", ["--seq-timeout", "30"] + (["--device", device] if device else []), log_path=d / "serve.log")
    yield s
    s.kill()


@pytest.fixture(scope="module")
def base_url(server):
    yield server.base_url


# ---- helpers shared by the test modules ----

def counting_datum(start: int, length: int = 16, first: int = 100, digits: int = 32):
    """A learnable example: count on a clock of `digits` tokens first..first+digits-1."""
    from tinker import types

    seq = [first + (start + i) % digits for i in range(length + 1)]
    return types.Datum(
        model_input=types.ModelInput.from_ints(seq[:-1]),
        loss_fn_inputs={"target_tokens": seq[1:], "weights": [1.0] * length},
    )


def make_datum(tokens, targets, weights=None):
    from tinker import types

    inputs = {"target_tokens": list(targets)}
    if weights is not None:
        inputs["weights"] = list(weights)
    return types.Datum(model_input=types.ModelInput.from_ints(list(tokens)), loss_fn_inputs=inputs)


def logprobs_of(result):
    """Per-datum logprobs (lists of float) of a ForwardBackwardOutput."""
    return [out["logprobs"].tolist() for out in result.loss_fn_outputs]


def max_abs_diff(a, b) -> float:
    assert len(a) == len(b), f"{len(a)} vs {len(b)} datums"
    worst = 0.0
    for x, y in zip(a, b):
        assert len(x) == len(y), f"datum lengths {len(x)} vs {len(y)}"
        for u, v in zip(x, y):
            worst = max(worst, abs(u - v))
    return worst


def service_client(base_url: str, key: str = "tml-alice", **kw):
    import tinker

    return tinker.ServiceClient(base_url=base_url, api_key=key, **kw)


def rest_client(base_url: str, key: str = "tml-alice"):
    import tinker

    return tinker.RestClient(base_url=base_url, api_key=key)


def new_training_client(sc, rank: int = 8, seed: int = 1234, **kw):
    tc = sc.create_lora_training_client(base_model=BASE_MODEL, rank=rank, seed=seed, **kw)
    if hasattr(tc, "result"):
        tc = tc.result(timeout=60)
    return tc


def adam(lr=5e-3):
    from tinker import types

    return types.AdamParams(learning_rate=lr, beta1=0.9, beta2=0.95, eps=1e-8)


def twin_steps(tc, tc_ce, weights, data, probe=None):
    """Compares a loss's update with the cross-entropy update whose weights are
    -dL/dp: tc already holds the loss's gradient; tc_ce (same seed) gets a
    cross_entropy forward_backward of `data` (Datums, or (model_input,
    target_tokens) pairs) with `weights` (one array per datum, 1-D or (N, K)).
    One AdamW step each; returns both clients' logprobs on a probe datum."""
    import numpy as np
    from tinker import types

    ce = []
    for d, w in zip(data, weights):
        mi, t = (d.model_input, d.loss_fn_inputs["target_tokens"]) if isinstance(d, types.Datum) else (d[0], d[1])
        ce.append(types.Datum(model_input=mi, loss_fn_inputs={"target_tokens": t,
                                                              "weights": np.asarray(w, dtype=np.float32)}))
    tc_ce.forward_backward(ce, "cross_entropy").result()
    tc.optim_step(adam(1e-2)).result()
    tc_ce.optim_step(adam(1e-2)).result()
    probe = probe or [counting_datum(7)]
    return [np.array(c.forward(probe, "cross_entropy").result().loss_fn_outputs[0]["logprobs"].tolist())
            for c in (tc, tc_ce)]


def counting_teacher(sc, seed, steps):
    """A rank-16 training client that has learned to count (cross-entropy on
    counting data, a quarter of the starts per step)."""
    tc = new_training_client(sc, rank=16, seed=seed)
    for step in range(steps):
        tc.forward_backward([counting_datum(s) for s in range(step % 4, 32, 4)], "cross_entropy").result()
        tc.optim_step(adam(2e-2)).result()
    return tc


def sdk_training_call(tc, port, route, body, key):
    """A raw POST made the way the SDK makes a training op (its save_weights_external,
    say): reserve the client's next request id, take its turn, send seq_id = id + 1.
    Returns (status, content type, body bytes, seq_id)."""
    import asyncio
    import http.client
    import json

    rid = tc._get_request_id()

    def post():
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        c.request("POST", f"/api/v1/{route}", body=json.dumps({"model_id": tc.model_id, "seq_id": rid + 1, **body}),
                  headers={"Content-Type": "application/json", "X-API-Key": key})
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, r.getheader("Content-Type") or "", data

    async def call():
        async with tc._take_turn(rid):
            return await asyncio.to_thread(post)

    return (*tc.holder.run_coroutine_threadsafe(call()).result(timeout=60), rid + 1)
