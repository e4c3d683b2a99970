# kvrelay: `make demo` and `make test` work on a fresh Debian 12 machine.
BUILD      ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
# The threaded tests ThreadSanitizer runs (agents, loopback transport, the
# store checksum, the store connector's save worker).
TSAN_TESTS ?= test_agent|test_xfer_loopback|test_store_faults|test_store_conn
JOBS       ?= $(shell nproc)
KVR        := $(BUILD)/bin/kvrelay

.PHONY: all deps build asan tsan test test-release test-asan test-tsan demo clean

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

# ThreadSanitizer build: clang, only what the threaded tests need.
tsan: deps
	cmake -S . -B $(TSAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Debug \
	  -DKVR_TSAN=ON -DKVR_FUZZ=OFF -DKVR_CUDA=OFF -DCMAKE_C_COMPILER=clang
	# every test program whose name TSAN_TESTS matches (a list written out
	# here had to name each new test, or ctest reported it "Not Run")
	cmake --build $(TSAN_BUILD) -j $(JOBS) --target $$(ninja -C $(TSAN_BUILD) \
	  -t targets all | sed -n 's/: phony$$//p' | grep -E '^($(TSAN_TESTS))[a-z0-9_]*$$')

test-release: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

test-asan: asan
	cd $(ASAN_BUILD) && ctest --output-on-failure -j $(JOBS)

test-tsan: tsan
	cd $(TSAN_BUILD) && ctest --output-on-failure -j $(JOBS) -R '$(TSAN_TESTS)'

# Every suite runs even when an earlier one fails; each reports, and make
# fails if any did. ThreadSanitizer runs the threaded tests only.
test: build asan tsan
	@JOBS=$(JOBS) tools/run-tests.sh $(BUILD) $(ASAN_BUILD) \
	  '$(TSAN_BUILD):$(TSAN_TESTS)'

# make demo ARGS="--requests 8 --json": options go to `kvrelay demo`.
demo: build
	@tools/demo.sh $(KVR) $(ARGS)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD)
