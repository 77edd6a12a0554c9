#!/usr/bin/env python3
"""Whether two PNGs (as the engine writes them: one encoder, same filters)
hold the same pixels, to within MAXDIFF levels; the standard library only.

    python3 tools/png_pixels.py A.png B.png [MAXDIFF]

Prints PASS or FAIL with the largest difference; exit status 0 or 1."""
import struct
import sys
import zlib


def pixels(path):
    b = open(path, 'rb').read()
    i, data = 8, b''
    while i < len(b):
        n, = struct.unpack('>I', b[i:i + 4])
        if b[i + 4:i + 8] == b'IDAT':
            data += b[i + 8:i + 8 + n]
        i += 12 + n
    return zlib.decompress(data)  # filter bytes included: the same encoder makes the same stream


def main():
    a, b = pixels(sys.argv[1]), pixels(sys.argv[2])
    limit = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    worst = max((abs(x - y) for x, y in zip(a, b)), default=0) if len(a) == len(b) else 256
    print('%s (largest difference %d of 255)' % ('PASS' if worst <= limit else 'FAIL', worst))
    return 0 if worst <= limit else 1


if __name__ == '__main__':
    sys.exit(main())
