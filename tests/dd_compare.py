#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""`qcowtool dd` against `qemu-img dd` (the oracle): the same output bytes
and virtual size for a matrix of inputs and operands (skip= and count=
past the end included), and the same exit status with the same message
for qemu-img's refusals.

  dd_compare.py QCOWTOOL

Raw outputs are compared byte for byte (cmp); qcow2 outputs are checked
with `qemu-img check`, their virtual sizes compared, and their contents
compared after `qemu-img convert -O raw` of both. Exits 77 (skipped)
without qemu-img.
"""
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

FAILURES = []


def run(cmd, cwd):
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True,
                          check=False)


def must(cmd, cwd):
    r = run(cmd, cwd)
    if r.returncode != 0:
        sys.exit(f"setup failed: {' '.join(cmd)}: {r.stderr.strip()}")
    return r


def fail(what):
    FAILURES.append(what)
    print("FAIL", what)


def make_inputs(d):
    rng = random.Random(47)
    with open(os.path.join(d, "odd.raw"), "wb") as f:  # not a 512 multiple
        f.write(rng.randbytes(5000))
    with open(os.path.join(d, "big.raw"), "wb") as f:
        f.write(rng.randbytes(3 * 65536 + 1536))
    # A chain: the base's data shows through where the top has none.
    must(["qemu-img", "create", "-q", "-f", "qcow2", "base.qcow2", "1M"], d)
    must(["qemu-io", "-c", "write -P 0x11 0 512k", "-c",
          "write -P 0x22 700k 100k", "base.qcow2"], d)
    must(["qemu-img", "create", "-q", "-f", "qcow2", "-b", "base.qcow2",
          "-F", "qcow2", "top.qcow2", "1M"], d)
    must(["qemu-io", "-c", "write -P 0x33 64k 64k", "-c",
          "write -z 300k 4k", "-c", "write -P 0x44 1020k 4k",
          "top.qcow2"], d)
    must(["qemu-img", "create", "-q", "-f", "qcow2", "empty.qcow2", "0"], d)


def virtual_size(path, cwd):
    r = must(["qemu-img", "info", "--output=json", path], cwd)
    return json.loads(r.stdout)["virtual-size"]


def compare_outputs(case, fmt, d):
    q, o = "q.out", "o.out"
    if fmt == "raw":
        if open(os.path.join(d, q), "rb").read() != open(
                os.path.join(d, o), "rb").read():
            fail(f"{case}: raw outputs differ "
                 f"({os.path.getsize(os.path.join(d, q))} vs "
                 f"{os.path.getsize(os.path.join(d, o))} bytes)")
        return
    r = run(["qemu-img", "check", "-q", o], d)
    if r.returncode != 0:
        fail(f"{case}: qemu-img check of our qcow2 output: {r.stdout}{r.stderr}")
        return
    qs, os_ = virtual_size(q, d), virtual_size(o, d)
    if qs != os_:
        fail(f"{case}: virtual sizes {qs} (qemu-img) vs {os_} (qcowtool)")
        return
    must(["qemu-img", "convert", "-O", "raw", q, "q.conv"], d)
    must(["qemu-img", "convert", "-O", "raw", o, "o.conv"], d)
    if open(os.path.join(d, "q.conv"), "rb").read() != open(
            os.path.join(d, "o.conv"), "rb").read():
        fail(f"{case}: qcow2 outputs' contents differ")


def message(stderr, prog):
    """The first line of stderr without the program's prefix. An open
    error keeps only "Could not open 'NAME'": the reason after it is the
    library's own wording."""
    line = stderr.strip().split("\n")[0] if stderr.strip() else ""
    line = line.removeprefix(prog + ": ")
    if line.startswith("Could not open '"):
        line = line[:line.find("': ") + 1]
    return line


def dd_both(qcowtool, args, d, leave_output=None):
    for name in ("q.out", "o.out"):
        p = os.path.join(d, name)
        if os.path.lexists(p):
            os.unlink(p)
        if leave_output is not None:
            with open(p, "wb") as f:
                f.write(leave_output)
    q = run(["qemu-img", "dd", *[a.replace("OUT", "q.out") for a in args]], d)
    o = run([qcowtool, "dd", *[a.replace("OUT", "o.out") for a in args]], d)
    return q, o


# Operand sets run on every input, to raw and to qcow2 outputs.
OPERANDS = [
    [],
    ["bs=4k"],
    ["bs=1000"],
    ["bs=64k", "count=2"],
    ["bs=4k", "skip=3", "count=5"],     # count ends before skip+count
    ["bs=4k", "skip=2", "count=2"],     # count*bs == skip*bs: empty
    ["bs=4k", "skip=1", "count=1k"],    # count past the end, suffix
    ["bs=512", "count=999999999"],       # count past the end
    ["bs=1000", "skip=4"],
    ["bs=4k", "skip=100000"],           # skip past the end: message, rc 0
    ["bs=2", "skip=9223372036854775807"],  # skip*bs overflows
    ["bs=64k", "count=9223372036854775807"],  # count*bs overflows
    ["count=0"],
    ["bs=1M", "count=1", "skip=0"],
    ["bs=7", "count=300", "skip=11"],
]

INPUTS = [("odd.raw", []), ("big.raw", ["-f", "raw"]),
          ("top.qcow2", ["-f", "qcow2"]), ("empty.qcow2", [])]

# qemu-img's refusals: same exit status, same message (first line).
REFUSALS = [
    ["if=odd.raw"],
    ["of=OUT"],
    ["if=odd.raw", "of=OUT", "foo"],
    ["if=odd.raw", "of=OUT", "foo=1"],
    ["if=odd.raw", "of=OUT", "bs=0"],
    ["if=odd.raw", "of=OUT", "bs=3x"],
    ["if=odd.raw", "of=OUT", "bs=2G"],
    ["if=odd.raw", "of=OUT", "count=-1"],
    ["if=odd.raw", "of=OUT", "skip=abc"],
    ["if=odd.raw", "of=OUT", "skip=9223372036854775808"],
    ["if=missing.raw", "of=OUT"],
    ["-O", "nosuchformat", "if=odd.raw", "of=OUT"],
]
# Refusals whose messages differ in wording on purpose (getopt's, and
# formats qemu-img has that qcowtool does not): exit status only.
REFUSALS_STATUS_ONLY = [
    ["-Z", "if=odd.raw", "of=OUT"],
    ["if=odd.raw", "of=OUT", "-f"],
]


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    qcowtool = os.path.abspath(sys.argv[1])
    if shutil.which("qemu-img") is None or shutil.which("qemu-io") is None:
        print("qemu-img/qemu-io not found: skipped")
        return 77
    d = tempfile.mkdtemp(prefix="dd_compare.")
    try:
        make_inputs(d)
        cases = 0
        for inp, fopt in INPUTS:
            for ops in OPERANDS:
                for ofmt in ("raw", "qcow2"):
                    args = [*fopt, "-O", ofmt, f"if={inp}", "of=OUT", *ops]
                    case = f"dd {' '.join(args)}"
                    q, o = dd_both(qcowtool, args, d)
                    cases += 1
                    if q.returncode != o.returncode:
                        fail(f"{case}: exit {o.returncode}, qemu-img "
                             f"{q.returncode}: {o.stderr.strip()}")
                        continue
                    if message(q.stderr, "qemu-img") != message(
                            o.stderr, "qcowtool"):
                        fail(f"{case}: message '{o.stderr.strip()}', "
                             f"qemu-img '{q.stderr.strip()}'")
                    if q.returncode == 0:
                        compare_outputs(case, ofmt, d)
        # An existing output is replaced, whatever it held.
        args = ["if=odd.raw", "of=OUT", "bs=1000", "count=2"]
        q, o = dd_both(qcowtool, args, d, leave_output=b"\xff" * 100000)
        cases += 1
        if q.returncode or o.returncode:
            fail(f"replace: exit {o.returncode}/{q.returncode}")
        else:
            compare_outputs("replace existing output", "raw", d)
        for args in REFUSALS + REFUSALS_STATUS_ONLY:
            q, o = dd_both(qcowtool, args, d)
            cases += 1
            case = f"dd {' '.join(args)}"
            if q.returncode != o.returncode:
                fail(f"{case}: exit {o.returncode}, qemu-img {q.returncode}")
            elif args in REFUSALS:
                qm, om = message(q.stderr, "qemu-img"), message(o.stderr,
                                                                "qcowtool")
                # qcowtool names the formats it has after qemu's words.
                if not (om == qm or om.startswith(qm)):
                    fail(f"{case}: message '{om}', qemu-img '{qm}'")
            if os.path.exists(os.path.join(d, "o.out")) != os.path.exists(
                    os.path.join(d, "q.out")):
                fail(f"{case}: an output file left by one tool only")
        print(f"{cases} cases, {len(FAILURES)} failed")
        return 1 if FAILURES else 0
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
