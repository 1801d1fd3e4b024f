# dynmo build. `make` builds build/dynmo; `make check` runs every test;
# `make demo` runs the main job; `make bench` the benchmarks;
# `make check-faults [TRIALS=20] [SEED=S]` the fault campaign (kill -9,
# full disk, read-only; not part of `make check`; mounts need root).
# Switches: SANITIZE=address,undefined  USE_CUDA=0/1 (CUDA_HOME)  ARCH=...

SANITIZE ?=
USE_CUDA ?= 0
CUDA_HOME ?= /usr/local/cuda
ARCH ?= -march=native
PKGS := mpich hdf5-mpich openblas cairo json-c

ifeq ($(SANITIZE),)
BUILD ?= build
SANFLAGS :=
else
BUILD ?= build/sanitize
SANFLAGS := -fsanitize=$(SANITIZE) -fno-omit-frame-pointer
endif

HAVE_PKGS := $(shell pkg-config --exists $(PKGS) && echo yes)
ifneq ($(HAVE_PKGS),yes)
ifeq ($(filter deps demo check check-faults bench clean,$(MAKECMDGOALS)),)
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
CFLAGS := -std=gnu11 -O3 $(ARCH) -g -Wall -Wextra -Werror -Wno-psabi -fno-fast-math $(FP_CONTRACT) \
          -Iinclude $(shell pkg-config --cflags $(PKGS) 2>/dev/null) $(SANFLAGS)
LDLIBS := $(shell pkg-config --libs $(PKGS) 2>/dev/null) -lhdf5_hl -lm -lpthread
LDFLAGS := $(SANFLAGS)

SRC := $(wildcard src/*/*.c)
OBJ := $(patsubst src/%.c,$(BUILD)/obj/%.o,$(SRC))
LIBOBJ := $(filter-out $(BUILD)/obj/tools/main.o,$(OBJ))
TEST_SRC := $(wildcard tests/test_*.c)
TEST_BIN := $(patsubst tests/%.c,$(BUILD)/tests/%,$(TEST_SRC))

.PHONY: all deps demo check check-portable check-faults bench clean info
all: info $(BUILD)/dynmo $(TEST_BIN)

info:
	@echo "dynmo: CC=$(CC) ARCH=$(ARCH) SANITIZE=$(or $(SANITIZE),none) USE_CUDA=$(USE_CUDA)"
	@for p in $(PKGS); do echo "  found $$p $$(pkg-config --modversion $$p)"; done
	@if [ "$(USE_CUDA)" = 1 ]; then echo "  CUDA: $(CUDA_HOME) (kernels/)"; \
	 else echo "  CUDA: skipped (USE_CUDA=0; the CPU build never needs it)"; fi

# The flags the objects were built with: a change of CFLAGS (ARCH=,
# SANITIZE=, a new warning) rebuilds everything.
FLAGS_STAMP := $(BUILD)/flags
$(shell mkdir -p $(BUILD); echo '$(CC) $(CFLAGS)' | cmp -s - $(FLAGS_STAMP) || echo '$(CC) $(CFLAGS)' > $(FLAGS_STAMP))

$(BUILD)/obj/%.o: src/%.c $(FLAGS_STAMP) $(wildcard include/dynmo/*.h) $(wildcard src/*/*.h) $(wildcard checkpoint_schema/*.def)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Isrc -c $< -o $@

$(BUILD)/libdynmo.a: $(LIBOBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/dynmo: $(BUILD)/obj/tools/main.o $(BUILD)/libdynmo.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/tests/%: tests/%.c $(BUILD)/libdynmo.a tests/testing.h $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Isrc -Itests -o $@ $< $(BUILD)/libdynmo.a $(LDLIBS)

deps:
	@scripts/setup.sh

demo: deps
	@$(MAKE) --no-print-directory all
	@scripts/demo.sh

check: deps
	@$(MAKE) --no-print-directory all
	@BUILD=$(BUILD) SANITIZE=$(SANITIZE) tests/run.sh

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

clean:
	rm -rf build
