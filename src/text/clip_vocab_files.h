// CLIP's tokenizer as transformers' CLIPTokenizer reads it from a folder
// (vocab.json, merges.txt, special_tokens_map.json, tokenizer_config.json),
// made from OpenAI's BPE file (bpe_simple_vocab_16e6.txt.gz), for pipeline
// folders written from files that carry no tokenizer (a single-file
// checkpoint, a random test model).
#pragma once
#include <stdbool.h>

// Writes the four files into the folder dir (created if needed) from the BPE
// file at bpe. SD 2's tokenizer pads with "!" (pad_excl), SD 1's with
// <|endoftext|>. 0 or -1 (message set, naming the file).
int dc_clip_vocab_write_files(const char *bpe, const char *dir, bool pad_excl);
