# diffusion.c — build: `make` (CPU engine, plus the CUDA backend when nvcc is
# found; CUDA=0 leaves it out), `make test`, `make demo`, `make fuzz`,
# `make install`.
# On a machine with nothing installed yet, `bash tools/demo.sh` and
# `bash tools/test.sh` install the Debian packages first (tools/deps.sh).
#
# Before anything compiles, tools/build_config.sh checks the dependencies
# (stopping with the packages to install when one is missing or is not the
# one expected, such as another BLAS's cblas.h) and records the configuration
# in $(BUILD)/config: compiler, flags, CUDA on or off, the headers and
# libraries found. Every object depends on it, so changing any of these, or a
# dependency appearing, rebuilds everything rather than linking stale objects.
CC      ?= gcc
# STATIC=1 links OpenBLAS, libpng, zlib, libjpeg-turbo, libwebp and libzstd statically
# and targets any x86-64-v3 CPU, so the binaries run on a machine without
# those packages.
ifeq ($(STATIC),1)
OPT     ?= -O3 -march=x86-64-v3
LDLIBS  += -Wl,-Bstatic -lopenblas -lpng16 -lz -ljpeg -lwebp -lzstd -lgfortran -lquadmath -Wl,-Bdynamic -lm -lpthread \
           -fopenmp
else
OPT     ?= -O3 -march=native
LDLIBS  += -lopenblas -lpng -lz -ljpeg -lwebp -lzstd -lm -fopenmp
endif
CFLAGS  ?= $(OPT)
# -MD (not -MMD) so that system headers such as cblas.h are tracked too. An
# undeclared function or a C type error is an error, never a warning that
# links into a binary which crashes. -fno-math-errno: no code reads errno after
# a math function, and without it every loop that takes a square root (AdamW)
# stays scalar, for the branch that would set errno (results are the same bits).
CFLAGS  += -std=c11 -D_GNU_SOURCE -Wall -Wextra -fopenmp -fno-math-errno -Isrc -MD -MP \
           -Werror=implicit-function-declaration -Werror=implicit-int \
           -Werror=int-conversion -Werror=incompatible-pointer-types
# OpenBLAS's own include directory when pkg-config knows it, so its cblas.h is
# found before any other BLAS's.
BLAS_CFLAGS := $(shell pkg-config --cflags openblas 2>/dev/null)
CPPFLAGS += $(BLAS_CFLAGS)

BUILD   ?= build
BIN     ?= diffusion
CONFIG  := $(BUILD)/config
LIB_SRC := $(wildcard src/core/*.c src/backend/*.c src/backend/cpu/*.c src/nn/*.c \
                      src/text/*.c src/models/*.c src/diffusion/*.c src/train/*.c src/io/*.c \
                      src/pipelines/*.c src/dist/*.c)
# The NCCL communicator exists only beside the CUDA backend (below).
LIB_SRC := $(filter-out src/dist/comm_nccl.c,$(LIB_SRC))
CLI_SRC := $(wildcard src/cli/*.c)
LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/%.o)
CLI_OBJ := $(CLI_SRC:%.c=$(BUILD)/%.o)
TESTS   := $(patsubst tests/%.c,$(BUILD)/tests/%,$(wildcard tests/test_*.c))
LIB     := $(BUILD)/libdiffusion.a
# Programs for tests and checks, built beside the tests (tools/*.c).
TOOLS   := $(patsubst tools/%.c,$(BUILD)/tools/%,$(wildcard tools/*.c))

# CUDA backend: Hopper machine code (sm_90a) plus PTX that any GPU from
# Ampere on compiles at load time.
ifeq ($(origin NVCC),undefined)
NVCC    := $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
endif
CUDA    ?= $(if $(NVCC),1,0)
ifeq ($(CUDA),1)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
GENCODE ?= -gencode=arch=compute_90a,code=sm_90a -gencode=arch=compute_80,code=compute_80
NVFLAGS ?= -O3 -std=c++20 $(GENCODE) -Xcompiler -Wall,-Wextra
NVFLAGS += -Isrc -MD -MP -DDC_HAVE_CUDA
CU_SRC  := $(wildcard src/backend/cuda/*.cu)
# Several GPUs: NCCL's header from the toolkit; libnccl.so.2 itself is opened
# at run time (-ldl), from the loader's path or the toolkit's lib folder.
LIB_OBJ += $(BUILD)/src/dist/comm_nccl.o
$(BUILD)/src/dist/comm_nccl.o: CPPFLAGS += -I$(CUDA_HOME)/include -DDC_NCCL_DIR='"$(CUDA_HOME)/lib"'
LIB_OBJ += $(CU_SRC:%.cu=$(BUILD)/%.o)
CFLAGS  += -DDC_HAVE_CUDA
# cuBLASLt runs the matrix products, cuDNN the convolutions.
LDLIBS  += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudnn -lcublasLt -lcudart -lstdc++ -ldl -lpthread
endif

.PHONY: all test demo fuzz fuzz-build clean sd-random install uninstall FORCE
all: $(BIN) $(TESTS) $(TOOLS)

# Rewritten only when its content changes, so an unchanged configuration
# rebuilds nothing.
$(CONFIG): FORCE
	@mkdir -p $(@D)
	@bash tools/build_config.sh > $@.new || { rm -f $@.new; exit 1; }
	@if cmp -s $@.new $@; then rm -f $@.new; else mv -f $@.new $@; fi
$(CONFIG): export DC_CC = $(CC)
$(CONFIG): export DC_CFLAGS = $(CFLAGS)
$(CONFIG): export DC_CPPFLAGS = $(CPPFLAGS)
$(CONFIG): export DC_LDFLAGS = $(LDFLAGS)
$(CONFIG): export DC_LDLIBS = $(LDLIBS)
$(CONFIG): export DC_CUDA = $(CUDA)
$(CONFIG): export DC_NVCC = $(NVCC)
$(CONFIG): export DC_NVFLAGS = $(NVFLAGS)

$(BUILD)/%.o: %.c $(CONFIG)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -c $< -o $@

$(BUILD)/%.o: %.cu $(CONFIG)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c $< -o $@

$(LIB): $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BIN): $(CLI_OBJ) $(LIB)
	$(CC) $(CFLAGS) $(LDFLAGS) $^ -o $@ $(LDLIBS)

$(BUILD)/tests/%: tests/%.c $(LIB) $(CONFIG)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(LDFLAGS) $< $(LIB) -o $@ $(LDLIBS)

$(BUILD)/tools/%: tools/%.c $(LIB) $(CONFIG)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(LDFLAGS) $< $(LIB) -o $@ $(LDLIBS)

test: all
	BUILD=$(BUILD) BIN=$(BIN) bash tests/run_all.sh

# Random-weight SD 1.5 and 2.1 models at full size, in both layouts (F16,
# about 2 GB each), for checking loaders, memory and speed without real weights;
# the folders get a tokenizer/ made from the shipped vocabulary. SD_CONFIGS
# picks others: `make sd-random SD_CONFIGS=tiny1` writes a tiny SD 1.x in a second.
SD_RANDOM ?= $(BUILD)/sd-random
SD_CONFIGS ?= sd1.5 sd2.1
sd-random: $(BUILD)/tools/sd_random
	@for c in $(SD_CONFIGS); do for l in diffusers single; do \
	  out=$(SD_RANDOM)/$$c-$$l; [ $$l = single ] && out=$$out.safetensors; \
	  echo "writing $$out"; $(BUILD)/tools/sd_random --config $$c --layout $$l --dtype f16 \
	    --vocab data/bpe_simple_vocab_16e6.txt.gz --out $$out || exit 1; \
	done; done

# The program and the CLIP vocabulary it looks for in ../share/diffusion/
# beside itself (PREFIX/share/diffusion/). DESTDIR stages the files for a
# package: they go under DESTDIR and are found once in place under PREFIX.
PREFIX  ?= /usr/local
install: $(BIN)
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/diffusion
	install -m 755 $(BIN) $(DESTDIR)$(PREFIX)/bin/diffusion
	install -m 644 data/bpe_simple_vocab_16e6.txt.gz data/LICENSE.CLIP $(DESTDIR)$(PREFIX)/share/diffusion/

uninstall:
	rm -f $(DESTDIR)$(PREFIX)/bin/diffusion $(DESTDIR)$(PREFIX)/share/diffusion/bpe_simple_vocab_16e6.txt.gz \
	      $(DESTDIR)$(PREFIX)/share/diffusion/LICENSE.CLIP
	-rmdir $(DESTDIR)$(PREFIX)/share/diffusion 2> /dev/null

# The demo script installs what is missing before it builds anything.
demo:
	bash tools/demo.sh

# ---- fuzzing: libFuzzer with AddressSanitizer and UBSan (clang 14+; Debian:
# clang-14 libclang-rt-14-dev libomp-14-dev, from `tools/deps.sh --tests`).
# One harness per reader of user files, tests/fuzz/fuzz_<name>.c, linked
# against the CPU library built with the sanitizers. `make fuzz` builds them,
# writes small valid seed files into $(BUILD)/fuzz_corpus/<name>/ and runs each
# for FUZZ_SECONDS; `make fuzz-build` only builds.
FUZZ_SECONDS ?= 60
ifeq ($(origin FUZZ_CC),undefined)
FUZZ_CC   := $(shell command -v clang-14 2>/dev/null || echo clang)
endif
FUZZ_DIR  := $(BUILD)/fuzz
FUZZ_CFG  := $(FUZZ_DIR)/config
FUZZ_FLAGS := -std=c11 -D_GNU_SOURCE -g -O1 -fopenmp -Isrc -Itests -MD -MP -Wall -Wextra \
              -Werror=implicit-function-declaration -Werror=implicit-int \
              -Werror=int-conversion -Werror=incompatible-pointer-types \
              -fsanitize=address,undefined -fno-sanitize-recover=undefined -Wno-pass-failed \
              $(BLAS_CFLAGS)
FUZZ_LIBS := -lopenblas -lpng -lz -ljpeg -lwebp -lzstd -lm -fopenmp
FUZZ_LIB_OBJ := $(LIB_SRC:%.c=$(FUZZ_DIR)/%.o)
FUZZ_LIB  := $(FUZZ_DIR)/libdiffusion.a
FUZZERS   := $(patsubst tests/fuzz/%.c,$(FUZZ_DIR)/%,$(wildcard tests/fuzz/fuzz_*.c))

$(FUZZ_CFG): FORCE
	@mkdir -p $(@D)
	@bash tools/build_config.sh > $@.new || { rm -f $@.new; exit 1; }
	@if cmp -s $@.new $@; then rm -f $@.new; else mv -f $@.new $@; fi
$(FUZZ_CFG): export DC_CC = $(FUZZ_CC)
$(FUZZ_CFG): export DC_CFLAGS = $(FUZZ_FLAGS)
$(FUZZ_CFG): export DC_LDLIBS = $(FUZZ_LIBS)
$(FUZZ_CFG): export DC_FUZZ = 1

$(FUZZ_DIR)/%.o: %.c $(FUZZ_CFG)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) -fsanitize=fuzzer-no-link -c $< -o $@

$(FUZZ_LIB): $(FUZZ_LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(FUZZ_DIR)/fuzz_%: tests/fuzz/fuzz_%.c $(FUZZ_LIB) $(FUZZ_CFG)
	$(FUZZ_CC) $(FUZZ_FLAGS) -fsanitize=fuzzer $< $(FUZZ_LIB) -o $@ $(FUZZ_LIBS)

$(FUZZ_DIR)/make_seeds: tests/fuzz/make_seeds.c $(FUZZ_LIB) $(FUZZ_CFG)
	$(FUZZ_CC) $(FUZZ_FLAGS) $< $(FUZZ_LIB) -o $@ $(FUZZ_LIBS)

fuzz-build: $(FUZZERS) $(FUZZ_DIR)/make_seeds

fuzz: fuzz-build
	FUZZ_DIR=$(FUZZ_DIR) FUZZ_SECONDS=$(FUZZ_SECONDS) CORPUS=$(BUILD)/fuzz_corpus \
	  bash tests/fuzz/run.sh

clean:
	rm -rf $(BUILD) diffusion

-include $(wildcard $(LIB_OBJ:.o=.d) $(CLI_OBJ:.o=.d) $(TESTS:=.d) \
                    $(FUZZ_LIB_OBJ:.o=.d) $(FUZZERS:=.d) $(FUZZ_DIR)/make_seeds.d)
