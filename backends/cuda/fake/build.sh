#!/bin/sh
# build.sh OUTDIR [extra g++ flags, e.g. -fsanitize=address,undefined]
# Builds the fake driver: OUTDIR/libcuda.so.1 and the link OUTDIR/libcublas.so.13 to it.
# Use: LD_LIBRARY_PATH=OUTDIR TWK_TEST_DEVICE=cuda build-cuda/tests/test_ops
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=$1
shift
cuda_inc=${CUDA_HOME:-/usr/local/cuda}/include
mkdir -p "$out"
python3 "$here/gen_kernels.py" "$here/../../kernels" "$out/fake_kernels.cpp"
${CXX:-g++} -std=c++17 -O1 -g -fPIC -shared -Wall -Wno-unused-function "$@" -I"$cuda_inc" -I"$here" \
    -Wl,-soname,libcuda.so.1 "$here/fake_cuda.cpp" "$out/fake_kernels.cpp" -o "$out/libcuda.so.1"
ln -sf libcuda.so.1 "$out/libcublas.so.13"
echo "fake CUDA driver in $out (LD_LIBRARY_PATH=$out)"
