# collie — one non-recursive Makefile.
#
#   make                 library (build/lib/libcollie.{so,a}), tools, examples, plugins;
#                        needs only libevent's and libcrypto's headers
#   make install         into $(DESTDIR)$(PREFIX) (default /usr/local); make uninstall
#   make tests           the test programs (needs cmocka too)
#   make run             the demo: several local ranks doing non-blocking work
#   make test            format, layer and size checks, the suite, the fault suite, the suite under
#                        ASan+UBSan, engine/work/store/fault tests under TSan
#   make test-faults     the fault suite alone (test_faults, test_trace)
#   make test-fuzz       the fuzz targets' short run (committed corpus and crash inputs, then
#                        a few seconds of fuzzing each); make fuzz SECONDS=N [FUZZ_TARGET=x]
#                        for long runs, make fuzz-merge to keep what they found (docs/fuzzing.md)
#   make test-chaos      the chaos harness's fixed-seed runs (docs/chaos.md; part of make test)
#   make chaos SECONDS=N a random chaos campaign of about N seconds (default 60; ASAN=1 too)
#   make valgrind        the suite under valgrind (by hand; slow)
#   make python          the torch backend's extension (when torch's headers are there)
#   make test-python     the Python package and torch backend tests, PyTorch's suite (curated)
#   make test-torch      PyTorch's whole distributed suite, gloo and collie side by side (long):
#                        torch 1.13's, then torch 2.x's when build/torch2-venv is there
#   make torch2-venv     build/torch2-venv: torch 2.x from PyPI, pinned (docs/torch2.md)
#   make torch2          the torch backend's extension for that torch 2.x (build/torch2/_C.so)
#   make test-torch2     the torch 2.x stage of make test: builds the venv and the extension
#                        when missing, runs tests/python/test_torch2*.py and a curated torch 2.x suite
#   make test-torch2-suite  torch 2.x's whole distributed suite, gloo and collie side by side,
#                        gates by backend name as shipped and opened (long; build/torch-suite/torch2)
#
# Knobs: DEBUG=1 (-O0 -g3), ASAN=1 (address+undefined sanitizers, into
# build/asan), TSAN=1 (thread sanitizer, into build/tsan), CUDA_HOME
# (default /usr/local/cuda), WITH_NCCL=auto|0|1.

CC        ?= gcc
CUDA_HOME ?= /usr/local/cuda
WITH_NCCL ?= auto

ifeq ($(ASAN),1)
  BUILD   ?= build/asan
  SANFLAGS = -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
  OPTFLAGS = -O1 -g
else ifeq ($(TSAN),1)
  BUILD   ?= build/tsan
  SANFLAGS = -fsanitize=thread
  OPTFLAGS = -O1 -g
else ifeq ($(DEBUG),1)
  BUILD   ?= build/debug
  OPTFLAGS = -O0 -g3
else
  BUILD   ?= build
  OPTFLAGS = -O2 -g
endif

CFLAGS_ALL = -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -fPIC -pthread \
             -fvisibility=hidden -I include -I . $(OPTFLAGS) $(SANFLAGS) $(CFLAGS)
LDFLAGS_ALL = -pthread $(SANFLAGS) $(LDFLAGS)
LIBS       = -levent -lcrypto
TEST_LIBS  = -lcmocka

# The version comes from the public header; the soname carries the major.
VERSION   := $(shell awk '/^\#define COLLIE_VERSION_(MAJOR|MINOR|PATCH) /{v = v s $$3; s = "."} \
                          END {print v}' include/collie.h)
SOVERSION := $(firstword $(subst ., ,$(VERSION)))

# ---- sources ----------------------------------------------------------------
CORE_SRC := $(wildcard engine/*.c work/*.c store/*.c comm/*.c transports/*.c transports/cpu/*.c \
              transports/cpu/shm/*.c)
CORE_OBJ := $(CORE_SRC:%.c=$(BUILD)/obj/%.o)
TOOLS    := $(patsubst tools/collie_%.c,$(BUILD)/bin/collie-%,$(wildcard tools/collie_*.c))
EXAMPLES := $(patsubst examples/%.c,$(BUILD)/examples/%,$(wildcard examples/*.c)) \
            $(patsubst examples/cxx/%.cpp,$(BUILD)/examples/cxx/%,$(wildcard examples/cxx/*.cpp))
TESTS    := $(patsubst tests/test_%.c,$(BUILD)/tests/test_%,$(wildcard tests/test_*.c))
TEST_HELPERS_SRC := $(filter-out tests/test_%.c,$(wildcard tests/*.c))
TEST_HELPERS_OBJ := $(TEST_HELPERS_SRC:%.c=$(BUILD)/obj/%.o)
DUMMY_OBJ    := $(patsubst %.c,$(BUILD)/obj/%.o,$(wildcard examples/dummy_backend/*.c))
TEST_PLUGINS := $(patsubst tests/plugins/%_plugin.c,$(BUILD)/tests/plugins/libcollie_%.so,\
                  $(wildcard tests/plugins/*_plugin.c))

LIB_A       := $(BUILD)/lib/libcollie.a
LIB_SO_REAL := $(BUILD)/lib/libcollie.so.$(VERSION)
LIB_SO      := $(BUILD)/lib/libcollie.so

# Missing Debian packages are installed (as root) before anything compiles:
# the library needs only libevent's and libcrypto's headers (the tools
# jansson's too), the tests cmocka, clang-format, python3, iproute2,
# pkg-config and jq as well, the fuzz targets clang-14 and libclang-rt-14-dev.
STAMP_DIR       ?= build
DEPS_STAMP      := $(STAMP_DIR)/.deps-build-ok
DEPS_TEST_STAMP := $(STAMP_DIR)/.deps-test-ok

.PHONY: all lib tools examples tests plugins test-plugins run test fresh-root bench-mac bench-mpi \
        test-normal test-faults test-asan test-tsan test-tsan-long format format-check valgrind clean \
        nccl-check deps deps-test \
        check-layers check-size check-backends gpu-kit install uninstall python test-python test-torch \
        torch2-venv torch2 test-torch2 test-torch2-suite test-torch211 \
        fuzz-build test-fuzz fuzz fuzz-merge fuzz-seeds test-chaos chaos

all: lib tools examples plugins python

lib: $(LIB_A) $(LIB_SO)
tools: $(TOOLS)
examples: $(EXAMPLES)
tests: $(TESTS) plugins test-plugins

deps: $(DEPS_STAMP)
$(DEPS_STAMP): scripts/deps.sh
	@scripts/deps.sh build
	@mkdir -p $(@D) && touch $@
deps-test: $(DEPS_TEST_STAMP)
$(DEPS_TEST_STAMP): scripts/deps.sh
	@scripts/deps.sh test
	@mkdir -p $(@D) && touch $@

$(BUILD)/obj/%.o: %.c | $(DEPS_STAMP)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_ALL) -MMD -MP -c $< -o $@

# the tests' objects (the more specific pattern wins) need cmocka's header
$(BUILD)/obj/tests/%.o: tests/%.c | $(DEPS_STAMP) $(DEPS_TEST_STAMP)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_ALL) -MMD -MP -c $< -o $@

$(LIB_A): $(CORE_OBJ)
	@mkdir -p $(@D)
	rm -f $@ && ar rcs $@ $^

# The shared library exports only the COLLIE_API (visibility default)
# symbols. The build tree has the links an install has: libcollie.so.0 (the
# soname, what programs load) and libcollie.so (what -lcollie finds).
$(LIB_SO_REAL): $(CORE_OBJ)
	@mkdir -p $(@D)
	$(CC) -shared -Wl,-soname,libcollie.so.$(SOVERSION) $(LDFLAGS_ALL) -o $@ $^ $(LIBS)
$(LIB_SO): $(LIB_SO_REAL)
	ln -sf $(notdir $<) $(@D)/libcollie.so.$(SOVERSION)
	ln -sf $(notdir $<) $@

# Plugins (collie-bench --backend nccl) need no -rdynamic: they reach the
# core only through its services table (backend ABI 3).
# what several tools share (reading a --token-file) lives in tools/common/
TOOLS_COMMON_OBJ := $(patsubst %.c,$(BUILD)/obj/%.o,$(wildcard tools/common/*.c))
$(BUILD)/bin/collie-%: $(BUILD)/obj/tools/collie_%.o $(TOOLS_COMMON_OBJ) $(LIB_A)
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS_ALL) -o $@ $(filter %.o,$^) $(LIB_A) $(LIBS) $(TOOL_LIBS)
# collie-bench's parts (command line, check data, posting, the table, a rank's setup) live in tools/bench/
BENCH_OBJ := $(patsubst %.c,$(BUILD)/obj/%.o,$(wildcard tools/bench/*.c))
$(BUILD)/bin/collie-bench $(BUILD)/gpu-kit/bin/collie-bench: $(BENCH_OBJ)
# collie-run's parts (command line, environment, spawning, output, setup, --stats) live in tools/run/
RUN_OBJ := $(patsubst %.c,$(BUILD)/obj/%.o,$(wildcard tools/run/*.c))
$(BUILD)/bin/collie-run $(BUILD)/gpu-kit/bin/collie-run: $(RUN_OBJ)
# the tools that read JSON (dumps, stats) use Debian's jansson
$(BUILD)/bin/collie-trace $(BUILD)/bin/collie-run: TOOL_LIBS = -ljansson

$(BUILD)/examples/%: $(BUILD)/obj/examples/%.o $(LIB_A)
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS_ALL) -o $@ $< $(LIB_A) $(LIBS)

# The C++ example: collie.h from C++17, with RAII wrappers of its own.
$(BUILD)/examples/cxx/%: examples/cxx/%.cpp $(LIB_A) $(wildcard include/collie*.h) | $(DEPS_STAMP)
	@mkdir -p $(@D)
	$(CXX) -std=c++17 -Wall -Wextra -Werror -pthread $(SANFLAGS) -I include -o $@ $< \
	  $(LDFLAGS_ALL) $(LIB_A) $(LIBS)

# Tests link the static library so they can reach internal cl_* functions.
# No -rdynamic: the plugins they load link no core symbol.
$(BUILD)/tests/test_%: $(BUILD)/obj/tests/test_%.o $(TEST_HELPERS_OBJ) $(LIB_A)
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS_ALL) -o $@ $< $(TEST_HELPERS_OBJ) $(LIB_A) $(LIBS) $(TEST_LIBS)

# The chaos harness's rank program (tests/chaos, issue 29; docs/chaos.md): a
# user of the public API only, built with the tests (and into build/asan,
# build/tsan with ASAN=1 / TSAN=1).
CHAOS_OBJ  := $(patsubst %.c,$(BUILD)/obj/%.o,$(wildcard tests/chaos/*.c))
CHAOS_RANK := $(BUILD)/tests/chaos/chaos_rank
tests: $(CHAOS_RANK)
$(CHAOS_RANK): $(CHAOS_OBJ) $(LIB_A)
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS_ALL) -o $@ $(CHAOS_OBJ) $(LIB_A) $(LIBS) -lm

# The same plugin host linked statically and against libcollie.so
# (test_backend runs both): a plugin must load into either.
PLUGIN_HOSTS := $(BUILD)/tests/plugin_host_static $(BUILD)/tests/plugin_host_shared
$(BUILD)/tests/plugin_host_static: $(BUILD)/obj/tests/hosts/plugin_host.o $(LIB_A)
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS_ALL) -o $@ $< $(LIB_A) $(LIBS)
$(BUILD)/tests/plugin_host_shared: $(BUILD)/obj/tests/hosts/plugin_host.o $(LIB_SO)
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS_ALL) -o $@ $< -L$(BUILD)/lib -lcollie -Wl,-rpath,'$$ORIGIN/../lib' $(LIBS)

# Backend plugins (docs/design.md §5): the example backend in lib/, the broken ones
# the tests need in tests/plugins/. They do not link libcollie and reference
# no core symbol: the core's services table is all they use.
plugins: $(BUILD)/lib/libcollie_dummy.so
test-plugins: $(TEST_PLUGINS) $(PLUGIN_HOSTS)

$(BUILD)/lib/libcollie_dummy.so: $(DUMMY_OBJ)
	@mkdir -p $(@D)
	$(CC) -shared $(LDFLAGS_ALL) -o $@ $^

$(BUILD)/tests/plugins/libcollie_%.so: $(BUILD)/obj/tests/plugins/%_plugin.o
	@mkdir -p $(@D)
	$(CC) -shared $(LDFLAGS_ALL) -o $@ $<

# libcollie_needslib.so links a library kept off every search path at run
# time: loading it fails the way a plugin whose libnccl.so.2 is missing does.
$(BUILD)/tests/plugins/absent/libcltest_absent.so: tests/plugins/absent/absent.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_ALL) -shared -o $@ $<

$(BUILD)/tests/plugins/libcollie_needslib.so: $(BUILD)/obj/tests/plugins/needslib_plugin.o \
		$(BUILD)/tests/plugins/absent/libcltest_absent.so
	@mkdir -p $(@D)
	$(CC) -shared $(LDFLAGS_ALL) -o $@ $< -L$(BUILD)/tests/plugins/absent -lcltest_absent

# keep objects of pattern chains (tests, tools) instead of deleting them
.SECONDARY:

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)

# ---- Python -------------------------------------------------------------------
# python/collie is plain Python over ctypes (nothing to build). Its torch
# backend (collie.torch) has one C++ file, built here when Debian's torch
# headers and pybind11 are installed (python3-torch, libtorch-dev,
# pybind11-dev; `make test` installs them), into build/python/_C.so.
PYTHON    ?= /usr/bin/python3
TORCH_DIR ?= /usr/lib/python3/dist-packages/torch
TORCH_EXT := $(BUILD)/python/_C.so
TORCH_SRC := python/collie/torch/process_group_collie.cpp
HAVE_TORCH := $(and $(wildcard $(TORCH_DIR)/include/torch/extension.h),\
                    $(wildcard /usr/include/pybind11/pybind11.h),$(filter build,$(BUILD)))

ifneq ($(HAVE_TORCH),)
python: $(TORCH_EXT)
else
python:
	@echo "collie: the torch backend is not built (needs python3-torch, libtorch-dev, pybind11-dev)"
endif

$(TORCH_EXT): $(TORCH_SRC) $(wildcard python/collie/torch/*.h) $(wildcard include/collie*.h) \
              scripts/torch_flags.py $(LIB_SO)
	@mkdir -p $(@D)
	@# a failing helper stops the build with its own message
	flags=$$($(PYTHON) scripts/torch_flags.py) || { echo "collie: scripts/torch_flags.py failed:" \
	  "the torch extension cannot be built (see its error above)" >&2; exit 1; }; \
	$(CXX) -std=c++17 -O2 -shared -fPIC -Wall -Wextra -Werror -Wno-unused-parameter -I include \
	  -o $@ $(TORCH_SRC) -L$(BUILD)/lib -lcollie -Wl,-rpath,'$$ORIGIN/../lib' $$flags

# ---- torch 2.x ----------------------------------------------------------------
# A virtual environment with torch 2.x from PyPI beside Debian's torch 1.13
# (docs/torch2.md): build/torch2-venv, made with Debian's /usr/bin/python3,
# every package pinned with its hash in scripts/torch2-requirements.txt (a
# CUDA build, about 3 GB of wheels, 5 GB installed; it runs on the CPU).
# The wheels are kept in ~/.cache/collie/wheels (COLLIE_WHEELS), outside the
# tree, so another clone or a rebuild installs them without downloading;
# pip's own cache (~/.cache/pip) stays empty behind a proxy that strips
# cache headers, as this machine's does.
TORCH2_VENV := build/torch2-venv
TORCH2_REQ  := scripts/torch2-requirements.txt

torch2-venv: $(TORCH2_VENV)/.ok
$(TORCH2_VENV)/.ok: $(TORCH2_REQ) scripts/torch2-venv.sh | $(DEPS_TEST_STAMP)
	scripts/torch2-venv.sh $(TORCH2_VENV) $(TORCH2_REQ)

# collie.torch's extension for that torch: the same source as the 1.13 one
# (python/collie/torch/compat.h holds the differences), into build/torch2/_C.so;
# collie.torch picks it when the importing torch is 2.x. TORCH2_PYTHON may
# name another Python whose torch is 2.x (a GPU machine's, without the venv).
# C++20: torch 2.15's headers require it (2.11's take C++17 or later).
TORCH2_PYTHON ?= $(TORCH2_VENV)/bin/python
TORCH2_EXT    := build/torch2/_C.so
torch2: $(TORCH2_EXT)
$(TORCH2_EXT): $(TORCH_SRC) $(wildcard python/collie/torch/*.h) $(wildcard include/collie*.h) \
               scripts/torch_flags.py $(LIB_SO) $(if $(filter $(TORCH2_VENV)/%,$(TORCH2_PYTHON)),$(TORCH2_VENV)/.ok)
	@mkdir -p $(@D)
	flags=$$($(TORCH2_PYTHON) scripts/torch_flags.py) || { echo "collie: scripts/torch_flags.py failed" \
	  "under $(TORCH2_PYTHON): the torch 2.x extension cannot be built (see its error above)" >&2; \
	  exit 1; }; \
	$(CXX) -std=c++20 -O2 -shared -fPIC -Wall -Wextra -Werror -Wno-unused-parameter -I include \
	  -o $@ $(TORCH_SRC) -L$(BUILD)/lib -lcollie -Wl,-rpath,'$$ORIGIN/../lib' $$flags

# make test's torch 2.x stage (scripts/torch2-stage.sh): the venv and the
# extension built when missing (a venv that cannot be had is one skip that
# says why; COLLIE_TORCH2=0 skips it), tests/python/test_torch2*.py (Debian's
# pytest, ranks under the venv's Python), then tests/torch_suite/curated2.txt
# of torch 2.x's own suite under the venv's Python.
test-torch2: all $(DEPS_TEST_STAMP)
	@scripts/torch2-stage.sh

# torch 2.11 (the lent GPU machines' version, which has no registry) on the
# CPU here: a venv of its own (scripts/torch211-requirements.txt, another
# 3 GB of wheels), the extension built against it into build/torch211, and
# collie.torch's torch 2.x tests run under it. Not in make test.
TORCH211_VENV := build/torch211-venv
test-torch211: all $(DEPS_TEST_STAMP)
	@$(MAKE) --no-print-directory torch2-venv TORCH2_VENV=$(TORCH211_VENV) \
	  TORCH2_REQ=scripts/torch211-requirements.txt
	@$(MAKE) --no-print-directory torch2 TORCH2_VENV=$(TORCH211_VENV) \
	  TORCH2_PYTHON=$(TORCH211_VENV)/bin/python TORCH2_EXT=build/torch211/_C.so
	@COLLIE_TORCH2_PYTHON=$(TORCH211_VENV)/bin/python COLLIE_TORCH_EXT=$(CURDIR)/build/torch211/_C.so \
	  scripts/run-pytest.sh torch211 tests/python/test_torch2*.py

# ---- running ----------------------------------------------------------------
DEMO_RANKS ?= 4
run: all
	$(BUILD)/bin/collie-run -n $(DEMO_RANKS) -- $(BUILD)/examples/demo

# TSan runs the tests of the modules with the most cross-thread logic.
# The two longest under TSan (the NCCL double, 100 s; shm single copy, 70 s)
# run in `make test-tsan-long`, outside `make test` (its 25-minute aim);
# `make test` runs both under the normal build and ASan.
TSAN_TESTS ?= engine work cq store coll collv p2p comm faults shm_ring shm assist backend shrink grow
TSAN_LONG_TESTS ?= nccl shm_copy

# The fault suite: multi-process kills, hangs, network cuts,
# policies, abort races, abort/re-create cycles, the store dying, the
# recovery example under collie-run (all in test_faults), and collie-trace.
# `make test` runs it after the normal suite; ASan and TSan runs include it
# (reduced by CLTEST_QUICK).
FAULT_TESTS := $(BUILD)/tests/test_faults $(BUILD)/tests/test_trace

# Every stage runs even when an earlier one failed, so one run shows every
# failure; the summary then repeats each failed test's own lines
# (build/test-results/failures.log) above the counts, where a log's tail
# (CI's) shows them.
TEST_STAGES := format-check check-layers check-size check-backends test-normal test-faults \
	test-fuzz test-chaos test-asan test-tsan test-python test-torch2

test:
	@rm -rf build/test-results
	@status=0; for stage in $(TEST_STAGES); do \
	  $(MAKE) --no-print-directory $$stage || { status=1; \
	    mkdir -p build/test-results; echo "stage $$stage failed" >> build/test-results/failed-stages; }; \
	done; \
	scripts/test-summary.sh build/test-results || status=1; exit $$status

# The default CPU backend puts same-host peers on shared memory, so the
# suites run the shm link; the collective suites run again forced onto TCP.
TCP_LEG_TESTS := coll collv p2p

test-normal: all tests
	@scripts/run-tests.sh normal $(BUILD) $(filter-out $(FAULT_TESTS),$(TESTS))
	@COLLIE_CPU_TRANSPORT=tcp scripts/run-tests.sh normal-tcp $(BUILD) \
	  $(patsubst %,$(BUILD)/tests/test_%,$(TCP_LEG_TESTS))

test-faults: all tests
	@scripts/run-tests.sh faults $(BUILD) $(FAULT_TESTS)

# The chaos harness (docs/chaos.md): tests/chaos/chaos.py drives ranks of
# $(BUILD)/tests/chaos/chaos_rank under collie-run. test-chaos runs its
# fixed seeds through scripts/run-tests.sh (tests/chaos/test_chaos prints the
# runner's lines; at most 2 minutes); `make chaos SECONDS=N` a campaign of
# random runs (a run started before N s ends, so it may overrun by one run).
CHAOS_DEPS := all tests $(BUILD)/tests/chaos/chaos_rank
test-chaos: $(CHAOS_DEPS)
	@scripts/run-tests.sh chaos $(BUILD) tests/chaos/test_chaos

chaos: $(CHAOS_DEPS)
	/usr/bin/python3 tests/chaos/chaos.py --build $(BUILD) --seconds $(or $(SECONDS),60)

# The Python package and the torch backend (pytest; tests/python), then the
# curated part of PyTorch's own distributed suite with BACKEND=collie, and
# test_c10d_common.py's plugin tests (fetched from the source package; they
# skip, saying why, where that cannot be had).
test-python: all $(DEPS_TEST_STAMP)
	@scripts/run-pytest.sh python tests/python --ignore-glob='tests/python/test_torch2*' -k 'not torch2'
	@scripts/torch-src.sh build/torch-src test/distributed/test_c10d_common.py || true
	@scripts/run-pytest.sh c10d-common tests/torch_suite/c10d_suite.py
	@scripts/run-pytest.sh torch-suite $(addprefix tests/torch_suite/dist_suite.py::TestDistBackendWithSpawn::,\
	  $(shell grep -v '^\#' tests/torch_suite/curated.txt))

# ---- fuzzing ------------------------------------------------------------------
# Coverage-guided libFuzzer targets for what a hostile peer can send
# (docs/fuzzing.md): every tests/fuzz/fuzz_<t>.c is a target (adding one is
# adding the file), linked with -fsanitize=fuzzer against the library
# compiled by clang-14 with -fsanitize=fuzzer-no-link and ASan+UBSan into
# build/fuzz (libclang-rt-14-dev has the runtime; scripts/deps.sh test
# installs both). Seeds: tests/fuzz/corpus/<t>; crash inputs, kept as
# regression inputs: tests/fuzz/crashes/<t>.
FUZZ_CC      ?= clang-14
FUZZ_DIR     := build/fuzz
FUZZ_CFLAGS  := -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -pthread -I include -I . -O1 -g \
                -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all
FUZZ_TARGETS := $(patsubst tests/fuzz/fuzz_%.c,%,$(wildcard tests/fuzz/fuzz_*.c))
FUZZ_BINS    := $(FUZZ_TARGETS:%=$(FUZZ_DIR)/fuzz_%)
FUZZ_LIB     := $(FUZZ_DIR)/libcollie.a
FUZZ_RUN     := $(if $(FUZZ_TARGET),$(FUZZ_TARGET),$(FUZZ_TARGETS))

$(FUZZ_DIR)/obj/%.o: %.c | $(DEPS_STAMP) $(DEPS_TEST_STAMP)
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -MMD -MP -c $< -o $@
$(FUZZ_LIB): $(CORE_SRC:%.c=$(FUZZ_DIR)/obj/%.o)
	rm -f $@ && ar rcs $@ $^
$(FUZZ_DIR)/fuzz_%: tests/fuzz/fuzz_%.c $(FUZZ_LIB) | $(DEPS_TEST_STAMP)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer -MMD -MP -o $@ $< $(FUZZ_LIB) $(LIBS)
-include $(shell find $(FUZZ_DIR) -name '*.d' 2>/dev/null)

fuzz-build: $(FUZZ_BINS)
# make test's stage: at most ~60 s for all targets together
test-fuzz: fuzz-build
	@scripts/run-fuzz.sh short $(FUZZ_DIR) $(FUZZ_RUN)
# make fuzz SECONDS=N [FUZZ_TARGET=x]: N seconds in all, shared by the targets
fuzz: fuzz-build
	@FUZZ_SECONDS=$(or $(SECONDS),600) scripts/run-fuzz.sh long $(FUZZ_DIR) $(FUZZ_RUN)
fuzz-merge: fuzz-build
	@scripts/run-fuzz.sh merge $(FUZZ_DIR) $(FUZZ_RUN)
fuzz-seeds: fuzz-build
	@scripts/run-fuzz.sh seeds $(FUZZ_DIR) $(FUZZ_RUN)

# bench/mpi_bench.c: collie-bench's rows on MPI, bench/peers.sh's MPI peer,
# built with mpicc.openmpi or mpicc.mpich (build/bench/mpi_bench_openmpi,
# build/bench/mpi_bench_mpich; libopenmpi-dev, libmpich-dev). It links
# collie-bench's parts (tools/bench/) but the two that post on collie, and
# posts on MPI itself. make bench-mpi builds those whose mpicc is installed.
MPI_BENCH_OBJ := $(filter-out %/bench_post.o %/bench_rank.o,$(BENCH_OBJ))
MPI_FLAVOURS  := $(strip $(foreach m,openmpi mpich,$(if $(shell command -v mpicc.$(m)),$(m))))
$(BUILD)/bench/mpi_bench_%: bench/mpi_bench.c $(MPI_BENCH_OBJ) $(LIB_A) | $(DEPS_STAMP)
	@mkdir -p $(@D)
	mpicc.$* $(CFLAGS_ALL) -o $@ $< $(MPI_BENCH_OBJ) $(LIB_A) $(LIBS)
bench-mpi: $(MPI_FLAVOURS:%=$(BUILD)/bench/mpi_bench_%)
	@$(if $(MPI_FLAVOURS),:,echo "bench-mpi: neither mpicc.openmpi nor mpicc.mpich is installed" \
	  "(libopenmpi-dev, libmpich-dev)")

# The keyed MACs libcrypto offers, side by side (chose the TCP frame MAC).
bench-mac: $(BUILD)/bench/mac_bench
	@$(BUILD)/bench/mac_bench
$(BUILD)/bench/mac_bench: bench/mac_bench.c | $(DEPS_STAMP)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_ALL) -o $@ $< -lcrypto

# The README's two commands on a clean clone inside a fresh Debian 12 root
# (debootstrap minbase; long, root only): what the machines' image hides.
fresh-root:
	@scripts/fresh-root.sh $(FRESH_ROOT)

# PyTorch's whole distributed suite, gloo and collie side by side (long):
# torch 1.13's (scripts/torch-suite.sh), then torch 2.x's when the venv is
# there (test-torch2-suite: gated and opened, tests/torch_suite/harness.py).
test-torch: all $(DEPS_TEST_STAMP)
	@status=0; scripts/torch-suite.sh || status=1; \
	if [ -x $(TORCH2_VENV)/bin/python ]; then \
	  $(MAKE) --no-print-directory test-torch2-suite || status=1; \
	else echo "collie: no $(TORCH2_VENV) (make torch2-venv): torch 2.x's suite not run"; fi; \
	exit $$status

test-torch2-suite: all $(TORCH2_EXT) $(DEPS_TEST_STAMP)
	@scripts/torch-suite.sh 2

test-asan:
	$(MAKE) --no-print-directory ASAN=1 tests tools examples
	@CLTEST_QUICK=1 CLTEST_TIMEOUT_SCALE=3 ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  scripts/run-tests.sh asan build/asan $(patsubst %,build/asan/tests/test_%,$(notdir $(TESTS:$(BUILD)/tests/test_%=%)))
	@COLLIE_CPU_TRANSPORT=tcp CLTEST_QUICK=1 CLTEST_TIMEOUT_SCALE=3 ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	  UBSAN_OPTIONS=print_stacktrace=1 \
	  scripts/run-tests.sh asan-tcp build/asan $(patsubst %,build/asan/tests/test_%,$(TCP_LEG_TESTS))

test-tsan-long:
	$(MAKE) --no-print-directory TSAN=1 TSAN_TESTS="$(TSAN_LONG_TESTS)" TCP_LEG_TESTS= test-tsan

test-tsan:
	$(MAKE) --no-print-directory TSAN=1 $(patsubst %,build/tsan/tests/test_%,$(TSAN_TESTS)) tools \
	  plugins test-plugins build/tsan/examples/recovery
	@# gcc 12's TSan runtime can crash at start-up under this kernel's 28-bit
	@# mmap randomisation; running with ASLR off avoids it.
	@# die_after_fork=0: test_nccl's procs_double forks a rank (no exec) from
	@# a process with threads; the child only runs the double's calls.
	@CLTEST_WRAP="setarch $$(uname -m) -R" CLTEST_QUICK=1 CLTEST_TIMEOUT_SCALE=5 \
	  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 die_after_fork=0" \
	  scripts/run-tests.sh tsan build/tsan $(patsubst %,build/tsan/tests/test_%,$(TSAN_TESTS))
	@COLLIE_CPU_TRANSPORT=tcp CLTEST_WRAP="setarch $$(uname -m) -R" CLTEST_QUICK=1 CLTEST_TIMEOUT_SCALE=5 \
	  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 die_after_fork=0" \
	  scripts/run-tests.sh tsan-tcp build/tsan $(patsubst %,build/tsan/tests/test_%,$(TCP_LEG_TESTS))

valgrind: all tests
	@for t in $(TESTS); do \
	  echo "== valgrind $$t"; \
	  valgrind --error-exitcode=1 --leak-check=full -q $$t || exit 1; \
	done

FORMAT_SRC = $(shell git ls-files '*.c' '*.h' 2>/dev/null || find . -name '*.[ch]' -not -path './build/*')
format:
	clang-format -i $(FORMAT_SRC)
# docs/hacking.md's Layers table, enforced (its self-test first: each way of
# breaking the table must be caught)
check-layers:
	@tests/layers/self_test.sh
	@scripts/check-layers.sh
# the backends (built-in and plugins) leave no symbol of the core undefined:
# they call it through the services table only
check-backends: lib plugins
	@scripts/check-backend-symbols.sh $(BUILD) $(filter $(BUILD)/obj/transports/%,$(CORE_OBJ))
# the size budget: files <= 700 lines, functions <= 80 (scripts/size-budget.txt
# lists today's overruns, which may only shrink)
check-size: $(DEPS_TEST_STAMP)
	@tests/size/self_test.sh
	@scripts/check-size.sh

format-check: $(DEPS_TEST_STAMP)
	@clang-format --dry-run --Werror $(FORMAT_SRC) && echo "format-check: ok"

# ---- NCCL -------------------------------------------------------------------
# WITH_NCCL=auto builds the NCCL pieces when $(CUDA_HOME) has nccl.h and
# libnccl; =1 fails loudly without them; =0 skips them.
HAVE_NCCL := $(shell test -f $(CUDA_HOME)/include/nccl.h && \
               ls $(CUDA_HOME)/lib64/libnccl.so* >/dev/null 2>&1 && echo 1)
ifeq ($(WITH_NCCL),1)
  ifneq ($(HAVE_NCCL),1)
    $(error WITH_NCCL=1 but nccl.h/libnccl.so were not found under CUDA_HOME=$(CUDA_HOME))
  endif
endif

# The NCCL transport plugin (transports/nccl, docs/design.md §7) and, for the tests
# only, the CPU double of the CUDA runtime and NCCL it is tested against
# (tests/cuda_double). Both join `plugins` (so `make` and `make tests` build
# them) when WITH_NCCL is not 0 and CUDA/NCCL were found. The core library
# never links CUDA; the plugin links the real libcudart/libnccl with a
# RUNPATH, which LD_LIBRARY_PATH overrides, so the tests can substitute the
# double (its version scripts give it the real libraries' symbol versions).
ifneq ($(WITH_NCCL),0)
ifeq ($(HAVE_NCCL),1)
NCCL_OBJ    := $(patsubst %.c,$(BUILD)/obj/%.o,$(wildcard transports/nccl/*.c))
NCCL_PLUGIN := $(BUILD)/lib/libcollie_nccl.so
DOUBLE_DIR  := $(BUILD)/tests/cuda_double
DOUBLE_LIBS := $(DOUBLE_DIR)/libcudart.so.13 $(DOUBLE_DIR)/libnccl.so.2 $(DOUBLE_DIR)/libcuda.so.1 \
               $(DOUBLE_DIR)/old/libnccl.so.2
DOUBLE_OBJ  := $(patsubst %.c,$(BUILD)/obj/%.o,$(wildcard tests/cuda_double/*.c)) \
               $(BUILD)/obj/tests/cuda_double/nccl_old.o

plugins: $(NCCL_PLUGIN)
test-plugins: $(DOUBLE_LIBS)

$(NCCL_OBJ) $(DOUBLE_OBJ): CFLAGS_ALL += -isystem $(CUDA_HOME)/include
# the double's exports are chosen by its version scripts
$(DOUBLE_OBJ): CFLAGS_ALL += -fvisibility=default

$(NCCL_PLUGIN): $(NCCL_OBJ)
	@mkdir -p $(@D)
	$(CC) -shared $(LDFLAGS_ALL) -o $@ $^ -L$(CUDA_HOME)/lib64 -lcudart -lnccl \
	  -Wl,-rpath,$(CUDA_HOME)/lib64 -Wl,--enable-new-dtags

$(DOUBLE_DIR)/libcudart.so.13: $(BUILD)/obj/tests/cuda_double/cudart.o tests/cuda_double/cudart.map
	@mkdir -p $(@D)
	$(CC) -shared $(LDFLAGS_ALL) -Wl,-soname,libcudart.so.13 \
	  -Wl,--version-script=tests/cuda_double/cudart.map -o $@ $<

# the driver call of the GPU kit's stream gate (cuStreamWaitValue32)
$(DOUBLE_DIR)/libcuda.so.1: $(BUILD)/obj/tests/cuda_double/cuda_driver.o $(DOUBLE_DIR)/libcudart.so.13
	$(CC) -shared $(LDFLAGS_ALL) -Wl,-soname,libcuda.so.1 -o $@ $< \
	  $(DOUBLE_DIR)/libcudart.so.13 -Wl,-rpath,'$$ORIGIN' -Wl,--enable-new-dtags

# the double reduces with collie's own kernels (transports/reduce.c)
$(DOUBLE_DIR)/libnccl.so.2: $(BUILD)/obj/tests/cuda_double/nccl.o \
    $(BUILD)/obj/tests/cuda_double/nccl_proc.o \
    $(BUILD)/obj/transports/reduce.o $(BUILD)/obj/engine/dtype.o \
    $(DOUBLE_DIR)/libcudart.so.13 tests/cuda_double/nccl.map
	$(CC) -shared $(LDFLAGS_ALL) -Wl,-soname,libnccl.so.2 \
	  -Wl,--version-script=tests/cuda_double/nccl.map -o $@ $(filter %.o,$^) \
	  $(DOUBLE_DIR)/libcudart.so.13 -Wl,-rpath,'$$ORIGIN' -Wl,--enable-new-dtags

# an NCCL older than 2.27 (no ncclCommShrink, no ncclCommRevoke), for the
# plugin's fallbacks: LD_LIBRARY_PATH=<double>/old:<double>
$(BUILD)/obj/tests/cuda_double/nccl_old.o: tests/cuda_double/nccl.c | $(DEPS_STAMP)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_ALL) -DCLTEST_NCCL_OLD -MMD -MP -c $< -o $@
$(DOUBLE_DIR)/old/libnccl.so.2: $(BUILD)/obj/tests/cuda_double/nccl_old.o \
    $(BUILD)/obj/tests/cuda_double/nccl_proc.o \
    $(BUILD)/obj/transports/reduce.o $(BUILD)/obj/engine/dtype.o \
    $(DOUBLE_DIR)/libcudart.so.13 tests/cuda_double/nccl.map
	@mkdir -p $(@D)
	$(CC) -shared $(LDFLAGS_ALL) -Wl,-soname,libnccl.so.2 \
	  -Wl,--version-script=tests/cuda_double/nccl.map -o $@ $(filter %.o,$^) \
	  $(DOUBLE_DIR)/libcudart.so.13 -Wl,-rpath,'$$ORIGIN/..' -Wl,--enable-new-dtags

# The GPU verification kit (gpu-kit): a folder to carry to a CUDA host
# (run.sh REPORT_DIR there). collie-gpucheck links libcollie, libevent and
# libcrypto statically (the host may lack them; the tools jansson too); the CUDA runtime travels
# with it; NCCL is the host's (run.sh finds it). `plugins` builds it, so
# `make test` keeps it from rotting and test_gpukit runs it on the double.
GPU_KIT := $(BUILD)/gpu-kit
GPU_KIT_FILES := $(GPU_KIT)/bin/collie-gpucheck $(GPU_KIT)/run.sh $(GPU_KIT)/README.md \
                 $(GPU_KIT)/bin/collie-run $(GPU_KIT)/bin/collie-bench \
                 $(GPU_KIT)/lib/libcollie_nccl.so $(GPU_KIT)/lib/libcudart.so.13
gpu-kit: $(GPU_KIT_FILES)
	@du -sh $(GPU_KIT) | awk '{print "gpu-kit: " $$2 " (" $$1 ")"}'
ifeq ($(SANFLAGS),)
test-plugins: $(GPU_KIT_FILES)
endif

# collie-gpucheck: main in gpu_check.c, its parts beside it (gpu_check.h lists them)
GPUCHECK_OBJ := $(patsubst %.c,$(BUILD)/obj/%.o,$(wildcard gpu-kit/*.c))
$(GPU_KIT)/bin/collie-gpucheck: $(GPUCHECK_OBJ) $(LIB_A)
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS_ALL) -o $@ $(GPUCHECK_OBJ) $(LIB_A) -Wl,-Bstatic -levent -lcrypto -Wl,-Bdynamic -ldl
$(GPU_KIT)/bin/collie-%: $(BUILD)/obj/tools/collie_%.o $(TOOLS_COMMON_OBJ) $(LIB_A)
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS_ALL) -o $@ $(filter %.o,$^) $(LIB_A) -Wl,-Bstatic -levent -lcrypto -ljansson \
	  -Wl,-Bdynamic -ldl
$(GPU_KIT)/run.sh: gpu-kit/run.sh
	@mkdir -p $(@D)
	cp $< $@
$(GPU_KIT)/README.md: gpu-kit/README.md
	@mkdir -p $(@D)
	cp $< $@
$(GPU_KIT)/lib/libcollie_nccl.so: $(NCCL_PLUGIN)
	@mkdir -p $(@D)
	cp $< $@
$(GPU_KIT)/lib/libcudart.so.13: $(CUDA_HOME)/lib64/libcudart.so.13
	@mkdir -p $(@D)
	cp -L $< $@
endif
endif

ifneq ($(HAVE_NCCL)$(filter 0,$(WITH_NCCL)),1)
gpu-kit:
	@echo "gpu-kit: needs CUDA and NCCL under CUDA_HOME=$(CUDA_HOME) (and WITH_NCCL not 0)"; exit 1
endif

# ---- installing ---------------------------------------------------------------
# make install [PREFIX=/usr/local] [LIBDIR=$(PREFIX)/lib] [DESTDIR=...]: the
# shared library with its soname and dev links, the static archive, the
# public headers, the plugins into $(LIBDIR)/collie (where libcollie looks
# for them, relative to itself, when COLLIE_PLUGIN_PATH is unset), the
# tools, the man pages and collie.pc. Nothing in the files depends on
# DESTDIR; only collie.pc names PREFIX.
PREFIX     ?= /usr/local
LIBDIR     ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
BINDIR     ?= $(PREFIX)/bin
MANDIR     ?= $(PREFIX)/share/man
PLUGINDIR  := $(LIBDIR)/collie
HEADERS    := include/collie.h include/collie_store.h include/collie_comm.h \
              include/collie_backend.h include/collie_cuda.h
MAN1       := $(wildcard docs/man/*.1)
MAN3       := $(wildcard docs/man/*.3)
INSTALL_PLUGINS := $(BUILD)/lib/libcollie_dummy.so $(NCCL_PLUGIN)
PC_FILE    := $(BUILD)/lib/pkgconfig/collie.pc
# what a backend plugin builds against: collie_backend.h (above) and the
# header-only base/ helpers, installed as <includedir>/collie/base/*.h and
# found through collie-backend.pc's -I<includedir>/collie
BASE_HEADERS := $(wildcard base/*.h)
PC_BACKEND := $(BUILD)/lib/pkgconfig/collie-backend.pc
# the Python package (Debian's layout: <prefix>/lib/python3/dist-packages)
PYDIR    ?= $(PREFIX)/lib/python3/dist-packages
PY_FILES := $(wildcard python/collie/*.py)

# written on every install (FORCE): they carry PREFIX and the other paths,
# which change from one `make install` to the next without any file changing
$(PC_FILE): FORCE
	@mkdir -p $(@D)
	printf '%s\n' 'prefix=$(PREFIX)' 'libdir=$(LIBDIR)' 'includedir=$(INCLUDEDIR)' \
	  'plugindir=$(PLUGINDIR)' '' 'Name: collie' \
	  'Description: non-blocking collective communication with a watchdog' \
	  'Version: $(VERSION)' 'Requires.private: libevent libcrypto' \
	  'Libs: -L$${libdir} -lcollie' 'Libs.private: -pthread -ldl' \
	  'Cflags: -I$${includedir}' > $@

# a plugin links no symbol of the core: no -lcollie
$(PC_BACKEND): FORCE
	@mkdir -p $(@D)
	printf '%s\n' 'prefix=$(PREFIX)' 'includedir=$(INCLUDEDIR)' 'plugindir=$(PLUGINDIR)' '' \
	  'Name: collie-backend' \
	  'Description: headers for collie backend plugins (collie_backend.h, base/)' \
	  'Version: $(VERSION)' 'Cflags: -I$${includedir} -I$${includedir}/collie' > $@

install: lib tools plugins $(PC_FILE) $(PC_BACKEND)
	install -d $(DESTDIR)$(LIBDIR) $(DESTDIR)$(PLUGINDIR) $(DESTDIR)$(LIBDIR)/pkgconfig \
	  $(DESTDIR)$(INCLUDEDIR) $(DESTDIR)$(BINDIR) $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(MANDIR)/man3
	install -m 755 $(LIB_SO_REAL) $(DESTDIR)$(LIBDIR)/
	ln -sf libcollie.so.$(VERSION) $(DESTDIR)$(LIBDIR)/libcollie.so.$(SOVERSION)
	ln -sf libcollie.so.$(VERSION) $(DESTDIR)$(LIBDIR)/libcollie.so
	install -m 644 $(LIB_A) $(DESTDIR)$(LIBDIR)/
	install -m 755 $(INSTALL_PLUGINS) $(DESTDIR)$(PLUGINDIR)/
	install -m 644 $(PC_FILE) $(PC_BACKEND) $(DESTDIR)$(LIBDIR)/pkgconfig/
	install -m 644 $(HEADERS) $(DESTDIR)$(INCLUDEDIR)/
	install -d $(DESTDIR)$(INCLUDEDIR)/collie/base
	install -m 644 $(BASE_HEADERS) $(DESTDIR)$(INCLUDEDIR)/collie/base/
	install -m 755 $(TOOLS) $(DESTDIR)$(BINDIR)/
	$(if $(MAN1),install -m 644 $(MAN1) $(DESTDIR)$(MANDIR)/man1/)
	$(if $(MAN3),install -m 644 $(MAN3) $(DESTDIR)$(MANDIR)/man3/)
	install -d $(DESTDIR)$(PYDIR)/collie/torch
	install -m 644 $(PY_FILES) $(DESTDIR)$(PYDIR)/collie/
	install -m 644 $(wildcard python/collie/torch/*.py) $(DESTDIR)$(PYDIR)/collie/torch/
	$(if $(wildcard $(TORCH_EXT)),install -m 755 $(TORCH_EXT) $(DESTDIR)$(PYDIR)/collie/torch/_C.so)
	$(if $(wildcard $(TORCH2_EXT)),install -m 755 $(TORCH2_EXT) $(DESTDIR)$(PYDIR)/collie/torch/_C_torch2.so)

.PHONY: FORCE
FORCE:

uninstall:
	rm -f $(DESTDIR)$(LIBDIR)/libcollie.so.$(VERSION) $(DESTDIR)$(LIBDIR)/libcollie.so.$(SOVERSION) \
	  $(DESTDIR)$(LIBDIR)/libcollie.so $(DESTDIR)$(LIBDIR)/libcollie.a \
	  $(DESTDIR)$(LIBDIR)/pkgconfig/collie.pc $(DESTDIR)$(LIBDIR)/pkgconfig/collie-backend.pc \
	  $(addprefix $(DESTDIR)$(INCLUDEDIR)/collie/base/,$(notdir $(BASE_HEADERS))) \
	  $(addprefix $(DESTDIR)$(PLUGINDIR)/,$(notdir $(INSTALL_PLUGINS))) \
	  $(addprefix $(DESTDIR)$(INCLUDEDIR)/,$(notdir $(HEADERS))) \
	  $(addprefix $(DESTDIR)$(BINDIR)/,$(notdir $(TOOLS))) \
	  $(addprefix $(DESTDIR)$(MANDIR)/man1/,$(notdir $(MAN1))) \
	  $(addprefix $(DESTDIR)$(MANDIR)/man3/,$(notdir $(MAN3)))
	rm -rf $(DESTDIR)$(PYDIR)/collie
	-rmdir $(DESTDIR)$(PLUGINDIR) $(DESTDIR)$(INCLUDEDIR)/collie/base $(DESTDIR)$(INCLUDEDIR)/collie 2>/dev/null

clean:
	rm -rf build
