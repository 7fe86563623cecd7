#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Seeds for fuzz_nbd: client byte streams as real clients send them
(fixed newstyle flags, options, then requests). Byte 0 picks the export
settings and byte 1 the arrival size (see fuzz/fuzz_nbd.cc).

Usage: nbd_seeds.py DIR
"""
import os
import struct
import sys

OPT = 0x49484156454F5054


def opt(code, data=b""):
    return struct.pack(">QII", OPT, code, len(data)) + data


def string(s):
    return struct.pack(">I", len(s)) + s


def req(type_, offset=0, length=0, flags=0, cookie=1):
    return struct.pack(">IHHQQI", 0x25609513, flags, type_, cookie, offset,
                       length)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    flags = struct.pack(">I", 3)
    meta = string(b"") + struct.pack(">I", 2) + string(b"base:allocation") + \
        string(b"qemu:allocation-depth")
    go = string(b"") + struct.pack(">H", 2) + struct.pack(">HH", 2, 3)
    reqs = (req(0, 0, 4096) + req(1, 8192, 512, 1) + b"\xab" * 512 +
            req(3) + req(4, 65536, 65536) + req(6, 0, 131072, 2 | 16) +
            req(7, 0, 1 << 20, 8) + req(5, 0, 4096) + req(0, 0, 4096, 4) +
            req(9) + req(2))
    seeds = {
        "go-structured": flags + opt(8) + opt(10, meta) + opt(7, go) + reqs,
        "list-info-go": flags + opt(3) + opt(6, go) + opt(9, meta) +
                        opt(8) + opt(9, meta) + opt(7, go) + reqs,
        "export-name": flags + opt(1, b"") + reqs,
        "starttls": flags + opt(5) + opt(8) + opt(7, go) + reqs,
        "abort": flags + opt(99, b"xyz") + opt(2),
        "past-end": flags + opt(7, go) + req(0, 1 << 30, 4096) +
                    req(1, (1 << 30) - 512, 1024) + b"\0" * 1024,
    }
    for name, body in seeds.items():
        for head in (b"\x00\x00", b"\x05\x07", b"\x6a\x01"):
            with open(os.path.join(out, f"{name}-{head.hex()}"), "wb") as f:
                f.write(head + body)


if __name__ == "__main__":
    main()
