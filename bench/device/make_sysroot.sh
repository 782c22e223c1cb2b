#!/bin/sh
# make_sysroot.sh — run HERE (a Debian bookworm amd64 machine with apt and network), not on the
# device machine: downloads the Debian packages twinkle's build needs that a bare CUDA image may
# lack (pkg-config, OpenBLAS, cJSON, SQLite, protobuf-c, libuv, http-parser, and for the Vulkan
# backend glslc and the Vulkan loader; for the OpenCL backend its headers, the ICD loader and
# CLBlast — the NVIDIA driver brings the OpenCL ICD itself), unpacks them (no install, no root needed) and packs the
# headers, shared libraries, pkg-config files and tools into bench/device/sysroot.tar.gz (~20 MB),
# which run.sh unpacks into a private prefix when the device machine lacks any of them.
# Carry it with the device run: run(command="bench/device/run.sh", carry=["bench/device/sysroot.tar.gz"]).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
pkgs="pkgconf pkgconf-bin libpkgconf3
libopenblas-dev libopenblas-pthread-dev libopenblas0 libopenblas0-pthread libgfortran5 libquadmath0
libcjson-dev libcjson1 libsqlite3-dev libsqlite3-0
protobuf-c-compiler libprotoc32 libprotobuf32 libprotobuf-c-dev libprotobuf-c1
libuv1-dev libuv1 libhttp-parser-dev libhttp-parser2.9
glslc libshaderc1 libvulkan-dev libvulkan1
opencl-c-headers opencl-clhpp-headers ocl-icd-opencl-dev ocl-icd-libopencl1 libclblast-dev libclblast1"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/debs" "$tmp/root"
# apt-get download resolves each name to the archive's current version for this architecture
(cd "$tmp/debs" && apt-get -q download $pkgs)
for d in "$tmp"/debs/*.deb; do dpkg-deb -x "$d" "$tmp/root"; done
# what a build does not read: static archives, LAPACK, documentation, manual pages
find "$tmp/root" \( -name '*.a' -o -name 'liblapack*' \) -delete
rm -rf "$tmp/root/usr/share/doc" "$tmp/root/usr/share/man" "$tmp/root/usr/share/lintian" "$tmp/root/usr/share/bug"
ls "$tmp/debs" > "$tmp/root/PACKAGES"
tar -C "$tmp/root" -czf "$here/sysroot.tar.gz" .
echo "wrote $here/sysroot.tar.gz ($(du -h "$here/sysroot.tar.gz" | cut -f1)) from $(ls "$tmp/debs" | wc -l) packages"
