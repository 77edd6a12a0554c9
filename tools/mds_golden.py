#!/usr/bin/env python3
"""Golden MDS data sets for tests/test_mds.c, written by mosaicml/streaming's
MDSWriter logic.

streaming itself is not on Debian, so the functions that decide the bytes are
transcribed below, unchanged in effect, from mosaicml/streaming at commit
89e7bb9082457a59f6efcfa4ef910102e07a9729:
  streaming/base/format/mds/writer.py     MDSWriter.__init__, encode_sample,
                                          get_config, encode_joint_shard
  streaming/base/format/base/writer.py    Writer.get_config, write, _name_next_shard,
                                          _hash, _process_file, _write_index, finish;
                                          JointWriter.flush_shard
  streaming/base/format/mds/encodings.py  Bytes, Str, Int, Scalar types, JSON,
                                          NDArray (encode), get_mds_encoded_size
  streaming/base/compression.py           Zstandard.compress: zstd.compress(data, level)
Needs python3-numpy and python3-zstd (the `zstd` module streaming uses).

Writes tests/golden/mds/{plain,zstd}/ (index.json and shards) and
tests/golden/mds/values.txt, one line per sample and column:
  SAMPLE COLUMN DTYPE NDIM SHAPE HEX
with DTYPE streaming's ndarray dtype number, SHAPE "d0,d1,..." ("-" for a
scalar) and HEX the value's elements as little-endian bytes (text: its UTF-8).
Regenerate: python3 tools/mds_golden.py tests/golden/mds
"""
import json
import os
import sys

import numpy as np
import zstd

# encodings.py NDArray._int2value_dtype, inverted
VALUE_DTYPE2INT = {'uint8': 8, 'int8': 9, 'uint16': 16, 'int16': 17, 'float16': 18, 'uint32': 32,
                   'int32': 33, 'float32': 34, 'uint64': 64, 'int64': 65, 'float64': 66}
SHAPE_DTYPE2INT = {'uint8': 0, 'uint16': 1, 'uint32': 2, 'uint64': 3}
SCALARS = ['uint8', 'uint16', 'uint32', 'uint64', 'int8', 'int16', 'int32', 'int64',
           'float16', 'float32', 'float64']


def ndarray_args(encoding):
    """encodings.py NDArray.from_str."""
    args = encoding.split(':')[1:]
    dtype = args[0] if len(args) >= 1 else None
    shape = tuple(map(int, args[1].split(','))) if len(args) >= 2 else None
    return dtype, shape


def get_mds_encoded_size(encoding):
    """encodings.py get_mds_encoded_size: the fixed size, or None."""
    if encoding == 'int':
        return 8
    if encoding in SCALARS:
        return np.dtype(encoding).itemsize
    if encoding.startswith('ndarray'):
        dtype, shape = ndarray_args(encoding)
        if dtype is None or shape is None:
            return None
        return int(np.prod(shape)) * getattr(np, dtype)().nbytes
    return None


def rightsize_shape_dtype(shape):
    """encodings.py NDArray._rightsize_shape_dtype."""
    x = shape.max()
    if x < (1 << 8):
        return 'uint8'
    elif x < (1 << 16):
        return 'uint16'
    elif x < (1 << 32):
        return 'uint32'
    return 'uint64'


def mds_encode(encoding, obj):
    """encodings.py mds_encode with the coders' encode methods."""
    if isinstance(obj, bytes):
        return obj
    if encoding == 'str':
        return obj.encode('utf-8')
    if encoding == 'json':
        return json.dumps(obj).encode('utf-8')
    if encoding == 'int':
        return np.int64(obj).tobytes()
    if encoding in SCALARS:
        return getattr(np, encoding)(obj).tobytes()
    if encoding.startswith('ndarray'):
        dtype, shape = ndarray_args(encoding)
        parts = []
        if dtype is None:
            parts.append(bytes([VALUE_DTYPE2INT[obj.dtype.name]]))
        else:
            assert obj.dtype == dtype
        if shape is None:
            shape_arr = np.array(obj.shape, np.int64)
            shape_dtype = rightsize_shape_dtype(shape_arr)
            parts.append(bytes([(len(obj.shape) << 2) | SHAPE_DTYPE2INT[shape_dtype]]))
            parts.append(shape_arr.astype(shape_dtype).tobytes())
        else:
            assert obj.shape == shape
        parts.append(obj.tobytes())
        return b''.join(parts)
    raise ValueError(encoding)


class MDSWriter:
    """The parts of streaming's JointWriter + MDSWriter that decide the bytes."""

    def __init__(self, columns, out, compression=None, size_limit=1 << 26):
        self.out = out
        self.compression = compression
        self.hashes = []
        self.size_limit = size_limit
        self.shards = []
        self.column_names, self.column_encodings, self.column_sizes = [], [], []
        for name in sorted(columns):
            self.column_names.append(name)
            self.column_encodings.append(columns[name])
            self.column_sizes.append(get_mds_encoded_size(columns[name]))
        self.config_data = json.dumps(self.get_config(), sort_keys=True).encode('utf-8')
        self.extra_bytes_per_shard = 4 + 4 + len(self.config_data)
        self.extra_bytes_per_sample = 4
        self._reset_cache()

    def _reset_cache(self):
        self.new_samples = []
        self.new_shard_size = self.extra_bytes_per_shard

    def get_config(self):
        obj = {'version': 2, 'format': 'mds', 'compression': self.compression,
               'hashes': self.hashes, 'size_limit': self.size_limit}
        obj.update({'column_names': self.column_names, 'column_encodings': self.column_encodings,
                    'column_sizes': self.column_sizes})
        return obj

    def encode_sample(self, sample):
        sizes, data = [], []
        for key, encoding, size in zip(self.column_names, self.column_encodings, self.column_sizes):
            datum = mds_encode(encoding, sample[key])
            if size is None:
                sizes.append(len(datum))
            else:
                assert size == len(datum)
            data.append(datum)
        return np.array(sizes, np.uint32).tobytes() + b''.join(data)

    def encode_joint_shard(self):
        num_samples = np.uint32(len(self.new_samples))
        sizes = list(map(len, self.new_samples))
        offsets = np.array([0] + sizes).cumsum().astype(np.uint32)
        offsets += len(num_samples.tobytes()) + len(offsets.tobytes()) + len(self.config_data)
        return num_samples.tobytes() + offsets.tobytes() + self.config_data + b''.join(self.new_samples)

    def write(self, sample):
        new_sample = self.encode_sample(sample)
        new_sample_size = len(new_sample) + self.extra_bytes_per_sample
        if self.size_limit and self.size_limit < self.new_shard_size + new_sample_size:
            self.flush_shard()
            self._reset_cache()
        self.new_samples.append(new_sample)
        self.new_shard_size += new_sample_size

    def _process_file(self, raw_data, raw_basename, zip_basename):
        raw_info = {'basename': raw_basename, 'bytes': len(raw_data), 'hashes': {}}
        if zip_basename:
            level = int(self.compression.split(':')[1])
            data = zstd.compress(raw_data, level)
            zip_info = {'basename': zip_basename, 'bytes': len(data), 'hashes': {}}
            basename = zip_basename
        else:
            zip_info, data, basename = None, raw_data, raw_basename
        with open(os.path.join(self.out, basename), 'wb') as out:
            out.write(data)
        return raw_info, zip_info

    def flush_shard(self):
        raw_basename = f'shard.{len(self.shards):05}.mds'
        zip_basename = raw_basename + '.zstd' if self.compression else None
        raw_info, zip_info = self._process_file(self.encode_joint_shard(), raw_basename, zip_basename)
        obj = {'samples': len(self.new_samples), 'raw_data': raw_info, 'zip_data': zip_info}
        obj.update(self.get_config())
        self.shards.append(obj)

    def finish(self):
        if self.new_samples:
            self.flush_shard()
            self._reset_cache()
        with open(os.path.join(self.out, 'index.json'), 'w') as out:
            json.dump({'version': 2, 'shards': self.shards}, out, sort_keys=True)


COLUMNS = {'bytes': 'bytes', 'caption': 'str', 'meta': 'json', 'count': 'int',
           'latent': 'ndarray:float16:2,3,4', 'tokens': 'ndarray:int32', 'anything': 'ndarray'}
COLUMNS.update({'s_' + t: t for t in SCALARS})


def make_samples(n):
    rng = np.random.default_rng(31)
    words = ['a photo of a', 'sneaker', 'bag', 'naïve café', 'snow ☃', 'emoji 😀', 'pullover']
    dyn_dtypes = ['uint8', 'int16', 'float32', 'float64', 'uint64', 'int8']
    out = []
    for i in range(n):
        s = {'bytes': rng.bytes(int(rng.integers(0, 40))),
             'caption': ' '.join(rng.choice(words, int(rng.integers(1, 5)))),
             'meta': {'width': int(rng.integers(1, 4096)), 'tag': words[i % len(words)], 'ok': bool(i % 2)},
             'count': int(rng.integers(-2**62, 2**62)),
             'latent': rng.standard_normal((2, 3, 4)).astype(np.float16),
             'tokens': rng.integers(-2**31, 2**31, int(rng.integers(1, 30)), dtype=np.int32),
             }
        dt = dyn_dtypes[i % len(dyn_dtypes)]
        shape = tuple(int(d) for d in rng.integers(1, 5, int(rng.integers(1, 4))))
        if i == 3:
            shape = (300, 1)  # a dimension past 255: a uint16 shape header
        s['anything'] = (np.abs(rng.standard_normal(shape)) * 100).astype(dt)
        for t in SCALARS:
            info = np.finfo(t) if t.startswith('float') else np.iinfo(t)
            if t.startswith('float'):
                s['s_' + t] = getattr(np, t)(rng.standard_normal() * 1000)
            else:
                s['s_' + t] = getattr(np, t)(rng.integers(info.min, info.max, dtype=t, endpoint=True))
        out.append(s)
    return out


def value_line(i, name, encoding, v):
    """The value as the C reader decodes it: dtype number, shape, element bytes."""
    if encoding in ('bytes', 'str', 'json'):
        data = v if encoding == 'bytes' else (v.encode() if encoding == 'str' else json.dumps(v).encode())
        return f'{i} {name} 8 1 {len(data)} {data.hex() or "-"}'
    if encoding == 'int':
        return f'{i} {name} 65 0 - {np.int64(v).tobytes().hex()}'
    if encoding in SCALARS:
        return f'{i} {name} {VALUE_DTYPE2INT[encoding]} 0 - {v.tobytes().hex()}'
    shape = ','.join(map(str, v.shape))
    return f'{i} {name} {VALUE_DTYPE2INT[v.dtype.name]} {v.ndim} {shape} {v.tobytes().hex()}'


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else 'tests/golden/mds'
    samples = make_samples(14)
    for sub, compression in (('plain', None), ('zstd', 'zstd:7')):
        out = os.path.join(root, sub)
        os.makedirs(out, exist_ok=True)
        for f in os.listdir(out):
            os.remove(os.path.join(out, f))
        # a small size_limit, so that the 14 samples fill several shards
        w = MDSWriter(COLUMNS, out, compression=compression, size_limit=2500)
        for s in samples:
            w.write(s)
        w.finish()
    with open(os.path.join(root, 'values.txt'), 'w') as f:
        for i, s in enumerate(samples):
            for name in sorted(COLUMNS):
                f.write(value_line(i, name, COLUMNS[name], s[name]) + '\n')


if __name__ == '__main__':
    main()
