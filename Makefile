# The two commands of the Quick start, and a few more for developers.
#   make run   [MODEL=path] [PORT=8000]    set up, build (Release), and serve the model over HTTP
#   make test                              set up, build, and run every test (+ ASan corruption tests)
#   make test-asan                         the untrusted-input and SIMD kernel tests under ASan+UBSan
#   make build | make clean
JOBS ?= 2
BUILD_DIR ?= build/release
ASAN_DIR ?= build/asan
MODEL ?= demo-random
HOST ?= 127.0.0.1
PORT ?= 8000
CMAKE_FLAGS ?=
PAGODA := $(BUILD_DIR)/apps/pagoda/pagoda

.PHONY: all setup build run test test-asan npm-deps clean

all: build

setup:
	@scripts/setup

$(BUILD_DIR)/build.ninja:
	cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

build: setup $(BUILD_DIR)/build.ninja
	cmake --build $(BUILD_DIR) -j $(JOBS)

run: setup $(BUILD_DIR)/build.ninja
	cmake --build $(BUILD_DIR) -j $(JOBS) --target pagoda
	$(PAGODA) serve "$(MODEL)" --host $(HOST) --port $(PORT)

# The ASan run goes first so that the full suite's ctest summary is the last thing printed.
test: test-asan npm-deps
	cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=Release -DPAGODA_WERROR=ON $(CMAKE_FLAGS)
	cmake --build $(BUILD_DIR) -j $(JOBS)
	ctest --test-dir $(BUILD_DIR) -j $(JOBS) --no-tests=error --output-on-failure --timeout 300

# The tests that parse untrusted input (model files, tokenizers, chat templates, request bodies,
# and the whole server over HTTP), labelled "untrusted-input", and the SIMD kernel tests
# ("kernels"), under AddressSanitizer + UBSan.
ASAN_TARGETS := loader_test tokenizer_test chat_template_test openai_protocol_test server_test pagoda \
  cpu_simd_kernels_test
test-asan: setup
	cmake -S . -B $(ASAN_DIR) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPAGODA_WERROR=ON \
	  -DPAGODA_SANITIZE=address,undefined $(CMAKE_FLAGS)
	cmake --build $(ASAN_DIR) -j $(JOBS) --target $(ASAN_TARGETS)
	ctest --test-dir $(ASAN_DIR) -j $(JOBS) --no-tests=error --output-on-failure --timeout 600 -L '^(untrusted-input|kernels)$$'

# npm packages of the client-side server tests, from the committed package-lock.json.
npm-deps: setup
	@[ -d tests/server/node_modules/openai ] || (cd tests/server && npm ci --no-audit --no-fund)

clean:
	rm -rf build
