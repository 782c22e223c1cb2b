#!/bin/sh
# The OpenCL program-binary cache: a first open writes one entry under
# $TWK_CACHE_DIR/opencl; a corrupted or truncated entry is rebuilt from source
# and rewritten (the run still passes); no temporary files are left behind.
# usage: opencl_cache.sh TWINKLE_BIN TEST_OPS_BIN
set -eu
TWINKLE=$1
OPS=$2
if ! "$TWINKLE" devices | grep -q "^opencl:0 "; then
    echo "FAIL no opencl device: $("$TWINKLE" devices | grep opencl)"
    exit 1
fi
DIR=$(mktemp -d /tmp/twk_ocl_cache.XXXXXX)
trap 'rm -rf "$DIR"' EXIT
fail() { echo "FAIL $*"; exit 1; }
run() { TWK_CACHE_DIR="$DIR" TWK_TEST_DEVICE=opencl "$OPS" silu > "$DIR/log" 2>&1 || { cat "$DIR/log"; fail "$1"; }; }

run "the first run"
n=$(ls "$DIR/opencl" | wc -l)
[ "$n" -eq 1 ] || fail "want one cache entry, found $n: $(ls "$DIR/opencl")"
entry=$(ls "$DIR/opencl"/*.bin)
size=$(wc -c < "$entry")
echo "ok   first open wrote $(basename "$entry") ($size bytes)"

printf 'not a program binary' | dd of="$entry" bs=1 seek=40 conv=notrunc 2>/dev/null
cp "$entry" "$DIR/corrupt"
run "the run after corrupting the entry"
cmp -s "$entry" "$DIR/corrupt" && fail "the corrupted entry was not rewritten"
echo "ok   a corrupted entry is rebuilt from source and rewritten ($(wc -c < "$entry") bytes)"

head -c 10 "$DIR/corrupt" > "$entry"
run "the run after truncating the entry"
[ "$(wc -c < "$entry")" -gt 10 ] || fail "the truncated entry was not rewritten"
echo "ok   a truncated entry is rebuilt and rewritten"

left=$(ls "$DIR/opencl" | grep -c tmp || true)
[ "$left" -eq 0 ] || fail "temporary files left: $(ls "$DIR/opencl")"
[ "$(ls "$DIR/opencl" | wc -l)" -eq 1 ] || fail "more than one entry for one source and device"
echo "ok   one entry, no temporary files left"
