# diffusion.c — build: `make` (CPU engine, plus the CUDA backend when nvcc is
# found; CUDA=0 leaves it out), `make test`, `make demo`.
CC      ?= gcc
# STATIC=1 links OpenBLAS, libpng and zlib statically and targets any
# x86-64-v3 CPU, so the binaries run on a machine without those packages.
ifeq ($(STATIC),1)
OPT     ?= -O3 -march=x86-64-v3
LDLIBS  += -Wl,-Bstatic -lopenblas -lpng16 -lz -lgfortran -lquadmath -Wl,-Bdynamic -lm -fopenmp
else
OPT     ?= -O3 -march=native
LDLIBS  += -lopenblas -lpng -lz -lm -fopenmp
endif
CFLAGS  ?= $(OPT)
CFLAGS  += -std=c11 -D_GNU_SOURCE -Wall -Wextra -fopenmp -Isrc -MMD -MP

BUILD   ?= build
BIN     ?= diffusion
LIB_SRC := $(wildcard src/core/*.c src/backend/*.c src/backend/cpu/*.c src/nn/*.c \
                      src/models/*.c src/diffusion/*.c src/train/*.c src/io/*.c)
CLI_SRC := $(wildcard src/cli/*.c)
LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/%.o)
CLI_OBJ := $(CLI_SRC:%.c=$(BUILD)/%.o)
TESTS   := $(patsubst tests/%.c,$(BUILD)/tests/%,$(wildcard tests/test_*.c))
LIB     := $(BUILD)/libdiffusion.a

# CUDA backend: Hopper machine code (sm_90a) plus PTX that any GPU from
# Ampere on compiles at load time.
NVCC    ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CUDA    ?= $(if $(NVCC),1,0)
ifeq ($(CUDA),1)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
GENCODE ?= -gencode=arch=compute_90a,code=sm_90a -gencode=arch=compute_80,code=compute_80
NVFLAGS ?= -O3 -std=c++20 $(GENCODE) -Xcompiler -Wall,-Wextra
NVFLAGS += -Isrc -MMD -MP -DDC_HAVE_CUDA
CU_SRC  := $(wildcard src/backend/cuda/*.cu)
LIB_OBJ += $(CU_SRC:%.cu=$(BUILD)/%.o)
CFLAGS  += -DDC_HAVE_CUDA
LDLIBS  += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublasLt -lcudart -lstdc++ -ldl -lpthread
endif

.PHONY: all test demo fuzz clean
all: $(BIN) $(TESTS)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c $< -o $@

$(LIB): $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BIN): $(CLI_OBJ) $(LIB)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

$(BUILD)/tests/%: tests/%.c $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $< $(LIB) -o $@ $(LDLIBS)

test: all
	bash tests/run_all.sh

demo: diffusion
	bash tools/demo.sh

# libFuzzer on the safetensors reader (clang 14+, Debian libclang-rt-14-dev).
FUZZ_SECONDS ?= 60
FUZZ_SRC := src/io/safetensors.c src/io/json.c src/core/fsutil.c src/core/error.c src/core/dtype.c
fuzz:
	@mkdir -p $(BUILD)/fuzz_corpus
	clang -std=c11 -D_GNU_SOURCE -g -O1 -Isrc -fsanitize=fuzzer,address,undefined \
	  tests/fuzz/fuzz_safetensors.c $(FUZZ_SRC) -lm -o $(BUILD)/fuzz_safetensors
	$(BUILD)/fuzz_safetensors -max_total_time=$(FUZZ_SECONDS) $(BUILD)/fuzz_corpus

clean:
	rm -rf $(BUILD) diffusion

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
