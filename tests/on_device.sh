#!/bin/sh
# Runs a test program on one device: on_device.sh TWINKLE_BIN SPEC PROGRAM [ARGS...]
# Exits 77 (ctest's skip code where the test asks for it) when `twinkle devices`
# lists no device SPEC, else runs PROGRAM with TWK_TEST_DEVICE=SPEC.
set -eu
twinkle=$1 spec=$2
shift 2
if ! "$twinkle" devices | grep -q "^$spec:0 "; then
    echo "skip: no $spec device here ($("$twinkle" devices | grep "^$spec" || echo "$spec not built"))"
    exit 77
fi
TWK_TEST_DEVICE=$spec exec "$@"
