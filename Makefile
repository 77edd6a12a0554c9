# diffusion.c — build: `make` (CPU engine), `make test`, `make demo`.
CC      ?= gcc
OPT     ?= -O3 -march=native
CFLAGS  ?= $(OPT)
CFLAGS  += -std=c11 -D_GNU_SOURCE -Wall -Wextra -fopenmp -Isrc -MMD -MP
LDLIBS  += -lopenblas -lpng -lz -lm -fopenmp

BUILD   := build
LIB_SRC := $(wildcard src/core/*.c src/backend/*.c src/backend/cpu/*.c src/nn/*.c \
                      src/models/*.c src/diffusion/*.c src/train/*.c src/io/*.c)
CLI_SRC := $(wildcard src/cli/*.c)
LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/%.o)
CLI_OBJ := $(CLI_SRC:%.c=$(BUILD)/%.o)
TESTS   := $(patsubst tests/%.c,$(BUILD)/tests/%,$(wildcard tests/test_*.c))
LIB     := $(BUILD)/libdiffusion.a

.PHONY: all test demo fuzz clean
all: diffusion $(TESTS)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(LIB): $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

diffusion: $(CLI_OBJ) $(LIB)
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
