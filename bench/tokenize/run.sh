#!/bin/sh
# bench/tokenize: twinkle's tokenizer encode against the `tokenizers` library, one thread each,
# same corpus (tests/tokenizer/corpus.bin.gz, 1.2 MB), record by record, add_special on, for every
# fixture tokenizer; both sides check their ids against the library's expected ids. Prints MB/s
# (thread CPU time, and wall time) and twinkle / tokenizers. See bench/README.md.
#
#   bench/tokenize/run.sh                 # ~1 minute
#   REPS=1 bench/tokenize/run.sh gpt2     # one fixture, one pass
#
# Environment:
#   TWK_PEER_PYTHON  a Python with `tokenizers` (pip install -r tests/tokenizer/requirements.txt;
#                    default /work/venv-tok/bin/python when it exists, else python3); without
#                    one, twinkle's figures only
#   REPS (3)         passes per fixture; the best counts
# Exits 1 when a side's ids differ from the library's expected ids.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"
bin=build/bench/bench_tokenize
if [ ! -x "$bin" ]; then
    [ -f build/Makefile ] || cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
    make -C build -j2 bench_tokenize >/dev/null
fi
peer=${TWK_PEER_PYTHON:-}
if [ -z "$peer" ]; then
    if [ -x /work/venv-tok/bin/python ]; then peer=/work/venv-tok/bin/python; else peer=python3; fi
fi
if ! "$peer" -c 'import tokenizers' 2>/dev/null; then
    echo "bench/tokenize: $peer cannot import tokenizers; twinkle only" >&2
    peer=
fi
REPS=${REPS:-3}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/twk-bench-tok.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM

"$bin" --reps "$REPS" "$@" | tee "$tmp/twk.txt"
if [ -n "$peer" ]; then
    RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false "$peer" "$here/peer.py" --reps "$REPS" "$@" | tee "$tmp/peer.txt"
    "$peer" - "$tmp/twk.txt" "$tmp/peer.txt" <<'PY'
import sys
def pairs(path, tag):
    line = [l for l in open(path) if l.startswith(tag)][-1]
    return {k: tuple(map(float, v.split(":"))) for k, v in (x.split("=") for x in line.split()[1:])}
t, p = pairs(sys.argv[1], "SUMMARY"), pairs(sys.argv[2], "PEER")
print()
print("| fixture | twinkle MB/s (cpu) | tokenizers MB/s (cpu) | ratio (cpu) | ratio (wall) |")
print("|---|---|---|---|---|")
for k in t:
    if k in p:
        print(f"| {k} | {t[k][0]:.2f} | {p[k][0]:.2f} | {t[k][0] / p[k][0]:.2f}x | {t[k][1] / p[k][1]:.2f}x |")
PY
fi
