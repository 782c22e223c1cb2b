#!/bin/sh
# examples/embed against the INSTALLED library only: installs the build tree into a temporary
# prefix, copies the example out of the source tree, builds it with pkg-config from that prefix and
# runs it (LoRA loss must fall below a tenth, the greedy sample must continue the cycle). Also: the
# shared library exports nothing but the public API, and the headers compile as C++.
# usage: embed.sh BUILD_DIR EXAMPLE_DIR [extra CFLAGS/LDFLAGS, e.g. the sanitizer's]
set -eu
build=$1 example=$2 extra=${3:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
# the shared library exports the public API only (TWK_API; the backend interface stays hidden)
so=$(find "$tmp/prefix" -name 'libtwinkle.so' | head -n 1)
leaked=$(nm -D --defined-only "$so" | awk '$3 !~ /^twk_/ || $3 ~ /^twk_(backend_register|backend_unregister|cpu_backend|device_backend|device_ctx|launch_dtypes_ok)$/ {print $3}')
if [ -n "$leaked" ]; then echo "FAIL libtwinkle.so exports non-public symbols: $leaked"; exit 1; fi
# and every function the installed headers declare (a header without TWK_API_BEGIN/END would be hidden)
inc=$(dirname "$(find "$tmp/prefix" -name twinkle.h)")
exported=$(nm -D --defined-only "$so" | awk '{print $3}')
inline=$(grep -h 'static inline' "$inc"/*.h | grep -o 'twk_[a-z0-9_]*(' | tr -d '(' | sort -u)
for f in $(grep -ho 'twk_[a-z0-9_]*(' "$inc"/*.h | tr -d '(' | sort -u); do
    if ! echo "$inline" | grep -qx "$f" && ! echo "$exported" | grep -qx "$f"; then
        echo "FAIL libtwinkle.so does not export $f, declared in $(grep -l "$f(" "$inc"/*.h | xargs -n1 basename | tr '\n' ' ')"
        exit 1
    fi
done
echo "libtwinkle.so exports $(echo "$exported" | wc -l) symbols: every function the headers declare, nothing else"
cp "$example/embed.c" "$example/Makefile" "$tmp/"
pcdir=$(dirname "$(find "$tmp/prefix" -name twinkle.pc)")
cflags=$(PKG_CONFIG_PATH=$pcdir pkg-config --cflags twinkle)
case "$cflags" in *"$(cd "$example/../.." && pwd)"*) echo "FAIL pkg-config points into the source tree: $cflags"; exit 1;; esac
PKG_CONFIG_PATH=$pcdir make -s -C "$tmp" CFLAGS="-O2 $extra" LDFLAGS="$extra"
echo "built against $(PKG_CONFIG_PATH=$pcdir pkg-config --modversion twinkle) in $pcdir:"
ldd "$tmp/embed" | grep twinkle
"$tmp/embed"
# the public headers also compile as C++ (extern "C", no C-only constructs) and link by C names
if command -v c++ >/dev/null 2>&1; then
    printf '#include <twinkle/twinkle.h>\nint main() { return twk_api_version() == TWK_API_VERSION ? 0 : 1; }\n' >"$tmp/cpp.cc"
    c++ -std=c++17 -Wall -Wextra -Werror $cflags $extra "$tmp/cpp.cc" -o "$tmp/cpp" \
        -Wl,-rpath,"$(PKG_CONFIG_PATH=$pcdir pkg-config --variable=libdir twinkle)" $(PKG_CONFIG_PATH=$pcdir pkg-config --libs twinkle)
    "$tmp/cpp" && echo "ok: the public headers compile and link as C++"
fi
