#!/bin/sh
# tinker-cookbook 0.6.1's supervised and RL loops, offline, against `twinkle serve`
# (tests/sdk/test_cookbook.py). Installs the cookbook into the SDK venv without its
# dependencies plus exactly the packages the two loops import (requirements.txt here),
# then runs the test through tests/sdk/run.sh (same environment variables).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
TWK_SDK_EXTRA_REQUIREMENTS="$here/requirements.txt" exec sh "$here/../sdk/run.sh" tests/sdk/test_cookbook.py "$@"
