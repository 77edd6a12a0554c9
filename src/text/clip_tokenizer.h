// The CLIP BPE tokenizer of Stable Diffusion's text encoders, as OpenAI's
// simple_tokenizer.py defines it: clean-up (text/clip_clean.h: ftfy's fixes,
// HTML unescaping, whitespace, lower-casing), the pre-tokenizer regex
//   <\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+
// (IGNORECASE), each piece's UTF-8 bytes mapped through bytes_to_unicode, then
// byte-pair merges by rank with "</w>" on the last symbol of a piece.
//
// The vocabulary comes from either format:
//   - OpenAI's bpe_simple_vocab_16e6.txt[.gz]: a header line, then merges "a b";
//     the first 48894 are used and the vocabulary is the 256 byte symbols, the
//     same with "</w>", each merge joined, <|startoftext|> and <|endoftext|>
//     (49408 entries); a transformers merges.txt alone reads the same way;
//   - transformers' vocab.json (token -> id) with merges.txt beside it, as in
//     a diffusers model's tokenizer/ folder. There, pad_token of
//     special_tokens_map.json or tokenizer_config.json (if either says) is the
//     padding token: "!" (id 0) for Stable Diffusion 2 and SDXL's second
//     encoder, <|endoftext|> otherwise.
#pragma once
#include <stdint.h>

#define DC_CLIP_CONTEXT 77  // ids per prompt: BOS, at most 75 tokens, EOS, padding

typedef struct dc_clip_vocab dc_clip_vocab;

typedef struct {
    int32_t bos, eos;  // the ids of <|startoftext|> and <|endoftext|>
    int32_t pad;       // what fills the ids after EOS (eos unless the folder says otherwise)
    int n_vocab;       // tokens in the vocabulary
    int n_merges;      // merge rules
    dc_clip_vocab *v;  // the tables (private)
} dc_clip_tokenizer;

// Loads a vocabulary from `path`: a .txt or .txt.gz BPE file, a vocab.json
// (merges.txt beside it), or a folder holding vocab.json and merges.txt
// itself or in tokenizer/ (a diffusers model folder). On failure returns -1
// with a message naming the file and the problem; t is then empty.
int dc_clip_tokenizer_load(dc_clip_tokenizer *t, const char *path);
void dc_clip_tokenizer_free(dc_clip_tokenizer *t);

// The BPE ids of `text` (NUL-terminated UTF-8), without BOS or EOS, in a new
// array (*ids, free() it) of *n entries. Text that is not valid UTF-8 is
// refused with a message giving the byte offset.
int dc_clip_encode(const dc_clip_tokenizer *t, const char *text, int32_t **ids, int *n);

// The model's input: BOS, the first 75 ids of dc_clip_encode, EOS, then the
// pad id up to 77. *n_tokens (may be NULL) receives the number of ids before
// truncation (more than 75 means some were cut).
int dc_clip_tokenize(const dc_clip_tokenizer *t, const char *text, int32_t ids[DC_CLIP_CONTEXT], int *n_tokens);
// The ids of that input which count, of a text of n_tokens ids: BOS, those
// kept (at most 75) and EOS.
static inline int dc_clip_counted(int n_tokens) {
    return 2 + (n_tokens < DC_CLIP_CONTEXT - 2 ? n_tokens : DC_CLIP_CONTEXT - 2);
}
