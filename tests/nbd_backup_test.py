#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Incremental backup over NBD, end to end, on `qcowtool serve` and, the
same way, on qemu-nbd as the reference.

  1. An image with data; a persistent dirty bitmap added by qemu-img
     (`qemu-img bitmap --add`); a full backup taken (raw copy).
  2. The image served with `--bitmap b0` (qemu-nbd: `-B b0`); qemu-io
     writes, write-zeroes and discards through the export.
  3. The changed extents read through the meta context
     qemu:dirty-bitmap:b0 (libnbd block status), and only those copied
     from the export onto the full backup.
  4. The server stopped: the backup equals the image (qemu-img compare),
     the image passes qemu-img check and its bitmap is not left in use.
Both servers must report the same dirty extents, through libnbd, through
`nbdinfo --map=qemu:dirty-bitmap:b0` and through `qemu-img map` with
`x-dirty-bitmap`, and fewer bytes than the disk must have been copied.

Usage: nbd_backup_test.py QCOWTOOL    (exit 77: a tool is missing)
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from nbd_util import wait_listening

try:
    import nbd
except ImportError:
    print("python3-libnbd is not installed: skipped")
    sys.exit(77)

MiB = 1 << 20
SIZE = 64 * MiB
CTX = "qemu:dirty-bitmap:b0"
WRITES = ["write -P 0x71 1M 64k", "write -P 0x72 5M 3M", "write -z 20M 1M",
          "discard 30M 2M", "write -P 0x73 40000 1000",
          "write -P 0x74 63M 1M"]


def run(*argv):
    r = subprocess.run(argv, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError("%s: exit %d: %s%s" % (" ".join(argv), r.returncode,
                                                   r.stdout, r.stderr))
    return r.stdout


def dirty_extents(uri):
    h = nbd.NBD()
    h.add_meta_context(CTX)
    h.connect_uri(uri)
    assert h.can_meta_context(CTX), "the server has no " + CTX
    out, pos = [], 0
    while pos < SIZE:
        got = []
        h.block_status(SIZE - pos, pos,
                       lambda m, o, e, err: got.extend(e) if m == CTX else 0)
        for i in range(0, len(got), 2):
            if got[i + 1] & 1:
                if out and out[-1][0] + out[-1][1] == pos:
                    out[-1] = (out[-1][0], out[-1][1] + got[i])
                else:
                    out.append((pos, got[i]))
            pos += got[i]
    h.shutdown()
    return out


def copy_extents(uri, extents, backup):
    h = nbd.NBD()
    h.connect_uri(uri)
    copied = 0
    with open(backup, "r+b") as f:
        for off, length in extents:
            while length > 0:
                n = min(length, 16 * MiB)
                f.seek(off)
                f.write(h.pread(n, off))
                off += n
                length -= n
                copied += n
    h.shutdown()
    return copied


def one_server(kind, qcowtool, work, src):
    img = os.path.join(work, kind + ".qcow2")
    shutil.copy(src, img)
    backup = os.path.join(work, kind + "-backup.raw")
    run("qemu-img", "convert", "-f", "qcow2", "-O", "raw", img, backup)
    sock = os.path.join(work, kind + ".sock")
    if kind == "qcowtool":
        argv = [qcowtool, "serve", "--socket", sock, "--bitmap", "b0", img]
    else:
        argv = ["qemu-nbd", "-k", sock, "-f", "qcow2", "-t", "-e", "4",
                "--discard=unmap", "-B", "b0", img]
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
    uri = "nbd+unix:///?socket=" + sock
    try:
        wait_listening(proc, sock)
        io = ["qemu-io", "-f", "raw"]
        for c in WRITES:
            io += ["-c", c]
        run(*io, uri)
        extents = dirty_extents(uri)
        info = run("nbdinfo", "--map=" + CTX, uri)
        qmap = json.loads(run(
            "qemu-img", "map", "--output=json", "--image-opts",
            "driver=nbd,server.type=unix,server.path=%s,"
            "x-dirty-bitmap=%s" % (sock, CTX)))
        # x-dirty-bitmap reports dirty ranges as "data": false.
        qdirty = [(e["start"], e["length"]) for e in qmap if not e["data"]]
        copied = copy_extents(uri, extents, backup)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    if proc.returncode != 0 and kind == "qcowtool":
        raise RuntimeError("qcowtool serve exited %d: %s" %
                           (proc.returncode, err))
    run("qemu-img", "check", img)
    run("qemu-img", "compare", "-f", "raw", "-F", "qcow2", backup, img)
    bitmaps = json.loads(run("qemu-img", "info", "--output=json", img))
    flags = [b["flags"] for b in bitmaps["format-specific"]["data"]
             .get("bitmaps", []) if b["name"] == "b0"]
    if flags != [["auto"]]:
        raise RuntimeError("%s: bitmap b0 afterwards: %s" % (kind, flags))
    return extents, info, qdirty, copied


def main():
    qcowtool = sys.argv[1]
    for tool in ("qemu-nbd", "qemu-img", "qemu-io", "nbdinfo"):
        if shutil.which(tool) is None:
            print("%s is not installed: skipped" % tool)
            return 77
    work = tempfile.mkdtemp(prefix="qcow2-nbdbackup-")
    try:
        src = os.path.join(work, "src.qcow2")
        run("qemu-img", "create", "-q", "-f", "qcow2", src, str(SIZE))
        run("qemu-io", "-f", "qcow2", "-c", "write -P 0x11 0 8M",
            "-c", "write -P 0x12 32M 4M", src)
        run("qemu-img", "bitmap", "--add", src, "b0")
        ours = one_server("qcowtool", qcowtool, work, src)
        theirs = one_server("qemu-nbd", qcowtool, work, src)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    failed = False
    for what, a, b in zip(("extents", "nbdinfo --map", "qemu-img map"),
                          ours[:3], theirs[:3]):
        if a != b:
            print("FAILED: %s differ:\n  ours:     %s\n  qemu-nbd: %s" %
                  (what, a, b))
            failed = True
    print("dirty extents: %s; copied %d of %d bytes" % (ours[0], ours[3],
                                                        SIZE))
    if not ours[0] or ours[3] >= SIZE:
        print("FAILED: nothing dirty, or the whole disk copied")
        failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
