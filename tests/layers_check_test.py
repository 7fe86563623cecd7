#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Shows that tests/layers_check.py can fail: it passes on the tree, then,
on a copy of the tree's checked folders with one probe file added, fails
naming the probe, for each kind of include it forbids: a tool, the nbdkit
plugin, an example and a new server folder reaching into lib/ (or the test
doubles), a layer below lib/api including a facade header, and an include
cycle among the parts of lib/driver.

Usage: layers_check_test.py SOURCE_DIR
"""
import os
import shutil
import subprocess
import sys
import tempfile

CHECKER = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                       "layers_check.py")
COPIED = ("docs", "lib", "include", "tools", "nbd", "examples", "serve")

# (probe path, its include line): each must make the check fail.
PROBES = [
    ("tools/probe_layers.cc", '#include "lib/base/endian.h"'),
    ("tools/sub/probe_layers.h", '#include "lib/driver/qcow2_layer.h"'),
    ("nbd/probe_layers.cc", '#include "lib/engine/engine.h"'),
    ("examples/c_epoll/probe_layers.c", '#include "lib/api/c_internal.h"'),
    ("serve/probe_layers.cc", '#include "testing/memory_file.h"'),
    ("tools/probe_layers_nbd.cc", '#include "nbd/anything.h"'),
    ("lib/chain/probe_layers.h", '#include "qcow2/image.h"'),
    # The offline checker sits on the format alone; the online driver
    # must not reach the offline surgery above it.
    ("lib/check/probe_layers.cc", '#include "lib/meta/refcounts.h"'),
    ("lib/driver/probe_layers.cc", '#include "lib/ops/amend.h"'),
    # The online driver's parts are untied: a source of the flush
    # sequencer that calls back into the pending clusters (which call the
    # sequencer) closes an include cycle inside lib/driver.
    ("lib/driver/flush_sequencer_probe.cc",
     '#include "lib/driver/pending_clusters.h"'),
]


def run(root):
    r = subprocess.run([sys.executable, CHECKER, root], capture_output=True,
                       text=True)
    return r.returncode, r.stdout + r.stderr


def main(argv):
    src = argv[1]
    rc, out = run(src)
    if rc != 0:
        print(f"layers_check fails on the tree:\n{out}")
        return 1
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for d in COPIED:
            if os.path.isdir(os.path.join(src, d)):
                shutil.copytree(os.path.join(src, d), os.path.join(tmp, d))
        rc, out = run(tmp)
        if rc != 0:
            print(f"layers_check fails on the copy before any probe:\n{out}")
            return 1
        for rel, line in PROBES:
            path = os.path.join(tmp, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.write("// SPDX-License-Identifier: Apache-2.0\n"
                        f"#include <cstdint>\n{line}\n")
            rc, out = run(tmp)
            os.remove(path)
            if rc != 1 or f"{rel}:3:" not in out:
                print(f"probe {rel} ({line}): exit {rc}, expected 1 naming "
                      f"it; output:\n{out}")
                failures += 1
            else:
                print(f"probe {rel}: refused as expected")
    if failures:
        return 1
    print("layers_check: passes on the tree, fails on every probe")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
