"""Crash consistency of checkpoints (issue 18, findings 5 and 6): the server is
made to _exit() (TWK_CRASH_AT=<mode>:<step>) at every step of a first save and
of an overwrite, with RENAME_EXCHANGE and with its fallback
(TWK_NO_RENAME_EXCHANGE=1); after a restart on the same data dir no leftover
.tmp-* / .old-* folder remains (start-up logged what it did), and every listed
checkpoint loads and holds exactly the old or the new weights."""
from __future__ import annotations

import pytest

from conftest import adam, counting_datum, logprobs_of, new_training_client, rest_client, service_client

KEY = "tml-crashckpt"
EVAL = [counting_datum(s, 12) for s in (0, 9)]
SAVE_STEPS = ["written", "synced", "published", "dir-synced", "recorded"]
EXCHANGE_STEPS = ["written", "synced", "exchanged", "dir-synced", "old-removed", "recorded"]
FALLBACK_STEPS = ["written", "synced", "old-aside", "published", "dir-synced", "old-removed", "recorded"]
CASES = ([("save", s, False) for s in SAVE_STEPS] + [("overwrite", s, False) for s in EXCHANGE_STEPS] +
         [("overwrite", s, True) for s in FALLBACK_STEPS])


@pytest.fixture(autouse=True)
def no_telemetry(monkeypatch):
    monkeypatch.setenv("TINKER_TELEMETRY", "0")


def train_step(tc, step):
    tc.forward_backward([counting_datum((step * 5 + i) % 32, 12) for i in range(4)], "cross_entropy")
    tc.optim_step(adam(2e-2)).result(timeout=60)
    return logprobs_of(tc.forward(EVAL, "cross_entropy").result(timeout=60))


@pytest.mark.parametrize("mode,step,fallback", CASES,
                         ids=[f"{m}-{s}{'-fallback' if f else ''}" for m, s, f in CASES])
def test_crash_at_every_step_leaves_old_or_new(start_server, tmp_path, monkeypatch, mode, step, fallback):
    data_dir = tmp_path / "data"
    monkeypatch.setenv("TWK_CRASH_AT", f"{mode}:{step}")
    if fallback:
        monkeypatch.setenv("TWK_NO_RENAME_EXCHANGE", "1")
    s1 = start_server(data_dir=data_dir)
    tc = new_training_client(service_client(s1.base_url, KEY), rank=4, seed=5)
    model_id = tc.model_id
    versions = [train_step(tc, 0)]
    fut = tc.save_state("c")
    if mode == "overwrite":
        path = fut.result(timeout=60).path
        versions.append(train_step(tc, 1))
        assert versions[0] != versions[1]
        tc.save_state("c", overwrite=True)
    s1.proc.wait(timeout=60)
    assert s1.proc.returncode == 86, f"no crash at {mode}:{step} (rc {s1.proc.returncode}):\n{s1.log_text()}"
    ck_dir = data_dir / "checkpoints" / model_id / "weights"
    leftovers = sorted(p.name for p in ck_dir.iterdir() if p.name.startswith(".")) if ck_dir.exists() else []

    monkeypatch.delenv("TWK_CRASH_AT")
    monkeypatch.delenv("TWK_NO_RENAME_EXCHANGE", raising=False)
    s2 = start_server(data_dir=data_dir)
    log = s2.log_text()
    assert not [p.name for p in ck_dir.iterdir() if p.name.startswith(".")] if ck_dir.exists() else True
    for name in leftovers:
        assert name in log, f"start-up did not log what it did with {name}:\n{log}"
    listed = [c.tinker_path for c in rest_client(s2.base_url, KEY).list_checkpoints(model_id).result(timeout=30).checkpoints]
    if mode == "overwrite":
        assert listed == [path], listed  # an overwrite never loses the checkpoint
    elif step == "recorded":
        assert len(listed) == 1, listed
    else:
        assert listed == [], listed  # a first save that never reached the store is not listed
    on_disk = sorted(p.name for p in ck_dir.iterdir()) if ck_dir.exists() else []
    assert on_disk == (["c"] if listed else []), on_disk  # nothing unlisted is left on disk either
    sc = service_client(s2.base_url, KEY)
    for p in listed:
        got = logprobs_of(sc.create_training_client_from_state(p).result(timeout=60).forward(EVAL, "cross_entropy")
                          .result(timeout=60))
        which = [i for i, v in enumerate(versions) if v == got]
        assert which, f"{p} after a crash at {mode}:{step} holds neither the old nor the new weights"
        print(f"{mode}:{step}{' (fallback)' if fallback else ''}: leftovers {leftovers}, listed {listed}, "
              f"holds version {which[0]} of {len(versions)}")
