#!/bin/sh
# Runs one libFuzzer harness for SECONDS from its seed corpus (read only) with its
# dictionary; new inputs and crash artifacts go to WORK. Exits non-zero on a crash,
# a sanitizer report, a leak or a hang (libFuzzer's own status).
#   sh run_one.sh BINARY FUZZ_DIR NAME WORK SECONDS
set -eu
bin=$1 src=$2 name=$3 work=$4 secs=$5
mkdir -p "$work/corpus" "$work/artifacts"
set -- -max_total_time="$secs" -timeout=20 -rss_limit_mb=3072 -print_final_stats=1 -artifact_prefix="$work/artifacts/"
if [ -f "$src/dict/$name.dict" ]; then set -- "$@" -dict="$src/dict/$name.dict"; fi
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
exec "$bin" "$@" "$work/corpus" "$src/corpus/$name"
