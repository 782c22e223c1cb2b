#!/bin/sh
# Installs every Debian package twinkle needs to build, test and benchmark.
# The one place that lists them. Idempotent and quiet: packages already
# present are skipped, and apt runs only when something is missing.
set -eu

PACKAGES="
build-essential
clang
libclang-rt-dev
cmake
pkg-config
libopenblas-dev
libopenblas0-pthread
libcjson-dev
zlib1g-dev
libuv1-dev
libhttp-parser-dev
libprotobuf-c-dev
protobuf-c-compiler
libsqlite3-dev
libcurl4-openssl-dev
mpich
libmpich-dev
python3-venv
python3-torch
ocl-icd-opencl-dev
opencl-c-headers
pocl-opencl-icd
libclblast-dev
clinfo
libvulkan-dev
glslc
mesa-vulkan-drivers
vulkan-tools
chromium
"

missing=""
for p in $PACKAGES; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing="$missing $p"
    fi
done

if [ -z "$missing" ]; then
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "install-deps: missing packages:$missing" >&2
    echo "install-deps: run as root (or: sudo $0)" >&2
    exit 1
fi

export DEBIAN_FRONTEND=noninteractive DEBCONF_NOWARNINGS=yes
echo "install-deps: installing$missing"
apt-get update -qq >/dev/null
# shellcheck disable=SC2086
apt-get install -y -qq --no-install-recommends $missing >/dev/null
