#!/usr/bin/env python3
"""Runs every example command of README.md, so the README cannot drift from the code.

    python3 tests/readme/run.py TWINKLE_BIN [--venv DIR]

The commands are read from README.md's ```sh and ```python blocks each time (a new example is
run without touching this file); placeholders are mapped to test fixtures:
  path/to/<anything>       a small fixture model (tests/parity/fixtures/qwen3|llama/model); in a command
                           with text data (chat.jsonl, text.jsonl, --prompt, --messages, `twinkle chat`)
                           the qwen3 model with tests/data/tokenizer's tokenizer and chat template
  train.jsonl, eval.jsonl  JSONL written here (tokens, weights, advantages)
  chat.jsonl, text.jsonl, conversation.json   messages / text lines and one conversation written here
  `twinkle chat`           gets two user turns on stdin
  runs/..., keys.txt, serve.conf, /srv/twinkle   files and folders in a temporary folder
  `...` in `twinkle train ...`   the arguments of the README's first train command
  [--opt X]                 the optional part is used
  step counts               shortened (--steps 4, --save-every 2, runs/a/step-50 -> step-2)
`mpirun -np N ./build/twinkle ...` lines run as N local ranks (lines naming a hosts file do not);
`twinkle serve` commands must start, print their port and answer /api/v1/healthz; the Python block (the
official SDK) runs against `twinkle serve` on the built-in model; every other command must exit 0.
The two setup commands (`make demo`, `make test`) are the suite itself and scripts/demo.sh, which
tests/CMakeLists.txt runs as its own test (readme_demo). Exit status: the number of failures.
"""
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(ROOT, "tests", "parity", "fixtures")


def blocks(text, lang):
    """The bodies of the fenced blocks of one language, in order."""
    return re.findall(r"^```" + lang + r"\n(.*?)^```", text, re.S | re.M)


def commands(block):
    """Shell commands of a block: continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", block)
    out = []
    for line in joined.splitlines():
        line = re.sub(r"\s+#.*$", "", line).strip()
        if line and not line.startswith("#"):
            out.append(line)
    return out


def write_data(tmp):
    """train.jsonl (SFT + RL fields, an even number of lines for DPO pairs) and eval.jsonl."""
    rows = []
    for i in range(8):
        toks = [(7 * i + 3 * j) % 997 + 1 for j in range(12)]
        rows.append({"tokens": toks, "advantages": 1.0 if i % 2 == 0 else -1.0})
    for name in ("train.jsonl", "eval.jsonl"):
        with open(os.path.join(tmp, name), "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")


def write_text_data(tmp):
    """chat.jsonl, text.jsonl, conversation.json, and the qwen3 fixture with a tokenizer + chat template."""
    words = "zero one two three four five six seven".split()
    with open(os.path.join(tmp, "chat.jsonl"), "w") as f:
        for i, w in enumerate(words):
            f.write(json.dumps({"messages": [{"role": "user", "content": f"Say the number {i} in words."},
                                             {"role": "assistant", "content": w}]}) + "\n")
    with open(os.path.join(tmp, "text.jsonl"), "w") as f:
        for i, w in enumerate(words):
            f.write(json.dumps({"text": f"{w} is the number {i}"}) + "\n")
    with open(os.path.join(tmp, "conversation.json"), "w") as f:
        json.dump([{"role": "user", "content": "Say the number 3 in words."}], f)
    model = os.path.join(tmp, "model-text")
    os.makedirs(model)
    for src in (os.path.join(FIXTURES, "qwen3", "model"), os.path.join(ROOT, "tests", "data", "tokenizer")):
        for name in os.listdir(src):
            shutil.copy(os.path.join(src, name), os.path.join(model, name))
    return model


TEXT_MARKS = ("chat.jsonl", "text.jsonl", "--prompt ", "--messages", "twinkle chat")


def substitute(cmd, tmp, binary, first_train):
    cmd = cmd.replace("./build/twinkle", binary)
    cmd = re.sub(r"\[(--[a-z-]+(?: [^\]]+)?)\]", r"\1", cmd)  # optional parts are used
    if " train ..." in cmd and first_train:
        cmd = cmd.replace(" train ...", " train " + first_train)
    if any(m in cmd for m in TEXT_MARKS):
        cmd = re.sub(r"path/to/[^ =]+", os.path.join(tmp, "model-text"), cmd)
    cmd = re.sub(r"path/to/Llama[^ ]*", os.path.join(FIXTURES, "llama", "model"), cmd)
    cmd = re.sub(r"path/to/[^ =]+", os.path.join(FIXTURES, "qwen3", "model"), cmd)
    cmd = cmd.replace("--adapter DIR", "--adapter runs/a/final")
    cmd = re.sub(r"--steps N\b", "--steps 3", cmd)
    cmd = re.sub(r"--seed S\b", "--seed 1", cmd)
    cmd = re.sub(r"--steps \d+", "--steps 4", cmd)
    cmd = re.sub(r"--save-every \d+", "--save-every 2", cmd)
    cmd = re.sub(r"step-\d+", "step-2", cmd)
    cmd = cmd.replace("/srv/twinkle", os.path.join(tmp, "srv"))
    args = shlex.split(cmd)
    for i, a in enumerate(args):
        if a.split(":")[0] in ("train.jsonl", "eval.jsonl", "keys.txt", "serve.conf", "chat.jsonl", "text.jsonl",
                               "conversation.json") or a.startswith("runs/"):
            args[i] = os.path.join(tmp, a)
    return args


def wait_port(proc, log_path, timeout=60):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            return None
        with open(log_path) as f:
            m = re.search(r"^port (\d+)$", f.read(), re.M)
        if m:
            return int(m.group(1))
        time.sleep(0.1)
    return None


def start_server(args, cwd, tmp, tag):
    if "--port" in args:
        args[args.index("--port") + 1] = "0"
    else:
        args += ["--port", "0"]
    log = os.path.join(tmp, f"serve-{tag}.log")
    proc = subprocess.Popen(args, cwd=cwd, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    return proc, wait_port(proc, log), log


def stop_server(proc):
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def run_serve(args, tmp, tag):
    proc, port, log = start_server(args, tmp, tmp, tag)
    if port is None:
        stop_server(proc)
        return f"did not report a port:\n{open(log).read()[-2000:]}"
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/healthz", timeout=10) as r:
            if r.status != 200:
                return f"/healthz answered {r.status}"
    except Exception as e:  # noqa: BLE001 - any failure is the test's failure
        return f"/healthz failed: {e}"
    finally:
        stop_server(proc)
    return None


def run_python(snippet, binary, tmp, venv):
    proc, port, log = start_server([binary, "serve", "--data-dir", os.path.join(tmp, "py-data")], tmp, tmp, "py")
    if port is None:
        stop_server(proc)
        return f"server did not start:\n{open(log).read()[-2000:]}"
    code = snippet.replace("http://127.0.0.1:8000", f"http://127.0.0.1:{port}")
    path = os.path.join(tmp, "snippet.py")
    with open(path, "w") as f:
        f.write(code)
    python = os.path.join(venv, "bin", "python")
    r = subprocess.run([python, path], cwd=tmp, capture_output=True, text=True, timeout=300)
    stop_server(proc)
    print(r.stdout, end="")
    if r.returncode != 0:
        return f"exit {r.returncode}:\n{r.stderr[-3000:]}"
    return None


def main():
    binary = os.path.abspath(sys.argv[1])
    venv = sys.argv[sys.argv.index("--venv") + 1] if "--venv" in sys.argv else os.path.join(ROOT, "build", "venv-sdk")
    text = open(os.path.join(ROOT, "README.md")).read()
    tmp = tempfile.mkdtemp(prefix="twk-readme-")
    write_data(tmp)
    write_text_data(tmp)
    with open(os.path.join(tmp, "keys.txt"), "w") as f:
        f.write("tml-readme-key alice\n")
    with open(os.path.join(tmp, "serve.conf"), "w") as f:
        f.write(f"data-dir = {os.path.join(tmp, 'conf-data')}\nport = 0\n")
    failures, ran, first_train = 0, 0, None
    for block in blocks(text, "sh"):
        for cmd in commands(block):
            local_mpi = re.match(r"mpirun -np \d+ \./build/twinkle ", cmd) and shutil.which("mpirun")
            if not cmd.startswith("./build/twinkle") and not local_mpi:
                # make/setup lines (the suite itself and readme_demo) and multi-node launches
                print(f"readme: not run here: {cmd}")
                continue
            launcher = []
            if local_mpi:  # `mpirun -np N` on this machine: the ranks oversubscribe its cores
                n = cmd.split()[2]
                cmd = cmd.split(" ", 3)[3]
                launcher = ["mpirun", "-np", n]
            if first_train is None and " train " in cmd and "..." not in cmd:
                first_train = cmd.split(" train ", 1)[1]
            args = substitute(cmd, tmp, binary, first_train)
            if launcher:
                args = launcher + args
            t0 = time.time()
            if args[1] == "serve" and not launcher:
                err = run_serve(args, tmp, ran)
            else:
                turns = "Say the number 3 in words.\nAnd 4?\n" if args[1] == "chat" else ""
                r = subprocess.run(args, cwd=tmp, capture_output=True, text=True, errors="replace", timeout=600, input=turns)
                err = None if r.returncode == 0 else f"exit {r.returncode}:\n{(r.stdout + r.stderr)[-3000:]}"
            ran += 1
            status = "ok" if err is None else "FAILED"
            print(f"readme: {status} ({time.time() - t0:.1f} s): {shlex.join(args)}")
            if err:
                print(err)
                failures += 1
    for snippet in blocks(text, "python"):
        err = run_python(snippet, binary, tmp, venv)
        ran += 1
        print(f"readme: {'ok' if err is None else 'FAILED'}: the Python example (official SDK)")
        if err:
            print(err)
            failures += 1
    print(f"readme: {ran} examples run, {failures} failed")
    if ran == 0:
        return 1
    return failures


if __name__ == "__main__":
    sys.exit(main())
