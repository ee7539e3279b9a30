# The two commands of the Quick start, and a few more for developers.
#   make run   [MODEL=path] [PORT=8000]    set up, build (Release), and serve the model over HTTP
#   make test                              set up, build, and run every test (+ sanitizers, fuzzers)
#   make test-asan                         the unit, engine, untrusted-input and kernel tests under ASan+UBSan
#   make test-tsan                         the thread pool, engine and server tests under TSan
#   make fuzz [FUZZ_SECONDS=60]            build the libFuzzer targets (clang) and run each that long
#                                          (`make test` runs each for TEST_FUZZ_SECONDS=30)
#   make soak [DURATION=600]               the soak test with its loss ledger (tests/soak/soak.mjs)
#   make install [PREFIX=/usr/local]      build, then install the binary, the Python module, the C++
#                                          engine (find_package(Pagoda)) and the systemd unit
#   make deb                               build, then the Debian package in build/release/packages
#   make build | make clean
JOBS ?= 2
empty :=
space := $(empty) $(empty)
BUILD_DIR ?= build/release
ASAN_DIR ?= build/asan
TSAN_DIR ?= build/tsan
MODEL ?= demo-random
HOST ?= 127.0.0.1
PORT ?= 8000
CMAKE_FLAGS ?=
PAGODA := $(BUILD_DIR)/apps/pagoda/pagoda
PREFIX ?= /usr/local

.PHONY: all setup build run test test-asan test-tsan fuzz test-fuzz soak npm-deps install deb clean

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

# The ASan run and the fuzzers go first so that the full suite's ctest summary is the last
# thing printed.
test: test-asan test-tsan test-fuzz npm-deps
	cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=Release -DPAGODA_WERROR=ON $(CMAKE_FLAGS)
	cmake --build $(BUILD_DIR) -j $(JOBS)
	ctest --test-dir $(BUILD_DIR) -j $(JOBS) --no-tests=error --output-on-failure --timeout 300

# Under AddressSanitizer + UBSan: the tests that parse untrusted input (model files, tokenizers,
# chat templates, request bodies, the whole server over HTTP, the fuzz corpora), labelled
# "untrusted-input", the SIMD kernel tests ("kernels"), and the unit, engine and CLI tests
# (labelled with their binary's name): every ctest but the Node.js client tests and the soak,
# which drive the Release server, determinism_types_test (the determinism suite over every weight
# type: hours under ASan; the kernels' memory safety is cpu_simd_kernels_test's), and three tests
# that compute for minutes under ASan what the Release run checks, on code that tests here run
# under ASan anyway (ASAN_SLOW_TESTS: 379, 175 and 62 s of the 845 s ASan test run on the 2-core
# Zen 3 CI machine): the fast kernels against the scalar ones at TinyLlama's shapes (the kernels'
# random shapes with odd tails run under ASan in cpu_simd_kernels_test), and the determinism suite
# on the two dummy models (stories260K's runs it under ASan: batching, prefix caching, chunked
# prefill, preemption, speculation); and the TinyLlama-shaped tensor-parallel logits (three
# processes computing a 2-layer TinyLlama; the small sharded models of the same test binary run
# the same slicing and collectives under ASan); and prefix caching and preemption at 32k tokens
# (53 s of attention over stories260K's contexts in Release, whose step and cache code the
# shorter engine tests run under ASan).
ASAN_UNIT_TESTS := base_test tensor_test quantize_test kv_test scheduler_test output_processor_test sampler_test metrics_test cpu_kernels_test guarded_backend_test \
  cpu_thread_pool_test engine_test executor_test worker_test shm_communicator_test tensor_parallel_test determinism_test \
  golden_stories_test model_reference_test gguf_hf_equivalence_test cli_test bench_serve_test \
  vllm_compat_test perplexity_test
FUZZ_TARGETS := gguf_fuzz safetensors_fuzz hf_config_fuzz packed_linear_fuzz tokenizer_json_fuzz tokenize_fuzz \
  chat_template_fuzz openai_request_fuzz
# The sanitizer builds compile at -O1 with line tables only (-g1: what their reports' stack traces
# need), the level the sanitizers' documentation recommends: on the 2-core CI machine one large
# test file took 151 s at -O1 and 173 s with -g1, against 203 s at RelWithDebInfo's -O2 -g. The
# SIMD leaves stay at -O2 (src/backend/cpu/x86/CMakeLists.txt says why). GCC for now: on the same
# (slow) evening of 2026-12-04 clang 14 compiled most files under ASan + UBSan in 0.6 to 0.9 of
# GCC's time (openai_protocol.cpp 52 s against 81, http_server.cpp 71 against 110) but
# matmul_avx2.cpp in 463 s against 188; moving to clang waits for that leaf's flags.
SANITIZER_BUILD := -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG"
# UBSan's vptr, null and alignment checks are left out of the ASan build: together they were a
# third of its compiling (on the 2-core Zen 3 of 2026-12-05, under ASan + UBSan: engine_flags.cpp
# 82 s with them, 44 s without; http_server.cpp 84 against 50; openai_protocol.cpp 62 against
# 48). What they would catch is caught there anyway or cannot happen unseen: a null dereference
# is a SEGV that ASan reports with its stack; the polymorphic objects' lifetimes are ASan's
# use-after-free checks; misaligned loads are legal on x86, and the parsers read file bytes with
# memcpy. The null-argument checks (a null memcpy source) and the integer, shift, bounds and
# enum checks stay, and the fuzz build (scripts/fuzz) keeps every UBSan check.
ASAN_SKIP := vptr,null,alignment
ASAN_SLOW_TESTS := FastKernels\.TinyLlamaShapedLogitsMatchScalarKernels|Determinism\.DummyQ8GroupOf8|Determinism\.DummyQwen3MoeQ4_0|TensorParallelModel\.TinyLlamaShapedLogitsMatchOneRank|Engine\.PrefixCachingAndPreemptionAt32kTokens
ASAN_TARGETS := loader_test quant_test tokenizer_test chat_template_test openai_protocol_test output_parsers_test server_test \
  structured_test pagoda \
  cpu_simd_kernels_test $(FUZZ_TARGETS) $(ASAN_UNIT_TESTS)
test-asan: setup
	cmake -S . -B $(ASAN_DIR) -G Ninja $(SANITIZER_BUILD) -DPAGODA_WERROR=ON \
	  -DPAGODA_SANITIZE=address,undefined -DPAGODA_SANITIZE_SKIP=$(ASAN_SKIP) $(CMAKE_FLAGS)
	cmake --build $(ASAN_DIR) -j $(JOBS) --target $(ASAN_TARGETS)
	ctest --test-dir $(ASAN_DIR) -j $(JOBS) --no-tests=error --output-on-failure --timeout 600 \
	  -L '^(untrusted-input|kernels|$(subst $(space),|,$(strip $(ASAN_UNIT_TESTS))))$$' -E '^($(ASAN_SLOW_TESTS))$$'

# The tests whose code runs on several threads (thread pools, the engine's threads, the server's
# I/O and engine threads, the server binary they start) under ThreadSanitizer; a race report
# stops the process (halt_on_error) and fails the test. Left out, for Release and ASan to run: one
# server test that times work TSan slows ten-fold (a 1.1B dummy load within 60 s), and the tests of
# a rank that dies or hangs, whose threads are those of the tests of a working parallel server
# (TSAN_SKIP; each loads the slow model into two ranks: 37 to 49 s each under TSan), and the 32k
# engine test (minutes of attention; its threads are the other engine tests').
TSAN_TARGETS := base_test cpu_thread_pool_test engine_test server_test pagoda
TSAN_SKIP := Server\.HealthIs503WhileLoading|Server\..*(RankKilled|ReplicaKilled|Hung).*|Engine\.PrefixCachingAndPreemptionAt32kTokens
test-tsan: setup
	cmake -S . -B $(TSAN_DIR) -G Ninja $(SANITIZER_BUILD) -DPAGODA_WERROR=ON \
	  -DPAGODA_SANITIZE=thread $(CMAKE_FLAGS)
	cmake --build $(TSAN_DIR) -j $(JOBS) --target $(TSAN_TARGETS)
	TSAN_OPTIONS=halt_on_error=1 ctest --test-dir $(TSAN_DIR) -j $(JOBS) --no-tests=error \
	  --output-on-failure --timeout 600 -R '^(ThreadPool|CpuThreadPool|Engine|Server)\.' -E '^($(TSAN_SKIP))$$'

# Every fuzz target for FUZZ_SECONDS (ASan + UBSan, clang's libFuzzer), two at a time; see
# fuzz/README.md. `make test` runs them for TEST_FUZZ_SECONDS each (test-fuzz): half a minute,
# to keep CI within its 50 minutes on 2 cores (docs/reliability.md).
FUZZ_SECONDS ?= 60
TEST_FUZZ_SECONDS ?= 30
fuzz: setup
	FUZZ_SECONDS=$(FUZZ_SECONDS) JOBS=$(JOBS) scripts/fuzz $(FUZZ_TARGETS)
test-fuzz: FUZZ_SECONDS = $(TEST_FUZZ_SECONDS)
test-fuzz: fuzz

# A mixed workload against `pagoda serve` for DURATION seconds, every request accounted for; the
# report (ledger, /metrics, RSS / fds / threads over time) goes to SOAK_REPORT as JSON.
DURATION ?= 600
SOAK_REPORT ?= $(BUILD_DIR)/soak-report.json
soak: build
	SOAK_SECONDS=$(DURATION) SOAK_REPORT=$(SOAK_REPORT) PAGODA_BINARY=$(PAGODA) node tests/soak/soak.mjs

# npm packages of the client-side server tests, from the committed package-lock.json.
npm-deps: setup
	@(cd tests/server && for p in openai ajv ajv-formats zod; do [ -d node_modules/$$p ] || exit 1; done) || \
	  (cd tests/server && npm ci --no-audit --no-fund)

# DESTDIR=/some/root stages the files there instead (as packagers do).
install: build
	cmake --install $(BUILD_DIR) --prefix $(PREFIX)

# packaging/CMakeLists.txt says what the package holds; docs/deployment.md how to run it.
deb: build
	cd $(BUILD_DIR) && cpack -G DEB -B packages
	@ls $(BUILD_DIR)/packages/*.deb

clean:
	rm -rf build
