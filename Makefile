# dynmo build. `make` builds build/dynmo; `make check` runs every test;
# `make demo` runs the main job; `make bench` the benchmarks;
# `make check-faults [TRIALS=20] [SEED=S]` the fault campaign (kill -9,
# full disk, read-only; not part of `make check`; mounts need root);
# `make fuzz` the libFuzzer harnesses (fuzz/), never part of `make check`.
# `make check-gpu` the CUDA backend on a GPU (docs/gpu.md); `make bench-gpu`
# the GPU benchmark beside PyTorch (docs/gpu-bench.md). `make device-bundle`
# dynmo and its libraries for a lent GPU machine (docs/gpu.md).
# Switches: SANITIZE=address,undefined  USE_CUDA=0/1 (CUDA_HOME, NCCL_HOME)  ARCH=...
#           FUZZ_RUNS=1000000 (executions per fuzz target)

SANITIZE ?=
USE_CUDA ?= 0
# /usr/local/cuda (NVIDIA's installer), else /usr (Debian's nvidia-cuda-toolkit)
CUDA_HOME ?= $(if $(wildcard /usr/local/cuda/bin/nvcc),/usr/local/cuda,/usr)
ARCH ?= -march=native
PKGS := mpich hdf5-mpich openblas cairo json-c zlib

ifeq ($(SANITIZE),)
BUILD ?= build
SANFLAGS :=
else
BUILD ?= build/sanitize
SANFLAGS := -fsanitize=$(SANITIZE) -fno-omit-frame-pointer
endif

HAVE_PKGS := $(shell pkg-config --exists $(PKGS) && echo yes)
ifneq ($(HAVE_PKGS),yes)
ifeq ($(filter deps demo check check-faults check-portable bench bench-gpu fuzz clean,$(MAKECMDGOALS)),)
$(error missing pkg-config packages (need: $(PKGS)); run `scripts/setup.sh` or `make check`)
endif
endif

CC := gcc
# -ffp-contract=off: GCC would otherwise fuse a * b + c into one FMA where
# the CPU has one, and which it fuses depends on the CPU (docs/architecture.md).
# FP_CONTRACT= builds the fused variant, for the benchmark that prices it.
FP_CONTRACT ?= -ffp-contract=off
# -Wno-psabi: GCC notes that 32-byte vector arguments (src/model/sparse.c's
# static helpers) pass differently without AVX; nothing crosses an ABI.
# -Wvla: no array on the stack is sized at run time (a size from the
# config, such as hash.buckets, once overflowed the stack).
CFLAGS := -std=gnu11 -O3 $(ARCH) -g -Wall -Wextra -Wvla -Werror -Wno-psabi -fno-fast-math $(FP_CONTRACT) \
          -Iinclude $(shell pkg-config --cflags $(PKGS) 2>/dev/null) $(SANFLAGS)
LDLIBS := $(shell pkg-config --libs $(PKGS) 2>/dev/null) -lhdf5_hl -lm -lpthread
LDFLAGS := $(SANFLAGS)

SRC := $(wildcard src/*/*.c src/*/*/*.c)
OBJ := $(patsubst src/%.c,$(BUILD)/obj/%.o,$(SRC))
LIBOBJ := $(filter-out $(BUILD)/obj/tools/main.o,$(OBJ))
TEST_SRC := $(wildcard tests/test_*.c)
TEST_BIN := $(patsubst tests/%.c,$(BUILD)/tests/%,$(TEST_SRC))
HEADERS := $(wildcard include/dynmo/*.h) $(wildcard src/*/*.h) $(wildcard checkpoint_schema/*.def)

# The fuzz targets (fuzz/fuzz_<target>.c). Their replays, built here by
# gcc with AddressSanitizer and UBSan on the harness and on the code it
# exercises, run the kept crash inputs in `make check`
# (tests/t_fuzz_regressions.sh); `make fuzz` builds them with clang's
# libFuzzer in build/fuzz.
FUZZ_TARGETS := config tokens costs ckpt runlog
SANITIZE_ALL := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
REPLAY_CFLAGS := -std=gnu11 -O1 -g -Wall -Wextra -Werror -Iinclude -Isrc \
                 $(shell pkg-config --cflags $(PKGS) 2>/dev/null) $(SANITIZE_ALL)
# The code the harnesses exercise, built with the sanitizers (and, for
# make fuzz, libFuzzer's coverage); the rest they call is the normal
# library's (some of it is gcc-only: vector builtins).
FUZZ_SRC := src/core/config.c src/core/error.c src/core/input_file.c src/core/memory.c \
              src/model/data.c src/model/token_formats.c src/tools/plan/plan_costs.c src/ckpt/ckpt_file.c \
              src/ckpt/ckpt_load.c src/ckpt/ckpt_dir.c src/ckpt/h5util.c \
              src/ckpt/layout_history.c src/ckpt/fletcher32.c src/ckpt/ckpt_dyn.c src/ckpt/ckpt_units.c \
              src/ckpt/h5check.c src/ckpt/runlog_read.c src/tools/report/report_load.c \
              src/tools/inspect.c src/tools/report/trace.c src/tools/simulate/simulate_model.c \
              src/tools/plan/plan_runlog.c
REPLAY_OBJ := $(patsubst src/%.c,$(BUILD)/replay/obj/%.o,$(FUZZ_SRC))
REPLAY_BIN := $(patsubst %,$(BUILD)/fuzz-replay/%,$(FUZZ_TARGETS))

.PHONY: all deps demo check check-gpu check-portable check-faults bench bench-gpu device-bundle fuzz fuzz-build clean info
all: info $(BUILD)/dynmo $(TEST_BIN) $(REPLAY_BIN)

info:
	@echo "dynmo: CC=$(CC) ARCH=$(ARCH) SANITIZE=$(or $(SANITIZE),none) USE_CUDA=$(USE_CUDA)"
	@for p in $(PKGS); do echo "  found $$p $$(pkg-config --modversion $$p)"; done
	@if [ "$(USE_CUDA)" = 1 ]; then echo "  CUDA: $(NVCC) $$($(NVCC) --version 2>/dev/null | tail -n 1 || echo '(missing)'), NCCL_HOME=$(NCCL_HOME) (kernels/)"; \
	 else echo "  CUDA: skipped (USE_CUDA=0; the CPU build never needs it)"; fi

# The flags the objects were built with: a change of CFLAGS (ARCH=,
# SANITIZE=, a new warning) rebuilds everything.
FLAGS_STAMP := $(BUILD)/flags
DEPFLAGS := -MMD -MP
$(shell mkdir -p $(BUILD); echo '$(CC) $(CFLAGS) $(DEPFLAGS)' | cmp -s - $(FLAGS_STAMP) || echo '$(CC) $(CFLAGS) $(DEPFLAGS)' > $(FLAGS_STAMP))

# Each object and test depends on the headers it includes (gcc -MMD
# writes them beside it as .d; -MP keeps a deleted header from breaking
# the build), so a header change rebuilds what includes it, not all.
$(BUILD)/obj/%.o: src/%.c $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(DEPFLAGS) -Isrc -c $< -o $@
-include $(OBJ:.o=.d) $(TEST_BIN:=.d)

$(BUILD)/libdynmo.a: $(LIBOBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/dynmo: $(BUILD)/obj/tools/main.o $(BUILD)/libdynmo.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/tests/%: tests/%.c $(BUILD)/libdynmo.a tests/testing.h $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(DEPFLAGS) -MF $@.d -Isrc -Itests -o $@ $< $(BUILD)/libdynmo.a $(LDLIBS)

# The benchmarks' C drivers (bench/*.c; bench/hash_block.sh, mod_block.sh).
$(BUILD)/bench/%: bench/%.c $(BUILD)/libdynmo.a $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(DEPFLAGS) -MF $@.d -Isrc -o $@ $< $(BUILD)/libdynmo.a $(LDLIBS)

# The sanitized objects come first, so the replay links them; the rest
# of what they call comes from the normal library.
$(BUILD)/replay/obj/%.o: src/%.c $(HEADERS) Makefile
	@mkdir -p $(dir $@)
	$(CC) $(REPLAY_CFLAGS) -c $< -o $@

$(BUILD)/replay/libsanitized.a: $(REPLAY_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/fuzz-replay/%: fuzz/fuzz_%.c fuzz/replay.c $(BUILD)/replay/libsanitized.a $(BUILD)/libdynmo.a
	@mkdir -p $(dir $@)
	$(CC) $(REPLAY_CFLAGS) -o $@ fuzz/fuzz_$*.c fuzz/replay.c $(BUILD)/replay/libsanitized.a \
	  $(BUILD)/libdynmo.a $(LDLIBS)

# ---- the CUDA backend (USE_CUDA=1; kernels/, docs/gpu.md) ---------------------
# nvcc builds kernels/*.cu into one plugin, $(BUILD)/libdynmo_cuda.so, that
# `dynmo` loads with dlopen when train.device = cuda; dynmo itself never
# links CUDA. Switches as nccl-tests has them: CUDA_HOME (nvcc, cudart,
# cuBLAS), NCCL_HOME (nccl.h, libnccl; default CUDA_HOME), CUDA_GENCODE.
# --fmad=false: no fused multiply-adds, as gcc's -ffp-contract=off, so the
# kernels' arithmetic gives the CPU's bits where it is the same.
NCCL_HOME ?= $(CUDA_HOME)
NVCC ?= $(CUDA_HOME)/bin/nvcc
CUDA_GENCODE ?= -gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_90,code=[sm_90,compute_90]
NVCCFLAGS := -O3 -std=c++17 --fmad=false $(CUDA_GENCODE) -Iinclude -I$(NCCL_HOME)/include \
             -Xcompiler -fPIC,-fvisibility=hidden,-Wall,-Wextra,-Werror --Werror all-warnings
CUDA_LDLIBS := -L$(CUDA_HOME)/lib64 -L$(NCCL_HOME)/lib -L$(NCCL_HOME)/lib64 \
               -Xlinker -rpath,$(CUDA_HOME)/lib64 -Xlinker -rpath,$(NCCL_HOME)/lib \
               -lcublas -lnccl -lcudart
CU_SRC := $(wildcard kernels/*.cu)
CU_OBJ := $(patsubst kernels/%.cu,$(BUILD)/cuda/%.o,$(CU_SRC))
CU_HEADERS := $(wildcard kernels/*.cuh kernels/*.h) include/dynmo/backend.h include/dynmo/topk_route.h include/dynmo/rotation_group.h include/dynmo/exit_confidence.h include/dynmo/mod_predictor.h include/dynmo/shared_fn.h

$(BUILD)/cuda/%.o: kernels/%.cu $(CU_HEADERS) Makefile
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

$(BUILD)/libdynmo_cuda.so: $(CU_OBJ)
	$(NVCC) -shared -o $@ $^ $(CUDA_LDLIBS)

# The emulated device (train.device = emulate; kernels/emulate.c): the
# plugin's table with the kernels' per-thread functions run on the CPU
# and cuBLAS's arguments applied to CBLAS, built by gcc in every build.
$(BUILD)/libdynmo_emulate.so: kernels/emulate.c $(CU_HEADERS) $(FLAGS_STAMP)
	$(CC) $(CFLAGS) -fPIC -fvisibility=hidden -shared -Ikernels -o $@ $< \
	  $(shell pkg-config --libs openblas 2>/dev/null) -lm
all: $(BUILD)/libdynmo_emulate.so

# Every op of a backend's table against the CPU backend (make check-gpu runs
# it with cuda; t_gpu_device.sh checks the checker with cpu). Plain C.
$(BUILD)/gpu/check_ops: tests/gpu/check_ops.c $(BUILD)/libdynmo.a $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Isrc -o $@ $< $(BUILD)/libdynmo.a $(LDLIBS)
all: $(BUILD)/gpu/check_ops

# The host harness compiles the kernels' per-thread functions with gcc;
# check_ops rounds its references with kernels/precision.cuh.
$(BUILD)/tests/test_kernels_host: $(CU_HEADERS)
$(BUILD)/gpu/check_ops: $(CU_HEADERS)

ifeq ($(USE_CUDA),1)
all: $(BUILD)/libdynmo_cuda.so
endif

# On a machine with a GPU: every op of the plugin against the CPU backend,
# then the model-level checks as far as they exist (scripts/check_gpu.sh).
check-gpu: deps
	@$(MAKE) --no-print-directory all USE_CUDA=1
	@BUILD=$(BUILD) scripts/check_gpu.sh

# ---- make fuzz ------------------------------------------------------------
# clang (scripts/setup.sh --fuzz installs it from Debian's archive) builds
# FUZZ_SRC with -fsanitize=fuzzer-no-link,address,undefined into
# build/fuzz, links one libFuzzer binary per target, and scripts/fuzz.sh
# runs each FUZZ_RUNS times, seeded from real files.
FUZZ_CC ?= clang
FUZZ_RUNS ?= 1000000
FUZZ_BUILD := build/fuzz
FUZZ_CFLAGS := -std=gnu11 -O1 -g -Wall -Wextra -Werror -Iinclude -Isrc \
               $(shell pkg-config --cflags $(PKGS) 2>/dev/null) $(SANITIZE_ALL)
FUZZ_OBJ := $(patsubst src/%.c,$(FUZZ_BUILD)/obj/%.o,$(FUZZ_SRC))

$(FUZZ_BUILD)/obj/%.o: src/%.c $(HEADERS) Makefile
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -c $< -o $@

$(FUZZ_BUILD)/libfuzzed.a: $(FUZZ_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(FUZZ_BUILD)/fuzz_%: fuzz/fuzz_%.c $(FUZZ_BUILD)/libfuzzed.a $(BUILD)/libdynmo.a
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer -o $@ $< $(FUZZ_BUILD)/libfuzzed.a \
	  $(BUILD)/libdynmo.a $(LDLIBS)

fuzz-build: $(patsubst %,$(FUZZ_BUILD)/fuzz_%,$(FUZZ_TARGETS))

fuzz:
	@scripts/setup.sh --fuzz
	@$(MAKE) --no-print-directory all fuzz-build
	@BUILD=$(BUILD) FUZZ_BUILD=$(FUZZ_BUILD) FUZZ_RUNS=$(FUZZ_RUNS) scripts/fuzz.sh $(FUZZ_TARGETS)

deps:
	@scripts/setup.sh

demo: deps
	@$(MAKE) --no-print-directory all
	@scripts/demo.sh

check: deps
	@$(MAKE) --no-print-directory all
	@BUILD=$(BUILD) SANITIZE=$(SANITIZE) tests/run.sh '$(TESTS)'

# The same bits on another x86-64 level: a build for x86-64-v2 (no FMA, no
# AVX) must reproduce the golden records that -march=native made.
check-portable: deps
	@$(MAKE) --no-print-directory BUILD=build/x86-64-v2 ARCH=-march=x86-64-v2 build/x86-64-v2/dynmo
	@DYNMO=$(CURDIR)/build/x86-64-v2/dynmo bash tests/t_golden.sh

# The fault campaign (tests/faults/campaign.sh): kill -9, full-disk and
# read-only trials; TRIALS= kill trials, SEED= to repeat one.
TRIALS ?= 20
SEED ?=
check-faults: deps
	@$(MAKE) --no-print-directory all
	@BUILD=$(BUILD) TRIALS=$(TRIALS) SEED=$(SEED) tests/faults/campaign.sh

bench:
	@scripts/setup.sh --bench
	@$(MAKE) --no-print-directory all
	@BUILD=$(BUILD) bench/run.sh

# On a GPU: dynmo bench on cuda beside PyTorch, one table (docs/gpu-bench.md);
# it builds what it needs itself and installs nothing (GPU nodes are offline).
bench-gpu:
	@BUILD=$(BUILD) bench/gpu.sh

# For a lent GPU machine that has CUDA but none of Debian's libraries: a
# portable dynmo, the CUDA plugin and every library they need in
# .devbundle/dynmo-device.tar.xz; scripts/device_session.sh runs it there
# (docs/gpu.md, "Running on a lent GPU").
device-bundle:
	@scripts/device_bundle.sh

clean:
	rm -rf build
