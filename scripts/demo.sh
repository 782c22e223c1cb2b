#!/bin/sh
# The main job: start `twinkle serve` on the built-in default model, run the
# bundled example client (the official Tinker SDK, unchanged) that LoRA-trains
# the model to count, print its loss per step, save a checkpoint, and stop the
# service. Needs a built tree (make build) and PyPI for the SDK on first run.
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
VENV=${TWK_SDK_VENV:-$BUILD/venv-sdk}
DATA=${TWK_DEMO_DATA:-$BUILD/demo-data}

if [ ! -x "$VENV/bin/python" ]; then
    echo "demo: creating $VENV with the tinker SDK (first run only)"
    /usr/bin/python3 -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "import tinker" 2>/dev/null; then
    "$VENV/bin/pip" install -q --disable-pip-version-check -r examples/requirements.txt
fi

PORTFILE=$(mktemp)
"$BUILD/twinkle" serve --port 0 --data-dir "$DATA" > "$PORTFILE" &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true; rm -f "$PORTFILE"' EXIT INT TERM
PORT=""
for _ in $(seq 1 200); do
    PORT=$(sed -n 's/^port \([0-9]*\)$/\1/p' "$PORTFILE")
    [ -n "$PORT" ] && break
    kill -0 $SERVER 2>/dev/null || { echo "demo: the server did not start" >&2; exit 1; }
    sleep 0.1
done
[ -n "$PORT" ] || { echo "demo: the server did not report its port" >&2; exit 1; }

TINKER_API_KEY=tml-demo "$VENV/bin/python" examples/tinker_lora_demo.py --base-url "http://127.0.0.1:$PORT"
status=$?
kill $SERVER
wait $SERVER 2>/dev/null || true
trap - EXIT INT TERM
rm -f "$PORTFILE"
exit $status
