#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""`qcowtool serve` and qemu-nbd side by side under libnbd (python3-libnbd,
the library behind nbdsh), strict mode on for the protocol and off only to
send the bad requests of the error paths.

Each scenario runs against both servers, each serving its own copy of the
same qcow2 chain (made by qemu-img and qemu-io), and records what the
client sees: option answers, flags, data, block status (per 64 KiB, as
extent boundaries may differ), read chunk kinds and errno values. The two
records must be equal, and some values are also checked outright (an
unknown flag is EINVAL, a write on a read-only export EPERM, ...).

Usage: nbd_clients_test.py QCOWTOOL     (exit 77: a tool is missing)
"""
import errno
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from nbd_util import wait_listening

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "nbdsh"))

try:
    import nbd
except ImportError:
    print("python3-libnbd is not installed: skipped")
    sys.exit(77)
from common import per_cluster as per_cluster_of  # tests/nbdsh/common.py

MiB = 1 << 20
SIZE = 16 * MiB
CLUSTER = 65536
NAME = "disk"


def run(*argv):
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)


def make_chain(d):
    base, top = os.path.join(d, "base.qcow2"), os.path.join(d, "top.qcow2")
    run("qemu-img", "create", "-q", "-f", "qcow2", base, str(SIZE))
    run("qemu-io", "-f", "qcow2", "-c", "write -P 0x11 0 1M",
        "-c", "write -P 0x22 4M 256k", base)
    run("qemu-img", "create", "-q", "-f", "qcow2", "-b", base, "-F", "qcow2",
        top)
    run("qemu-io", "-f", "qcow2", "-c", "write -P 0x33 512k 1M",
        "-c", "write -z 8M 1M", "-c", "write -P 0x44 12M 64k", top)
    return top


class Server:
    def __init__(self, kind, qcowtool, d, read_only=False):
        self.sock = os.path.join(d, f"{kind}.sock")
        src = make_chain(d)
        if kind == "qcowtool":
            argv = [qcowtool, "serve", "--socket", self.sock,
                    "--export-name", NAME, src]
            if read_only:
                argv[2:2] = ["-r"]
        else:
            argv = ["qemu-nbd", "-k", self.sock, "-f", "qcow2", "-t",
                    "-e", "8", "-x", NAME, "-A", "--cache=writeback",
                    "--discard=unmap", src]
            if read_only:
                argv[1:1] = ["-r"]
        self.image = src
        self.proc = subprocess.Popen(argv, stderr=subprocess.PIPE)
        wait_listening(self.proc, self.sock)

    def stop(self):
        self.proc.terminate()
        _, err = self.proc.communicate(timeout=60)
        return self.proc.returncode, err.decode(errors="replace")


def handle(server, structured=True, contexts=(), strict=True, name=NAME):
    h = nbd.NBD()
    h.set_request_structured_replies(structured)
    for c in contexts:
        h.add_meta_context(c)
    if not strict:
        h.set_strict_mode(0)
    h.set_export_name(name)
    h.connect_unix(server.sock)
    return h


def errname(e):
    return errno.errorcode.get(e.errnum, str(e.errnum)) if e.errnum else "error"


def attempt(fn):
    try:
        r = fn()
        return ("ok", r if isinstance(r, (int, bool, str, type(None))) else None)
    except nbd.Error as e:
        return ("error", errname(e))


FLAGS = ("is_read_only", "can_flush", "can_fua", "can_trim", "can_zero",
         "can_fast_zero", "can_cache", "can_multi_conn", "can_df")


def options(server, rec):
    h = nbd.NBD()
    h.set_opt_mode(True)
    h.connect_unix(server.sock)
    names = []
    h.opt_list(lambda name, desc: names.append(name))
    rec.append(("list", names))
    contexts = []
    h.set_export_name(NAME)
    h.opt_list_meta_context(lambda name: contexts.append(name))
    rec.append(("list_meta_context", sorted(contexts)))
    h.set_export_name("nosuch")
    rec.append(("info nosuch", attempt(h.opt_info)))
    h.set_export_name(NAME)
    h.opt_info()
    rec.append(("info size", h.get_size()))
    h.add_meta_context("base:allocation")
    h.add_meta_context("nope:thing")
    h.opt_go()
    rec.append(("go", h.get_size(), h.get_structured_replies_negotiated(),
                h.can_meta_context("base:allocation"),
                h.can_meta_context("nope:thing")))
    rec.append(("flags", [getattr(h, f)() for f in FLAGS]))
    h.shutdown()
    h = nbd.NBD()
    h.set_opt_mode(True)
    h.connect_unix(server.sock)
    h.opt_abort()
    rec.append(("abort", h.aio_is_closed()))


def per_cluster(h, context):
    """Block status flags of every 64 KiB, whatever the extent sizes."""
    return per_cluster_of(h, context, SIZE)


def chunks(h, count, offset):
    kinds = []

    def cb(buf, off, status, err):
        kinds.append({nbd.READ_DATA: "data", nbd.READ_HOLE: "hole"}
                     .get(status, status))
        return 0
    h.pread_structured(count, offset, cb)
    return kinds


def commands(server, rec, structured):
    ctx = ("base:allocation", "qemu:allocation-depth") if structured else ()
    h = handle(server, structured, ctx)
    rec.append(("structured", h.get_structured_replies_negotiated()))
    rec.append(("read", h.pread(3 * MiB, 0)))
    h.pwrite(b"\x55" * 4096, 2 * MiB, nbd.CMD_FLAG_FUA)
    h.pwrite(b"\x66" * 100000, 3 * MiB + 7)
    h.zero(CLUSTER, 5 * MiB, nbd.CMD_FLAG_NO_HOLE)
    h.zero(2 * CLUSTER, 6 * MiB)
    rec.append(("fast zero", attempt(
        lambda: h.zero(CLUSTER, 7 * MiB, nbd.CMD_FLAG_FAST_ZERO))))
    h.trim(CLUSTER, 9 * MiB)
    # CACHE of a range the top allocates already (nothing to copy);
    # copy-on-read of backing data is compared in tests/nbdsh/commands.py.
    h.cache(CLUSTER, 12 * MiB)
    h.flush()
    rec.append(("read back", h.pread(10 * MiB, 0)))
    if structured:
        rec.append(("chunks data", chunks(h, 4096, 12 * MiB)))
        rec.append(("chunks hole", chunks(h, 4096, 14 * MiB)))
        rec.append(("chunks df", attempt(lambda: h.pread(
            CLUSTER, 12 * MiB - CLUSTER, nbd.CMD_FLAG_DF))))
        rec.append(("base:allocation", per_cluster(h, "base:allocation")))
        rec.append(("qemu:allocation-depth",
                    per_cluster(h, "qemu:allocation-depth")))
        one = []
        h.block_status(SIZE, 0, lambda m, o, e, err: one.append((m, len(e))),
                       nbd.CMD_FLAG_REQ_ONE)
        rec.append(("req_one", sorted(one)))
    h.shutdown()


def errors(server, rec):
    h = handle(server, True, (), strict=False)
    rec.append(("read past end", attempt(lambda: h.pread(4096, SIZE))))
    rec.append(("read across end", attempt(lambda: h.pread(8192, SIZE - 4096))))
    rec.append(("write past end",
                attempt(lambda: h.pwrite(b"x" * 512, SIZE))))
    rec.append(("zero past end", attempt(lambda: h.zero(512, SIZE))))
    rec.append(("read unknown flag",
                attempt(lambda: h.pread(512, 0, 1 << 7))))
    rec.append(("write unknown flag",
                attempt(lambda: h.pwrite(b"x" * 512, 0, 1 << 7))))
    rec.append(("block status without context",
                attempt(lambda: h.block_status(512, 0, lambda *a: 0))))
    rec.append(("still serving", h.pread(512, 0) == b"\x11" * 512))
    h.shutdown()


def read_only(server, rec):
    h = handle(server, True, (), strict=False)
    rec.append(("ro flags", [getattr(h, f)() for f in FLAGS]))
    rec.append(("ro write", attempt(lambda: h.pwrite(b"x" * 512, 0))))
    rec.append(("ro zero", attempt(lambda: h.zero(512, 0))))
    rec.append(("ro trim", attempt(lambda: h.trim(512, 0))))
    rec.append(("ro read", h.pread(512, 0) == b"\x11" * 512))
    h.shutdown()


def nbdinfo(server, rec):
    uri = f"nbd+unix:///{NAME}?socket={server.sock}"
    def out(*args):
        r = subprocess.run(["nbdinfo", *args, uri], capture_output=True,
                           text=True)
        return r.returncode, r.stdout.replace(server.sock, "SOCKET")
    rec.append(("--list", out("--list")))
    for what in ("read", "write", "flush", "fua", "trim", "zero",
                 "fast-zero", "cache", "multi-conn", "df", "extents",
                 "structured-reply"):
        rec.append((f"--can {what}", out("--can", what)[0]))
    rec.append(("--map", out("--map")))
    rec.append(("--map depth", out("--map=qemu:allocation-depth")))
    rec.append(("--map totals", out("--map", "--totals")))


def scenario(kind, qcowtool, fn, read_only_export=False):
    d = tempfile.mkdtemp(prefix="qcow2-nbdclients-")
    try:
        server = Server(kind, qcowtool, d, read_only_export)
        rec = []
        try:
            fn(server, rec)
        finally:
            rc, err = server.stop()
        if kind == "qcowtool":
            assert rc == 0, f"qcowtool serve exited {rc}: {err}"
        check = subprocess.run(["qemu-img", "check", server.image],
                               capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
        return rec
    finally:
        shutil.rmtree(d)


def main():
    qcowtool = sys.argv[1]
    for tool in ("qemu-nbd", "qemu-img", "qemu-io"):
        if shutil.which(tool) is None:
            print(f"{tool} is not installed: skipped")
            return 77
    cases = [
        ("options", options, False),
        ("nbdinfo", nbdinfo, False),
        ("commands structured", lambda s, r: commands(s, r, True), False),
        ("commands simple", lambda s, r: commands(s, r, False), False),
        ("errors", errors, False),
        ("read-only", read_only, True),
    ]
    # Where the protocol document prescribes an error value and qemu-nbd
    # 7.2 answers EINVAL instead: both must fail, ours with the
    # prescribed value (ENOSPC for writes past the end, EPERM for writes
    # on a read-only export).
    prescribed = {
        "write past end": ("error", "ENOSPC"),
        "zero past end": ("error", "ENOSPC"),
        "ro write": ("error", "EPERM"),
        "ro zero": ("error", "EPERM"),
        "ro trim": ("error", "EPERM"),
    }
    failed = 0
    for name, fn, ro in cases:
        ours = scenario("qcowtool", qcowtool, fn, ro)
        theirs = scenario("qemu-nbd", qcowtool, fn, ro)
        for a, b in zip(ours, theirs):
            if a[0] in prescribed and a[0] == b[0]:
                if a[1] != prescribed[a[0]] or b[1][0] != "error":
                    failed += 1
                    print(f"{name}: {a[0]}: ours {a[1]}, qemu-nbd {b[1]}; "
                          f"expected {prescribed[a[0]]}")
                continue
            if a != b:
                failed += 1
                sa, sb = repr(a), repr(b)
                print(f"{name}: differs from qemu-nbd:\n  ours:     "
                      f"{sa[:300]}\n  qemu-nbd: {sb[:300]}")
        if len(ours) != len(theirs):
            failed += 1
            print(f"{name}: {len(ours)} records, qemu-nbd {len(theirs)}")
        if name == "errors":
            got = dict((r[0], r[1]) for r in ours)
            for key in ("read past end", "read unknown flag",
                        "write unknown flag"):
                if got[key] != ("error", "EINVAL"):
                    failed += 1
                    print(f"{name}: {key}: {got[key]}, expected EINVAL")
        print(f"{name}: {len(ours)} records compared")
    if failed:
        print(f"FAILED: {failed} difference(s)")
        return 1
    print("all equal to qemu-nbd")
    return 0


if __name__ == "__main__":
    sys.exit(main())
