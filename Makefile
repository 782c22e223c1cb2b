# twinkle — the two commands (README.md): `make demo` and `make test`.
# Both install missing Debian packages first (scripts/install-deps.sh).

BUILD      ?= build
BUILD_SAN  ?= build-sanitize
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)

.PHONY: all deps build demo test test-sanitize bench clean

all: build

deps:
	@sh scripts/install-deps.sh

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

# The main job: train a tiny transformer from scratch and print a falling loss.
demo: build
	./$(BUILD)/twinkle demo

# The whole test suite.
test: build
	cd $(BUILD) && ctest --output-on-failure --timeout 900

# The same suite under AddressSanitizer + UndefinedBehaviorSanitizer.
test-sanitize: deps
	@cmake -S . -B $(BUILD_SAN) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTWK_SANITIZE=ON >/dev/null
	@cmake --build $(BUILD_SAN) -j $(JOBS)
	cd $(BUILD_SAN) && ctest --output-on-failure --timeout 1800

# Benchmarks (not tests): see bench/README.md.
bench: build
	./$(BUILD)/bench/bench_gemm --quick
	./$(BUILD)/bench/bench_overhead

clean:
	rm -rf $(BUILD) $(BUILD_SAN)
