// MosaicML streaming's MDS data sets (format version 2), read and written.
// A data set is a folder: index.json lists the shards, and each shard file
// holds samples of named columns:
//   u32 num_samples | u32 offsets[num_samples + 1] (absolute) | config JSON | samples
// and each sample is a u32 size for every variable-size column (in column
// order) followed by the columns' bytes. Shards may be zstd-compressed
// ("shard.00000.mds.zstd"). Source: mosaicml/streaming,
// streaming/base/format/mds/{writer,reader,encodings}.py and
// streaming/base/format/base/writer.py.
//
// The reader reads sample i without loading its shard: two preads (the
// offsets, then the sample). A compressed shard is decompressed into memory
// once, when first read; a few shards stay open at a time.
#pragma once
#include <stddef.h>
#include <stdint.h>

// Element types, numbered as streaming's ndarray encoding numbers them (the
// number is the byte written in a dynamic-dtype ndarray): bits / 8 = size.
typedef enum {
    DC_MDS_U8 = 8, DC_MDS_I8 = 9, DC_MDS_U16 = 16, DC_MDS_I16 = 17, DC_MDS_F16 = 18,
    DC_MDS_U32 = 32, DC_MDS_I32 = 33, DC_MDS_F32 = 34, DC_MDS_U64 = 64, DC_MDS_I64 = 65,
    DC_MDS_F64 = 66
} dc_mds_dtype;

// What a column's encoding says its bytes are.
typedef enum {
    DC_MDS_BYTES,    // "bytes": raw bytes
    DC_MDS_STR,      // "str" and "json": UTF-8 text (json: one JSON value)
    DC_MDS_SCALAR,   // "int" (int64), "uint8".."uint64", "int8".."int64", "float16/32/64"
    DC_MDS_NDARRAY   // "ndarray[:dtype[:d0,d1,...]]"
} dc_mds_kind;

#define DC_MDS_MAX_DIMS 63  // streaming's limit: ndim is 6 bits of the shape byte

typedef struct {
    char *name;
    char *encoding;   // as the index writes it, e.g. "ndarray:float16:4,32,32"
    dc_mds_kind kind;
    int is_json;      // STR written as "json"
    int dtype;        // SCALAR, NDARRAY: dc_mds_dtype; 0 when the ndarray's dtype is per sample
    int ndim;         // NDARRAY: static shape's rank; 0 when the shape is per sample
    int64_t shape[DC_MDS_MAX_DIMS];
    int64_t size;     // bytes of every value, or -1 when values vary in size
} dc_mds_column;

size_t dc_mds_dtype_size(int dtype);  // 0 for a code that is no dtype
const char *dc_mds_dtype_name(int dtype);

// Parses an encoding name for column `name` (named in messages). Refuses
// "pkl" (unpickling runs code) and the image encodings (pil, jpeg, png, ...),
// which this engine does not decode from shards.
int dc_mds_column_parse(dc_mds_column *c, const char *name, const char *encoding);
void dc_mds_column_free(dc_mds_column *c);

// One decoded value: a scalar is rank 0 with one element; bytes and str are
// U8 arrays of their length. `values` points into the sample's buffer.
typedef struct {
    int dtype;
    int ndim;
    int64_t shape[DC_MDS_MAX_DIMS];
    int64_t count;       // elements
    const void *values;  // count * dc_mds_dtype_size(dtype) bytes, unaligned
} dc_mds_array;

// Decodes the bytes of one value of column c, checking the dynamic header
// (dtype code, shape) against the bytes there are.
int dc_mds_decode(const dc_mds_column *c, const uint8_t *data, size_t len, dc_mds_array *out);
// Converts a decoded value to float (any dtype, through double: 64-bit
// integers past 2^53 may round twice). dst holds a->count floats.
void dc_mds_to_f32(const dc_mds_array *a, float *dst);

// ---- reading

typedef struct dc_mds_reader dc_mds_reader;

typedef struct {
    int64_t samples;
    int64_t raw_bytes;   // the shard file's bytes, uncompressed
    int compressed;      // zstd
} dc_mds_shard_info;

// Opens the data set in folder `dir` (its index.json). Every shard must have
// the same columns. Shard files are opened and checked when first read.
int dc_mds_open(dc_mds_reader **out, const char *dir);
void dc_mds_close(dc_mds_reader *r);
int64_t dc_mds_samples(const dc_mds_reader *r);
int dc_mds_shards(const dc_mds_reader *r);
dc_mds_shard_info dc_mds_shard(const dc_mds_reader *r, int k);
int dc_mds_columns(const dc_mds_reader *r);
const dc_mds_column *dc_mds_column_at(const dc_mds_reader *r, int i);
// The column named `name`, or -1 with a message listing the columns there are.
int dc_mds_find(const dc_mds_reader *r, const char *name);

// One sample's column bytes; the buffer is reused by the next read into it.
typedef struct {
    uint8_t *buf;
    size_t cap;
    int ncols;
    const uint8_t **data;  // [ncols]
    size_t *len;           // [ncols]
} dc_mds_sample;

// Reads sample i (0 <= i < dc_mds_samples) of the data set into s.
int dc_mds_read(dc_mds_reader *r, int64_t i, dc_mds_sample *s);
void dc_mds_sample_free(dc_mds_sample *s);

// ---- writing

typedef struct {
    const char *name;
    const char *encoding;
} dc_mds_spec;

typedef struct {
    int zstd_level;       // 0: uncompressed; 1..22: "zstd:N"
    int64_t size_limit;   // bytes per shard before the next starts; 0: streaming's 1 << 26
} dc_mds_write_opts;

// One value to write. bytes/str/json: data, len. Scalars: data points at one
// value of the column's dtype (len its size). ndarray: data holds the values,
// len their bytes; dtype, ndim, shape describe them (required where the
// encoding leaves them to the sample, and checked where it fixes them; ndim 0
// takes the column's static shape).
typedef struct {
    const void *data;
    size_t len;
    int dtype;
    int ndim;
    const int64_t *shape;
} dc_mds_value;

typedef struct dc_mds_writer dc_mds_writer;

// Starts a data set in folder `dir` (created if missing; refused if it holds
// an index.json already). Columns are stored sorted by name, as streaming
// stores them; values are always passed in the order of `cols`.
int dc_mds_writer_open(dc_mds_writer **out, const char *dir, const dc_mds_spec *cols, int ncols,
                       const dc_mds_write_opts *opts);
int dc_mds_write(dc_mds_writer *w, const dc_mds_value *values);
// Writes the last shard and index.json (last, so a folder whose writer was
// killed has no index and is never read as whole), then frees w. On failure
// w is freed too.
int dc_mds_writer_finish(dc_mds_writer *w);
// Frees w without writing an index (the shards written so far stay).
void dc_mds_writer_free(dc_mds_writer *w);
// The shards written so far and the samples they hold (the samples gathering
// for the next shard are not among them): what a killed writer leaves.
void dc_mds_writer_progress(const dc_mds_writer *w, int *shards, int64_t *samples);
// Continues a data set a writer left unfinished: its first `shards` shard
// files, written by a writer of the same columns and options, are read back
// and checked (sample count, offsets, the config every shard starts with, the
// zstd frame), and the next sample starts shard number `shards`. On a newly
// opened writer only; `*samples` receives the samples the shards hold.
int dc_mds_writer_resume(dc_mds_writer *w, int shards, int64_t *samples);
