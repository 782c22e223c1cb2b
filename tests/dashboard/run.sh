#!/bin/sh
# ctest `dashboard`: the runs dashboard in headless Chromium (tests/dashboard/test_dashboard.py,
# through tests/sdk/run.sh and its SDK venv). Exits 77 (ctest: Skipped) with a message when
# Chromium is not installed; scripts/install-deps.sh installs it, so CI runs the test.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
if [ -z "${TWK_CHROMIUM:-}" ] && ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then
    echo "dashboard: SKIPPED: chromium is not installed (apt-get install chromium, or sh scripts/install-deps.sh)" >&2
    exit 77
fi
exec sh "$here/../sdk/run.sh" "$here/test_dashboard.py" -s "$@"
