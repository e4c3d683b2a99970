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

test: test-release test-asan

demo: build
	@tools/demo.sh $(KVR)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
