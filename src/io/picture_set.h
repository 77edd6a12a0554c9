// Captioned pictures as people keep them, listed for `diffusion prepare`:
//   - a folder tree of pictures (PNG, JPEG, WebP by their extension), each
//     captioned by a file of the same stem: `.txt`, else `.caption`
//     (kohya's default), or only the extension asked for;
//   - kohya's DreamBooth folders, `N_class tokens/` directly under the root:
//     every picture inside counts N times (`repeats`), and one without a
//     caption file is captioned with the class tokens, as kohya's
//     sd-scripts does (library/config_util.py, extract_dreambooth_params);
//   - a folder with `metadata.jsonl` (diffusers' / Hugging Face's
//     imagefolder): one JSON object a line, `file_name` relative to the
//     folder and the caption in a column ("text", or the one named); only
//     the pictures it lists are taken;
//   - webdataset shards (`.tar`, given alone or found in the tree) as
//     img2dataset writes them: members grouped by key (the path up to the
//     first '.' of its last part), the picture `key.jpg` (or .jpeg, .png,
//     .webp), the caption `key.txt`, else `key.json`'s "caption".
// The list is sorted by path (then member name), so the same files give the
// same order on every machine. A picture without a caption gets an empty one
// with a warning naming it; a caption that is not UTF-8, a malformed
// metadata line or a damaged archive is an error naming the file.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "io/image.h"

typedef struct {
    char *path;            // the picture, or the archive holding it
    char *member;          // the archive member's name; NULL for a file of its own
    int64_t offset, size;  // the member's bytes in the archive
    char *caption;         // UTF-8, surrounding white space removed
    int repeats;           // kohya's N; 1 elsewhere
} dc_picture_entry;

typedef struct {
    dc_picture_entry *e;
    int64_t n, cap;
    int64_t uncaptioned;   // pictures given an empty caption (each warned about)
} dc_picture_set;

typedef struct {
    const char *caption_ext;     // e.g. ".txt"; NULL: ".txt", then ".caption"
    const char *caption_column;  // metadata.jsonl's caption column; NULL: "text"
    const char *caption;         // every picture's caption (DreamBooth's prompts), none read; NULL: theirs
} dc_picture_set_opts;

// Lists the pictures under `path`: a folder (any layout above) or one .tar.
// An empty result is an error saying what was looked for.
int dc_picture_set_scan(dc_picture_set *s, const char *path, const dc_picture_set_opts *o);
void dc_picture_set_free(dc_picture_set *s);
// "path" or "archive.tar:member", for messages.
void dc_picture_set_name(const dc_picture_set *s, int64_t i, char *buf, size_t cap);
// Reads picture i (header_only: its size alone, as dc_image_probe does).
int dc_picture_set_read(const dc_picture_set *s, int64_t i, dc_image *img, int64_t max_pixels, bool header_only);
