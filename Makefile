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

.PHONY: all test demo clean
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

clean:
	rm -rf $(BUILD) diffusion

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
