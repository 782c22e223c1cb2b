"""The runs dashboard (`GET /` + `/api/v1/dashboard`) in headless Chromium.

A `twinkle serve` with a keys file of two tenants and an admin trains one run per tenant through
the official SDK (alice N_ALICE steps, bob N_BOB), then Chromium loads the page with a key in the
URL fragment and the DOM (--dump-dom) must show: for alice her run with a loss curve of exactly
N_ALICE points and not bob's run; for bob the reverse; for the admin both; for a bad key the login
form and an error. The JSON API is checked too (per-step losses equal the SDK's, 401 / 404 for
other tenants). A screenshot of the admin's view is saved as a test artefact and its path printed.

Environment: TWK_CHROMIUM (default: chromium on PATH), TWK_DASHBOARD_OUT (the artefact folder,
default: a temporary one). Skipped, saying so, when Chromium is absent (tests/dashboard/run.sh
turns that into ctest's "Skipped")."""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from html.parser import HTMLParser
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sdk"))
from conftest import Server, counting_datum, new_training_client, service_client  # noqa: E402

N_ALICE, N_BOB = 7, 5
LR = 5e-3
KEYS = {"alice": "tml-alice-dash", "bob": "tml-bob-dash", "ops": "tml-ops-dash"}


def chromium_bin() -> str | None:
    return os.environ.get("TWK_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


class Dom(HTMLParser):
    """The parts of a dumped DOM the checks read: body attributes, run cards, curves, visible errors."""

    def __init__(self, text: str):
        super().__init__()
        self.body: dict = {}
        self.runs: list[dict] = []      # article.run attributes
        self.curves: list[dict] = []    # svg.curve attributes + "polyline_points": coordinate pairs
        self.hidden_ids: set[str] = set()
        self.error_text = ""
        self._in_error = False
        self._curve: dict | None = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "body":
            self.body = a
        if "id" in a and "hidden" in a:
            self.hidden_ids.add(a["id"])
        if a.get("id") == "error":
            self._in_error = True
        if tag == "article" and "run" in a.get("class", "").split():
            self.runs.append(a)
        if tag == "svg" and "curve" in a.get("class", "").split():
            self._curve = dict(a, polyline_points=0)
            self.curves.append(self._curve)
        if tag == "polyline" and self._curve is not None:
            self._curve["polyline_points"] += len(a.get("points", "").split())

    def handle_endtag(self, tag):
        if tag == "svg":
            self._curve = None
        if tag == "p":
            self._in_error = False

    def handle_data(self, data):
        if self._in_error:
            self.error_text += data


def chromium(args: list[str], profile: Path) -> subprocess.CompletedProcess:
    cmd = [chromium_bin(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
           "--no-first-run", "--disable-extensions", "--disable-background-networking",
           f"--user-data-dir={profile}", "--virtual-time-budget=8000", *args]
    return subprocess.run(cmd, capture_output=True, timeout=90)


def load_dom(url: str, profile: Path) -> tuple[Dom, str]:
    r = chromium(["--dump-dom", url], profile)
    text = r.stdout.decode("utf-8", "replace")
    assert r.returncode == 0 and "<body" in text, f"chromium failed (rc {r.returncode}): {r.stderr.decode()[-2000:]}"
    return Dom(text), text


def api(base: str, path: str, key: str | None):
    req = urllib.request.Request(base + path, headers={"X-API-Key": key} if key else {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def train(base: str, key: str, steps: int) -> tuple[str, list[float]]:
    from tinker import types

    tc = new_training_client(service_client(base, key), rank=4, seed=7)
    losses = []
    for i in range(steps):
        fb = tc.forward_backward([counting_datum(0), counting_datum(5)], "cross_entropy")
        opt = tc.optim_step(types.AdamParams(learning_rate=LR))
        losses.append(fb.result(timeout=120).metrics["loss:sum"])
        opt.result(timeout=120)
    tc.forward([counting_datum(0)], "cross_entropy").result(timeout=120)  # an eval loss: the "forward" series
    tc.save_state("dash").result(timeout=120)
    return tc.model_id, losses


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    d = tmp_path_factory.mktemp("dash")
    keys = d / "keys.txt"
    keys.write_text(f"{KEYS['alice']} alice\n{KEYS['bob']} bob\n{KEYS['ops']} ops admin\n")
    srv = Server(d / "data", ["--keys", str(keys)], log_path=d / "serve.log")
    try:
        runs = {"alice": train(srv.base_url, KEYS["alice"], N_ALICE), "bob": train(srv.base_url, KEYS["bob"], N_BOB)}
        yield srv, runs, d
    finally:
        srv.stop()  # SIGTERM: a clean shutdown, so a sanitizer build reports leaks into the log
    log = srv.log_text()
    assert srv.proc.returncode == 0, f"twinkle serve exited {srv.proc.returncode}:\n{log}"
    for bad in ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:"):
        assert bad not in log, log


def test_api_isolation_and_losses(trained):
    srv, runs, _ = trained
    base = srv.base_url
    status, body = api(base, "/api/v1/dashboard", None)
    assert status == 401 and "API key" in body["error"]
    assert api(base, "/api/v1/dashboard", "tml-nobody")[0] == 401
    for tenant, other in (("alice", "bob"), ("bob", "alice")):
        status, view = api(base, "/api/v1/dashboard", KEYS[tenant])
        assert status == 200 and view["tenant"] == tenant and view["admin"] is False
        assert [r["id"] for r in view["runs"]] == [runs[tenant][0]]
        assert {c["tenant"] for c in view["checkpoints"]} == {tenant}
        # another tenant's run is as absent as an unknown one
        q = "/api/v1/dashboard/steps?run=" + urllib.parse.quote(runs[other][0], safe="")
        assert api(base, q, KEYS[tenant])[0] == 404
    status, view = api(base, "/api/v1/dashboard", KEYS["ops"])
    assert status == 200 and view["admin"] is True
    assert {r["id"] for r in view["runs"]} == {runs["alice"][0], runs["bob"][0]}
    assert {c["tenant"] for c in view["checkpoints"]} == {"alice", "bob"}
    for tenant, n in (("alice", N_ALICE), ("bob", N_BOB)):
        run_id, losses = runs[tenant]
        q = "/api/v1/dashboard/steps?run=" + urllib.parse.quote(run_id, safe="")
        for key in (KEYS[tenant], KEYS["ops"]):
            status, steps = api(base, q, key)
            assert status == 200
            series = {s["kind"]: s for s in steps["series"]}
            fb, opt = series["forward_backward"], series["optim_step"]
            assert fb["points"] == n and opt["points"] == n
            assert fb["step"] == list(range(n)) and opt["step"] == list(range(1, n + 1))
            assert opt["metrics"]["learning_rate"] == [pytest.approx(LR)] * n
            assert series["forward"]["points"] == 1 and series["forward"]["step"] == [n]
            assert all(g is not None and math.isfinite(g) for g in opt["metrics"]["grad_norm"])
            err = max(abs(a - b) / max(abs(b), 1e-30) for a, b in zip(fb["metrics"]["loss:sum"], losses))
            print(f"{tenant}: {n} stored losses vs the SDK's, max relative error {err:.2e} (tolerance 1e-6)")
            assert err <= 1e-6 and all(math.isfinite(x) for x in fb["metrics"]["loss:sum"])


def test_page_in_chromium(trained):
    if not chromium_bin():
        pytest.skip("chromium is not installed (apt-get install chromium; scripts/install-deps.sh lists it)")
    srv, runs, d = trained
    out = Path(os.environ.get("TWK_DASHBOARD_OUT") or tempfile.mkdtemp(prefix="twk-dashboard-"))
    out.mkdir(parents=True, exist_ok=True)
    expect = {"alice": N_ALICE, "bob": N_BOB}
    for tenant in ("alice", "bob"):
        dom, text = load_dom(f"{srv.base_url}/#key={KEYS[tenant]}", d / f"profile-{tenant}")
        assert dom.body.get("data-state") == "ready", f"{tenant}: page state {dom.body}; error {dom.error_text!r}"
        assert dom.body.get("data-admin") == "0"
        shown = {r["data-run"] for r in dom.runs}
        assert shown == {runs[tenant][0]}, f"{tenant} sees {shown}"
        curves = [c for c in dom.curves if c["data-run"] == runs[tenant][0]]
        assert len(curves) == 1 and curves[0]["data-metric"] == "loss:sum"
        assert int(curves[0]["data-points"]) == expect[tenant] == curves[0]["polyline_points"], curves
        assert KEYS[tenant] not in text  # the key is not written into the page
        print(f"{tenant}: page shows 1 run, its loss curve has {curves[0]['polyline_points']} points")
    dom, _ = load_dom(f"{srv.base_url}/#key={KEYS['ops']}", d / "profile-ops")
    assert dom.body.get("data-state") == "ready" and dom.body.get("data-admin") == "1"
    assert {r["data-run"]: r["data-tenant"] for r in dom.runs} == {runs["alice"][0]: "alice", runs["bob"][0]: "bob"}
    points = {c["data-run"]: c["polyline_points"] for c in dom.curves}
    assert points == {runs["alice"][0]: N_ALICE, runs["bob"][0]: N_BOB}, points
    print(f"admin: page shows both runs, curves of {N_ALICE} and {N_BOB} points")
    dom, _ = load_dom(f"{srv.base_url}/#key=tml-wrong", d / "profile-bad")
    assert dom.body.get("data-state") == "login" and "login-section" not in dom.hidden_ids
    assert "not accepted" in dom.error_text and not dom.runs
    shot = out / "dashboard-admin.png"
    shot.unlink(missing_ok=True)
    r = chromium(["--window-size=1280,1000", f"--screenshot={shot}", f"{srv.base_url}/#key={KEYS['ops']}"],
                 d / "profile-shot")
    assert r.returncode == 0 and shot.exists(), r.stderr.decode()[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    print(f"dashboard screenshot: {shot}")
