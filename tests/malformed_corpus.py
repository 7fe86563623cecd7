#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Builds the malformed-image corpus: qcow2 files that lie about themselves.

    python3 tests/malformed_corpus.py OUTDIR [--only NAME[,NAME...]] [--list]

Every case starts from a valid image made by QEMU's own tools (qemu-img
create / convert -c, qemu-io writes, qemu-img snapshot), then has a few
bytes patched. Each case lives in its own directory OUTDIR/<name>/ (chains
keep their files together), and OUTDIR/manifest.json describes them all:

  {"version": 1, "cases": [ {
     "name":    "l1_past_eof",
     "image":   "l1_past_eof/image.qcow2",   # what to open (relative)
     "files":   ["l1_past_eof/image.qcow2"], # every file of the case
     "what":    "l1_table_offset points 16 MiB past the end of the file",
     "expect":  "refused" | "read-only" | "read errors at offset X" | "ok",
     "ro":  {"open": "error"|"ok",          # read-only open
             "errors": [[offset, length]],  # guest ranges whose reads fail
             "message": "...", "code": "DATA_LOSS", "names": "image.qcow2",
             "data": [offset, length, byte]},  # optional: expected contents
     "rw":  {"open": "error"|"ok",          # read-write open
             "write_at": X,                 # then a 4 KiB write there
             "write": "error"|"ok",
             "message": "...", "code": "...", "names": "...",
             "modifies": "no"|"corrupt-bit"|"yes"},
     "info_exit": [..], "info_chain_exit": [..],  # qcowtool info [--backing-chain]
     "check_exit": [..], "check_message": "...",  # qcowtool check
     "defect":  null | "..."                # known library defect (DEFECTS)
  }, ...]}

"message" is a substring the library's error must contain and "names" the
base name of the file the error must name. "modifies" says what the
read-write step may change: nothing, only the corrupt bit of the header
(the library marks an image corrupt when it meets an inconsistency while
writing, as QEMU does), or anything (a dirty image gets its refcounts
rebuilt). The read-only steps and qcowtool never change a byte.

Only the Python standard library is needed (struct, zlib, json), plus
qemu-img and qemu-io on PATH.
"""

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import zlib

KIB = 1024
MIB = 1024 * 1024

QCOW_OFLAG_COPIED = 1 << 63
QCOW_OFLAG_COMPRESSED = 1 << 62
OFFSET_MASK = 0x00FFFFFFFFFFFE00

EXT_FEATURE_NAMES = 0x6803F857
EXT_BITMAPS = 0x23852875


# Library defects found by this corpus, reported and not fixed yet (lib/ is
# owned elsewhere). The manifest copies each into its case as "defect";
# tests/malformed_test.cc then reports the case as skipped while the
# expectations stay unmet (QCOW2_STRICT_CORPUS=1 makes them fail), and fails
# once they are met, so that the line here gets deleted.
DEFECTS = {}


def run(*argv, cwd=None):
    r = subprocess.run(list(argv), cwd=cwd, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        sys.exit("malformed_corpus: %s failed (exit %d):\n%s%s" %
                 (" ".join(argv), r.returncode, r.stdout, r.stderr))
    return r.stdout


def qemu_img(*args, cwd=None):
    return run("qemu-img", *args, cwd=cwd)


def qemu_io(path, *cmds):
    argv = ["qemu-io", "-f", "qcow2"]
    for c in cmds:
        argv += ["-c", c]
    argv.append(path)
    run(*argv)


def compressible(seed, size):
    """Bytes over a 16-symbol alphabet in short runs: every cluster differs,
    yet deflate and zstd shrink it well below a cluster."""
    out = bytearray()
    x = seed * 2654435761 + 12345
    alphabet = bytes(range(0x41, 0x51))
    while len(out) < size:
        x = (x * 6364136223846793005 + 1442695040888963407) & (2**64 - 1)
        out += bytes([alphabet[(x >> 33) & 15]]) * (1 + ((x >> 40) & 7))
    return bytes(out[:size])


class Qcow2:
    """A qcow2 file in memory with just enough parsing to find things."""

    def __init__(self, path):
        self.path = path
        with open(path, "rb") as f:
            self.data = bytearray(f.read())

    def save(self):
        with open(self.path, "wb") as f:
            f.write(self.data)

    def u16(self, off):
        return struct.unpack_from(">H", self.data, off)[0]

    def u32(self, off):
        return struct.unpack_from(">I", self.data, off)[0]

    def u64(self, off):
        return struct.unpack_from(">Q", self.data, off)[0]

    def put16(self, off, v):
        struct.pack_into(">H", self.data, off, v)

    def put32(self, off, v):
        struct.pack_into(">I", self.data, off, v)

    def put64(self, off, v):
        struct.pack_into(">Q", self.data, off, v & (2**64 - 1))

    # Header fields.
    @property
    def cluster_bits(self):
        return self.u32(20)

    @property
    def cs(self):
        return 1 << self.cluster_bits

    @property
    def size(self):
        return self.u64(24)

    @property
    def l1_size(self):
        return self.u32(36)

    @property
    def l1_offset(self):
        return self.u64(40)

    @property
    def rt_offset(self):
        return self.u64(48)

    @property
    def rt_clusters(self):
        return self.u32(56)

    @property
    def incompat(self):
        return self.u64(72)

    @property
    def header_length(self):
        return self.u32(100)

    @property
    def backing_offset(self):
        return self.u64(8)

    @property
    def backing_size(self):
        return self.u32(16)

    @property
    def snapshots_offset(self):
        return self.u64(64)

    @property
    def extended(self):
        return bool(self.incompat & (1 << 4))

    @property
    def entry_size(self):
        return 16 if self.extended else 8

    def l1_entry_pos(self, guest):
        per = self.cs // self.entry_size
        return self.l1_offset + (guest // self.cs // per) * 8

    def l2_table(self, guest):
        e = self.u64(self.l1_entry_pos(guest)) & OFFSET_MASK
        assert e != 0, "%s: guest offset %#x has no L2 table" % (self.path, guest)
        return e

    def l2_entry_pos(self, guest):
        per = self.cs // self.entry_size
        return self.l2_table(guest) + (guest // self.cs % per) * self.entry_size

    def l2_entry(self, guest):
        return self.u64(self.l2_entry_pos(guest))

    def set_l2_entry(self, guest, value):
        self.put64(self.l2_entry_pos(guest), value)

    def data_cluster(self, guest):
        e = self.l2_entry(guest)
        assert not e & QCOW_OFLAG_COMPRESSED
        off = e & OFFSET_MASK
        assert off != 0
        return off

    def compressed(self, guest):
        """(entry position, host offset, sector count field, shift)."""
        pos = self.l2_entry_pos(guest)
        e = self.u64(pos)
        assert e & QCOW_OFLAG_COMPRESSED, "%#x is not compressed" % guest
        shift = 62 - (self.cluster_bits - 8)
        host = e & ((1 << shift) - 1)
        sectors = (e >> shift) & ((1 << (self.cluster_bits - 8)) - 1)
        return pos, host, sectors, shift

    def refblock(self, index=0):
        return self.u64(self.rt_offset + 8 * index) & ~0x1FF & (2**64 - 1)

    # Header extensions.
    def extension_end(self):
        end = self.cs
        if self.backing_offset:
            end = min(end, self.backing_offset)
        return end

    def extensions(self):
        pos, end, out = self.header_length, self.extension_end(), []
        while pos + 8 <= end:
            magic, length = struct.unpack_from(">II", self.data, pos)
            if magic == 0:
                break
            out.append((magic, bytes(self.data[pos + 8:pos + 8 + length])))
            pos += 8 + (length + 7) // 8 * 8
        return out

    def write_extensions(self, exts):
        """Rewrites the extension area and moves the backing name after it."""
        name = bytes(self.data[self.backing_offset:
                               self.backing_offset + self.backing_size])
        area = bytearray()
        for magic, payload in exts:
            area += struct.pack(">II", magic, len(payload)) + payload
            area += b"\0" * (-len(payload) % 8)
        area += b"\0" * 8
        start = self.header_length
        assert start + len(area) + len(name) <= self.cs
        self.data[start:self.cs] = b"\0" * (self.cs - start)
        self.data[start:start + len(area)] = area
        if self.backing_offset:
            pos = start + len(area)
            self.data[pos:pos + len(name)] = name
            self.put64(8, pos)

    def set_backing_name(self, name):
        """Stores `name` (bytes) as the backing file name, after the
        extensions (the image must have a backing file already)."""
        assert self.backing_offset
        pos = self.backing_offset
        assert pos + len(name) <= self.cs
        self.data[pos:self.cs] = b"\0" * (self.cs - pos)
        self.data[pos:pos + len(name)] = name
        self.put32(16, len(name))


class Corpus:
    def __init__(self, out, only=None, list_only=False):
        self.out = os.path.abspath(out)
        self.base_dir = os.path.join(self.out, ".base")
        self.cases = []
        self.only = only          # None: every case
        self.list_only = list_only
        self.names = []           # every case name, in order
        self.built_bases = set()

    def want(self, name):
        """Whether to build case `name` (and records the name)."""
        self.names.append(name)
        if self.list_only:
            return False
        return self.only is None or name in self.only

    # --- Base images, made by QEMU (built on first use) ---------------------

    def base(self, name):
        """Path of base image `name`, building it first if needed."""
        b = self.base_dir
        path = os.path.join(b, name)
        if name in self.built_bases:
            return path
        os.makedirs(b, exist_ok=True)
        p = lambda n: os.path.join(b, n)
        if name == "p64.qcow2":
            # 64 KiB clusters, 4 MiB: header 0, refcount table 0x10000,
            # refcount block 0x20000, L1 0x30000, L2 0x40000, data 0x50000..
            qemu_img("create", "-q", "-f", "qcow2", "-o", "cluster_size=64k",
                     path, "4M")
            qemu_io(path, "write -P 0x11 0 64k", "write -P 0x22 1M 128k",
                    "write -P 0x33 3145728 4k")
        elif name == "p512.qcow2":
            # 512-byte clusters, 2 MiB: 64 L1 entries, an L2 table per 32 KiB.
            qemu_img("create", "-q", "-f", "qcow2", "-o", "cluster_size=512",
                     path, "2M")
            qemu_io(path, "write -P 0x41 0 1k", "write -P 0x42 32k 1k",
                    "write -P 0x43 64k 512", "write -P 0x44 1M 2k")
        elif name == "p4k.qcow2":
            # 4 KiB clusters, 8 MiB: an L2 table per 2 MiB (4 L1 entries).
            qemu_img("create", "-q", "-f", "qcow2", "-o", "cluster_size=4k",
                     path, "8M")
            qemu_io(path, "write -P 0x31 0 8k", "write -P 0x32 2M 8k",
                    "write -P 0x33 4M 4k", "write -P 0x34 6M 4k")
        elif name == "xl2.qcow2":
            # Extended L2, 64 KiB clusters (2 KiB subclusters).
            qemu_img("create", "-q", "-f", "qcow2", "-o",
                     "cluster_size=64k,extended_l2=on", path, "4M")
            qemu_io(path, "write -P 0x51 0 4k", "write -P 0x52 64k 64k",
                    "write -z 128k 64k")
        elif name == "lazy.qcow2":
            qemu_img("create", "-q", "-f", "qcow2", "-o",
                     "cluster_size=64k,lazy_refcounts=on", path, "4M")
            qemu_io(path, "write -P 0x61 0 64k", "write -P 0x62 1M 64k")
        elif name in ("comp64k.qcow2", "comp4k.qcow2", "compzstd.qcow2",
                      "compxl2.qcow2"):
            # qemu-img convert -c of four compressible clusters.
            raw = p("src.raw")
            if not os.path.exists(raw):
                with open(raw, "wb") as f:
                    f.write(compressible(1, 256 * KIB))
                    f.truncate(4 * MIB)
            opts = {"comp64k.qcow2": "cluster_size=64k",
                    "comp4k.qcow2": "cluster_size=4k",
                    "compzstd.qcow2": "cluster_size=64k,compression_type=zstd",
                    "compxl2.qcow2": "cluster_size=64k,extended_l2=on"}[name]
            qemu_img("convert", "-c", "-f", "raw", "-O", "qcow2", "-o", opts,
                     raw, path)
        elif name == "bm.qcow2":
            # A persistent dirty bitmap b0 that has seen a write.
            shutil.copy(self.base("p64.qcow2"), path)
            qemu_img("bitmap", "--add", path, "b0")
            qemu_io(path, "write -P 0x44 2M 64k")
        elif name == "snap.qcow2":
            # An internal snapshot.
            shutil.copy(self.base("p64.qcow2"), path)
            qemu_img("snapshot", "-c", "s1", path)
        elif name in ("base.qcow2", "top.qcow2"):
            # A two-file chain: base.qcow2 <- top.qcow2.
            qemu_img("create", "-q", "-f", "qcow2", p("base.qcow2"), "4M")
            qemu_io(p("base.qcow2"), "write -P 0x71 0 2M")
            qemu_img("create", "-q", "-f", "qcow2", "-b", "base.qcow2", "-F",
                     "qcow2", p("top.qcow2"), cwd=b)
            qemu_io(p("top.qcow2"), "write -P 0x72 64k 64k")
            self.built_bases.update(("base.qcow2", "top.qcow2"))
        elif name in ("ext.qcow2", "ext.data"):
            # External data file.
            qemu_img("create", "-q", "-f", "qcow2", "-o", "data_file=ext.data",
                     "ext.qcow2", "4M", cwd=b)
            self.built_bases.update(("ext.qcow2", "ext.data"))
        else:
            raise ValueError("no base image " + name)
        self.built_bases.add(name)
        return path

    # --- Case bookkeeping ----------------------------------------------------

    def case_dir(self, name):
        d = os.path.join(self.out, name)
        if os.path.exists(d):
            shutil.rmtree(d)
        os.makedirs(d)
        return d

    def copy(self, name, base, as_name="image.qcow2"):
        """Copies base image `base` into case `name`; returns a Qcow2."""
        d = os.path.join(self.out, name)
        if not os.path.isdir(d):
            self.case_dir(name)
        dst = os.path.join(d, as_name)
        shutil.copy(self.base(base), dst)
        return Qcow2(dst)

    def add(self, name, what, expect, ro, rw, image="image.qcow2",
            info_exit=None, info_chain_exit=None, check_exit=None,
            check_message=None, files=None):
        d = os.path.join(self.out, name)
        if files is None:
            files = sorted(f for f in os.listdir(d)
                           if os.path.isfile(os.path.join(d, f)) and
                           not os.path.islink(os.path.join(d, f)))
        ro = dict(ro)
        rw = dict(rw)
        for block in (ro, rw):
            block.setdefault("names", image)
        rw.setdefault("modifies", "no")
        if ro["open"] == "error":
            default_info = [1]  # qemu-img's status
        else:
            default_info = [0]
        self.cases.append({
            "name": name,
            "image": name + "/" + image,
            "files": [name + "/" + f for f in files],
            "what": what,
            "expect": expect,
            "ro": ro,
            "rw": rw,
            "info_exit": info_exit if info_exit is not None else default_info,
            "info_chain_exit": (info_chain_exit if info_chain_exit is not None
                                else default_info),
            "check_exit": check_exit if check_exit is not None else [1, 2],
            "check_message": check_message,
            "defect": DEFECTS.get(name),
        })

    # Shorthands for the common shapes.
    def refused(self, name, what, message, code="DATA_LOSS", **kw):
        err = {"open": "error", "message": message, "code": code}
        self.add(name, what, "refused", err, dict(err), **kw)

    def read_errors(self, name, what, ranges, message, write_at=None,
                    write_message=None, code="DATA_LOSS", **kw):
        if write_at is None:
            write_at = ranges[0][0]
        self.add(name, what, "read errors at offset %#x" % ranges[0][0],
                 {"open": "ok", "errors": ranges, "message": message,
                  "code": code},
                 {"open": "ok", "write_at": write_at, "write": "error",
                  "message": write_message or message, "code": code,
                  "modifies": "corrupt-bit"}, **kw)

    def write_refused(self, name, what, write_at, message, **kw):
        """Reads fine (the guest sees the image's own bytes, as in QEMU),
        but a write there must be refused: it would land on metadata."""
        self.add(name, what, "read-only (writes at %#x refused)" % write_at,
                 {"open": "ok", "errors": []},
                 {"open": "ok", "write_at": write_at, "write": "error",
                  "message": message, "code": "DATA_LOSS",
                  "modifies": "corrupt-bit"}, **kw)

    # --- The cases -----------------------------------------------------------

    def build_cases(self):
        self.header_cases()
        self.table_cases()
        self.feature_cases()
        self.backing_cases()
        self.l1_l2_cases()
        self.compressed_cases()
        self.extended_l2_cases()
        self.refcount_cases()
        self.snapshot_cases()
        self.bitmap_cases()

    def header_cases(self):
        if self.want("header_length_huge"):
            q = self.copy("header_length_huge", "p64.qcow2")
            q.put32(100, 0x7FFFFFF8)
            q.save()
            self.refused("header_length_huge", "header_length 0x7ffffff8, far past "
                         "the 64 KiB cluster", "header_length 2147483640 exceeds")

        if self.want("header_length_misaligned"):
            q = self.copy("header_length_misaligned", "p64.qcow2")
            q.put32(100, 108)
            q.save()
            self.refused("header_length_misaligned", "header_length 108 is not a "
                         "multiple of 8", "header_length 108 is not a multiple of 8")

        if self.want("header_length_short"):
            q = self.copy("header_length_short", "p64.qcow2")
            q.put32(100, 96)
            q.save()
            self.refused("header_length_short", "header_length 96, below the v3 "
                         "minimum of 104", "header_length 96 is below the minimum")

        if self.want("cluster_bits_8"):
            q = self.copy("cluster_bits_8", "p64.qcow2")
            q.put32(20, 8)
            q.save()
            self.refused("cluster_bits_8", "cluster_bits 8 (256-byte clusters)",
                         "cluster_bits 8 out of range")

        if self.want("cluster_bits_22"):
            q = self.copy("cluster_bits_22", "p64.qcow2")
            q.put32(20, 22)
            q.save()
            self.refused("cluster_bits_22", "cluster_bits 22 (4 MiB clusters)",
                         "cluster_bits 22 out of range")

        if self.want("ext_length_overflow"):
            q = self.copy("ext_length_overflow", "p64.qcow2")
            pos = q.header_length
            assert q.u32(pos) == EXT_FEATURE_NAMES
            q.put32(pos + 4, 0xFFFFFFF0)
            q.save()
            self.refused("ext_length_overflow", "feature-name table extension "
                         "claims 0xfffffff0 bytes", "overflows the extension area")

        if self.want("ext_length_past_cluster"):
            q = self.copy("ext_length_past_cluster", "p64.qcow2")
            q.put32(q.header_length + 4, q.cs - q.header_length)
            q.save()
            self.refused("ext_length_past_cluster", "an extension whose data would "
                         "end past the header cluster (by 8 bytes)",
                         "overflows the extension area")

        if self.want("ext_length_into_backing_name"):
            q = self.copy("ext_length_into_backing_name", "top.qcow2")
            exts = q.extensions()
            assert exts, "top.qcow2 has no extensions"
            q.put32(q.header_length + 4, q.backing_offset - q.header_length)
            q.save()
            self.copy("ext_length_into_backing_name", "base.qcow2", "base.qcow2")
            self.refused("ext_length_into_backing_name", "backing-format extension "
                         "length runs into the backing file name",
                         "overflows the extension area")

        if self.want("ext_header_truncated"):
            q = self.copy("ext_header_truncated", "top.qcow2")
            # Four bytes of extension area: too short for a magic and a length.
            name = bytes(q.data[q.backing_offset:q.backing_offset + q.backing_size])
            q.data[q.header_length:q.cs] = b"\0" * (q.cs - q.header_length)
            q.data[q.header_length:q.header_length + 4] = b"\xe2\x79\x2a\xca"
            at = q.header_length + 4
            q.data[at:at + len(name)] = name
            q.put64(8, at)
            q.save()
            self.copy("ext_header_truncated", "base.qcow2", "base.qcow2")
            self.refused("ext_header_truncated", "the extension area is 4 bytes "
                         "long, too short for an extension header",
                         "runs past the extension area")

        if self.want("virtual_size_huge"):
            q = self.copy("virtual_size_huge", "p64.qcow2")
            q.put64(24, 1 << 63)
            q.save()
            self.refused("virtual_size_huge", "virtual size 2^63",
                         "virtual size 9223372036854775808 is too large")

    def table_cases(self):
        if self.want("l1_size_overflow"):
            q = self.copy("l1_size_overflow", "p64.qcow2")
            q.put32(36, 0xFFFFFFFF)
            q.save()
            self.refused("l1_size_overflow", "l1_size 0xffffffff (32 GiB of L1)",
                         "exceeds the 32 MiB L1 limit")

        if self.want("l1_size_too_small"):
            q = self.copy("l1_size_too_small", "p512.qcow2")
            assert q.l1_size == 64
            q.put32(36, 63)
            q.save()
            self.refused("l1_size_too_small", "l1_size 63 for a 2 MiB disk of "
                         "512-byte clusters (needs 64)",
                         "l1_size 63 is too small for virtual size 2097152")

        if self.want("l1_past_eof"):
            q = self.copy("l1_past_eof", "p64.qcow2")
            q.put64(40, 16 * MIB)
            q.save()
            self.refused("l1_past_eof", "l1_table_offset 16 MiB, past the end of "
                         "the 512 KiB file", "lies past the end of the file")

        if self.want("l1_overlaps_refcount_table"):
            q = self.copy("l1_overlaps_refcount_table", "p64.qcow2")
            q.put64(40, q.rt_offset)
            q.save()
            self.refused("l1_overlaps_refcount_table", "l1_table_offset equals "
                         "refcount_table_offset", "overlaps the refcount table")

        if self.want("l1_overlaps_header"):
            q = self.copy("l1_overlaps_header", "p64.qcow2")
            q.put64(40, 0)
            q.save()
            self.refused("l1_overlaps_header", "l1_table_offset 0 (the header)",
                         "overlaps the header")

        if self.want("l1_unaligned"):
            q = self.copy("l1_unaligned", "p64.qcow2")
            q.put64(40, q.l1_offset + 0x200)
            q.save()
            self.refused("l1_unaligned", "l1_table_offset not cluster aligned",
                         "is not cluster aligned")

        if self.want("l1_above_2_56"):
            q = self.copy("l1_above_2_56", "p64.qcow2")
            q.put64(40, 1 << 56)
            q.save()
            self.refused("l1_above_2_56", "l1_table_offset 2^56",
                         "2^56 host offset limit")

        if self.want("l1_offset_wraps"):
            q = self.copy("l1_offset_wraps", "p64.qcow2")
            q.put64(40, 0xFFFFFFFFFFFF0000)
            q.put32(36, 0x10000)
            q.save()
            self.refused("l1_offset_wraps", "l1_table_offset 0xffffffffffff0000 "
                         "with 512 KiB of L1: offset + length wraps", "overflows")

        if self.want("refcount_table_past_eof"):
            q = self.copy("refcount_table_past_eof", "p64.qcow2")
            q.put64(48, 64 * MIB)
            q.save()
            self.refused("refcount_table_past_eof", "refcount_table_offset 64 MiB, "
                         "past the end of the file", "refcount table at 0x4000000")

        if self.want("refcount_table_overlaps_header"):
            q = self.copy("refcount_table_overlaps_header", "p64.qcow2")
            q.put64(48, 0)
            q.save()
            self.refused("refcount_table_overlaps_header", "refcount_table_offset "
                         "0 (the header)",
                         "refcount table at 0x0 overlaps the header")

        if self.want("refcount_table_clusters_huge"):
            q = self.copy("refcount_table_clusters_huge", "p64.qcow2")
            q.put32(56, 0xFFFFFFFF)
            q.save()
            self.refused("refcount_table_clusters_huge", "refcount_table_clusters "
                         "0xffffffff", "exceeds the 8 MiB refcount table limit")

        if self.want("refcount_table_clusters_zero"):
            q = self.copy("refcount_table_clusters_zero", "p64.qcow2")
            q.put32(56, 0)
            q.save()
            self.refused("refcount_table_clusters_zero", "refcount_table_clusters 0",
                         "refcount_table_clusters is 0")

        if self.want("snapshot_count_huge"):
            q = self.copy("snapshot_count_huge", "p64.qcow2")
            q.put32(60, 0xFFFFFFFF)
            q.put64(64, 0x70000)
            q.save()
            self.refused("snapshot_count_huge", "nb_snapshots 0xffffffff",
                         "nb_snapshots 4294967295 exceeds the limit of 65536")

        if self.want("snapshot_table_past_eof"):
            q = self.copy("snapshot_table_past_eof", "p64.qcow2")
            q.put32(60, 1000)
            q.put64(64, 32 * MIB)
            q.save()
            self.refused("snapshot_table_past_eof", "1000 snapshots at 32 MiB, past "
                         "the end of the file", "snapshot table at 0x2000000")

        if self.want("snapshot_table_overlaps_l1"):
            q = self.copy("snapshot_table_overlaps_l1", "p64.qcow2")
            q.put32(60, 1)
            q.put64(64, q.l1_offset)
            q.save()
            self.refused("snapshot_table_overlaps_l1", "snapshot table on top of "
                         "the L1 table", "snapshot table at 0x30000 overlaps the "
                         "L1 table")

        if self.want("truncated_file"):
            q = self.copy("truncated_file", "p64.qcow2")
            del q.data[q.cs:]
            q.save()
            self.refused("truncated_file", "file cut after the header cluster",
                         "past the end of the file")

    def feature_cases(self):
        if self.want("incompat_unknown_named"):
            q = self.copy("incompat_unknown_named", "p64.qcow2")
            exts = q.extensions()
            named = []
            for magic, payload in exts:
                if magic == EXT_FEATURE_NAMES:
                    entry = bytes([0, 9]) + b"quantum entanglement".ljust(46, b"\0")
                    payload = payload + entry
                named.append((magic, payload))
            q.write_extensions(named)
            q.put64(72, q.incompat | (1 << 9))
            q.save()
            self.refused("incompat_unknown_named", "unknown incompatible bit 9, "
                         "named by the feature-name table",
                         "incompatible feature bit 9 (quantum entanglement)",
                         code="UNIMPLEMENTED", check_exit=[1])

        if self.want("incompat_unknown_unnamed"):
            q = self.copy("incompat_unknown_unnamed", "p64.qcow2")
            q.put64(72, q.incompat | (1 << 40))
            q.save()
            self.refused("incompat_unknown_unnamed", "unknown incompatible bit 40, "
                         "not in the feature-name table",
                         "unsupported incompatible feature bit 40",
                         code="UNIMPLEMENTED", check_exit=[1])

        if self.want("refcount_order_7"):
            q = self.copy("refcount_order_7", "p64.qcow2")
            q.put32(96, 7)
            q.save()
            self.refused("refcount_order_7", "refcount_order 7 (128-bit refcounts)",
                         "refcount_order 7 out of range", check_exit=[1])

        if self.want("crypt_method_aes"):
            q = self.copy("crypt_method_aes", "p64.qcow2")
            q.put32(32, 1)
            q.save()
            self.refused("crypt_method_aes", "crypt_method 1 (legacy AES)",
                         "encrypted images are not supported", code="UNIMPLEMENTED",
                         check_exit=[1])

        if self.want("external_data_file_unnamed"):
            # Data files are supported (interop_data_file_test.cc); the
            # bit with no name extension is not an image QEMU opens.
            q = self.copy("external_data_file_unnamed", "p64.qcow2")
            q.put64(72, q.incompat | (1 << 2))
            q.save()
            self.refused("external_data_file_unnamed", "external data file bit "
                         "without a data file name extension",
                         "names no data file")

        if self.want("compression_type_unknown"):
            q = self.copy("compression_type_unknown", "p64.qcow2")
            q.data[104] = 2
            q.put64(72, q.incompat | (1 << 3))
            q.save()
            self.refused("compression_type_unknown", "compression_type 2",
                         "unsupported compression_type 2", code="UNIMPLEMENTED",
                         check_exit=[1])

        if self.want("corrupt_bit"):
            q = self.copy("corrupt_bit", "p64.qcow2")
            q.put64(72, q.incompat | 2)
            q.save()
            self.add("corrupt_bit", "corrupt bit set on a consistent image",
                     "read-only", {"open": "ok", "errors": []},
                     {"open": "error", "message": "marked corrupt",
                      "code": "FAILED_PRECONDITION"}, check_exit=[0])

        if self.want("dirty_bit"):
            q = self.copy("dirty_bit", "lazy.qcow2")
            # A lazy-refcounts image that was not closed: dirty bit set and the
            # refcount of the data cluster at guest 1M never written.
            host = q.data_cluster(1 * MIB)
            blk = q.refblock(0)
            q.put16(blk + 2 * (host // q.cs), 0)
            q.put64(72, q.incompat | 1)
            q.save()
            self.add("dirty_bit", "dirty bit set (lazy refcounts) with a stale "
                     "refcount: a read-only open must not try to repair it",
                     "ok", {"open": "ok", "errors": []},
                     {"open": "ok", "write_at": 2 * MIB, "write": "ok",
                      "modifies": "yes"}, check_exit=[2])

    def backing_cases(self):
        def chain_copy(name):
            self.copy(name, "top.qcow2")
            self.copy(name, "base.qcow2", "base.qcow2")

        if self.want("backing_name_too_long"):
            chain_copy("backing_name_too_long")
            q = Qcow2(os.path.join(self.out, "backing_name_too_long", "image.qcow2"))
            q.put32(16, 1024)
            q.save()
            self.refused("backing_name_too_long", "backing_file_size 1024 (the "
                         "limit is 1023)", "backing file name too long (1024 bytes")

        if self.want("backing_name_past_cluster"):
            chain_copy("backing_name_past_cluster")
            q = Qcow2(os.path.join(self.out, "backing_name_past_cluster",
                                   "image.qcow2"))
            q.put64(8, q.cs - 10)
            q.put32(16, 100)
            q.save()
            self.refused("backing_name_past_cluster", "backing file name runs 90 "
                         "bytes past the header cluster",
                         "lies outside the header cluster")

        if self.want("backing_offset_in_header"):
            chain_copy("backing_offset_in_header")
            q = Qcow2(os.path.join(self.out, "backing_offset_in_header",
                                   "image.qcow2"))
            q.put64(8, 40)
            q.save()
            self.refused("backing_offset_in_header", "backing_file_offset 40, "
                         "inside the header fields", "lies inside the header")

        for name, backing, message, code, what in [
                ("backing_protocol_nbd", b"nbd:127.0.0.1:10809",
                 "uses the protocol 'nbd:'", "PERMISSION_DENIED",
                 "backing file name nbd:127.0.0.1:10809"),
                ("backing_protocol_json",
                 b'json:{"file":{"driver":"file","filename":"/etc/passwd"}}',
                 "uses the protocol 'json:'", "PERMISSION_DENIED",
                 "backing file name json:{...} naming /etc/passwd"),
                ("backing_nul_byte", b"base\0.qcow2", "NUL byte", "DATA_LOSS",
                 "backing file name with a NUL byte"),
                ("backing_missing", b"missing.qcow2",
                 "cannot open backing file 'missing.qcow2'", "NOT_FOUND",
                 "backing file that does not exist")]:
            if not self.want(name):
                continue
            chain_copy(name)
            q = Qcow2(os.path.join(self.out, name, "image.qcow2"))
            q.set_backing_name(backing)
            q.save()
            self.refused(name, what, message, code=code, info_exit=[0],
                         check_exit=[0])

        if self.want("backing_loop_self"):
            # Loops: a -> a, a -> b -> a, a -> link -> a (link is a symlink to a).
            d = self.case_dir("backing_loop_self")
            # qemu-img will not name an image after itself: patch the name in.
            qemu_img("create", "-q", "-f", "qcow2", "-u", "-b", "x.qcow2", "-F",
                     "qcow2", "a.qcow2", "1M", cwd=d)
            q = Qcow2(os.path.join(d, "a.qcow2"))
            q.set_backing_name(b"a.qcow2")
            q.save()
            self.refused("backing_loop_self", "a.qcow2 names itself as its backing "
                         "file", "backing chain loops back", image="a.qcow2",
                         info_exit=[0], check_exit=[0])

        if self.want("backing_loop_pair"):
            d = self.case_dir("backing_loop_pair")
            qemu_img("create", "-q", "-f", "qcow2", "-u", "-b", "b.qcow2", "-F",
                     "qcow2", "a.qcow2", "1M", cwd=d)
            qemu_img("create", "-q", "-f", "qcow2", "-u", "-b", "a.qcow2", "-F",
                     "qcow2", "b.qcow2", "1M", cwd=d)
            err = {"open": "error", "message": "backing chain loops back",
                   "code": "DATA_LOSS", "names": "b.qcow2"}
            self.add("backing_loop_pair", "a.qcow2 -> b.qcow2 -> a.qcow2",
                     "refused", err, dict(err), image="a.qcow2", info_exit=[0],
                     info_chain_exit=[1], check_exit=[0])

        if self.want("backing_loop_symlink"):
            d = self.case_dir("backing_loop_symlink")
            qemu_img("create", "-q", "-f", "qcow2", "-u", "-b", "link.qcow2", "-F",
                     "qcow2", "a.qcow2", "1M", cwd=d)
            os.symlink("a.qcow2", os.path.join(d, "link.qcow2"))
            self.refused("backing_loop_symlink", "a.qcow2 -> link.qcow2, a "
                         "symlink to a.qcow2", "backing chain loops back",
                         image="a.qcow2", info_exit=[0], check_exit=[0])

        if self.want("backing_chain_too_deep"):
            # 66 files: d00 (bottom) .. d65 (top), one more than max_chain_depth
            # (64) + 1 allows.
            d = self.case_dir("backing_chain_too_deep")
            qemu_img("create", "-q", "-f", "qcow2", "d00.qcow2", "1M", cwd=d)
            for i in range(1, 66):
                qemu_img("create", "-q", "-f", "qcow2", "-u", "-b",
                         "d%02d.qcow2" % (i - 1), "-F", "qcow2", "d%02d.qcow2" % i,
                         "1M", cwd=d)
            self.refused("backing_chain_too_deep", "a chain of 66 images, deeper "
                         "than the default max_chain_depth of 64",
                         "backing chain is deeper than 64 images",
                         code="FAILED_PRECONDITION", image="d65.qcow2",
                         info_exit=[0], check_exit=[0])

    def l1_l2_cases(self):
        # p512: L1 entry i maps guest [32 KiB * i, 32 KiB * (i + 1)).
        span = 32 * KIB
        # p64: one L2 table at 0x40000 maps the whole disk; guest 0 is data
        # at 0x50000, guest 64 KiB is unallocated.
        cl = 64 * KIB
        if self.want("l1_entry_unaligned"):
            # p4k: L1 entry i maps guest [2 MiB * i, 2 MiB * (i + 1)).
            # (With 512-byte clusters every unaligned offset hits the
            # reserved bits 0..8 instead.)
            q = self.copy("l1_entry_unaligned", "p4k.qcow2")
            q.put64(q.l1_offset + 8, q.u64(q.l1_offset + 8) + 0x200)
            q.save()
            self.read_errors("l1_entry_unaligned", "L1 entry 1 points 512 "
                             "bytes into a cluster", [[2 * MIB, 2 * MIB]],
                             "is not cluster aligned")

        if self.want("l1_entry_past_eof"):
            q = self.copy("l1_entry_past_eof", "p512.qcow2")
            q.put64(q.l1_offset + 8, QCOW_OFLAG_COPIED | 0x1000000000)
            q.save()
            self.read_errors("l1_entry_past_eof", "L1 entry 1 points at 64 GiB, "
                             "past the end of the file", [[span, span]],
                             "lies past the end of the file")

        if self.want("l1_entry_reserved_bits"):
            q = self.copy("l1_entry_reserved_bits", "p512.qcow2")
            q.put64(q.l1_offset + 8, q.u64(q.l1_offset + 8) | (1 << 62))
            q.save()
            self.read_errors("l1_entry_reserved_bits", "L1 entry 1 has reserved "
                             "bit 62 set", [[span, span]], "has reserved bits set")

        if self.want("l1_entry_points_at_refcount_table"):
            q = self.copy("l1_entry_points_at_refcount_table", "p512.qcow2")
            q.put64(q.l1_offset + 2 * 8, QCOW_OFLAG_COPIED | q.rt_offset)
            q.save()
            self.write_refused("l1_entry_points_at_refcount_table", "L1 entry 2 "
                               "names the refcount table as its L2 table (COPIED)",
                               2 * span, "corrupt image")

        if self.want("l1_entry_points_at_l1"):
            q = self.copy("l1_entry_points_at_l1", "p512.qcow2")
            q.put64(q.l1_offset + 2 * 8, QCOW_OFLAG_COPIED | q.l1_offset)
            q.save()
            self.write_refused("l1_entry_points_at_l1", "L1 entry 2 names the L1 "
                               "table itself as its L2 table (COPIED)", 2 * span,
                               "corrupt image")

        if self.want("l2_offset_zero_copied"):
            q = self.copy("l2_offset_zero_copied", "p64.qcow2")
            q.set_l2_entry(0, QCOW_OFLAG_COPIED)
            q.save()
            self.read_errors("l2_offset_zero_copied", "L2 entry with host offset 0 "
                             "(the header) and the COPIED flag", [[0, cl]],
                             "has the COPIED flag but no host offset",
                             # QEMU reads such an entry as unallocated and its
                             # check (like ours) sees only the leaked cluster.
                             check_exit=[3])

        if self.want("l2_points_at_l1"):
            q = self.copy("l2_points_at_l1", "p64.qcow2")
            q.set_l2_entry(0, QCOW_OFLAG_COPIED | q.l1_offset)
            q.save()
            self.write_refused("l2_points_at_l1", "L2 entry for guest 0 points at "
                               "the L1 table (COPIED)", 0, "over the L1 table",
                               check_exit=[2])

        if self.want("l2_points_at_refcount_table"):
            q = self.copy("l2_points_at_refcount_table", "p64.qcow2")
            q.set_l2_entry(0, QCOW_OFLAG_COPIED | q.rt_offset)
            q.save()
            self.write_refused("l2_points_at_refcount_table", "L2 entry for guest 0 "
                               "points at the refcount table (COPIED)", 0,
                               "over the refcount table", check_exit=[2])

        if self.want("l2_points_at_refcount_block"):
            q = self.copy("l2_points_at_refcount_block", "p64.qcow2")
            q.set_l2_entry(0, QCOW_OFLAG_COPIED | q.refblock(0))
            q.save()
            self.write_refused("l2_points_at_refcount_block", "L2 entry for guest 0 "
                               "points at the refcount block (COPIED)", 0,
                               "refcount block", check_exit=[2])

        if self.want("l2_points_at_own_table"):
            q = self.copy("l2_points_at_own_table", "p64.qcow2")
            q.set_l2_entry(0, QCOW_OFLAG_COPIED | q.l2_table(0))
            q.save()
            self.write_refused("l2_points_at_own_table", "L2 entry for guest 0 "
                               "points at its own L2 table (COPIED)", 0,
                               "L2 table", check_exit=[2])

        if self.want("l2_offset_above_2_56"):
            q = self.copy("l2_offset_above_2_56", "p64.qcow2")
            q.set_l2_entry(0, q.l2_entry(0) | (1 << 56))
            q.save()
            self.read_errors("l2_offset_above_2_56", "L2 entry with bit 56 set "
                             "(host offset above 2^56)", [[0, cl]],
                             "has reserved bits set")

        if self.want("l2_unaligned"):
            q = self.copy("l2_unaligned", "p64.qcow2")
            q.set_l2_entry(0, q.l2_entry(0) + 0x200)
            q.save()
            self.read_errors("l2_unaligned", "L2 entry 512 bytes into a cluster",
                             [[0, cl]], "points at an unaligned host offset")

        if self.want("l2_past_eof"):
            q = self.copy("l2_past_eof", "p64.qcow2")
            q.set_l2_entry(0, QCOW_OFLAG_COPIED | (1 << 36))
            q.save()
            self.read_errors("l2_past_eof", "L2 entry for guest 0 points at 64 GiB, "
                             "past the end of the 512 KiB file", [[0, cl]],
                             "past the end of the file")

    def compressed_cases(self):
        cl = 64 * KIB
        if self.want("compressed_past_eof"):
            # comp64k: guest clusters 0..3 are compressed.
            q = self.copy("compressed_past_eof", "comp64k.qcow2")
            pos, host, sectors, shift = q.compressed(cl)
            q.put64(pos, QCOW_OFLAG_COMPRESSED | (sectors << shift) | (1 << 30))
            q.save()
            self.read_errors("compressed_past_eof", "compressed descriptor at 1 GiB,"
                             " past the end of the file", [[cl, cl]],
                             "compressed cluster at host offset 0x40000000")

        if self.want("compressed_above_2_56"):
            q = self.copy("compressed_above_2_56", "comp4k.qcow2")
            pos, host, sectors, shift = q.compressed(4 * KIB)
            q.put64(pos, QCOW_OFLAG_COMPRESSED | (sectors << shift) | (1 << 57))
            q.save()
            self.read_errors("compressed_above_2_56", "compressed descriptor "
                             "offset 2^57 (4 KiB clusters have 58 offset bits)",
                             [[4 * KIB, 4 * KIB]], "points outside the image")

        if self.want("compressed_in_header"):
            q = self.copy("compressed_in_header", "comp64k.qcow2")
            pos, host, sectors, shift = q.compressed(0)
            q.put64(pos, QCOW_OFLAG_COMPRESSED | (sectors << shift) | 0x100)
            q.save()
            self.read_errors("compressed_in_header", "compressed descriptor "
                             "pointing into the header cluster", [[0, cl]],
                             "points outside the image")

        if self.want("compressed_garbage"):
            q = self.copy("compressed_garbage", "comp64k.qcow2")
            pos, host, sectors, shift = q.compressed(2 * cl)
            # The first 256 bytes only: streams are packed back to back, and
            # the next cluster's stream starts inside this one's last sector.
            length = 256
            x = 0x9E3779B97F4A7C15
            garbage = bytearray()
            for _ in range(length):
                x = (x * 6364136223846793005 + 1) & (2**64 - 1)
                garbage.append((x >> 56) & 0xFF)
            garbage[0] = 0xFF  # BTYPE 11: reserved, an invalid deflate block
            q.data[host:host + length] = garbage
            q.save()
            self.read_errors("compressed_garbage", "compressed cluster bytes "
                             "replaced by garbage (invalid deflate stream)",
                             [[2 * cl, cl]], "compressed cluster at host offset",
                             check_exit=[0])  # check does not decompress

        if self.want("compressed_short_stream"):
            q = self.copy("compressed_short_stream", "comp64k.qcow2")
            pos, host, sectors, shift = q.compressed(3 * cl)
            co = zlib.compressobj(6, zlib.DEFLATED, -12)
            stream = co.compress(b"short" * 100) + co.flush()
            q.data[host:host + len(stream)] = stream
            q.save()
            self.read_errors("compressed_short_stream", "a valid deflate stream "
                             "that ends after 500 bytes, short of the cluster",
                             [[3 * cl, cl]], "decompresses to 500 bytes",
                             check_exit=[0])

        if self.want("compressed_bomb"):
            q = self.copy("compressed_bomb", "comp64k.qcow2")
            pos, host, sectors, shift = q.compressed(cl)
            length = (sectors + 1) * 512 - (host & 511)
            co = zlib.compressobj(9, zlib.DEFLATED, -15)
            stream = co.compress(b"A" * (16 * MIB)) + co.flush()
            # In place of QEMU's stream, inside the sectors the descriptor names
            # (refcounts stay right; the bytes after the stream are ignored).
            assert len(stream) <= length, (len(stream), length)
            q.data[host:host + len(stream)] = stream
            q.save()
            self.add("compressed_bomb", "a raw deflate stream of 16 MiB of 'A' "
                     "(%d bytes) as one compressed 64 KiB cluster: the output "
                     "stays bounded to the cluster (QEMU also accepts the first "
                     "cluster's worth)" % len(stream), "ok",
                     {"open": "ok", "errors": [], "data": [cl, cl, 0x41]},
                     {"open": "ok", "write_at": cl, "write": "ok",
                      "modifies": "yes"}, check_exit=[0])

        if self.want("compressed_zstd_garbage"):
            q = self.copy("compressed_zstd_garbage", "compzstd.qcow2")
            pos, host, sectors, shift = q.compressed(cl)
            q.data[host:host + 64] = bytes(range(64))
            q.save()
            self.read_errors("compressed_zstd_garbage", "zstd compressed cluster "
                             "with its frame header overwritten", [[cl, cl]],
                             "compressed cluster at host offset", check_exit=[0])

    def extended_l2_cases(self):
        cl = 64 * KIB
        if self.want("xl2_alloc_and_zero"):
            # xl2: guest 0 has subclusters 0-1 allocated, cluster 1 fully
            # allocated, cluster 2 all zero, cluster 3 unallocated.
            q = self.copy("xl2_alloc_and_zero", "xl2.qcow2")
            pos = q.l2_entry_pos(0)
            bitmap = q.u64(pos + 8)
            assert bitmap & 0xFFFFFFFF == 0x3, hex(bitmap)
            q.put64(pos + 8, bitmap | (1 << 32))
            q.save()
            self.read_errors("xl2_alloc_and_zero", "extended L2 bitmap with "
                             "subcluster 0 both allocated and zero", [[0, cl]],
                             "invalid subcluster bitmap")

        if self.want("xl2_alloc_without_offset"):
            q = self.copy("xl2_alloc_without_offset", "xl2.qcow2")
            pos = q.l2_entry_pos(3 * cl)
            assert q.u64(pos) == 0
            q.put64(pos + 8, 0xF0)
            q.save()
            self.read_errors("xl2_alloc_without_offset", "extended L2 entry with "
                             "allocated subclusters but no host cluster",
                             [[3 * cl, cl]], "invalid subcluster bitmap")

        if self.want("xl2_zero_flag_set"):
            q = self.copy("xl2_zero_flag_set", "xl2.qcow2")
            pos = q.l2_entry_pos(cl)
            q.put64(pos, q.u64(pos) | 1)
            q.save()
            self.read_errors("xl2_zero_flag_set", "extended L2 entry with bit 0 "
                             "(reserved with extended L2) set", [[cl, cl]],
                             "has reserved bits set",
                             # QEMU ignores bit 0 with extended L2 entries.
                             check_exit=[0])

        if self.want("xl2_compressed_with_bitmap"):
            q = self.copy("xl2_compressed_with_bitmap", "compxl2.qcow2")
            pos, host, sectors, shift = q.compressed(cl)
            q.put64(pos + 8, 0x00000000FFFFFFFF)
            q.save()
            self.read_errors("xl2_compressed_with_bitmap", "compressed cluster in "
                             "an extended-L2 image with allocation bits set in its "
                             "(reserved) bitmap", [[cl, cl]], "bitmap")

    def refcount_cases(self):
        if self.want("refcount_block_unaligned"):
            q = self.copy("refcount_block_unaligned", "p64.qcow2")
            q.put64(q.rt_offset, q.refblock(0) + 0x200)
            q.save()
            self.add("refcount_block_unaligned", "refcount table entry 0 is not "
                     "cluster aligned: reads work, the first allocation must fail",
                     "read-only", {"open": "ok", "errors": []},
                     {"open": "ok", "write_at": 2 * MIB, "write": "error",
                      "message": "refcount block offset 0x20200",
                      "code": "DATA_LOSS", "modifies": "corrupt-bit"})

        if self.want("refcount_block_points_at_l1"):
            q = self.copy("refcount_block_points_at_l1", "p64.qcow2")
            q.put64(q.rt_offset, q.l1_offset)
            q.save()
            self.add("refcount_block_points_at_l1", "refcount table entry 0 names "
                     "the L1 table as a refcount block: an allocation must not "
                     "rewrite the L1 table as refcounts", "read-only",
                     {"open": "ok", "errors": []},
                     {"open": "ok", "write_at": 2 * MIB, "write": "error",
                      "message": "corrupt image", "code": "DATA_LOSS",
                      "modifies": "corrupt-bit"})

        if self.want("refcount_block_past_eof"):
            q = self.copy("refcount_block_past_eof", "p64.qcow2")
            q.put64(q.rt_offset, 1 << 40)
            q.save()
            self.add("refcount_block_past_eof", "refcount table entry 0 points at "
                     "1 TiB, past the end of the file (reads as all-free)",
                     "read-only", {"open": "ok", "errors": []},
                     {"open": "ok", "write_at": 2 * MIB, "write": "error",
                      "message": "corrupt image", "code": "DATA_LOSS",
                      "modifies": "corrupt-bit"})

        if self.want("refcounts_zero_for_metadata"):
            q = self.copy("refcounts_zero_for_metadata", "p64.qcow2")
            blk = q.refblock(0)
            # Clusters 2.. (refcount block, L1, L2, data) claim refcount 0.
            for c in range(2, 16):
                q.put16(blk + 2 * c, 0)
            q.save()
            self.add("refcounts_zero_for_metadata", "refcount block says the "
                     "refcount block, L1, L2 and data clusters are free (not "
                     "dirty): an allocating write must not land on metadata",
                     "read-only", {"open": "ok", "errors": []},
                     {"open": "ok", "write_at": 2 * MIB, "write": "error",
                      "message": "corrupt image", "code": "DATA_LOSS",
                      "modifies": "corrupt-bit"}, check_exit=[2])

    def snapshot_cases(self):
        if self.want("snapshot_extra_data_huge"):
            q = self.copy("snapshot_extra_data_huge", "snap.qcow2")
            at = q.snapshots_offset
            q.put32(at + 36, 0xFFFFFFFF)
            q.save()
            self.add("snapshot_extra_data_huge", "internal snapshot entry with "
                     "extra_data_size 0xffffffff (the library does not use "
                     "internal snapshots; check must stop cleanly)", "ok",
                     {"open": "ok", "errors": []},
                     {"open": "ok", "write_at": 2 * MIB, "write": "ok",
                      "modifies": "yes"}, check_exit=[1],
                     check_message="Too much extra metadata")

        if self.want("snapshot_l1_size_huge"):
            q = self.copy("snapshot_l1_size_huge", "snap.qcow2")
            at = q.snapshots_offset
            q.put32(at + 8, 0x7FFFFFFF)
            q.save()
            self.add("snapshot_l1_size_huge", "internal snapshot whose L1 table "
                     "claims 0x7fffffff entries", "ok", {"open": "ok", "errors": []},
                     {"open": "ok", "write_at": 2 * MIB, "write": "ok",
                      "modifies": "yes"}, check_exit=[1, 2],
                     check_message="snapshot")

    def bitmap_cases(self):
        """A bitmap directory entry patched: the guest data stays readable,
        a read-write open (which would have to maintain the bitmap) is
        refused, naming what is wrong. (qemu-img refuses to open all of
        these; qcowtool check counts what the entry names, so its verdict
        is a leak or corruption report, never a crash.)"""
        def entry(q):
            for magic, payload in q.extensions():
                if magic == EXT_BITMAPS:
                    return struct.unpack(">Q", payload[16:24])[0]
            raise ValueError("no bitmaps extension")

        cases = [
            ("bitmap_flags_reserved", "bitmap flags with reserved bit 3",
             12, struct.pack(">I", 0xA), "unsupported flags 0x8",
             "UNIMPLEMENTED", [0]),
            ("bitmap_type_2", "bitmap of type 2 (only 1 is defined)", 16,
             bytes([2]), "has type 2", "UNIMPLEMENTED", [0]),
            ("bitmap_name_size_0", "bitmap directory entry with an empty "
             "name", 18, struct.pack(">H", 0), "name_size is 0", "DATA_LOSS",
             [0, 1, 2]),
            ("bitmap_table_unaligned", "bitmap table offset not cluster "
             "aligned", 6, struct.pack(">H", 0x1234), "bitmap table offset",
             "DATA_LOSS", [0, 1, 2, 3]),
            ("bitmap_table_past_eof", "bitmap table 16 TiB past the end of "
             "the file", 2, bytes([0x10]), "past the end of the file",
             "DATA_LOSS", [0, 1, 2]),
        ]
        for name, what, at, patch, message, code, check_exit in cases:
            if not self.want(name):
                continue
            q = self.copy(name, "bm.qcow2")
            d = entry(q) + at
            q.data[d:d + len(patch)] = patch
            q.save()
            self.add(name, what, "read-only (read-write refused)",
                     {"open": "ok", "errors": [],
                      "data": [2 * MIB, 64 * KIB, 0x44]},
                     {"open": "error", "message": message, "code": code},
                     check_exit=check_exit)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("outdir", nargs="?")
    ap.add_argument("--only", help="comma-separated case names to build")
    ap.add_argument("--list", action="store_true",
                    help="print the case names and exit")
    args = ap.parse_args()
    if args.list:
        c = Corpus(".", list_only=True)
        c.build_cases()
        print("\n".join(c.names))
        return
    if not args.outdir:
        ap.error("OUTDIR is required")
    only = set(args.only.split(",")) if args.only else None
    c = Corpus(args.outdir, only=only)
    os.makedirs(c.out, exist_ok=True)
    c.build_cases()
    if os.path.isdir(c.base_dir):
        shutil.rmtree(c.base_dir)
    names = [x["name"] for x in c.cases]
    assert len(c.names) == len(set(c.names)), "duplicate case names"
    assert set(DEFECTS) <= set(c.names), "DEFECTS names an unknown case"
    if only is not None and set(names) != only:
        sys.exit("malformed_corpus: unknown case(s): %s" %
                 ", ".join(sorted(only - set(names))))
    with open(os.path.join(c.out, "manifest.json"), "w") as f:
        json.dump({"version": 1, "cases": c.cases}, f, indent=1)
        f.write("\n")
    print("malformed_corpus: %d cases in %s" % (len(c.cases), c.out))


if __name__ == "__main__":
    main()
