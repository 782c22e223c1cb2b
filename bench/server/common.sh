# Sourced by bench/server/run.sh and widths.sh: the SDK's python and the binaries they need.
# bench_setup BENCH_TARGET...: sets PY (TWK_SDK_PYTHON, else $BUILD/venv-sdk/bin/python, else python3),
# exits 2 when it cannot import tinker, and builds twinkle and the given bench targets when missing.
bench_setup() {
    PY=${TWK_SDK_PYTHON:-}
    if [ -z "$PY" ]; then
        if [ -x "$BUILD/venv-sdk/bin/python" ]; then PY=$BUILD/venv-sdk/bin/python; else PY=python3; fi
    fi
    if ! "$PY" -c "import tinker" 2>/dev/null; then
        echo "bench/server: $PY cannot import tinker; set TWK_SDK_PYTHON to a python with tinker 0.38.0" \
             "(make demo creates $BUILD/venv-sdk)" >&2
        exit 2
    fi
    missing=""
    for t in "$@"; do [ -x "$BUILD/bench/$t" ] || missing=1; done
    if [ ! -x "$BUILD/twinkle" ] || [ -n "$missing" ]; then
        cmake -S . -B "$BUILD" >/dev/null
        make -C "$BUILD" -j2 twinkle_cli "$@" >/dev/null
    fi
}
