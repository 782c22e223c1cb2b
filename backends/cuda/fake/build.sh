#!/bin/sh
# build.sh OUTDIR [extra cc flags, e.g. -fsanitize=address,undefined]
# Builds the fake driver: OUTDIR/libcuda.so.1 and the link OUTDIR/libcublas.so.13 to it.
# Use: LD_LIBRARY_PATH=OUTDIR TWK_TEST_DEVICE=cuda build-cuda/tests/test_ops
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=$1
shift
cuda_inc=${CUDA_HOME:-/usr/local/cuda}/include
mkdir -p "$out"
python3 "$here/gen_kernels.py" "$here/../../kernels" "$out/fake_kernels.c"
${CC:-cc} -std=c11 -O1 -g -fPIC -shared -Wall -Wextra -Werror -Wno-unused-function -Wno-unused-parameter "$@" \
    -I"$cuda_inc" -I"$here" -Wl,-soname,libcuda.so.1 "$here/fake_cuda.c" "$out/fake_kernels.c" -o "$out/libcuda.so.1"
ln -sf libcuda.so.1 "$out/libcublas.so.13"
echo "fake CUDA driver in $out (LD_LIBRARY_PATH=$out)"
