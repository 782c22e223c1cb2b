"""Getting weights out: save_weights_external, signed download URLs served by
twinkle itself, the SDK's own `tinker checkpoint download`, copy_weights."""
from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np

from conftest import adam, counting_datum, logprobs_of, max_abs_diff, new_training_client, rest_client, service_client


def read_safetensors(path: Path) -> dict:
    """name -> float32 array (the adapter files are f32)."""
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        assert meta["dtype"] == "F32", (name, meta["dtype"])
        a, b = meta["data_offsets"]
        out[name] = np.frombuffer(raw[8 + n + a:8 + n + b], dtype=np.float32).reshape(meta["shape"])
    return out


def trained_client(sc, steps=2):
    tc = new_training_client(sc, rank=8, seed=77)
    for step in range(steps):
        tc.forward_backward([counting_datum(s) for s in range(step, 16, 4)], "cross_entropy").result()
        tc.optim_step(adam(1e-2)).result()
    return tc


def ckpt_folder(server, tinker_path: str) -> Path:
    run, kind, name = tinker_path[len("tinker://"):].split("/")
    return server.data_dir / "checkpoints" / run / kind / name


def http(url, method="GET", body=None, headers=None):
    """(status, bytes) of a plain HTTP request."""
    req = urllib.request.Request(url, method=method, data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def tinker_cli(base_url, *args, cwd=None):
    exe = Path(sys.executable).parent / "tinker"
    env = {**os.environ, "TINKER_API_KEY": "tml-alice", "TINKER_BASE_URL": base_url}
    return subprocess.run([str(exe), *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=300)


def test_cli_downloads_a_training_checkpoint(server, tmp_path):
    """`tinker checkpoint download tinker://…/weights/…`: the SDK's CLI exports the checkpoint
    through save_weights_external, downloads every file at its signed URL, deletes the export."""
    sc = service_client(server.base_url)
    tc = trained_client(sc)
    path = tc.save_state("dl").result().path
    r = tinker_cli(server.base_url, "checkpoint", "download", path, "--output", str(tmp_path / "out"))
    assert r.returncode == 0, r.stdout + r.stderr
    got = tmp_path / "out" / path[len("tinker://"):].replace("/", "_")
    assert sorted(p.name for p in got.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    ours = read_safetensors(ckpt_folder(server, path) / "adapter_model.safetensors")
    theirs = read_safetensors(got / "adapter_model.safetensors")
    assert sorted(ours) == sorted(theirs) and len(ours) > 0
    worst = max(float(np.abs(ours[k] - theirs[k]).max()) for k in ours)
    print(f"downloaded adapter: {len(ours)} tensors, max |diff| vs the checkpoint {worst:.3g}")
    assert worst == 0.0
    cfg = json.loads((got / "adapter_config.json").read_text())
    assert cfg["r"] == 8 and cfg["peft_type"] == "LORA"
    # the temporary export is gone again
    rc = rest_client(server.base_url)
    left = [c.tinker_path for c in rc.list_user_checkpoints().result().checkpoints]
    assert not [p for p in left if "/external_weights/" in p], left


def test_external_weights_urls_are_signed_and_expire(server, start_server):
    sc = service_client(server.base_url)
    tc = trained_client(sc, steps=1)
    path = tc.save_weights_external("ext").result().path
    assert path.endswith("/external_weights/ext")
    rc = rest_client(server.base_url)
    listed = {c.tinker_path: c.checkpoint_type for c in rc.list_checkpoints(path.split("/")[2]).result().checkpoints}
    assert listed[path] == "external"
    resp = rc.get_external_weights_urls(path).result()
    assert sorted(resp.urls) == ["adapter_config.json", "adapter_model.safetensors"]
    folder = ckpt_folder(server, path)
    for name, url in resp.urls.items():  # no API key: the signature is the permission
        status, body = http(url)
        assert status == 200 and body == (folder / name).read_bytes(), (name, status)
    url = resp.urls["adapter_model.safetensors"]
    # the signature is HMAC-SHA256 (checked with Python's hmac) under the data dir's key
    import hashlib
    import hmac

    key = bytes.fromhex((server.data_dir / "url_signing.key").read_text())
    run = path.split("/")[2]
    exp = url.split("expires=")[1].split("&")[0]
    mac = hmac.new(key, f"{run}/ext/adapter_model.safetensors\n{exp}".encode(), hashlib.sha256).hexdigest()
    assert url.endswith("&sig=" + mac)
    assert (server.data_dir / "url_signing.key").stat().st_mode & 0o777 == 0o600
    base, query = url.split("?")
    sig = query.split("sig=")[1]
    expires = int(query.split("expires=")[1].split("&")[0])
    flipped = sig[:-1] + ("0" if sig[-1] != "0" else "1")
    tampered = {
        "signature": f"{base}?expires={expires}&sig={flipped}",
        "expiry pushed": f"{base}?expires={expires + 3600}&sig={sig}",
        "other file": f"{base.replace('adapter_model.safetensors', 'adapter_config.json')}?{query}",
        "no signature": f"{base}?expires={expires}",
    }
    for what, u in tampered.items():
        status, body = http(u)
        assert status == 403, (what, status, body)
    # the URL listing itself needs the key
    status, _ = http(f"{server.base_url}/api/v1/training_runs/{path.split('/')[2]}/checkpoints/external_weights/ext"
                     "/external_weights_urls")
    assert status == 401
    # deleted: the signed URL finds nothing
    rc.delete_checkpoint_from_tinker_path(path).result()
    assert http(url)[0] == 404

    # expiry: a server whose URLs live one second
    short = start_server("--url-ttl", "1")
    sc2 = service_client(short.base_url)
    p2 = trained_client(sc2, steps=1).save_weights_external("soon").result().path
    urls = rest_client(short.base_url).get_external_weights_urls(p2).result()
    u = urls.urls["adapter_config.json"]
    exp = int(u.split("expires=")[1].split("&")[0])
    while time.time() <= exp + 1:  # wait until the URL's second has passed
        time.sleep(0.5)
    status, body = http(u)
    assert status == 410, (status, body)


def test_cli_downloads_external_weights(server, tmp_path):
    sc = service_client(server.base_url)
    path = trained_client(sc, steps=1).save_weights_external("ext-cli").result().path
    r = tinker_cli(server.base_url, "checkpoint", "download", path, "--output", str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    got = tmp_path / path[len("tinker://"):].replace("/", "_")
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        assert (got / name).read_bytes() == (ckpt_folder(server, path) / name).read_bytes()


def test_save_weights_external_refuses_encryption(server):
    import pytest

    sc = service_client(server.base_url)
    tc = new_training_client(sc, rank=4)
    with pytest.raises(Exception, match="age_encryption_recipients"):
        tc.save_weights_external("enc", age_encryption_recipients=["age1xyz"]).result()
    # the run's order goes on
    tc.forward([counting_datum(0)], "cross_entropy").result()


def test_copy_weights_then_load_the_copy(server):
    sc = service_client(server.base_url)
    tc = trained_client(sc)
    src = tc.save_state("orig").result().path
    rc = rest_client(server.base_url)
    copied = rc.copy_weights(src, "proj-archive").result()
    assert copied != src and copied.endswith("/weights/orig"), copied
    copy_run = copied.split("/")[2]
    assert [c.tinker_path for c in rc.list_checkpoints(copy_run).result().checkpoints] == [copied]
    # storage is shared: the files are hard links of the source's
    a, b = ckpt_folder(server, src) / "adapter_model.safetensors", ckpt_folder(server, copied) / "adapter_model.safetensors"
    assert a.stat().st_ino == b.stat().st_ino
    probe = [counting_datum(s) for s in (3, 9)]
    want = logprobs_of(tc.forward(probe, "cross_entropy").result())
    loaded = sc.create_training_client_from_state(copied)
    loaded = loaded.result() if hasattr(loaded, "result") else loaded
    got = logprobs_of(loaded.forward(probe, "cross_entropy").result())
    err = max_abs_diff(want, got)
    print(f"copy loaded: max |logprob diff| {err:.3g}")
    assert err == 0.0
    # deleting the source leaves the copy whole
    rc.delete_checkpoint_from_tinker_path(src).result()
    assert b.exists() and not a.exists()


def test_copy_weights_http(server):
    sc = service_client(server.base_url)
    src = new_training_client(sc, rank=4).save_state("h").result().path
    hdr = {"X-API-Key": "tml-alice", "X-Idempotency-Key": "k-123"}
    url = f"{server.base_url}/api/v1/copy_weights"
    s1, b1 = http(url, "POST", {"source_path": src, "destination_project_id": "p"}, hdr)
    s2, b2 = http(url, "POST", {"source_path": src, "destination_project_id": "p"}, hdr)
    assert s1 == 200 and s2 == 200 and json.loads(b1) == json.loads(b2), (b1, b2)  # a retry finds its copy
    # into a session's model slot
    sess = http(f"{server.base_url}/api/v1/create_session", "POST", {"tags": [], "sdk_version": "x"}, hdr)
    sid = json.loads(sess[1])["session_id"]
    s3, b3 = http(url, "POST", {"source_path": src, "session_id": sid, "model_seq_id": 5}, hdr)
    assert s3 == 200 and json.loads(b3)["tinker_path"] == f"tinker://{sid}:train:5/weights/h"
    s4, b4 = http(url, "POST", {"source_path": src, "session_id": sid, "model_seq_id": 5}, {"X-API-Key": "tml-alice"})
    assert s4 == 200  # the same slot already holds this copy
    bad = [
        ({"source_path": src}, 400, "destination_project_id"),
        ({"source_path": src, "destination_project_id": "p", "ttl_seconds": 10}, 400, "ttl_seconds"),
        ({"source_path": "tinker://nope/weights/x", "destination_project_id": "p"}, 404, "not found"),
        ({"source_path": "file:///etc", "destination_project_id": "p"}, 400, "source_path"),
    ]
    for body, status, word in bad:
        s, b = http(url, "POST", body, {"X-API-Key": "tml-alice"})
        assert s == status and word in b.decode(), (body, s, b)
    # another tenant cannot copy alice's checkpoint
    s, _ = http(url, "POST", {"source_path": src, "destination_project_id": "p"}, {"X-API-Key": "tml-bob"})
    assert s == 404


def test_signed_urls_survive_a_restart(start_server, tmp_path):
    """The signing key is made once and kept in the data dir: a URL signed before a restart
    still downloads after it."""
    first = start_server(data_dir=tmp_path / "keep")
    path = trained_client(service_client(first.base_url), steps=1).save_weights_external("kept").result().path
    url = rest_client(first.base_url).get_external_weights_urls(path).result().urls["adapter_config.json"]
    key = (tmp_path / "keep" / "url_signing.key").read_text()
    first.stop()
    second = start_server(data_dir=tmp_path / "keep")
    assert (tmp_path / "keep" / "url_signing.key").read_text() == key
    status, body = http(url.replace(f":{first.port}/", f":{second.port}/"))
    assert status == 200 and body == (ckpt_folder(second, path) / "adapter_config.json").read_bytes()
