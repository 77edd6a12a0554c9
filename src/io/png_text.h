// PNG text chunks between the UTF-8 strings the engine keeps and what
// libpng stores: tEXt and zTXt hold Latin-1, iTXt UTF-8. Internal to src/io.
#pragma once
#include <png.h>

#include "io/png.h"

// libpng chunks for text[n]: tEXt with the value in Latin-1 when every
// character is Latin-1, else iTXt. Fails (message naming path) on an invalid
// key or a value that is not UTF-8. Free with dc_png_text_chunks_free.
int dc_png_text_chunks(const char *path, const dc_png_text *text, int n, png_text **out);
void dc_png_text_chunks_free(png_text *chunks, int n);

// Copies up to DC_PNG_MAX_TEXT chunks libpng read into img->keys/values as
// UTF-8 (0, or -1 out of memory).
int dc_png_text_collect(const png_text *chunks, int n, dc_png_image *img);
