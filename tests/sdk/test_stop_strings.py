"""Stop strings through the SDK: a served model with a tokenizer.json ends a
sample with the token that completes the stop string (included); a model
without one refuses stop strings with a message."""
import shutil

import pytest
from tinker import types

from conftest import BASE_MODEL, REPO, service_client

tokenizers = pytest.importorskip("tokenizers")


def _sampler(sc, base):
    c = sc.create_sampling_client(base_model=base)
    return c.result() if hasattr(c, "result") and not hasattr(c, "sample") else c


def test_stop_strings(start_server, tmp_path):
    first = start_server()  # generates the built-in model into its data dir
    model = tmp_path / "tok-model"
    shutil.copytree(first.data_dir / "models" / "tiny", model)
    shutil.copy(REPO / "tests" / "tokenizer" / "bytelevel" / "tokenizer.json", model / "tokenizer.json")
    first.stop()
    server = start_server("--model", f"{model}=tok-model")
    sc = service_client(server.base_url, "tml-stop")
    sampler = _sampler(sc, "tok-model")
    tok = tokenizers.Tokenizer.from_file(str(model / "tokenizer.json"))
    prompt = types.ModelInput.from_ints([40, 41, 42])
    free = sampler.sample(prompt=prompt, num_samples=1,
                          sampling_params=types.SamplingParams(max_tokens=16, temperature=0.0, stop=[])).result()
    tokens = list(free.sequences[0].tokens)
    stop = tok.decode(tokens[4:6])
    assert stop, "pick a stop string that has text"
    r = sampler.sample(prompt=prompt, num_samples=1,
                       sampling_params=types.SamplingParams(max_tokens=16, temperature=0.0, stop=[stop])).result()
    got = list(r.sequences[0].tokens)
    assert r.sequences[0].stop_reason == "stop"
    assert got == tokens[:len(got)]
    assert stop in tok.decode(got)
    assert stop not in tok.decode(got[:-1])


def test_stop_strings_need_a_tokenizer(base_url):
    sampler = _sampler(service_client(base_url, "tml-stop2"), BASE_MODEL)
    with pytest.raises(Exception) as err:
        sampler.sample(prompt=types.ModelInput.from_ints([1, 2]), num_samples=1,
                       sampling_params=types.SamplingParams(max_tokens=4, stop=["ab"])).result()
    assert "tokenizer" in str(err.value)
