#!/bin/bash
# bench/device/run.sh — the one script for a machine with an NVIDIA GPU (an H200 with CUDA 13 at
# /usr/local/cuda, no network). It checks the tools, configures a Release build with the CUDA
# backend (and the Vulkan one when glslc, the Vulkan headers and loader are there), builds with
# every core, then runs, each step under `timeout` and all within a total budget (default 450 s):
#
#   twinkle devices                      what the binary sees
#   backend_ops on cuda, vulkan, opencl  every op vs the CPU backend (NMSE), forward and backward
#   test_vulkan                          the Vulkan backend's checks (TWK_VULKAN_GEMM=fp16 vs the CPU)
#   test_parity on cpu, cuda             the transformers/PEFT fixtures replayed
#   test_curve on cuda, vulkan           20 LoRA steps, losses vs the CPU's
#   bench_gemm on cpu, cuda, vulkan      MATMUL GFLOP/s (the GPU runs also time the CPU: ratio);
#                                        cuda also with TWK_CUDA_GEMM=tf32, bf16, vulkan with TWK_VULKAN_GEMM=fp16
#   bench_train_step on cpu, cuda, vulkan  LoRA step tokens/s and MFU; the same step with elementwise
#                                        fusion off (TWK_FUSION=0): launches per step and tokens/s, fused vs unfused
#   bench_train_step --widths 8b         a LoRA step at Qwen3-8B's widths, bf16 weights, 8 x 1,024
#                                        tokens (TRAIN8B_LAYERS layers): tokens/s, MFU, bytes per step
#   bench_attn on every GPU              causal attention forward / backward at 4k and 16k tokens (and, last,
#                                        the per-token kernels at 4k; decode with split-K off)
#   bench_sample_inproc                  decode batch 1 over a 32k-token context (bf16 weights)
#   bench_train_pack on every GPU        8 LoRA runs packed into one pass against the same runs time-shared:
#                                        the built-in tiny model (8 x 64 tokens), and on cuda Qwen3-0.6B's
#                                        widths (8 x 256 tokens, 4 layers; not against the fake driver)
#
# and prints ONE table at the end. Writes run.log (everything) and table.txt under $OUT when it
# is set (else under the build dir). Exit status 0 when every test that ran passed.
#
# Missing libraries (OpenBLAS, cJSON, SQLite, protobuf-c, libuv, http-parser, pkg-config, glslc,
# the Vulkan loader) come from bench/device/sysroot.tar.gz when it is there: make it beforehand on
# a machine with apt (bench/device/make_sysroot.sh) and carry it along. Nothing is installed.
#
# Environment: BUILD_DIR (default build-device), BUDGET_S (540), PEAK_TFLOPS (67: an H200's
# plain FP32 peak by the datasheet; the engine computes in FP32), BF16_PEAK_TFLOPS (989: its dense
# bf16 tensor-core peak, the second MFU column), JOBS (all cores),
# SKIP_BUILD=1 (reuse BUILD_DIR), CUDA_HOME (/usr/local/cuda), CUDA=OFF (build without the CUDA
# backend: a dry run of this script on a machine without one), CUDA_FAKE=1 (build the CUDA backend
# and the host fake of libcuda, backends/cuda/fake, and run the cuda rows against it: a dry run of the
# cuda rows without a GPU; plumbing, not speed), FORCE_SYSROOT=1 (take the libraries
# from sysroot.tar.gz even where the machine has them: a test of that path), and the sizes
# GEMM_M (4096), TRAIN_LAYERS (4), TRAIN_TOKENS (4096 on the GPUs), CPU_TRAIN_TOKENS (1024),
# VOCAB (151936: the vocabulary of the train steps, the 8B-widths one too, and of the decode rows),
# TRAIN8B_LAYERS (4: of Qwen3-8B's 36; the unembedding of 151,936 x 4,096 is counted once), TRAIN8B_TOKENS
# (8192), ATTN_TOKENS
# (4096,16384), DECODE_CTX (32768).
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD_DIR:-$root/build-device}
case $build in /*) ;; *) build=$root/$build ;; esac
budget=${BUDGET_S:-540}
peak=${PEAK_TFLOPS:-67}
peak16=${BF16_PEAK_TFLOPS:-989}
train8b_layers=${TRAIN8B_LAYERS:-4}
train8b_tokens=${TRAIN8B_TOKENS:-8192}
attn_tokens=${ATTN_TOKENS:-4096,16384}
decode_ctx=${DECODE_CTX:-32768}
jobs=${JOBS:-$(nproc 2>/dev/null || echo 4)}
cuda_home=${CUDA_HOME:-/usr/local/cuda}
cuda=${CUDA:-ON}
cuda_fake=${CUDA_FAKE:-0}
[ "$cuda_fake" = 1 ] && cuda=ON
vocab=${VOCAB:-151936}
gemm_m=${GEMM_M:-4096}
train_layers=${TRAIN_LAYERS:-4}
train_tokens=${TRAIN_TOKENS:-4096}
cpu_train_tokens=${CPU_TRAIN_TOKENS:-1024}
outdir=${OUT:-$build}
mkdir -p "$outdir" "$build"
log=$outdir/run.log
table=$outdir/table.txt
: > "$log"
start=$SECONDS

say() { echo "$*" | tee -a "$log"; }
left() { echo $((budget - (SECONDS - start))); }

# step NAME LIMIT_S CMD...: runs CMD under timeout (the smaller of LIMIT_S and the time left, less
# 15 s kept for the table), its output into the log and into $build/step-NAME.out. Sets step_rc
# (124: timed out; 125: skipped for lack of time).
step() {
    local name=$1 lim=$2
    shift 2
    local rest=$(($(left) - 15))
    [ "$rest" -lt "$lim" ] && lim=$rest
    if [ "$lim" -lt 5 ]; then
        say "==== $name: skipped, the time budget is spent"
        step_rc=125
        : > "$build/step-$name.out"
        return
    fi
    say "==== $name (timeout ${lim}s): $*"
    local t0=$SECONDS
    # line-buffered, so a step killed by its timeout still leaves the lines it printed
    local lb=""
    command -v stdbuf > /dev/null 2>&1 && lb="stdbuf -oL -eL"
    timeout --kill-after=5 "$lim" $lb "$@" > "$build/step-$name.out" 2>&1
    step_rc=$?
    cat "$build/step-$name.out" >> "$log"
    say "==== $name: exit $step_rc after $((SECONDS - t0)) s"
}

say "twinkle device run, $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $(uname -srm), $jobs cores, budget ${budget}s"
say "repository $root ($(cd "$root" && git rev-parse --short HEAD 2>/dev/null || echo 'no git'))"

# ---- tools and libraries ----------------------------------------------------------------------
missing=""
need_tool() { command -v "$1" > /dev/null 2>&1 || missing="$missing $1"; }
export PATH="$cuda_home/bin:$PATH"
for t in cmake cc make timeout tar; do need_tool "$t"; done
if [ -n "$missing" ]; then
    say "missing tools:$missing — cannot build here" | tee "$table"
    exit 2
fi
command -v nvidia-smi > /dev/null 2>&1 && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | sed 's/^/gpu: /' | tee -a "$log"
[ -x "$cuda_home/bin/nvcc" ] && say "nvcc: $("$cuda_home/bin/nvcc" --version | tail -1)" || say "nvcc: not found under $cuda_home (the CUDA backend may still build: it dlopens the driver and cuBLAS)"

have_pc() { command -v pkg-config > /dev/null 2>&1 && pkg-config --exists "$1" 2>/dev/null; }
have_lib() { ldconfig -p 2>/dev/null | grep -q "$1" || ls /usr/lib/x86_64-linux-gnu/$1* /usr/lib64/$1* /usr/lib/$1* > /dev/null 2>&1; }
lack=""
command -v pkg-config > /dev/null 2>&1 || lack="$lack pkg-config"
for p in openblas libcjson sqlite3 libprotobuf-c libuv; do have_pc "$p" || lack="$lack $p"; done
command -v protoc-c > /dev/null 2>&1 || lack="$lack protoc-c"
have_lib libhttp_parser.so || lack="$lack http_parser"
[ -f /usr/include/http_parser.h ] || lack="$lack http_parser.h"
vk_lack=""
command -v glslc > /dev/null 2>&1 || vk_lack="$vk_lack glslc"
have_lib libvulkan.so || vk_lack="$vk_lack libvulkan"
[ -f /usr/include/vulkan/vulkan.h ] || vk_lack="$vk_lack vulkan.h"
cl_lack=""
[ -f /usr/include/CL/cl.h ] || cl_lack="$cl_lack CL/cl.h"
[ -f /usr/include/clblast_c.h ] || cl_lack="$cl_lack clblast_c.h"
have_lib libclblast.so || cl_lack="$cl_lack libclblast"

sysroot_tar=$root/bench/device/sysroot.tar.gz
[ "${FORCE_SYSROOT:-0}" = 1 ] && [ -z "$lack" ] && lack=" (FORCE_SYSROOT)"
if [ -n "$lack$vk_lack$cl_lack" ]; then
    say "not on this machine:$lack$vk_lack$cl_lack"
    if [ -f "$sysroot_tar" ]; then
        sr=$build/sysroot
        rm -rf "$sr" && mkdir -p "$sr" && tar -C "$sr" -xzf "$sysroot_tar"
        # pkg-config files name /usr: point them into the private prefix
        find "$sr" -name '*.pc' -exec sed -i "s|=/usr|=$sr/usr|g; s|-I/usr|-I$sr/usr|g; s|-L/usr|-L$sr/usr|g" {} +
        lib=$sr/usr/lib/x86_64-linux-gnu
        export PATH="$sr/usr/bin:$PATH"
        export PKG_CONFIG_PATH="$lib/openblas-pthread/pkgconfig:$lib/pkgconfig:$sr/usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
        export CPATH="$sr/usr/include:$sr/usr/include/x86_64-linux-gnu${CPATH:+:$CPATH}"
        export LIBRARY_PATH="$lib:$lib/openblas-pthread${LIBRARY_PATH:+:$LIBRARY_PATH}"
        export LD_LIBRARY_PATH="$lib:$lib/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        export CMAKE_PREFIX_PATH="$sr/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
        export VULKAN_SDK="$sr/usr"
        say "using the packages of $sysroot_tar ($(tr '\n' ' ' < "$sr/PACKAGES" | wc -w) .debs) from $sr"
        vk_lack=""
        have_lib libvulkan.so || [ -e "$lib/libvulkan.so.1" ] || vk_lack=" libvulkan"
        cl_lack=""
        [ -e "$sr/usr/include/clblast_c.h" ] && [ -e "$lib/libclblast.so.1" ] || cl_lack=" clblast (not in the sysroot)"
    elif [ -n "$lack" ]; then
        say "and no $sysroot_tar to take them from: run bench/device/make_sysroot.sh on a machine with apt and carry the file"
        echo "device run: NOT BUILT, missing:$lack (no sysroot.tar.gz); see run.log" > "$table"
        exit 2
    fi
fi
export LD_LIBRARY_PATH="$cuda_home/lib64:/usr/local/nvidia/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
vulkan=OFF
if [ -z "$vk_lack" ]; then
    vulkan=ON
    # the NVIDIA ICD where the loader does not look by itself
    if [ -z "${VK_DRIVER_FILES:-}" ] && ! ls /usr/share/vulkan/icd.d/nvidia* /etc/vulkan/icd.d/nvidia* > /dev/null 2>&1 &&
        [ -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ]; then
        export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
    fi
else
    say "Vulkan backend off: missing$vk_lack"
fi
opencl=OFF
if [ -z "$cl_lack" ]; then
    opencl=ON
    # NVIDIA's OpenCL ICD: the driver ships libnvidia-opencl.so.1; containers often lack its .icd file
    if [ -z "${OCL_ICD_VENDORS:-}" ] && ! ls /etc/OpenCL/vendors/*.icd > /dev/null 2>&1 &&
        ldconfig -p 2>/dev/null | grep -q libnvidia-opencl.so.1; then
        mkdir -p "$build/icd" && echo libnvidia-opencl.so.1 > "$build/icd/nvidia.icd"
        export OCL_ICD_VENDORS=$build/icd
    fi
else
    say "OpenCL backend off: missing$cl_lack"
fi

# ---- build ------------------------------------------------------------------------------------
targets="twinkle_cli backend_ops test_parity test_curve test_ops bench_gemm bench_train_step bench_attn bench_sample_inproc bench_train_pack"
[ "$cuda_fake" = 1 ] && targets="$targets twk_cuda_fake"
vk_targets=""
[ "$vulkan" = ON ] && vk_targets="test_vulkan"
if [ "${SKIP_BUILD:-0}" != 1 ]; then
    step configure 120 cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DTWK_CUDA=$cuda -DTWK_VULKAN=$vulkan -DTWK_OPENCL=$opencl \
        -DCMAKE_CUDA_COMPILER="$cuda_home/bin/nvcc" -DCMAKE_CUDA_ARCHITECTURES=90 -DCUDAToolkit_ROOT="$cuda_home"
    if [ "$step_rc" != 0 ] && [ "$vulkan" = ON ]; then
        say "configure failed with Vulkan on; trying once more with it off"
        vulkan=OFF
        step configure2 120 cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DTWK_CUDA=$cuda -DTWK_VULKAN=OFF -DTWK_OPENCL=$opencl \
            -DCMAKE_CUDA_COMPILER="$cuda_home/bin/nvcc" -DCMAKE_CUDA_ARCHITECTURES=90 -DCUDAToolkit_ROOT="$cuda_home"
    fi
    [ "$step_rc" = 0 ] && step build 300 cmake --build "$build" -j"$jobs" --target $targets $vk_targets
    if [ "$step_rc" != 0 ] && [ "$step_rc" != 124 ] && [ "$vulkan" = ON ]; then
        say "the build failed with Vulkan on; once more with it off (the CUDA figures matter more)"
        tail -20 "$build/step-build.out" | tee -a "$log"
        vulkan=OFF
        step configure3 120 cmake -S "$root" -B "$build" -DTWK_VULKAN=OFF -DTWK_OPENCL=$opencl
        [ "$step_rc" = 0 ] && step build2 240 cmake --build "$build" -j"$jobs" --target $targets
    fi
    build_rc=$step_rc
else
    build_rc=0
fi
bin=$build
if [ "$build_rc" != 0 ] || [ ! -x "$bin/twinkle" ]; then
    say "the build failed (exit $build_rc); the last lines:"
    tail -30 "$(ls -t "$build"/step-*.out | head -1)" 2>/dev/null | tee -a "$log"
    { echo "device run $(date -u '+%F %T') UTC: BUILD FAILED (exit $build_rc); see run.log"; } | tee "$table"
    exit 1
fi

if [ "$cuda_fake" = 1 ]; then
    # the host fake of libcuda (and of libcublas) ahead of any real driver or CUDA library
    if [ ! -e "$build/cuda_fake/libcuda.so.1" ]; then
        say "CUDA_FAKE=1 but no $build/cuda_fake/libcuda.so.1 (build the twk_cuda_fake target of a -DTWK_CUDA=ON build)"
        echo "device run $(date -u '+%F %T') UTC: NO FAKE CUDA DRIVER in $build/cuda_fake; see run.log" | tee "$table"
        exit 1
    fi
    export LD_LIBRARY_PATH="$build/cuda_fake:$LD_LIBRARY_PATH"
    say "cuda rows against the fake driver $build/cuda_fake/libcuda.so.1 (host emulation: plumbing, not speed)"
fi
step devices 30 "$bin/twinkle" devices
devices_out=$(cat "$build/step-devices.out")
has_dev() { echo "$devices_out" | grep -q "^$1:0 "; }
devs=""
for d in cuda vulkan opencl; do
    if has_dev "$d"; then devs="$devs $d"; else say "no $d device: $(echo "$devices_out" | grep "^$d" | head -1)"; fi
done

# ---- tests and benchmarks ---------------------------------------------------------------------
declare -A ops parity curve gemm gemm_best train mfu ratio_gemm big attn decode fusion pack
fails=0
# result NAME: "pass", "FAIL", "timeout", "skipped" from step_rc
verdict() { case $step_rc in 0) echo pass ;; 124 | 137) echo timeout ;; 125) echo skipped ;; *) echo FAIL ;; esac; }
count_fail() { case $step_rc in 0 | 125) ;; *) fails=$((fails + 1)) ;; esac; }

for d in $devs; do
    step "backend_ops-$d" 120 env TWK_TEST_DEVICE=$d "$bin/tests/backend_ops"
    count_fail
    runs=$(grep -Eo '^[0-9]+ case runs' "$build/step-backend_ops-$d.out" | cut -d' ' -f1)
    ops[$d]="$(verdict)${runs:+ $runs/$(grep -Eo '[0-9]+ failures$' "$build/step-backend_ops-$d.out" | cut -d' ' -f1)f}"
done
if echo "$devs" | grep -qw vulkan && [ -x "$bin/backends/vulkan/test_vulkan" ]; then
    # the Vulkan backend's own checks, among them TWK_VULKAN_GEMM=fp16 on cooperative matrices against the CPU
    # (awkward sizes, every transpose, batched: the edges bench_gemm's sizes do not reach)
    step test_vulkan 90 "$bin/backends/vulkan/test_vulkan"
    count_fail
    vk_checks="$(verdict) $(grep -c '^ok' "$build/step-test_vulkan.out")ok; $(grep 'TWK_VULKAN_GEMM=fp16' "$build/step-test_vulkan.out" |
        grep -v '^vulkan:' | head -1 | cut -c1-110)"
fi
for d in cpu $(echo "$devs" | grep -o cuda); do
    step "parity-$d" 90 env TWK_TEST_DEVICE=$d "$bin/tests/test_parity"
    count_fail
    parity[$d]="$(verdict) $(grep -c '^ok' "$build/step-parity-$d.out")ok"
done
for d in $devs; do
    step "curve-$d" 60 env TWK_TEST_DEVICE=$d "$bin/tests/test_curve"
    count_fail
    curve[$d]="$(verdict) $(grep -Eo 'worst [0-9.e+-]+' "$build/step-curve-$d.out" | cut -d' ' -f2)"
done

summary() { grep '^SUMMARY' "$1" | tr ' ' '\n' | grep "^$2=" | cut -d= -f2; }
step gemm-cpu 90 "$bin/bench/bench_gemm" --quick
count_fail
gemm[cpu]=$(summary "$build/step-gemm-cpu.out" tflops_geo)
gemm_best[cpu]=$(summary "$build/step-gemm-cpu.out" tflops_best)
for d in $devs; do
    cmp=""
    [ "$d" = cuda ] && cmp="--compare cpu" # the ratio device/cpu in the same run (the CPU side costs ~10 s)
    step "gemm-$d" 120 "$bin/bench/bench_gemm" --quick --m "$gemm_m" --reps 5 --device $d $cmp --peak-tflops "$peak"
    count_fail
    gemm[$d]=$(summary "$build/step-gemm-$d.out" tflops_geo)
    gemm_best[$d]=$(summary "$build/step-gemm-$d.out" tflops_best)
    ratio_gemm[$d]=$(summary "$build/step-gemm-$d.out" ratio)
    [ -z "$cmp" ] && ratio_gemm[$d]="" # no --compare: bench_gemm's ratio=0 means "not measured"
done
if echo "$devs" | grep -qw cuda; then
    # cuBLAS on tensor cores (TWK_CUDA_GEMM, backends/cuda/README.md): rates only; results differ from fp32
    for mode in tf32 bf16; do
        step "gemm-cuda-$mode" 60 env TWK_CUDA_GEMM=$mode "$bin/bench/bench_gemm" --quick --m "$gemm_m" --reps 5 --device cuda
        case $step_rc in 0 | 1) ;; *) count_fail ;; esac # a tolerance MISMATCH is expected here, not a failure
        gemm[cuda/$mode]=$(summary "$build/step-gemm-cuda-$mode.out" tflops_geo)
        gemm_best[cuda/$mode]=$(summary "$build/step-gemm-cuda-$mode.out" tflops_best)
    done
fi
if echo "$devs" | grep -qw vulkan; then
    # cooperative matrices, fp16 inputs, fp32 accumulation (TWK_VULKAN_GEMM, backends/vulkan/README.md): rates, and
    # the worst |engine - BLAS| as a sanity figure; the 1e-3 fp32 tolerance may not hold, as for the cuda rows.
    # The line "using the fp32 GEMM" in its output means the device lacks VK_NV_cooperative_matrix.
    step gemm-vulkan-fp16 60 env TWK_VULKAN_GEMM=fp16 "$bin/bench/bench_gemm" --quick --m "$gemm_m" --reps 5 --device vulkan
    case $step_rc in 0 | 1) ;; *) count_fail ;; esac # a tolerance MISMATCH is expected here, not a failure
    gemm[vulkan/fp16]=$(summary "$build/step-gemm-vulkan-fp16.out" tflops_geo)
    gemm_best[vulkan/fp16]=$(summary "$build/step-gemm-vulkan-fp16.out" tflops_best)
    # the worst max|diff| column of bench_gemm's product lines (absolute, against max|ref| ~ 50-100 with inputs in
    # [-1, 1]: fp16 rounding should give ~1e-2, inside the 1e-3 x max|ref| tolerance; ~1 or more means a wrong kernel)
    vk16_diff=$(awk '$4 ~ /^[0-9]+$/ && $6 ~ /x/ { d = $NF == "MISMATCH" ? $(NF - 1) : $NF
        if (w !~ /nan/ && (d ~ /nan/ || d + 0 > w + 0)) w = d } END { print w }' "$build/step-gemm-vulkan-fp16.out")
    vk16_diff="worst |diff| ${vk16_diff:--}, within 1e-3: $(summary "$build/step-gemm-vulkan-fp16.out" ok)"
    grep -q 'using the fp32 GEMM' "$build/step-gemm-vulkan-fp16.out" && vk16_diff="FELL BACK to fp32 (no coopmat)"
fi
# fused_vs_unfused FILE: bench_train_step's launches per step and tokens/s with fusion on (the default) and off
# (TWK_FUSION=0), from its SUMMARY line ("-" when the step did not get that far)
fused_vs_unfused() {
    awk '/^SUMMARY bench_train_step/ { for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
        if (v["unfused_tokens_per_s"] + 0 > 0) printf "launches/step %d unfused -> %d fused (%.1f%% fewer); tok/s %.1f unfused, %.1f fused (x%.3f)",
            v["launches_unfused"], v["launches"], 100 * (v["launches_unfused"] - v["launches"]) / v["launches_unfused"],
            v["unfused_tokens_per_s"], v["tokens_per_s"], v["tokens_per_s"] / v["unfused_tokens_per_s"]
        else printf "launches/step %d fused; no unfused run", v["launches"]; found = 1 } END { if (!found) printf "-" }' "$1"
}
step train-cpu 120 "$bin/bench/bench_train_step" --layers "$train_layers" --tokens "$cpu_train_tokens" --steps 2 --vocab "$vocab"
count_fail
train[cpu]=$(summary "$build/step-train-cpu.out" tokens_per_s)
fusion[cpu]="$(verdict) $(fused_vs_unfused "$build/step-train-cpu.out")"
for d in $devs; do
    step "train-$d" 120 "$bin/bench/bench_train_step" --device $d --layers "$train_layers" --tokens "$train_tokens" --seqs 8 --steps 5 \
        --vocab "$vocab" --peak-tflops "$peak"
    count_fail
    train[$d]=$(summary "$build/step-train-$d.out" tokens_per_s)
    mfu[$d]=$(summary "$build/step-train-$d.out" mfu)
    fusion[$d]="$(verdict) $(fused_vs_unfused "$build/step-train-$d.out")"
done
# A real-size step: Qwen3-8B's widths, bf16 frozen weights (widened to f32 for the GEMMs), 8 x 1,024 tokens
for d in $devs; do
    step "train8b-$d" 150 "$bin/bench/bench_train_step" --device $d --widths 8b --dtype bf16 --layers "$train8b_layers" \
        --tokens "$train8b_tokens" --seqs 8 --steps 3 --vocab "$vocab" --peak-tflops "$peak16"
    count_fail
    o=$build/step-train8b-$d.out
    m=$(summary "$o" mfu)
    [ -n "$m" ] && m=$(awk -v m="$m" -v a="$peak16" -v b="$peak" 'BEGIN { printf "MFU %.1f%% of bf16 peak, %.1f%% of fp32", 100 * m, 100 * m * a / b }')
    big[$d]=$(verdict)
    [ -n "$(summary "$o" tokens_per_s)" ] && big[$d]="${big[$d]} $(summary "$o" tokens_per_s) tok/s, ${m:-MFU -}, bytes/step $(summary "$o" up_bytes) up / $(summary "$o" down_bytes) down; fusion: $(fused_vs_unfused "$o")"
done
# attention alone: 32 query heads / 8 kv heads (Qwen3-8B), head_dim 128, one causal segment
for d in $devs; do
    step "attn-$d" 150 "$bin/bench/bench_attn" --device $d --tokens "$attn_tokens" --heads 32 --kv-heads 8 --head-dim 128 \
        --reps 3 --peak-tflops "$peak"
    count_fail
    attn[$d]="$(verdict) $(awk -v a="$peak16" -v b="$peak" '/^SUMMARY bench_attn/ { for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
        printf "%sT fwd %.2f bwd %.2f TFLOP/s (fwd %.1f%% fp32, %.1f%% bf16 peak); ", v["tokens"], v["fwd_tflops"], v["bwd_tflops"],
            100 * v["fwd_tflops"] / b, 100 * v["fwd_tflops"] / a }' "$build/step-attn-$d.out")"
done
# decode batch 1 over a long context (4 layers of Qwen3-0.6B's widths, bf16 weights and KV cache)
for d in $devs; do
    step "decode-$d" 120 "$bin/bench/bench_sample_inproc" --device $d --dtype bf16 --ctx $((decode_ctx + 64)) \
        --prompt "$decode_ctx" --new 64 --prefill 16 --phase decode1 --reps 1 --vocab "$vocab"
    count_fail
    decode[$d]="$(verdict) $(sed -n 's/^twinkle decode b1 *\([0-9.]*\) tokens\/s.*/\1 tok\/s/p' "$build/step-decode-$d.out" | head -1)"
done
# packed multi-LoRA training (the service's batched tenants): 8 runs' forward_backward in one pass against
# the same 8 time-shared; RESULT runs ts_steps/s packed_steps/s ts_tok/s packed_tok/s
pack_ratio() { awk '/^RESULT/ { if ($3 > 0) printf "%.2fx (%.1f vs %.1f steps/s)", $4 / $3, $4, $3 }' "$1"; }
for d in $devs; do
    step "pack-tiny-$d" 90 "$bin/bench/bench_train_pack" --device $d --model tiny --runs 8 --datums 4 --tokens 16 --steps 10
    count_fail
    pack[$d]="tiny 8 x 64 tokens $(verdict) $(pack_ratio "$build/step-pack-tiny-$d.out")"
    if [ "$d" = cuda ] && [ "$cuda_fake" != 1 ]; then
        step "pack-qwen-$d" 120 "$bin/bench/bench_train_pack" --device $d --model qwen --runs 8 --datums 1 --tokens 256 \
            --layers 4 --vocab 32768 --steps 3
        count_fail
        pack[$d]="${pack[$d]}; Qwen3-0.6B widths 8 x 256 tokens $(verdict) $(pack_ratio "$build/step-pack-qwen-$d.out")"
    fi
done
# the same decode with one work-group per (query, head) (TWK_ATTN_UNSPLIT=1: no split-K), then the attention
# at the first ATTN_TOKENS count on the per-token kernels (TWK_ATTN_UNTILED=1): ratios split / unsplit and
# tiled / per-token from the same run; last, so the time budget skips them first
for d in $devs; do
    step "decode-unsplit-$d" 120 env TWK_ATTN_UNSPLIT=1 "$bin/bench/bench_sample_inproc" --device $d --dtype bf16 \
        --ctx $((decode_ctx + 64)) --prompt "$decode_ctx" --new 64 --prefill 16 --phase decode1 --reps 1 --vocab "$vocab"
    count_fail
    u=$(sed -n 's/^twinkle decode b1 *\([0-9.]*\) tokens\/s.*/\1/p' "$build/step-decode-unsplit-$d.out" | head -1)
    decode[$d]="${decode[$d]:--}; unsplit (TWK_ATTN_UNSPLIT=1) $(verdict)${u:+ $u tok/s}"
done
for d in $devs; do
    step "attn-untiled-$d" 120 env TWK_ATTN_UNTILED=1 "$bin/bench/bench_attn" --device $d --tokens "${attn_tokens%%,*}" \
        --heads 32 --kv-heads 8 --head-dim 128 --reps 1
    count_fail
    attn[$d]="${attn[$d]:--} per-token kernels (TWK_ATTN_UNTILED=1): $(verdict) $(awk '/^SUMMARY bench_attn/ { for (i = 2; i <= NF; i++) {
        split($i, kv, "="); v[kv[1]] = kv[2] } printf "%sT fwd %.2f bwd %.2f TFLOP/s", v["tokens"], v["fwd_tflops"], v["bwd_tflops"] }' \
        "$build/step-attn-untiled-$d.out")"
done

# ---- the table --------------------------------------------------------------------------------
{
    echo "twinkle device run $(date -u '+%F %T') UTC, $(cd "$root" && git rev-parse --short HEAD 2>/dev/null), $((SECONDS - start)) s"
    echo "$(echo "$devices_out" | grep -E '^(cuda|vulkan|opencl):0' | head -3 | tr '\n' ';')"
    [ "$cuda_fake" = 1 ] && echo "cuda: the host fake of libcuda (backends/cuda/fake; CUDA_FAKE=1): plumbing, not speed"
    printf '%-7s %-16s %-11s %-14s %-22s %-10s %-12s %-7s\n' device backend_ops parity loss_curve \
        "GEMM TFLOP/s geo/best" "GEMM x cpu" "step tok/s" "MFU"
    for d in cpu cuda vulkan opencl; do
        [ "$d" != cpu ] && ! echo "$devs" | grep -qw $d && {
            printf '%-7s %s\n' $d "no device (see run.log)"
            continue
        }
        m=${mfu[$d]:-}
        [ -n "$m" ] && m=$(awk -v m="$m" 'BEGIN { printf "%.1f%%", 100 * m }')
        printf '%-7s %-16s %-11s %-14s %-22s %-10s %-12s %-7s\n' $d "${ops[$d]:-(reference)}" "${parity[$d]:--}" \
            "${curve[$d]:--}" "${gemm[$d]:--}/${gemm_best[$d]:--}" "${ratio_gemm[$d]:--}" "${train[$d]:--}" "${m:--}"
    done
    for mode in tf32 bf16; do
        [ -n "${gemm[cuda/$mode]:-}" ] && printf '%-7s %-16s %-11s %-14s %-22s\n' "cuda" "TWK_CUDA_GEMM=$mode" "" "" \
            "${gemm[cuda/$mode]}/${gemm_best[cuda/$mode]:--}"
    done
    [ -n "${gemm[vulkan/fp16]:-}" ] && printf '%-7s %-16s %-11s %-14s %-22s %s\n' "vulkan" "TWK_VULKAN_GEMM=fp16" "" "" \
        "${gemm[vulkan/fp16]}/${gemm_best[vulkan/fp16]:--}" "${vk16_diff:--}"
    [ -n "${vk_checks:-}" ] && echo "vulkan  test_vulkan: $vk_checks"
    for d in cpu $devs; do
        echo "$d  fused vs unfused (LoRA step, $train_layers layers, TWK_FUSION=0 vs on): ${fusion[$d]:--}"
    done
    for d in $devs; do
        echo "$d  8B-widths step (bf16, $train8b_layers layers, $train8b_tokens tokens in 8 sequences): ${big[$d]:--}"
        echo "$d  attention (32/8 heads, d 128): ${attn[$d]:--}"
        echo "$d  decode b1, ${decode_ctx}-token context: ${decode[$d]:--}"
        echo "$d  packed multi-LoRA, 8 runs, packed / time-shared: ${pack[$d]:--}"
    done
    echo "backend_ops: verdict runs/failures; parity: checks ok; loss_curve: worst relative step-loss difference"
    echo "vs the CPU; GEMM: bench_gemm --quick (M=2048 on cpu, $gemm_m on the GPUs); step: LoRA r16, $train_layers Qwen3-0.6B"
    echo "layers, vocab $vocab, $cpu_train_tokens tokens (cpu) / $train_tokens (GPUs); MFU = 6 N tokens/s / ${peak} TFLOP/s (PEAK_TFLOPS)"
    echo "$fails step(s) failed; full output in run.log"
} | tee "$table" | tee -a "$log"
[ "$fails" = 0 ]
