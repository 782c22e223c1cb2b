#!/usr/bin/env python3
"""Build the encoding corpus, the extra fixture tokenizers and the expected ids for
tests/test_tokenizer.c (encode of Hugging Face tokenizer.json) and bench/tokenize.

    python3 -m venv /tmp/venv-tok && /tmp/venv-tok/bin/pip install -r tests/tokenizer/requirements.txt
    /tmp/venv-tok/bin/python tests/tokenizer/make_encode_fixtures.py

Run make_fixtures.py first (it writes the four decode fixtures this script also encodes with).
Deterministic (seeded): running it again rewrites identical files. Writes, next to this script:

  corpus.bin.gz     ~1.2 MB of text in records: b"TWKCORP1", u32 count, then per record u32 length
                    and its bytes (little endian). Prose in English, French, German, Spanish,
                    Russian, Greek, Arabic, Hindi, Thai, Chinese, Japanese and Korean (sentences
                    written here, recombined at random), code, numbers, contractions, whitespace
                    runs (tabs, CR/LF, Unicode spaces), control characters, emoji (ZWJ sequences,
                    flags, skin tones, VS16), combining and compatibility characters (NFC/NFKC
                    cases), random assigned code points, special tokens inside text, and
                    invalid UTF-8 (lone continuation bytes, overlongs, surrogates, truncated
                    sequences, 0xFF).
  <name>/tokenizer.json for gpt2, llama3, qwen2, llama2, mistral, nfkc (below).
  <name>/expected_ids.bin.gz for every fixture (these six, bytelevel, sp, sp_legacy, metaspace
                    and the three CONFIG_FIXTURES below): b"TWKIDS01", u32 count, then per record a flags byte (bit 0: the
                    library's decode(encode(text, add_special_tokens=False)) == text) and the
                    ids of tokenizer.encode(text, add_special_tokens=True) as a LEB128 count
                    followed by LEB128 ids.

Invalid UTF-8: a Python str cannot hold it, so the reference is the library's encode of
bytes.decode("utf-8", "replace") (one U+FFFD per maximal ill-formed subpart); twinkle's
encode takes bytes and does the same replacement.

The fixtures (vocab 1000-3000, trained here on the corpus):
  gpt2     ByteLevel pre-tokenizer with GPT-2's regex (use_regex), ByteLevel decoder and
           post-processor; <|endoftext|> special; "<mask>" lstrip, "[rs]" rstrip, "hello"
           single_word (the AddedToken flags).
  llama3   Llama 3's Split regex + ByteLevel(use_regex=false), ignore_merges, 256 special
           tokens, TemplateProcessing "<|begin_of_text|> $A" (add_bos).
  qwen2    Qwen2/Qwen3's: NFC, Qwen2's Split regex + ByteLevel, <|endoftext|> <|im_start|>
           <|im_end|> special, <think> </think> not special.
  llama2   SentencePiece-style BPE as Llama 2's tokenizer.json: normalizer Prepend("▁") +
           Replace(" ", "▁"), no pre-tokenizer, byte_fallback, fuse_unk, TemplateProcessing
           "<s> $A".
  mistral  The same model as transformers converts Mistral / Llama 2 (legacy=False): Metaspace
           (prepend_scheme "first", split false), TemplateProcessing "<s> $A </s>" (bos and eos).
  nfkc     NFKC normalizer, ByteLevel(add_prefix_space=true, use_regex=true).

And the tokenizer_config.json fixtures (CONFIG_FIXTURES), whose expected ids are transformers'
(4.57) AutoTokenizer.from_pretrained(folder)(text)["input_ids"] (add_special_tokens on): each folder
holds a tokenizer_config.json and a symbolic link tokenizer.json to another fixture's file.
  llama2_eos     llama2's tokenizer.json ("<s> $A"), class LlamaTokenizer, add_eos_token true, no
                 bos_token / eos_token (the class defaults "<s>" / "</s>"): "<s> $A </s>".
  mistral_nobos  mistral's ("<s> $A </s>"), class LlamaTokenizerFast, add_bos_token false, no
                 add_eos_token (its default, false), tokens as AddedToken objects: "$A".
  llama3_cfg     llama3's ("<|begin_of_text|> $A"), class PreTrainedTokenizerFast, add_bos_token
                 false and add_eos_token true, which that class ignores: the post-processor decides.
transformers 4.57 wants tokenizers <= 0.23.0 at import; it is installed without its dependencies
(see tests/tokenizer/README.md) and this script lets the import see 0.23.0: the ids come from
transformers' loading rules over the same tokenizers library as the other fixtures.

It also checks that the tables of train/unicode_data.c agree with the library's regex engine on
\\p{L}, \\p{N} and \\s for every code point (see train/unicode_gen.py).
"""

from __future__ import annotations

import gzip
import json
import os
import random
import re
import struct
import sys

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import train_sp  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")

PROSE = {
    "en": ["The quick brown fox jumps over the lazy dog.", "It's a truth universally acknowledged that we'll need more data.",
           "She said: \"I'd rather not, but THEY'RE waiting and I'M late.\"", "Training a model means predicting the next token.",
           "Rivers run to the sea, yet the sea is never full.", "Don't panic; keep a towel and your wits about you.",
           "In 1969, 600 million people watched the landing.", "What's the difference between 3.14 and 22/7?"],
    "fr": ["Le café est très chaud ; où est la bibliothèque ?", "Voilà, c'est déjà l'été à Montréal.",
           "L'œuvre d'art coûte 1 200 €, n'est-ce pas ?", "Ça me plaît beaucoup, merci à vous."],
    "de": ["Über den Wolken muss die Freiheit wohl grenzenlos sein.", "Schöne Grüße aus München, Straße 5.",
           "Die Größe des Maßbands ist ärgerlich falsch."],
    "es": ["El niño comió una piña el año pasado.", "¿Dónde está la estación? ¡Qué día tan bonito!",
           "La pingüina bebió agua en la cigüeña."],
    "ru": ["Привет, мир! Как дела?", "Москва — столица России, а Ёлки растут в лесу.",
           "Съешь же ещё этих мягких французских булок, да выпей чаю."],
    "el": ["Καλημέρα κόσμε· τι κάνεις;", "Η γλώσσα μου έδωσαν ελληνική."],
    "ar": ["مرحبا بالعالم، كيف حالك اليوم؟", "اللغة العربية جميلة جداً.", "١٢٣ + ٤٥٦ = ٥٧٩"],
    "hi": ["नमस्ते दुनिया, आप कैसे हैं?", "हिन्दी भाषा देवनागरी लिपि में लिखी जाती है।", "२०२४ में १० लाख लोग आए।"],
    "th": ["สวัสดีชาวโลก วันนี้อากาศดีมาก", "ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ"],
    "zh": ["我们今天学习机器学习。", "模型正在训练中，请稍等。你好，世界！", "北京是中国的首都，有三千多年的历史。"],
    "ja": ["東京は日本の首都です。今日はいい天気ですね。", "カタカナとひらがなと漢字を使います。"],
    "ko": ["안녕하세요, 세계! 오늘은 날씨가 좋네요.", "한국어는 한글로 씁니다."],
}
CODE = [
    "def decode(ids):\n    return ''.join(vocab[i] for i in ids)\n",
    "for (int i = 0; i < n; i++) {\n\tsum += a[i] * b[i];\n}\nreturn sum;\n",
    "{\"name\": \"twinkle\", \"version\": [1, 2, 3], \"ok\": true, \"pi\": 3.14159}",
    "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); return 0; }\n",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC;",
    "    if x == None:\n        raise ValueError(f\"bad {x!r}\")\n\n\n    else:\n        pass\n",
    "const f = (a, b) => a ?? b; // nullish\r\nlet s = `${a}-${b}`;",
    "$ ls -la /usr/bin | grep python3 && echo 'done' >> log.txt",
]
EMOJI = ["😀", "🚀", "🎉", "👍🏽", "❤️", "🇫🇷", "🇯🇵", "👩‍💻", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🤖", "✨", "🧑🏿‍🚀", "☺︎", "#️⃣", "🫠"]
SPACES = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "\t\t", "\u00a0", "\u3000", "\u2009", "\u200b",
          "          ", "\n\n\n\n", " \t \n"]
COMPAT = ["ﬁ", "ﬂ", "①", "Ａ", "ｂ", "１２３", "㎏", "½", "™", "ｶﾀｶﾅ", "Å", "Ω", "ǅ", "ẛ̣", "e\u0301", "a\u0308\u0301",
          "\u1100\u1161\u11a8", "가", "ḱ", "ṩ", "q\u0307\u0323", "ﾟ", "ℌ", "⁵", "₂", "…", "ﷺ", "\u0344", "\u0f73"]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<s>", "</s>", "<unk>", "<pad>",
            "<|user|>", "<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>", "<mask>",
            "[rs]", "hello", "café", "<|reserved_special_token_7|>"]
INVALID = [b"\x80", b"\xbf\xbf", b"\xc0\xaf", b"\xc3", b"\xe2\x82", b"\xed\xa0\x80", b"\xf0\x9f\x98", b"\xff",
           b"\xfe\xff", b"\xf4\x90\x80\x80", b"\xe0\x80\xaf", b"\xf8\x88\x80\x80\x80", b"\xc3\x28", b"\xa0\xa1"]


def assigned_chars(rng, n):
    """Random assigned code points from old blocks (stable across Unicode versions)."""
    import unicodedata
    out = []
    blocks = [(0xA0, 0x2FF), (0x370, 0x52F), (0x590, 0x6FF), (0x900, 0xDFF), (0x1E00, 0x1FFF), (0x2000, 0x2BFF),
              (0x3040, 0x30FF), (0x4E00, 0x9FA5), (0xAC00, 0xD7A3), (0xF900, 0xFAFF), (0xFB00, 0xFFEF), (0x1D400, 0x1D7FF),
              (0x1F300, 0x1F64F)]
    while len(out) < n:
        a, b = rng.choice(blocks)
        c = chr(rng.randint(a, b))
        if unicodedata.category(c) not in ("Cn", "Cs", "Co"):
            out.append(c)
    return "".join(out)


def make_record(rng) -> bytes:
    kind = rng.random()
    parts = []
    if kind < 0.45:  # prose in one or two languages
        langs = rng.sample(sorted(PROSE), rng.choice([1, 1, 2]))
        for _ in range(rng.randint(2, 12)):
            s = rng.choice(PROSE[rng.choice(langs)])
            if rng.random() < 0.3:
                w = s.split(" ")
                rng.shuffle(w)
                s = " ".join(w)
            parts.append(s)
            parts.append(rng.choice([" ", " ", " ", "\n", "  ", "\n\n"]))
    elif kind < 0.6:
        for _ in range(rng.randint(1, 4)):
            parts.append(rng.choice(CODE))
    else:  # mixtures of everything
        pool = [lambda: rng.choice(PROSE[rng.choice(sorted(PROSE))]), lambda: rng.choice(EMOJI) * rng.randint(1, 3),
                lambda: rng.choice(SPACES), lambda: rng.choice(COMPAT), lambda: rng.choice(SPECIALS),
                lambda: str(rng.randint(0, 10 ** rng.randint(1, 12))), lambda: chr(rng.choice(list(range(0, 32)) + [127])),
                lambda: assigned_chars(rng, rng.randint(1, 6)), lambda: rng.choice(CODE),
                lambda: rng.choice(["'s", "'T", "'re", "'VE", "'m", "'ll", "'D", "n't", "o'clock"])]
        for _ in range(rng.randint(3, 30)):
            parts.append(rng.choice(pool)())
    text = "".join(parts).encode("utf-8")
    if rng.random() < 0.08:  # invalid UTF-8 somewhere
        for _ in range(rng.randint(1, 3)):
            i = rng.randint(0, len(text))
            text = text[:i] + rng.choice(INVALID) + text[i:]
    if rng.random() < 0.03:  # a long run
        text += rng.choice([b" ", b"\n", b"a", "字".encode(), b"-"]) * rng.randint(50, 600)
    return text


def make_corpus(rng, target=1_200_000):
    recs, size = [b"", b" ", b"\n", "<s>".encode(), b"\xff", "  <|endoftext|>  ".encode()], 0
    while size < target:
        r = make_record(rng)
        recs.append(r)
        size += len(r)
    return recs


def write_gz(path, data: bytes):
    with open(path, "wb") as f:  # mtime 0 and no file name: the same bytes on every run
        with gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=0, compresslevel=9) as g:
            g.write(data)
    print(f"{os.path.relpath(path, ROOT)}: {os.path.getsize(path)} bytes ({len(data)} uncompressed)")


def leb(n, out):
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return


def texts_of(recs):
    return [r.decode("utf-8", "replace") for r in recs]


def train_bpe(texts, pre, norm=None, vocab_size=2000, **kw):
    tok = Tokenizer(models.BPE(**kw))
    tok.normalizer = norm
    tok.pre_tokenizer = pre
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), limit_alphabet=300)
    tok.train_from_iterator(texts, trainer)
    return tok


def bytelevel_tok(texts, split, norm, vocab_size, ignore_merges=False):
    pre = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
                                   pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok = train_bpe(texts, pre, norm, vocab_size)
    if ignore_merges:
        j = json.loads(tok.to_str())
        j["model"]["ignore_merges"] = True
        tok = Tokenizer.from_str(json.dumps(j))
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def sp_tok(texts, variant, vocab_size=2000):
    vocab, merges = train_sp(texts, vocab_size, limit_alphabet=150)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    if variant == "llama2":
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        single = "<s> $A"
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
        single = "<s> $A </s>"
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in ["<unk>", "<s>", "</s>"]])
    tok.post_processor = processors.TemplateProcessing(single=single, pair=single + " $B:1",
                                                       special_tokens=[("<s>", 1), ("</s>", 2)])
    return tok


def build(texts):
    toks = {}
    gpt2 = train_bpe(texts, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True), None, 3000)
    gpt2.decoder = decoders.ByteLevel()
    gpt2.post_processor = processors.ByteLevel(trim_offsets=True)
    gpt2.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=False),
                             AddedToken("<mask>", special=True, normalized=False, lstrip=True)])
    gpt2.add_tokens([AddedToken("[rs]", special=False, normalized=False, rstrip=True),
                     AddedToken("hello", special=False, normalized=False, single_word=True)])
    toks["gpt2"] = gpt2

    l3 = bytelevel_tok(texts, LLAMA3_SPLIT, None, 3000, ignore_merges=True)
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    specials += [f"<|reserved_special_token_{i}|>" for i in range(251)]
    l3.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    bos = l3.token_to_id("<|begin_of_text|>")
    l3.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
                                      special_tokens=[("<|begin_of_text|>", bos)])])
    toks["llama3"] = l3

    q2 = bytelevel_tok(texts, QWEN2_SPLIT, normalizers.NFC(), 3000)
    q2.add_special_tokens([AddedToken(s, special=True, normalized=False)
                           for s in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]])
    q2.add_tokens([AddedToken(s, special=False, normalized=False) for s in ["<think>", "</think>"]])
    toks["qwen2"] = q2

    toks["llama2"] = sp_tok(texts, "llama2")
    toks["mistral"] = sp_tok(texts, "mistral")

    nk = train_bpe(texts, pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True), normalizers.NFKC(), 1500)
    nk.decoder = decoders.ByteLevel()
    nk.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=False)])
    toks["nfkc"] = nk
    return toks


CONFIG_FIXTURES = {
    "llama2_eos": ("llama2", {"tokenizer_class": "LlamaTokenizer", "add_eos_token": True}),
    "mistral_nobos": ("mistral", {
        "tokenizer_class": "LlamaTokenizerFast", "add_bos_token": False,
        "bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": False, "normalized": False, "rstrip": False,
                      "single_word": False},
        "eos_token": {"__type": "AddedToken", "content": "</s>", "lstrip": False, "normalized": False, "rstrip": False,
                      "single_word": False},
        "unk_token": "<unk>"}),
    "llama3_cfg": ("llama3", {"tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": False,
                              "add_eos_token": True, "bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}),
}


def auto_tokenizer_class():
    """transformers' AutoTokenizer (4.x), imported past its tokenizers <= 0.23.0 check."""
    import importlib.metadata as md
    real = md.version
    md.version = lambda name: "0.23.0" if name == "tokenizers" else real(name)
    try:
        import transformers
        from transformers import AutoTokenizer
    finally:
        md.version = real
    assert transformers.__version__.startswith("4."), f"transformers {transformers.__version__}: want 4.x"
    print("transformers", transformers.__version__)
    transformers.logging.set_verbosity_error()
    return AutoTokenizer


def make_config_fixtures():
    for name, (base, cfg) in sorted(CONFIG_FIXTURES.items()):
        d = os.path.join(HERE, name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(cfg, f, indent=2)
            f.write("\n")
        link = os.path.join(d, "tokenizer.json")
        if os.path.lexists(link):
            os.remove(link)
        os.symlink(os.path.join("..", base, "tokenizer.json"), link)


def check_unicode_tables():
    """\\p{L}, \\p{N}, \\s of the library's regex engine against train/unicode_data.c's tables."""
    src = open(os.path.join(ROOT, "train", "unicode_data.c"), encoding="utf-8").read()
    ver = re.search(r'twk_uc_version\[\] = "([^"]+)"', src).group(1)
    def table(name):
        body = src[src.index(name + "["):]
        body = body[body.index("{") + 1:body.index("}")]
        return [int(x) for x in body.replace(",", " ").split()]
    index, blocks = table("twk_uc_block_index"), table("twk_uc_blocks")
    cat = [blocks[index[c >> 8] * 256 + (c & 255)] & 31 for c in range(0x110000)]
    s = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c < 0xE000)
    for name, neg, lo, hi in (("L", r"[^\p{L}]+", 1, 5), ("N", r"[^\p{N}]+", 9, 11)):
        got = set()
        for piece, _ in pre_tokenizers.Split(Regex(neg), behavior="removed").pre_tokenize_str(s):
            got.update(ord(c) for c in piece)
        want = {c for c in range(0x110000) if lo <= cat[c] <= hi and not 0xD800 <= c < 0xE000}
        assert got == want, f"\\p{{{name}}}: {len(got ^ want)} code points differ, e.g. {sorted(got ^ want)[:5]}"
    got = set()
    for piece, _ in pre_tokenizers.Split(Regex(r"[^\s]+"), behavior="removed").pre_tokenize_str(s):
        got.update(ord(c) for c in piece)
    ws = {9, 10, 11, 12, 13, 32, 0x85, 0xA0, 0x1680, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000} | set(range(0x2000, 0x200B))
    assert got == ws, f"\\s differs: {sorted(got ^ ws)}"
    print(f"unicode tables ({ver}) agree with the library's \\p{{L}}, \\p{{N}}, \\s on every code point")


def main():
    import tokenizers
    print("tokenizers", tokenizers.__version__)
    check_unicode_tables()
    rng = random.Random(20261201)
    recs = make_corpus(rng)
    body = bytearray(b"TWKCORP1" + struct.pack("<I", len(recs)))
    for r in recs:
        body += struct.pack("<I", len(r)) + r
    write_gz(os.path.join(HERE, "corpus.bin.gz"), bytes(body))
    texts = texts_of(recs)
    AutoTokenizer = auto_tokenizer_class()
    toks = {name: Tokenizer.from_file(os.path.join(HERE, name, "tokenizer.json"))
            for name in ("bytelevel", "sp", "sp_legacy", "metaspace")}
    for name, tok in build(texts[: len(texts) // 2]).items():
        d = os.path.join(HERE, name)
        os.makedirs(d, exist_ok=True)
        tok.save(os.path.join(d, "tokenizer.json"), pretty=True)
        print(f"{name}/tokenizer.json: {os.path.getsize(os.path.join(d, 'tokenizer.json'))} bytes")
        toks[name] = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    make_config_fixtures()
    hf = {name: AutoTokenizer.from_pretrained(os.path.join(HERE, name)) for name in CONFIG_FIXTURES}
    for name, tok in sorted(list(toks.items()) + list(hf.items())):
        lib = toks.get(name) or tok.backend_tokenizer
        out = bytearray(b"TWKIDS01" + struct.pack("<I", len(texts)))
        n_ids = n_rt = 0
        for t in texts:
            if name in hf:
                ids = tok(t)["input_ids"]  # add_special_tokens=True
            else:
                ids = tok.encode(t, add_special_tokens=True).ids
            rt = lib.decode(lib.encode(t, add_special_tokens=False).ids) == t
            out.append(1 if rt else 0)
            leb(len(ids), out)
            for i in ids:
                leb(i, out)
            n_ids += len(ids)
            n_rt += rt
        print(f"{name}: {n_ids} ids, {n_rt} of {len(texts)} records round-trip")
        write_gz(os.path.join(HERE, name, "expected_ids.bin.gz"), bytes(out))


if __name__ == "__main__":
    sys.exit(main())
