// diffusion tokenize: the CLIP token ids of prompts, one line of 77 per prompt,
// to check what the text encoder will see and how many tokens a prompt takes.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/args.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "core/error.h"
#include "text/clip_tokenizer.h"

// Prints one prompt's line; a truncated prompt is also reported on stderr.
static int tokenize_one(const dc_clip_tokenizer *t, const char *prompt, int index, bool count_only) {
    int32_t ids[DC_CLIP_CONTEXT];
    int n;
    if (dc_clip_tokenize(t, prompt, ids, &n)) return dc_fail_ctx("prompt %d", index);
    if (count_only) {
        printf("%d\n", n);
    } else {
        for (int i = 0; i < DC_CLIP_CONTEXT; i++) printf(i ? " %d" : "%d", ids[i]);
        putchar('\n');
    }
    if (n > DC_CLIP_CONTEXT - 2)
        fprintf(stderr, "warning: prompt %d: %d tokens, truncated to %d\n", index, n, DC_CLIP_CONTEXT - 2);
    return 0;
}

// Prompts from standard input, one a line.
static int tokenize_stdin(const dc_clip_tokenizer *t, int *index, bool count_only) {
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int rc = 0;
    while (!rc && (len = getline(&line, &cap, stdin)) >= 0) {
        if (len > 0 && line[len - 1] == '\n') line[--len] = 0;
        if (strlen(line) != (size_t)len) rc = dc_fail("prompt %d (standard input) holds a NUL byte", *index);
        else rc = tokenize_one(t, line, (*index)++, count_only);
    }
    free(line);
    if (!rc && ferror(stdin)) rc = dc_fail("reading standard input failed");
    return rc;
}

int cmd_tokenize(int argc, char **argv) {
    const char *vocab = NULL;
    bool count_only = false;
    arg_spec specs[] = {
        {"vocab", ARG_STR, &vocab, "PATH", "the vocabulary (default: the first found of those above)"},
        {"count", ARG_FLAG, &count_only, NULL, "print each prompt's token count (before truncation) instead of its ids"},
    };
    arg_parser ap = {"diffusion tokenize [--vocab PATH] [--count] PROMPT... (- reads prompts from standard input)",
                     "Prints the CLIP token ids of each prompt on one line: 77 ids, <|startoftext|>\n"
                     "(49406), at most 75 tokens, <|endoftext|> (49407), then padding (<|endoftext|>,\n"
                     "or the pad_token of a diffusers tokenizer folder). A prompt of more than 75\n"
                     "tokens is truncated, with a warning on stderr giving its count. The text is\n"
                     "cleaned as OpenAI's tokenizer cleans it (HTML entities, whitespace, lower\n"
                     "case, and ftfy's fixes except its mojibake repair). \"-\" reads one prompt per\n"
                     "line from standard input; after \"--\" every argument is a prompt.\n\n"
                     "The vocabulary (--vocab) is OpenAI's " CLI_VOCAB_NAME " (or the .txt),\n"
                     "a vocab.json with merges.txt beside it, or a folder holding them (a diffusers\n"
                     "model folder, or its tokenizer/). Without --vocab: $DIFFUSION_VOCAB, else\n"
                     "./" CLI_VOCAB_NAME ", data/ beside this program (the repository's copy),\n"
                     "../share/diffusion/ beside it (where make install puts it),\n"
                     "/usr/local/share/diffusion/ and /usr/share/diffusion/.",
                     specs, (int)(sizeof specs / sizeof specs[0]), 0, {0}, 0, {0}};
    // Prompts are set aside before the flags are parsed: there may be any
    // number of them (args_parse keeps a few positionals).
    char **flags = malloc((size_t)(argc + 1) * sizeof *flags);
    const char **prompts = malloc((size_t)(argc + 1) * sizeof *prompts);
    if (!flags || !prompts) return free(flags), free(prompts), dc_fail("out of memory"), cli_fail();
    int nflags = 0, nprompts = 0;
    flags[nflags++] = argv[0];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--")) {
            while (++i < argc) prompts[nprompts++] = argv[i];
            break;
        }
        if (strncmp(a, "--", 2) != 0 && strcmp(a, "-h") != 0) {
            prompts[nprompts++] = a;
            continue;
        }
        flags[nflags++] = argv[i];
        if (!strcmp(a, "--vocab") && i + 1 < argc) flags[nflags++] = argv[++i];  // its value, whatever it looks like
    }
    int rc = args_parse(&ap, nflags, flags), status = 0;
    free(flags);
    if (rc) return free(prompts), rc > 0 ? 0 : cli_usage_fail();
    if (!nprompts) {
        free(prompts);
        dc_fail("tokenize needs a PROMPT, or - to read prompts from standard input (see --help)");
        return cli_usage_fail();
    }
    dc_clip_tokenizer t;
    if (!vocab && cli_find_vocab(&vocab)) return free(prompts), cli_fail();
    cli_inputs ins = {0};  // the ids go to standard output: never into the vocabulary (>> vocab.json)
    int bad = cli_inputs_add(&ins, "--vocab", vocab) || cli_check_stdio(&ins);
    cli_inputs_free(&ins);
    if (bad || dc_clip_tokenizer_load(&t, vocab)) return free(prompts), cli_fail();
    int index = 1;
    for (int i = 0; i < nprompts && !status; i++) {
        if (!strcmp(prompts[i], "-")) status = tokenize_stdin(&t, &index, count_only);
        else status = tokenize_one(&t, prompts[i], index++, count_only);
    }
    dc_clip_tokenizer_free(&t);
    free(prompts);
    if (fflush(stdout) != 0 && !status) status = dc_fail("writing the ids failed");
    return status ? cli_fail() : 0;
}
