# kvrelay: `make demo` and `make test` work on a fresh Debian 12 machine.
BUILD      ?= build
ASAN_BUILD ?= build-asan
JOBS       ?= $(shell nproc)
KVR        := $(BUILD)/bin/kvrelay

.PHONY: all deps build asan test test-release test-asan demo clean

all: build

deps:
	@tools/install-deps.sh

build: deps
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release
	cmake --build $(BUILD) -j $(JOBS)

# Sanitizer build: clang, ASan + UBSan, libFuzzer targets, no CUDA.
asan: deps
	cmake -S . -B $(ASAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Debug \
	  -DKVR_SANITIZE=ON -DKVR_FUZZ=ON -DKVR_CUDA=OFF -DCMAKE_C_COMPILER=clang
	cmake --build $(ASAN_BUILD) -j $(JOBS)

test-release: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

test-asan: asan
	cd $(ASAN_BUILD) && ctest --output-on-failure -j $(JOBS)

# Both suites run even when the first fails; each reports, and make fails if
# either did.
test: build asan
	@JOBS=$(JOBS) tools/run-tests.sh $(BUILD) $(ASAN_BUILD)

# make demo ARGS="--requests 8 --json": options go to `kvrelay demo`.
demo: build
	@tools/demo.sh $(KVR) $(ARGS)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
