"""Webhook alerts (issue 17, item 3) against receivers this test runs on loopback: each event kind
(an op failing with a server error through the TWK_FAULT hook, a loss that is not finite, a stalled
worker, the disk and memory watermarks, a start after an unclean shutdown), the payload of each
format (slack, feishu, dingtalk, generic), the rate limit per kind, and receivers that are down,
refuse, or take the connection and never answer (training is unaffected and a graceful stop is not
held up; retries and failures are counted in /metrics)."""
from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
from tinker import types

from conftest import adam, counting_datum, make_datum, new_training_client, service_client
from test_metrics import scrape, value

KEY = "tml-alerts"


class Receiver:
    """Collects the JSON posted to /<name>; /dingbad answers dingtalk's 200 with a non-zero errcode."""

    def __init__(self):
        self.posts: list[tuple[str, dict, str]] = []
        self.lock = threading.Lock()
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self):
                n = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(n))
                with outer.lock:
                    outer.posts.append((self.path.strip("/"), body, self.headers.get("Content-Type", "")))
                reply = {"feishu": {"code": 0}, "dingtalk": {"errcode": 0}, "dingbad": {"errcode": 310000}}
                data = json.dumps(reply.get(self.path.strip("/"), {"ok": True})).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def of(self, target, kind=None):
        with self.lock:
            return [b for t, b, _ in self.posts if t == target and (kind is None or kind in json.dumps(b))]

    def wait(self, pred, what, limit=30.0):
        end = time.time() + limit
        while time.time() < end:
            if pred():
                return
            time.sleep(0.05)
        with self.lock:
            raise AssertionError(f"never received {what}; got {self.posts}")

    def close(self):
        self.httpd.shutdown()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p  # nothing listens there: posts to it are refused


KINDS = ("unclean_shutdown", "disk_watermark", "memory_watermark", "op_failed", "loss_nonfinite", "worker_stall")


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def text_of(target, body):
    return {"slack": lambda b: b["text"], "feishu": lambda b: b["content"]["text"],
            "dingtalk": lambda b: b["text"]["content"], "generic": lambda b: b["text"]}[target](body)


def test_alert_events_formats_and_delivery(start_server, receiver, tmp_path, monkeypatch):
    data = tmp_path / "data"
    # a server killed without shutting down leaves its marker behind
    first = start_server(data_dir=data)
    assert (data / "serve.running").exists()
    first.kill()
    down = free_port()
    url = f"http://127.0.0.1:{receiver.port}"
    monkeypatch.setenv("TWK_FAULT", "fail:optim_step,sleep:save_weights:2")
    srv = start_server("--alert-webhook", f"slack={url}/slack", "--alert-webhook", f"feishu={url}/feishu",
                       "--alert-webhook", f"dingtalk={url}/dingtalk", "--alert-webhook", f"{url}/generic",
                       "--alert-webhook", f"generic=http://127.0.0.1:{down}/down",
                       "--alert-webhook", f"dingtalk={url}/dingbad",
                       "--alert-stall-s", "0.5", "--alert-check-s", "0.1", "--alert-rate-s", "3600",
                       "--alert-backoff-s", "0.05", "--alert-retries", "2",
                       "--alert-disk-pct", "0.001", "--alert-mem-pct", "0.001", data_dir=data)
    monkeypatch.delenv("TWK_FAULT")
    sc = service_client(srv.base_url, KEY)
    tc = new_training_client(sc, rank=4, seed=7)
    # training goes on while one receiver is down and another refuses every post
    losses = [tc.forward_backward([counting_datum(i)], "cross_entropy").result(timeout=60).metrics["loss:sum"]
              for i in range(2)]
    assert all(np.isfinite(losses)), losses
    # an op that fails with a server error (TWK_FAULT), twice: the second is rate-limited
    for _ in range(2):
        with pytest.raises(Exception, match="injected fault"):
            tc.optim_step(adam()).result(timeout=60)
    # a loss that overflows float32: finite weights of 3e38 on every token
    toks = list(range(100, 116))
    out = tc.forward([make_datum(toks[:-1], toks[1:], [3e38] * 15)], "cross_entropy").result(timeout=60)
    assert not np.isfinite(out.metrics["loss:sum"]), out.metrics
    # a save that sleeps 2 s on the worker: past --alert-stall-s 0.5
    tc.save_state("slow").result(timeout=60)
    run_id = tc.model_id

    fmts = ("slack", "feishu", "dingtalk", "generic")
    receiver.wait(lambda: all(len(receiver.of(t, k)) >= 1 for t in fmts for k in KINDS), "every kind in every format")
    _, fams = scrape(srv.port, KEY)
    receiver.wait(lambda: value(scrape(srv.port, KEY)[1], "twinkle_alert_failures_total", target="5") >= len(KINDS),
                  "the refused dingtalk posts given up")
    _, fams = scrape(srv.port, KEY)
    for t in fmts:  # one post per kind (the second op failure was suppressed)
        for k in KINDS:
            assert len(receiver.of(t, k)) == 1, (t, k, receiver.of(t, k))
    # payload shapes
    g = {b["kind"]: b for b in receiver.of("generic")}
    assert set(g) == set(KINDS)
    for b in g.values():
        assert {"source", "kind", "severity", "message", "text", "tenant", "run_id", "request_id", "host", "time",
                "suppressed"} <= set(b), b
        assert b["source"] == "twinkle" and b["time"].endswith("Z")
    assert g["op_failed"]["tenant"] and g["op_failed"]["run_id"] == run_id and g["op_failed"]["request_id"].startswith("req-")
    assert "injected fault" in g["op_failed"]["message"] and g["op_failed"]["severity"] == "error"
    assert g["loss_nonfinite"]["run_id"] == run_id and "inf" in g["loss_nonfinite"]["message"]
    assert g["unclean_shutdown"]["tenant"] is None and "unclean" in g["unclean_shutdown"]["message"]
    for b in receiver.of("slack"):
        assert set(b) == {"text"} and b["text"].startswith("[twinkle] ")
    for b in receiver.of("feishu"):
        assert b["msg_type"] == "text" and set(b["content"]) == {"text"}
    for b in receiver.of("dingtalk"):
        assert b["msgtype"] == "text" and set(b["text"]) == {"content"}
    assert run_id in text_of("slack", receiver.of("slack", "op_failed")[0])
    assert all(ct == "application/json" for _, _, ct in receiver.posts)
    # delivery counters: 6 kinds to each live receiver; the down one and the refusing one retried, then gave up
    n = len(KINDS)
    for t in ("0", "1", "2", "3"):
        assert value(fams, "twinkle_alert_deliveries_total", target=t) == n, t
        assert value(fams, "twinkle_alert_failures_total", target=t) == 0, t
    for t in ("4", "5"):
        assert value(fams, "twinkle_alert_deliveries_total", target=t) == 0, t
        assert value(fams, "twinkle_alert_retries_total", target=t) == 2 * n, t  # --alert-retries 2 each
        assert value(fams, "twinkle_alert_failures_total", target=t) == n, t
    assert value(fams, "twinkle_alerts_total", kind="op_failed") == 2
    assert value(fams, "twinkle_alerts_suppressed_total", kind="op_failed") == 1
    assert value(fams, "twinkle_alerts_dropped_total") == 0
    assert len(receiver.of("dingbad")) == 3 * n  # each kind tried 1 + 2 times

    # a clean shutdown removes the marker: the next start raises no unclean_shutdown
    srv.stop()
    assert not (data / "serve.running").exists()
    again = start_server("--alert-webhook", f"{url}/third", "--alert-disk-pct", "0", "--alert-mem-pct", "0", data_dir=data)
    _, fams = scrape(again.port, KEY)
    assert value(fams, "twinkle_alerts_total") == 0
    assert receiver.of("third") == []


def test_alert_options_refused(start_server, tmp_path):
    import subprocess

    from conftest import twinkle_bin

    for args, word in ((["--alert-webhook", "ftp://x"], "http"), (["--alert-webhook", "teams=http://x"], "format"),
                       (["--alert-stall-s", "-1"], "alert-stall-s"), (["--metrics-auth", "nobody"], "metrics-auth")):
        r = subprocess.run([str(twinkle_bin()), "serve", "--data-dir", str(tmp_path / "d"), *args],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 2 and word in r.stderr, (args, r.returncode, r.stderr)


class Hanging:
    """A webhook that accepts the connection, reads the request and never answers."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        self.stopped = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.stopped:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(c)  # held open, never answered

    def close(self):
        self.stopped = True
        self.sock.close()
        for c in self.conns:
            c.close()


def test_hanging_receiver_never_blocks_training(start_server, tmp_path):
    """A receiver that takes the connection and never answers: the delivery thread waits out
    --alert-timeout-s per attempt while forward_backward / optim_step keep their latency (each
    within 3x the slowest of the same ops with no alert in flight, measured first), the attempts
    are counted as retries and then a failure in /metrics, and a graceful stop is not held up by
    the post in progress."""
    hang = Hanging()
    try:
        srv = start_server("--alert-webhook", f"generic=http://127.0.0.1:{hang.port}/hook", "--alert-timeout-s", "3",
                           "--alert-retries", "1", "--alert-backoff-s", "0.05", "--alert-check-s", "0.1",
                           "--alert-rate-s", "0")
        tc = new_training_client(service_client(srv.base_url, KEY), rank=4, seed=3)

        def step(i):
            t = time.perf_counter()
            tc.forward_backward([counting_datum(i)], "cross_entropy").result(timeout=60)
            tc.optim_step(adam()).result(timeout=60)
            return time.perf_counter() - t

        quiet = [step(i) for i in range(4)]  # no alert raised yet: nothing in flight
        toks = list(range(100, 116))  # a non-finite loss raises loss_nonfinite: its post hangs
        tc.forward([make_datum(toks[:-1], toks[1:], [3e38] * 15)], "cross_entropy").result(timeout=60)
        deadline = time.time() + 10
        while not hang.conns and time.time() < deadline:
            time.sleep(0.02)
        assert hang.conns, "the alert was never posted"
        t0 = time.time()
        loaded = [step(i) for i in range(4, 10)]  # while the first attempt (3 s) and its retry hang
        during = time.time() - t0
        print(f"steps with no alert in flight: max {max(quiet) * 1e3:.0f} ms; while a post hangs: max "
              f"{max(loaded) * 1e3:.0f} ms over {during:.1f} s")
        assert max(loaded) < 3 * max(quiet) + 0.5, (quiet, loaded)
        end = time.time() + 30
        while value(scrape(srv.port, KEY)[1], "twinkle_alert_failures_total", target="0") < 1 and time.time() < end:
            time.sleep(0.2)
        _, fams = scrape(srv.port, KEY)
        assert value(fams, "twinkle_alert_retries_total", target="0") == 1
        assert value(fams, "twinkle_alert_failures_total", target="0") == 1
        assert value(fams, "twinkle_alert_deliveries_total", target="0") == 0
        # a new alert's post hangs again; the stop aborts it
        tc.forward([make_datum(toks[:-1], toks[1:], [3e38] * 15)], "cross_entropy").result(timeout=60)
        time.sleep(0.5)
        t = time.time()
        srv.stop()
        print(f"graceful stop with a hanging post: {time.time() - t:.2f} s")
        assert time.time() - t < 2.5
    finally:
        hang.close()
