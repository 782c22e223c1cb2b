#!/usr/bin/env python3
"""The `tokenizers` side of bench/tokenize/run.sh: Tokenizer.encode(text, add_special_tokens=True)
record by record over tests/tokenizer/corpus.bin.gz (each record's bytes decoded with
errors="replace", as twinkle's encode does), on one thread (RAYON_NUM_THREADS=1,
TOKENIZERS_PARALLELISM=false, and no encode_batch). Best of --reps passes, timed in thread CPU
time and wall time; the ids are checked against the fixture's expected_ids.bin.gz.

    python bench/tokenize/peer.py [--reps N] [fixture ...]
Prints `PEER name=cpu_MB/s:wall_MB/s ...`."""
import argparse
import gzip
import os
import struct
import sys
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
from tokenizers import Tokenizer  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DIR = os.path.join(ROOT, "tests", "tokenizer")


def records():
    b = gzip.open(os.path.join(DIR, "corpus.bin.gz")).read()
    assert b[:8] == b"TWKCORP1"
    n, at, out = struct.unpack_from("<I", b, 8)[0], 12, []
    for _ in range(n):
        ln = struct.unpack_from("<I", b, at)[0]
        out.append(b[at + 4:at + 4 + ln])
        at += 4 + ln
    return out


def expected(name, n):
    b = gzip.open(os.path.join(DIR, name, "expected_ids.bin.gz")).read()
    at, out = 12, []

    def leb():
        nonlocal at
        v = s = 0
        while True:
            x = b[at]
            at += 1
            v |= (x & 0x7F) << s
            s += 7
            if not x & 0x80:
                return v
    for _ in range(n):
        at += 1
        k = leb()
        out.append([leb() for _ in range(k)])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("names", nargs="*")
    a = ap.parse_args()
    names = a.names or ["bytelevel", "sp", "sp_legacy", "metaspace", "gpt2", "llama3", "qwen2", "llama2", "mistral",
                        "nfkc"]
    recs = records()
    size = sum(len(r) for r in recs)
    texts = [r.decode("utf-8", "replace") for r in recs]
    out = []
    for name in names:
        tok = Tokenizer.from_file(os.path.join(DIR, name, "tokenizer.json"))
        want = expected(name, len(texts))
        best_cpu = best_wall = 1e30
        for _ in range(a.reps):
            c0, w0 = time.thread_time(), time.perf_counter()
            got = [tok.encode(t, add_special_tokens=True).ids for t in texts]
            best_cpu = min(best_cpu, time.thread_time() - c0)
            best_wall = min(best_wall, time.perf_counter() - w0)
            if got != want:
                print(f"{name}: ids differ from expected_ids.bin.gz", file=sys.stderr)
                return 1
        print(f"{name:10s} {size / best_cpu / 1e6:8.2f} MB/s cpu {size / best_wall / 1e6:8.2f} MB/s wall", flush=True)
        out.append(f"{name}={size / best_cpu / 1e6:.3f}:{size / best_wall / 1e6:.3f}")
    print("PEER " + " ".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
