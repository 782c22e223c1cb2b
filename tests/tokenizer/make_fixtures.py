#!/usr/bin/env python3
"""Build the tokenizer fixtures for tests/test_tokenizer.c (decode of Hugging Face tokenizer.json).

    python3 -m venv /tmp/venv-tok && /tmp/venv-tok/bin/pip install -r tests/tokenizer/requirements.txt
    /tmp/venv-tok/bin/python tests/tokenizer/make_fixtures.py

Needs the `tokenizers` library (0.23.3, pinned in requirements.txt). Then run
make_encode_fixtures.py, which encodes its corpus with these four too. Writes, next to this script:

  bytelevel/tokenizer.json  GPT-2 / Qwen2 style byte-level BPE trained here on the built-in
                            multilingual text: NFC normalizer, Qwen2's Split regex + ByteLevel
                            pre-tokenizer, ByteLevel decoder; added tokens <|endoftext|>,
                            <|im_start|>, <|im_end|> (special), <think>, </think>, "\\n\\n"
                            (not special, not normalized) and "café" (not special, normalized).
  sp/tokenizer.json         SentencePiece-style BPE as transformers converts Llama 2 / Mistral
                            (legacy=False): Metaspace pre-tokenizer (prepend_scheme "first"),
                            byte_fallback with <0x00>..<0xFF> at ids 3..258, <unk> <s> </s> at
                            0..2, decoder Sequence[Replace("▁"→" "), ByteFallback, Fuse,
                            Strip(" ", 1, 0)]. CJK and emoji are left out of the trained
                            alphabet, so they decode through byte fallback.
  sp_legacy/tokenizer.json  The same model as Llama 2's original tokenizer.json has it:
                            normalizer Sequence[Prepend("▁"), Replace(" "→"▁")], no
                            pre-tokenizer; plus added tokens "<pad>" (normalized, not special)
                            and "<|user|>" (normalized, special), which the library decodes in
                            their normalized form ("▁<pad>").
  metaspace/tokenizer.json  The same model with a Metaspace decoder (prepend_scheme "always").
  expected.json             Per tokenizer: its size (max id + 1) and ~50 id sequences with what
                            tokenizers' Tokenizer.decode(ids, skip_special_tokens=False / True)
                            returns (text_b64 / text_skip_b64, UTF-8, base64), and the raw
                            bytes twinkle's decoder returns (raw_b64 / raw_skip_b64).

Raw bytes vs the library's string: the library converts bytes that are not valid UTF-8 to
U+FFFD (ByteLevel: one per maximal invalid subpart of the decoded chunk, as
String::from_utf8_lossy; ByteFallback: one per byte of a run of <0xNN> tokens that is not
valid UTF-8). twinkle returns the raw bytes instead, so a stop string can be matched across
tokens that each hold part of a character. `raw` here comes from a small Python model of the
decoder chain (`decode_chain` below). The script checks, for every sequence, that the same
model with the library's lossy rules applied gives exactly the library's string, and that
raw == the library's bytes whenever raw is valid UTF-8 ("valid": true).

The output is deterministic: running it again rewrites identical files.
"""

from __future__ import annotations

import base64
import json
import os
import random

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

HERE = os.path.dirname(os.path.abspath(__file__))

CORPUS = [
    "The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs away into the forest.",
    "Training a language model means predicting the next token, one token at a time, again and again.",
    "She said: \"It's 3:45 pm, and we're late!\" He replied, 'I'll drive — you read the map.'",
    "Numbers: 0 1 2 3 4 5 6 7 8 9, 10, 100, 1000, 3.14159, 2.71828, -42, +7, 1e-5, 0x1F.",
    "Code: for (int i = 0; i < n; i++) { sum += a[i] * b[i]; } return sum;",
    "def decode(ids):\n    return ''.join(vocab[i] for i in ids)\n\n\tprint(decode([1, 2, 3]))",
    "Le café est très chaud. Où est la bibliothèque ? Voilà, c'est déjà l'été à Montréal.",
    "Über den Wolken muss die Freiheit wohl grenzenlos sein. Schöne Grüße aus München, Straße 5.",
    "El niño comió una piña en el año pasado. ¿Dónde está la estación? ¡Qué día tan bonito!",
    "Ελληνικά: καλημέρα κόσμε. Русский: привет, мир! Как дела? Українська: дякую.",
    "日本語のテキスト：東京は日本の首都です。今日はいい天気ですね。",
    "中文文本：我们今天学习机器学习。模型正在训练中，请稍等。你好，世界！",
    "한국어: 안녕하세요, 세계! 오늘은 날씨가 좋네요.",
    "Emoji: 😀 😃 😄 🚀 🎉 👍 ❤️ 🇫🇷 👩‍💻 🤖 — and symbols: © ® ™ € £ ¥ § ¶ • … ≠ ≤ ≥ ∞ √ π.",
    "Mixed: naïve coöperation façade jalapeño Zürich São Paulo Kraków Ångström œuvre.",
    "  leading spaces, trailing spaces   \n\nnew lines\r\nand tabs\t\tbetween words  ",
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\nParis.<|im_end|>",
]
# Extra, longer English so that merges form real words.
CORPUS += [
    "In the beginning the model knows nothing; after many steps of gradient descent it learns "
    "which words follow which, how sentences end, and where the spaces go. " * 3,
    "A tokenizer splits text into pieces; a decoder joins the pieces back into text. "
    "Byte-level tokenizers never meet an unknown character, because every byte has a token. " * 3,
]

# Texts to round-trip through encode (not all of them seen in training).
TEXTS = [
    "Hello, world!",
    "The café is open — naïve résumé.",
    "東京は日本の首都です。",
    "我们今天学习机器学习。",
    "Rocket 🚀 party 🎉 thumbs 👍 and a family 👨‍👩‍👧 flag 🇯🇵",
    "  two leading spaces and a trailing one ",
    "line one\nline two\n\nline four\ttabbed",
    "Mixed scripts: Ελληνικά, русский, 한국어, עברית, العربية, हिन्दी.",
    "Numbers 12345 and 3.14159 and -0.5e-3",
    "def f(x):\n    return x ** 2  # square",
    "Zero-width joiner: a\u200db, soft hyphen: co\u00adop, nbsp: a\u00a0b",
    "Combining: e\u0301 vs é, ñ vs n\u0303",
    "\U0001F9D1\u200D\U0001F52C scientist, \U0001F3F3\uFE0F\u200D\U0001F308 flag, ☕ coffee",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi! 😀<|im_end|>",
    "<think>reasoning here</think>\n\nAnswer: 42<|endoftext|>",
    "<s> Hello</s><s>Again <pad> and <|user|> here",
]

QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")


# ---------------------------------------------------------------------------------------------
# A Python model of the decoder chain (the spec is tokenizers' decoders/*.rs, 0.23).
# lossy=False gives raw bytes (twinkle's behaviour); lossy=True applies the library's U+FFFD rules.

def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


CHAR_BYTES = {c: b for b, c in bytes_to_unicode().items()}


def byte_token(piece: bytes):
    if len(piece) == 6 and piece.startswith(b"<0x") and piece.endswith(b">"):
        h = piece[3:5]
        try:
            s = h.decode("ascii")
        except UnicodeDecodeError:
            return None
        if s[0] == "+" and s[1] in "0123456789abcdefABCDEF":
            return int(s[1], 16)
        if all(c in "0123456789abcdefABCDEF" for c in s):
            return int(s, 16)
    return None


def decode_chain(steps, pieces, lossy):
    """pieces: list of bytes; returns bytes."""
    for st in steps:
        t = st["type"]
        if t == "Replace":
            pat, content = st["pattern"]["String"].encode(), st["content"].encode()
            pieces = [p.replace(pat, content) for p in pieces]
        elif t == "ByteFallback":
            out, run = [], []

            def flush():
                if run:
                    b = bytes(run)
                    try:
                        b.decode("utf-8")
                        out.append(b)
                    except UnicodeDecodeError:
                        out.extend([b] if not lossy else ["\ufffd".encode()] * len(run))
                    run.clear()

            for p in pieces:
                v = byte_token(p)
                if v is not None:
                    run.append(v)
                else:
                    flush()
                    out.append(p)
            flush()
            pieces = out
        elif t == "Fuse":
            pieces = [b"".join(pieces)]
        elif t == "Strip":
            c = st["content"].encode()
            out = []
            for p in pieces:
                s = 0
                for _ in range(st["start"]):
                    if p.startswith(c, s):
                        s += len(c)
                    else:
                        break
                e = len(p)
                for _ in range(st["stop"]):
                    if e - len(c) >= s and p[e - len(c):e] == c:
                        e -= len(c)
                    else:
                        break
                out.append(p[s:e])
            pieces = out
        elif t == "Metaspace":
            rep = st["replacement"].encode()
            never = st.get("prepend_scheme", "always") == "never"
            pieces = [p.replace(rep, b"" if (i == 0 and not never) else b" ") for i, p in enumerate(pieces)]
        elif t == "ByteLevel":
            buf = b""
            for p in pieces:
                s = p.decode("utf-8")
                if all(ch in CHAR_BYTES for ch in s):
                    buf += bytes(CHAR_BYTES[ch] for ch in s)
                else:
                    buf += p
            pieces = [buf.decode("utf-8", "replace").encode() if lossy else buf]
        else:
            raise SystemExit(f"decoder step {t} not modelled")
    return b"".join(pieces)


def flatten_decoder(d):
    if d is None:
        return None
    if d["type"] == "Sequence":
        out = []
        for x in d["decoders"]:
            out += flatten_decoder(x)
        return out
    return [d]


def model_decode(tj, ids, skip, lossy):
    """tj: the tokenizer.json dict; the library's TokenizerImpl::decode, written out."""
    vocab_r = {i: s for s, i in tj["model"]["vocab"].items()}
    added = {}
    special = set()
    for a in tj["added_tokens"]:
        added[a["id"]] = a.get("_decode_as", a["content"])
        if a["special"]:
            special.add(a["content"])
    steps = flatten_decoder(tj["decoder"])
    toks = []
    for i in ids:
        s = added.get(i, vocab_r.get(i))
        assert s is not None, f"id {i} has no token"
        if skip and s in special:
            continue
        toks.append(s.encode())
    if steps is None:
        return b" ".join(toks)
    return decode_chain(steps, toks, lossy)


# ---------------------------------------------------------------------------------------------

def train_bytelevel():
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(vocab_size=700, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False)
                            for s in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]])
    tok.add_tokens([AddedToken("<think>", special=False, normalized=False),
                    AddedToken("</think>", special=False, normalized=False),
                    AddedToken("\n\n", special=False, normalized=False),
                    AddedToken("café", special=False, normalized=True)])
    return tok


def train_sp(texts=None, vocab_size=500, **trainer_kw):
    """Returns (vocab, merges) of a SentencePiece-style BPE with byte fallback (also used by
    make_encode_fixtures.py): <unk> <s> </s>, then <0x00>..<0xFF>, then the trained pieces."""
    tmp = Tokenizer(models.BPE(unk_token="<unk>"))
    tmp.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    if texts is None:  # Latin, Greek and Cyrillic letters only: CJK and emoji fall back to <0xNN> byte tokens.
        texts = [t for t in CORPUS if not any(ord(c) >= 0x3000 for c in t)]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  special_tokens=[], **trainer_kw)
    tmp.train_from_iterator(texts, trainer)
    m = json.loads(tmp.to_str())["model"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for s, _ in sorted(m["vocab"].items(), key=lambda kv: kv[1]):
        if s not in vocab:
            vocab[s] = len(vocab)
    merges = [tuple(x) if isinstance(x, list) else tuple(x.split(" ")) for x in m["merges"]]
    return vocab, merges


def build_sp(vocab, merges, variant):
    tok = Tokenizer(models.BPE(vocab=dict(vocab), merges=list(merges), unk_token="<unk>",
                               byte_fallback=True, fuse_unk=True))
    llama2_decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                        decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    if variant == "sp":
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
        tok.decoder = llama2_decoder
    elif variant == "sp_legacy":
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        tok.decoder = llama2_decoder
    elif variant == "metaspace":
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in ["<unk>", "<s>", "</s>"]])
    if variant == "sp_legacy":
        tok.add_tokens([AddedToken("<pad>", special=False, normalized=True)])
        tok.add_special_tokens([AddedToken("<|user|>", special=True, normalized=True)])
    return tok


def b64(b: bytes) -> str:
    return base64.b64encode(b).decode("ascii")


def utf8_ok(b: bytes) -> bool:
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def make_cases(name, tok, tj, rng):
    size = max(tok.get_vocab(with_added_tokens=True).values()) + 1
    added_ids = sorted(tok.get_added_tokens_decoder().keys())
    seqs = []
    seqs.append([])
    seqs.append(added_ids[:1])
    seqs.append(added_ids)
    for t in TEXTS:
        seqs.append(tok.encode(t, add_special_tokens=False).ids)
    # Prefixes / slices of encodings of multi-byte text: characters split across tokens.
    for t in [TEXTS[2], TEXTS[3], TEXTS[4], TEXTS[12], TEXTS[7]]:
        ids = tok.encode(t, add_special_tokens=False).ids
        for _ in range(3):
            a = rng.randrange(0, len(ids))
            b = rng.randrange(a + 1, len(ids) + 1)
            seqs.append(ids[a:b])
    # Random ids over the whole range, and random ids mixed with the added tokens.
    for k in range(14):
        n = rng.randrange(1, 24)
        seq = [rng.randrange(0, size) for _ in range(n)]
        if k % 2:
            for _ in range(rng.randrange(1, 4)):
                seq.insert(rng.randrange(0, len(seq) + 1), rng.choice(added_ids))
        seqs.append(seq)
    cases = []
    invalid = 0
    for ids in seqs:
        case = {"ids": ids}
        for key, skip in (("", False), ("_skip", True)):
            lib = tok.decode(ids, skip_special_tokens=skip).encode("utf-8")
            raw = model_decode(tj, ids, skip, lossy=False)
            lossy = model_decode(tj, ids, skip, lossy=True)
            assert lossy == lib, f"{name} {ids} skip={skip}: model {lossy!r} != library {lib!r}"
            if utf8_ok(raw):
                assert raw == lib, f"{name} {ids}: valid raw differs from the library"
            case["text" + key + "_b64"] = b64(lib)
            case["raw" + key + "_b64"] = b64(raw)
        case["valid"] = utf8_ok(base64.b64decode(case["raw_b64"])) and utf8_ok(base64.b64decode(case["raw_skip_b64"]))
        invalid += not case["valid"]
        cases.append(case)
    print(f"{name}: size {size}, {len(cases)} sequences, {invalid} with invalid UTF-8 bytes")
    return {"size": size, "cases": cases}


def save(tok, sub):
    d = os.path.join(HERE, sub)
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "tokenizer.json")
    tok.save(path, pretty=True)
    with open(path, encoding="utf-8") as f:
        tj = json.load(f)
    # Normalized added tokens decode in their normalized form (AddedVocabulary.normalized_cache).
    for a in tj["added_tokens"]:
        if a["normalized"] and tok.normalizer is not None:
            a["_decode_as"] = tok.normalizer.normalize_str(a["content"])
    print(f"{path}: {os.path.getsize(path)} bytes")
    return tj


def main():
    rng = random.Random(1234)
    expected = {"library": "tokenizers", "tokenizers": {}}
    import tokenizers
    expected["library_version"] = tokenizers.__version__

    bl = train_bytelevel()
    tj = save(bl, "bytelevel")
    expected["tokenizers"]["bytelevel"] = make_cases("bytelevel", bl, tj, rng)

    vocab, merges = train_sp()
    for variant in ("sp", "sp_legacy", "metaspace"):
        tok = build_sp(vocab, merges, variant)
        tj = save(tok, variant)
        expected["tokenizers"][variant] = make_cases(variant, tok, tj, rng)

    path = os.path.join(HERE, "expected.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(expected, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"{path}: {os.path.getsize(path)} bytes")


if __name__ == "__main__":
    main()
