# twinkle — the two commands (README.md): `make demo` and `make test`.
# Both install missing Debian packages first (scripts/install-deps.sh).

BUILD      ?= build
BUILD_SAN  ?= build-sanitize
BUILD_FUZZ ?= build-fuzz
FUZZ_S     ?= 25
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)

.PHONY: all deps build demo test test-sanitize fuzz bench clean

all: build

deps:
	@sh scripts/install-deps.sh

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

# The main job: `twinkle serve` on the built-in model + the bundled Tinker SDK
# client that LoRA-trains it (scripts/demo.sh).
demo: build
	BUILD=$(BUILD) sh scripts/demo.sh

# The whole test suite.
test: build
	cd $(BUILD) && ctest --output-on-failure --timeout 900 -j $(JOBS)

# The same suite under AddressSanitizer + UndefinedBehaviorSanitizer (LeakSanitizer ignores
# leaks inside PoCL / LLVM / CLBlast only: tests/lsan.supp). intercept_tls_get_addr=0: GCC 12's
# LeakSanitizer sometimes records a bogus dynamic-TLS block for the drivers' dlopen'ed modules
# (PoCL, lavapipe's LLVM) and its leak scan then dies ("Tracer caught signal 11") after a test
# passed; without the interception it scans static TLS and every thread's stack as before.
test-sanitize: deps
	@cmake -S . -B $(BUILD_SAN) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTWK_SANITIZE=ON >/dev/null
	@cmake --build $(BUILD_SAN) -j $(JOBS)
	cd $(BUILD_SAN) && ASAN_OPTIONS=intercept_tls_get_addr=0 LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp ctest --output-on-failure --timeout 1800 -j $(JOBS)
	@$(MAKE) --no-print-directory fuzz FUZZ_S=$(FUZZ_S)

# Every libFuzzer harness of tests/fuzz for FUZZ_S seconds (default 25) under ASan + UBSan,
# built with clang in $(BUILD_FUZZ); fails on any crash (artifacts in $(BUILD_FUZZ)/tests/fuzz/work/).
fuzz: deps
	@cmake -S . -B $(BUILD_FUZZ) -DCMAKE_C_COMPILER=clang -DTWK_FUZZ=ON -DTWK_OPENCL=OFF -DTWK_VULKAN=OFF \
	  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTWK_FUZZ_SECONDS=$(FUZZ_S) >/dev/null
	@cmake --build $(BUILD_FUZZ) -j $(JOBS) --target twk_fuzzers
	cd $(BUILD_FUZZ) && ctest -L fuzz --output-on-failure -j $(JOBS)

# Benchmarks (not tests): see bench/README.md.
bench: build
	./$(BUILD)/bench/bench_gemm --quick
	./$(BUILD)/bench/bench_overhead

clean:
	rm -rf $(BUILD) $(BUILD_SAN) $(BUILD_FUZZ)
