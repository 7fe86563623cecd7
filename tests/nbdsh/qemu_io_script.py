#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Prints a qemu-io command script of random I/O (seeded: the same script
every run): writes with patterns, reads that check them (-P), zeroes,
discards of whole clusters, unaligned and cluster-crossing ranges, and
flushes, for an image
of SIZE bytes. tests/nbd_nbdsh_test.sh runs it through the NBD export and
on a copy of the image; the two outputs and images must be equal.

Usage: qemu_io_script.py SIZE COUNT SEED"""
import random
import sys

size, count, seed = (int(a) for a in sys.argv[1:4])
rng = random.Random(seed)
for i in range(count):
    kind = rng.choice(("write", "write", "write", "read", "zero", "discard",
                       "flush", "readv"))
    length = rng.choice((512, 4096, 65536, 65536 + 512, 300 * 1024, 1 << 20))
    offset = rng.randrange(0, (size - length) // 512) * 512
    if kind == "write":
        pattern = rng.randrange(1, 256)
        print(f"write -P {pattern} {offset} {length}")
    elif kind == "read":
        print(f"read {offset} {length}")
    elif kind == "readv":
        half = length // 2 // 512 * 512 or 512
        print(f"readv {offset} {half} {length - half if length > half else 512}")
    elif kind == "zero":
        print(f"write -z {offset} {length}")
    elif kind == "discard":
        # Whole clusters: qcow2 in QEMU ignores the rest of a discard (the
        # bytes stay), ours zeroes it; both are what NBD's TRIM allows.
        print(f"discard {offset // 65536 * 65536} {max(1, length // 65536) * 65536}")
    else:
        print("flush")
# Every byte read back, in 1 MiB steps, so that the output (qemu-io prints
# nothing of the data, only the lengths) is joined by the images' compare.
for off in range(0, size, 1 << 20):
    print(f"read -v {off} 512")
