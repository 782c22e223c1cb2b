#!/usr/bin/env python3
"""`twinkle train` on text datasets with the parity Qwen3 model (vocab 1000) and the fixture tokenizer
+ Qwen3 chat template of tests/data/tokenizer (made by tests/data/make_tokenizer.py).

Checks, on the packed batches that --dump-batches writes: a `messages` line trains exactly the tokens
whose bytes all lie in an assistant span (found here independently: "<|im_start|>assistant\\n" ...
"<|im_end|>" in the decoded text, the byte-level decode done here from tokenizer.json); prompt +
completion trains the completion only; text trains every token; chosen / rejected pairs; the loss
falls; bad lines of each format are refused naming file:line and the field; a missing tokenizer.json
is named; overflow truncate / split counts; --shuffle orders that a resumed run continues; --epochs; eval
loss from --eval-fraction / --eval-data; --lr-schedule values against transformers' formulas;
--global-batch-tokens accumulation; --data FILE:W mixing; metrics.jsonl. Usage: data_train.py TWINKLE_BIN"""
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TWINKLE = sys.argv[1]
failed = 0


def check(ok, what):
    global failed
    print(("ok   " if ok else "FAIL ") + what)
    failed += not ok


def byte_decoder():
    """GPT-2's bytes_to_unicode, inverted: the ByteLevel character of each byte."""
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def make_model(dest):
    dest.mkdir()
    for f in (REPO / "tests/parity/fixtures/qwen3/model").iterdir():
        shutil.copy(f, dest / f.name)
    for f in (REPO / "tests/data/tokenizer").iterdir():
        shutil.copy(f, dest / f.name)
    tj = json.loads((dest / "tokenizer.json").read_text())
    dec = byte_decoder()
    id_bytes = {i: bytes(dec[ch] for ch in tok) for tok, i in tj["model"]["vocab"].items()}
    for a in tj["added_tokens"]:
        id_bytes[a["id"]] = a["content"].encode()
    return id_bytes


def train(args, tmp, name):
    out = subprocess.run([TWINKLE, "train", *args, "--out", str(tmp / name)], capture_output=True, text=True)
    return out.returncode, out.stdout + out.stderr


def batches(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def sequences(b):
    """(tokens + last target, weights per target) of each sequence of a dumped batch."""
    starts = sorted(set(b["seg_start"]))
    ends = starts[1:] + [len(b["tokens"])]
    for a, e in zip(starts, ends):
        yield b["tokens"][a:e] + [b["targets"][e - 1]], b["weights"][a:e]


def expected_mask(ids, id_bytes, pattern):
    """Per target (ids[1:]): 1 when every byte of the token lies in a span matched by pattern."""
    pieces = [id_bytes[i] for i in ids]
    text = b"".join(pieces)
    inside = bytearray(len(text))
    for m in re.finditer(pattern, text, re.S):
        inside[m.start(1):m.end(1)] = b"\x01" * (m.end(1) - m.start(1))
    want, off = [], 0
    for p in pieces:
        want.append(1.0 if p and all(inside[off:off + len(p)]) else 0.0)
        off += len(p)
    return want[1:], text


def main():
    tmp = Path(tempfile.mkdtemp(prefix="twk_data_train."))
    try:
        run(tmp)
    finally:
        shutil.rmtree(tmp)
    print("data_train: %s" % ("FAILED" if failed else "all passed"))
    sys.exit(1 if failed else 0)


def run(tmp):
    model = tmp / "model"
    id_bytes = make_model(model)
    words = "zero one two three four five six seven eight nine ten eleven".split()
    chats = []
    for i, w in enumerate(words):
        conv = [{"role": "user", "content": f"Say the number {i} in words."}, {"role": "assistant", "content": w}]
        if i % 3 == 0:
            conv = [{"role": "system", "content": "You count."}] + conv + [
                {"role": "user", "content": "and the next one?"}, {"role": "assistant", "content": words[(i + 1) % 12]}]
        chats.append({"messages": conv})
    data = tmp / "chat.jsonl"
    data.write_text("".join(json.dumps(c) + "\n" for c in chats))
    common = ["--model", str(model), "--batch-tokens", "256", "--lr", "1e-2", "--rank", "8"]

    # messages: the weights on the packed batch are the assistant tokens, the loss falls
    rc, log = train([*common, "--data", str(data), "--steps", "20", "--dump-batches", str(tmp / "a.dump")], tmp, "a")
    check(rc == 0, "messages: train runs" + ("" if rc == 0 else "\n" + log))
    if rc:
        return
    print("     " + [l for l in log.splitlines() if l.startswith("data:")][0])
    span = rb"<\|im_start\|>assistant\n(.*?<\|im_end\|>)"
    n_seq = n_tok = n_trained = bad = 0
    for b in batches(tmp / "a.dump"):
        for ids, w in sequences(b):
            want, _ = expected_mask(ids, id_bytes, span)
            n_seq += 1
            n_tok += len(w)
            n_trained += sum(w)
            bad += want != w
    check(n_seq > 0 and bad == 0 and 0 < n_trained < n_tok,
          f"messages (--train-on assistant): {n_seq} packed sequences, {int(n_trained)} of {n_tok} targets trained, "
          f"{bad} sequences whose weights differ from the assistant spans")
    m = re.search(r"^loss ([0-9.]+) -> ([0-9.]+)", log, re.M)
    check(m and float(m[2]) * 3 < float(m[1]), f"messages: loss {m[1]} -> {m[2]} (want 3x lower)" if m else log)

    run_sample_chat(tmp, model, tmp / "a/final", id_bytes)

    # --train-on last: only the last assistant turn of each conversation
    rc, log = train([*common, "--data", str(data), "--steps", "1", "--train-on", "last", "--dump-batches",
                     str(tmp / "l.dump")], tmp, "l")
    bad = n = 0
    for b in batches(tmp / "l.dump"):
        for ids, w in sequences(b):
            want, _ = expected_mask(ids, id_bytes, rb"(?:.*)<\|im_start\|>assistant\n(.*?<\|im_end\|>)")
            n += 1
            bad += want != w
    check(rc == 0 and n > 0 and bad == 0, f"messages (--train-on last): {n} sequences, {bad} differ from the last span")

    # text, prompt + completion, chosen / rejected (strings and messages)
    mixed = tmp / "mixed.jsonl"
    mixed.write_text("".join(json.dumps(x) + "\n" for x in [
        {"text": "one two three four five six"},
        {"prompt": "What is two and two?", "completion": " four"},
        {"text": ""}]))
    rc, log = train([*common, "--data", str(mixed), "--steps", "1", "--dump-batches", str(tmp / "m.dump")], tmp, "m")
    seqs = [s for b in batches(tmp / "m.dump") for s in sequences(b)]
    ok = rc == 0 and len(seqs) == 2
    if ok:
        (t_ids, t_w), (p_ids, p_w) = seqs
        ptext = b"".join(id_bytes[i] for i in p_ids)
        ok = all(x == 1 for x in t_w) and b"".join(id_bytes[i] for i in t_ids) == b"one two three four five six"
        comp = [i for i, x in enumerate(p_w) if x]
        ok = ok and ptext == b"What is two and two? four" and b"".join(id_bytes[p_ids[i + 1]] for i in comp) == b" four"
        ok = ok and "1 dropped" in log
    check(ok, "text trains every token, prompt + completion only ' four', an empty text is dropped and counted: "
          + ([l for l in log.splitlines() if l.startswith("data:")] or [log])[0])
    if ok:
        run_bos_eos(tmp, model, common, mixed, seqs, id_bytes)

    pairs = tmp / "pairs.jsonl"
    pairs.write_text("".join(json.dumps(x) + "\n" for x in [
        {"prompt": "Say one:", "chosen": " one", "rejected": " two"},
        {"chosen": [{"role": "user", "content": "Say two"}, {"role": "assistant", "content": "two"}],
         "rejected": [{"role": "user", "content": "Say two"}, {"role": "assistant", "content": "ten"}]},
        {"prompt": [{"role": "user", "content": "Say six"}], "chosen": [{"role": "assistant", "content": "six"}],
         "rejected": [{"role": "assistant", "content": "red"}]}]))
    rc, log = train([*common, "--data", str(pairs), "--loss", "dpo", "--steps", "1", "--dump-batches",
                     str(tmp / "p.dump")], tmp, "p")
    seqs = [s for b in batches(tmp / "p.dump") for s in sequences(b)]
    trained = [b"".join(id_bytes[ids[i + 1]] for i, x in enumerate(w) if x) for ids, w in seqs]
    want = [b" one", b" two", b"<think>\n\n</think>\n\ntwo<|im_end|>", b"<think>\n\n</think>\n\nten<|im_end|>",
            b"<think>\n\n</think>\n\nsix<|im_end|>", b"<think>\n\n</think>\n\nred<|im_end|>"]
    check(rc == 0 and trained == want, f"chosen / rejected (strings and messages): trained parts {trained}")

    # bad lines of each format name file:line and the field
    bad_lines = [({"text": 5}, "text"), ({"prompt": "x"}, "completion"), ({"prompt": "x", "completion": 3}, "completion"),
                 ({"messages": "hi"}, "messages"), ({"messages": [{"role": "user"}]}, "messages"),
                 ({"chosen": "a"}, "rejected"), ({"chosen": "a", "rejected": [{"role": "user", "content": "b"}]}, "chosen"),
                 ({"tokens": [1, 5000]}, "tokens[1]")]
    for k, (line, fieldname) in enumerate(bad_lines):
        f = tmp / f"bad{k}.jsonl"
        f.write_text(json.dumps({"text": "one two"}) + "\n" + json.dumps(line) + "\n")
        rc, log = train([*common, "--data", str(f), "--steps", "1"], tmp, "bad")
        msg = log.strip().splitlines()[-1] if log.strip() else ""
        check(rc != 0 and f"bad{k}.jsonl:2:" in msg and fieldname in msg, f"bad line {json.dumps(line)}: {msg}")

    # no tokenizer.json: the message names the file
    bare = tmp / "bare"
    bare.mkdir()
    for f in ("config.json", "model.safetensors"):
        shutil.copy(model / f, bare / f)
    rc, log = train(["--model", str(bare), "--data", str(data), "--steps", "1"], tmp, "bare")
    msg = log.strip().splitlines()[-1]
    check(rc != 0 and str(bare / "tokenizer.json") in msg,
          f"missing tokenizer files named: {msg}")

    # overflow: a long text truncated or split to --max-len targets
    long_text = tmp / "long.jsonl"
    long_text.write_text(json.dumps({"text": " ".join(words * 4)}) + "\n")
    counts = {}
    for mode in ("truncate", "split"):
        rc, log = train([*common, "--data", str(long_text), "--steps", "1", "--max-len", "10", "--overflow", mode,
                         "--dump-batches", str(tmp / f"o{mode}.dump")], tmp, "o")
        seqs = [s for b in batches(tmp / f"o{mode}.dump") for s in sequences(b)]
        counts[mode] = (rc, [len(w) for _, w in seqs], [l for l in log.splitlines() if l.startswith("data:")])
    rc_t, lens_t, line_t = counts["truncate"]
    rc_s, lens_s, line_s = counts["split"]
    check(rc_t == 0 and lens_t == [10] and "1 truncated" in line_t[0], f"--overflow truncate: lengths {lens_t}; {line_t}")
    check(rc_s == 0 and len(lens_s) > 2 and max(lens_s) == 10 and "1 split" in line_s[0],
          f"--overflow split: piece lengths {lens_s}; {line_s}")

    run_order(tmp, model, words, common, data, id_bytes)


def run_bos_eos(tmp, model, common, mixed, plain, id_bytes):
    """A Llama-style tokenizer_config.json (class LlamaTokenizerFast, add_bos_token and add_eos_token true): as
    transformers 4.x's tokenizer(text), text is bos + text + eos, and prompt + completion is framed as
    tokenizer(prompt + completion): bos before the prompt, eos after the completion and trained, none between."""
    le = tmp / "model_le"
    shutil.copytree(model, le)
    cfg = json.loads((le / "tokenizer_config.json").read_text())
    cfg.update(tokenizer_class="LlamaTokenizerFast", add_bos_token=True, add_eos_token=True,
               bos_token="<|endoftext|>", eos_token="<|im_end|>")
    (le / "tokenizer_config.json").write_text(json.dumps(cfg))
    tj = json.loads((le / "tokenizer.json").read_text())
    ids = {a["content"]: a["id"] for a in tj["added_tokens"]}
    bos, eos = ids["<|endoftext|>"], ids["<|im_end|>"]
    args = [a if a != str(model) else str(le) for a in common]
    rc, log = train([*args, "--data", str(mixed), "--steps", "1", "--dump-batches", str(tmp / "le.dump")], tmp, "le")
    seqs = [s for b in batches(tmp / "le.dump") for s in sequences(b)]
    ok = rc == 0 and len(seqs) == 3 and seqs[2][0] == [bos, eos]  # the empty text: tokenizer("") is [bos, eos]
    if ok:
        (t_ids, t_w), (p_ids, p_w), _ = seqs
        (t0, _), (p0, _) = plain
        trained = b"".join(id_bytes[p_ids[i + 1]] for i, x in enumerate(p_w) if x)
        ok = (t_ids == [bos] + t0 + [eos] and all(x == 1 for x in t_w) and p_ids == [bos] + p0 + [eos]
              and trained == b" four<|im_end|>")
    check(ok, "add_bos_token / add_eos_token (LlamaTokenizerFast): text is bos + text + eos, prompt + completion "
          "bos + prompt + completion + eos with ' four<|im_end|>' trained, the empty text bos + eos" + ("" if rc == 0 else "\n" + log))


def run_sample_chat(tmp, model, adapter, id_bytes):
    """twinkle sample --prompt / --messages print text (and ids with --ids); twinkle chat, fed by a pipe, replies
    as sample --messages does to the same conversation (greedy), its history included."""
    base = [TWINKLE, "sample", "--model", str(model), "--adapter", str(adapter), "--temperature", "0", "--max-tokens", "12"]
    out = subprocess.run([*base, "--prompt", "Say the number", "--ids"], capture_output=True, text=True)
    lines = out.stdout.split("\n")
    js = [json.loads(l) for l in lines if l.startswith("{")]
    text = out.stdout[:out.stdout.rindex("\n{")] if js else ""
    specials = {a["id"] for a in json.loads((model / "tokenizer.json").read_text())["added_tokens"] if a["special"]}
    want = b"".join(id_bytes.get(i, b"") for i in js[0]["tokens"] if i not in specials).decode(errors="replace") if js else None
    check(out.returncode == 0 and len(js) == 1 and text == want,
          f"sample --prompt --ids: text {text!r} equals the decode of its ids {js[0]['tokens'] if js else out.stderr}")

    def sample_messages(conv):
        f = tmp / "conv.json"
        f.write_text(json.dumps(conv))
        r = subprocess.run([*base, "--messages", str(f)], capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else "ERROR " + r.stderr

    turns = ["Say the number 3 in words.", "Say the number 7 in words."]
    r = subprocess.run([TWINKLE, "chat", "--model", str(model), "--adapter", str(adapter), "--temperature", "0",
                        "--max-tokens", "12"], input="\n".join(turns) + "\n", capture_output=True, text=True)
    replies = r.stdout.strip("\n").split("\n")
    first = sample_messages([{"role": "user", "content": turns[0]}])
    second = sample_messages([{"role": "user", "content": turns[0]}, {"role": "assistant", "content": first},
                              {"role": "user", "content": turns[1]}])
    check(r.returncode == 0 and replies == [first, second],
          f"chat over a pipe: replies {replies} == sample --messages of the same conversations {[first, second]}")


def lr_reference(kind, step, total, warmup):
    """transformers' get_{constant,linear,cosine}_schedule_with_warmup lambdas (float64)."""
    import math
    if step < warmup:
        return step / max(1, warmup)
    if kind == "constant":
        return 1.0
    if kind == "linear":
        return max(0.0, (total - step) / max(1, total - warmup))
    progress = (step - warmup) / max(1, total - warmup)
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * 0.5 * 2.0 * progress)))


def metrics(path):
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


def run_order(tmp, model, words, common, chat, id_bytes):
    text = tmp / "text.jsonl"
    text.write_text("".join(json.dumps({"text": f"{w} {w} {words[(i + 3) % 12]}"}) + "\n" for i, w in enumerate(words)))
    small = ["--model", str(model), "--batch-tokens", "16", "--lr", "1e-2", "--rank", "8"]

    # --shuffle: a new order per epoch; a run resumed at step 6 packs the same batches and ends identical
    args = [*small, "--data", str(text), "--shuffle", "--seed", "5", "--steps", "12"]
    rc, log = train([*args, "--save-every", "6", "--dump-batches", str(tmp / "s1.dump")], tmp, "s1")
    rc2, log2 = train([*args, "--resume", str(tmp / "s1/step-6"), "--dump-batches", str(tmp / "s2.dump")], tmp, "s2")
    rc3, log3 = train([*small, "--data", str(text), "--steps", "12", "--dump-batches", str(tmp / "s3.dump")], tmp, "s3")
    a, b, c = batches(tmp / "s1.dump"), batches(tmp / "s2.dump"), batches(tmp / "s3.dump")
    same = rc == 0 and rc2 == 0 and [x for x in a if x["step"] > 6] == b and len(b) == 6
    ident = (tmp / "s1/final/adapter_model.safetensors").read_bytes() == (tmp / "s2/final/adapter_model.safetensors").read_bytes()
    order = [x["tokens"][0] for x in a]
    check(same and ident and [x["tokens"] for x in a] != [x["tokens"] for x in c],
          f"--shuffle: the resumed run packed the same {len(b)} batches for steps 7-12, final adapter identical: {ident}; "
          f"the order differs from the unshuffled one")
    m = metrics(tmp / "s1")
    check(len(m) == 12 and [x["step"] for x in m] == list(range(1, 13)) and all("loss" in x and "tokens_per_s" in x for x in m),
          f"metrics.jsonl: {len(m)} lines, steps 1..12 with loss, lr, tokens, tokens_per_s")

    # --epochs 2: every example exactly twice, in two different orders
    rc, log = train([*small, "--data", str(text), "--shuffle", "--epochs", "2", "--dump-batches", str(tmp / "e.dump")], tmp, "e")
    seqs = [tuple(ids) for bt in batches(tmp / "e.dump") for ids, _ in sequences(bt)]
    half = len(seqs) // 2
    check(rc == 0 and len(seqs) == 24 and sorted(seqs[:half]) == sorted(seqs[half:]) and seqs[:half] != seqs[half:]
          and len(set(seqs)) == 12, f"--epochs 2 --shuffle: {len(seqs)} sequences, each of 12 twice, epochs in different "
          f"orders; {[l for l in log.splitlines() if l.startswith('steps')]}")

    # eval loss on 3 held-out conversations every 2 steps and at the end: it falls (by 2x at its lowest; the
    # held-out numbers are never trained, so it rises again as the adapter overfits)
    rc, log = train([*common, "--data", str(chat), "--eval-fraction", "0.25", "--eval-every", "2", "--steps", "11"], tmp, "ev")
    m = metrics(tmp / "ev")
    ev = [(x["step"], round(x["eval_loss"], 4)) for x in m if "eval_loss" in x]
    check(rc == 0 and [s for s, _ in ev] == [2, 4, 6, 8, 10, 11] and min(e for _, e in ev) * 2 < ev[0][1]
          and "eval loss" in log and "eval: 3 examples" in log, f"--eval-fraction 0.25: eval losses {ev}")
    rc, log = train([*common, "--data", str(chat), "--eval-data", str(text), "--steps", "2"], tmp, "ev2")
    check(rc == 0 and "eval: 12 examples" in log and "eval_loss" in metrics(tmp / "ev2")[-1],
          f"--eval-data: {[l for l in log.splitlines() if l.startswith('eval') or 'eval loss' in l]}")

    # lr schedules against the reference formulas (lr 1e-2, 20 steps, 4 warmup)
    for kind in ("constant", "linear", "cosine"):
        rc, log = train([*small, "--data", str(text), "--steps", "20", "--lr-schedule", kind, "--warmup-steps", "4"],
                        tmp, "lr")
        got = [x["lr"] for x in metrics(tmp / "lr")]
        want = [1e-2 * lr_reference(kind, s, 20, 4) for s in range(20)]
        err = max(abs(g - w) for g, w in zip(got, want)) if len(got) == 20 else float("inf")
        check(rc == 0 and err <= 1e-9, f"--lr-schedule {kind} --warmup-steps 4: max |lr - reference| {err:.2e} "
              f"(float32 lr; tolerance 1e-9)")

    # gradient accumulation: micro-batches of <= 16 tokens up to 40 tokens a step
    rc, log = train([*small, "--data", str(text), "--steps", "4", "--global-batch-tokens", "40", "--dump-batches",
                     str(tmp / "g.dump")], tmp, "g")
    per_step = {}
    for bt in batches(tmp / "g.dump"):
        per_step.setdefault(bt["step"], []).append(len(bt["tokens"]))
    tok = [x["tokens"] for x in metrics(tmp / "g")]
    check(rc == 0 and len(per_step) == 4 and all(len(v) >= 2 and sum(v) <= 40 and max(v) <= 16 for v in per_step.values())
          and tok == [sum(v) for v in per_step.values()],
          f"--global-batch-tokens 40: micro-batch tokens per step {list(per_step.values())}")

    # mixing 1:1 a file of 12 lines and one of 4: an epoch of 16 examples, 8 of a (subsampled, distinct) and
    # 8 of b (each of its 4 lines twice)
    other = tmp / "other.jsonl"
    other.write_text("".join(json.dumps({"text": f"red green {w}"}) + "\n" for w in words[:4]))
    rc, log = train([*small, "--data", f"{text}:1", "--data", f"{other}:1", "--epochs", "1", "--dump-batches",
                     str(tmp / "x.dump")], tmp, "x")
    texts = [b"".join(id_bytes[i] for i in ids) for bt in batches(tmp / "x.dump") for ids, _ in sequences(bt)]
    a = [t for t in texts if not t.startswith(b"red green")]
    b = [t for t in texts if t.startswith(b"red green")]
    check(rc == 0 and len(a) == 8 and len(set(a)) == 8 and len(b) == 8 and len(set(b)) == 4,
          f"--data a:1 --data b:1 (12 and 4 lines): one epoch has {len(a)} of a ({len(set(a))} distinct), "
          f"{len(b)} of b ({len(set(b))} distinct)")


if __name__ == "__main__":
    main()
