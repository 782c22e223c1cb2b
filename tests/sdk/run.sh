#!/bin/sh
# Runs the Tinker SDK compatibility suite (tests/sdk) against `twinkle serve`.
#
#   sh tests/sdk/run.sh [pytest args...]
#   sh tests/sdk/run.sh --setup-only     # only create / update the venv (ctest's sdk_venv fixture)
#
# Environment:
#   TWINKLE_BIN    the twinkle binary (default build/twinkle, relative to the repo root)
#   TWK_SDK_VENV   the virtual environment to create/use (default build/venv-sdk)
#   TWK_PYTHON     the Python that creates the venv (default /usr/bin/python3, >= 3.11)
#   TWK_SDK_EXTRA_REQUIREMENTS  a requirements file also installed, with --no-deps (tests/cookbook/run.sh)
# Exits with pytest's status.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)

# a relative TWINKLE_BIN given by the caller is relative to the caller's cwd
if [ -n "${TWINKLE_BIN:-}" ]; then
    case "$TWINKLE_BIN" in
    /*) ;;
    *) if [ -e "$TWINKLE_BIN" ]; then TWINKLE_BIN="$(pwd)/$TWINKLE_BIN"; fi ;;
    esac
fi
cd "$root"
TWINKLE_BIN=${TWINKLE_BIN:-build/twinkle}
export TWINKLE_BIN

venv=${TWK_SDK_VENV:-build/venv-sdk}
python=${TWK_PYTHON:-/usr/bin/python3}
req=tests/sdk/requirements.txt

# --system-site-packages: torch for forward_backward_custom comes from Debian (python3-torch,
# installed by scripts/install-deps.sh); PyPI's wheel would pull gigabytes of CUDA libraries
if [ -x "$venv/bin/python" ] && ! grep -q "include-system-site-packages = true" "$venv/pyvenv.cfg"; then
    echo "tests/sdk: recreating $venv with system site packages" >&2
    rm -rf "$venv"
fi
if [ ! -x "$venv/bin/python" ]; then
    echo "tests/sdk: creating $venv" >&2
    mkdir -p "$(dirname "$venv")"
    "$python" -m venv --system-site-packages "$venv"
fi
# install only when requirements.txt changed since the last successful install
stamp="$venv/.twinkle-sdk-requirements"
if ! cmp -s "$req" "$stamp" 2>/dev/null; then
    "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$req"
    cp "$req" "$stamp"
fi

# extra requirements installed without their dependencies (tests/cookbook/run.sh: the cookbook)
extra=${TWK_SDK_EXTRA_REQUIREMENTS:-}
if [ -n "$extra" ]; then
    estamp="$venv/.twinkle-extra-$(basename "$(dirname "$extra")")"
    if ! cmp -s "$extra" "$estamp" 2>/dev/null; then
        "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps -r "$extra"
        cp "$extra" "$estamp"
    fi
fi

if [ "${1:-}" = "--setup-only" ]; then
    echo "tests/sdk: $venv is ready"
    exit 0
fi

if [ ! -x "$TWINKLE_BIN" ]; then
    echo "tests/sdk: $TWINKLE_BIN is missing: build it (make -C build twinkle) or set TWINKLE_BIN" >&2
    exit 2
fi

# the whole suite unless the arguments name test files or folders
target=tests/sdk
for a in "$@"; do
    case "$a" in
    -*) ;; # options, --ignore=tests/sdk/x.py too
    tests/sdk*|*.py|*.py::*) target= ;;
    esac
done
export PYTHONDONTWRITEBYTECODE=1
set +e
"$venv/bin/python" -m pytest -q --tb=short -p no:cacheprovider $target "$@"
exit $?
