"""HTTP hardening of `twinkle serve` (issue 18, findings 1, 2 and 9) against the
real service with a keys file of two tenants: a chunked request's trailers are
never headers (no key in a trailer, none completed by an earlier request's
bytes), the route is the exact normalised path, and idle connections without
a key cannot lock out /healthz or keyed clients."""
from __future__ import annotations

import socket
import subprocess

from conftest import twinkle_bin

ALICE = "tml-alice-secret-7f3a"
BOB = "tml-bob-secret-91c2"


def keys_file(tmp_path):
    p = tmp_path / "keys"
    p.write_text(f"{ALICE} alice\n{BOB} bob\n")
    return str(p)


def read_response(s: socket.socket) -> tuple[int, bytes]:
    """(status, body) of one Content-Length framed response."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        b = s.recv(65536)
        assert b, f"connection closed before a response: {buf!r}"
        buf += b
    head, _, body = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    n = 0
    for l in lines[1:]:
        k, _, v = l.partition(":")
        if k.strip().lower() == "content-length":
            n = int(v)
    while len(body) < n:
        b = s.recv(65536)
        assert b, "connection closed inside a response body"
        body += b
    return int(lines[0].split()[1]), body[:n]


def exchange(port: int, data: bytes) -> tuple[int, bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        return read_response(s)


def test_trailers_are_not_headers(start_server, tmp_path):
    srv = start_server("--keys", keys_file(tmp_path))
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        # alice creates a session, so her sessions list is not empty
        body = b'{"tags":[],"user_metadata":{},"sdk_version":"0.38.0","type":"create_session"}'
        s.sendall(b"POST /api/v1/create_session HTTP/1.1\r\nHost: x\r\nX-API-Key: " + ALICE.encode() +
                  b"\r\nContent-Type: application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        status, created = read_response(s)
        assert status == 200, created
        # the reviewer's pair: request A with alice's key, then B whose 4-byte trailer "tml-"
        # was completed by A's key left in the connection's buffer
        s.sendall(b"GET /api/v1/sessions HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"p" * 40 + b"\r\nX-API-Key: " +
                  ALICE.encode() + b"\r\n\r\n")
        status, sessions = read_response(s)
        assert status == 200 and b"session" in sessions, sessions
        s.sendall(b"GET /api/v1/sessions?" + b"b" * 26 + b" HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                  b"0\r\nX-API-Key: tml-\r\n\r\n")
        status, leaked = read_response(s)
        assert status == 401, leaked
    # a key sent only as a trailer
    status, body = exchange(srv.port, b"GET /api/v1/sessions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                            b"0\r\nX-API-Key: " + ALICE.encode() + b"\r\n\r\n")
    assert status == 401, body
    # the minimal ASan crash input: a clean answer, and the server still serves
    status, body = exchange(srv.port, b"POST /\nTransfer-Encoding:chunked\n\n0\r\nT:\n\n")
    assert status == 505, body
    status, body = exchange(srv.port, b"GET /api/v1/healthz HTTP/1.1\r\n\r\n")
    assert status == 200, body


def test_routing_on_the_exact_path(start_server, tmp_path):
    srv = start_server("--keys", keys_file(tmp_path))
    key = b"X-API-Key: " + BOB.encode() + b"\r\n"
    for target in [b"/whatever/../x/api/v1/training_runs", b"/x/api/v1/training_runs", b"//api/v1/training_runs",
                   b"/api/v1/./training_runs", b"/api/v1/%2e%2e/v1/training_runs", b"/api%2fv1/training_runs"]:
        status, body = exchange(srv.port, b"GET " + target + b" HTTP/1.1\r\nHost: x\r\n" + key + b"\r\n")
        assert status in (400, 404), (target, status, body)
    status, body = exchange(srv.port, b"GET /api/v1/training_runs HTTP/1.1\r\nHost: x\r\n" + key + b"\r\n")
    assert status == 200, body
    for version in [b"HTTP/0.9", b"HTTP/9.9", b"HTTP/2.0"]:
        status, body = exchange(srv.port, b"GET /api/v1/healthz " + version + b"\r\nHost: x\r\n\r\n")
        assert status == 505, (version, body)
    # a chunk size of 2^63: refused at once (413), not after the read timeout (408)
    status, body = exchange(srv.port, b"POST /api/v1/create_session HTTP/1.1\r\nHost: x\r\n" + key +
                            b"Transfer-Encoding: chunked\r\n\r\n8000000000000000\r\n")
    assert status == 413, body


def test_idle_connections_do_not_lock_out(start_server, tmp_path):
    cap, per_addr = 16, 8
    srv = start_server("--keys", keys_file(tmp_path), "--max-connections", str(cap), "--max-connections-per-addr",
                       str(per_addr), "--header-timeout", "60")
    idle = []
    try:
        for i in range(4 * cap):  # from several loopback addresses: over both caps
            s = socket.socket()
            s.bind((f"127.0.0.{2 + i % 3}", 0))
            s.connect(("127.0.0.1", srv.port))
            idle.append(s)
        status, body = exchange(srv.port, b"GET /api/v1/healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status == 200, body
        status, body = exchange(srv.port, b"GET /api/v1/training_runs HTTP/1.1\r\nHost: x\r\nX-API-Key: " +
                                ALICE.encode() + b"\r\n\r\n")
        assert status == 200, body
    finally:
        for s in idle:
            s.close()


def test_connection_options_in_help():
    out = subprocess.run([str(twinkle_bin()), "serve", "--help"], capture_output=True, text=True, check=True).stdout
    for opt in ["--max-connections N", "--max-connections-per-addr N", "--header-timeout S", "--idle-timeout S",
                "--read-timeout S"]:
        assert opt in out, opt
