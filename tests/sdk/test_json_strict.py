"""JSON request bodies are parsed strictly (issue 18, finding 8): an embedded
\\u0000 is refused naming the field (it used to truncate the string: a save named
"ok\\u0000../../x" was saved as "ok"), data after the object, invalid UTF-8,
unpaired surrogates and deep nesting are refused with a 400 that says so; valid
non-ASCII text still passes."""
from __future__ import annotations

import json

import pytest

from conftest import new_training_client, service_client
from test_bad_input import json_error, request

KEY = "tml-jsonstrict"


@pytest.fixture(scope="module")
def tc(server):
    return new_training_client(service_client(server.base_url, KEY), rank=4, seed=1)


def post_raw(port, route, raw: bytes):
    return request(port, "POST", "/api/v1/" + route, raw, key=KEY)


def test_nul_in_string_is_refused_naming_the_field(server, tc):
    sid = tc.holder.get_session_id()
    raw = b'{"session_id": "' + sid.encode() + b'\\u0000junk"}'
    msg = json_error(*post_raw(server.port, "session_heartbeat", raw), 400)
    assert "session_id" in msg and "\\u0000" in msg, msg
    raw = json.dumps({"model_id": tc.model_id, "seq_id": 1, "path": "ok\u0000../../x"}).encode()
    assert b"\\u0000" in raw
    msg = json_error(*post_raw(server.port, "save_weights", raw), 400)
    assert "'path'" in msg, msg
    # nested: the innermost member is named
    raw = json.dumps({"model_id": tc.model_id, "seq_id": 1, "adam_params": {"learning_rate": 1e-3},
                      "user_metadata": {"note": "a\u0000b"}}).encode()
    msg = json_error(*post_raw(server.port, "optim_step", raw), 400)
    assert "'note'" in msg, msg


@pytest.mark.parametrize("raw,want", [
    (b'{"session_id": "x"} trailing', "after the JSON object"),
    (b'{"session_id": "x"}{}', "after the JSON object"),
    (b'{"session_id": "\xff\xfe"}', "UTF-8"),
    (b'{"session_id": "\xc0\xaf"}', "UTF-8"),            # overlong '/'
    (b'{"session_id": "\xed\xa0\x80"}', "UTF-8"),        # an encoded surrogate
    (b'{"session_id": "\\ud800x"}', "surrogate"),
    (b'{"session_id": "x",}', "member name"),
    (b'{"a": [' * 1 + b'[' * 1000 + b']' * 1000 + b']}', "nesting too deep"),
    (b'[' * 1000 + b']' * 1000, "not a JSON object"),
    (b'{"a": ' + b'{"a": ' * 1000 + b'1' + b'}' * 1001, "nesting too deep"),
], ids=["garbage", "second-object", "bad-bytes", "overlong", "utf8-surrogate", "escaped-surrogate",
        "trailing-comma", "deep-array", "top-level-array", "deep-object"])
def test_malformed_json_is_400_saying_why(server, raw, want):
    msg = json_error(*post_raw(server.port, "session_heartbeat", raw), 400)
    assert want in msg, msg


def test_valid_unicode_passes(server, tc):
    sid = tc.holder.get_session_id()
    # escaped pair, raw 2-, 3- and 4-byte UTF-8 in an ignored member: still a valid heartbeat
    raw = ('{"session_id": "%s", "note": "\\ud83d\\ude00 é € 😀", "n": [1, -0.5e3, true, null, {}]}' % sid).encode()
    st, _, data = post_raw(server.port, "session_heartbeat", raw)
    assert st == 200, (st, data)
