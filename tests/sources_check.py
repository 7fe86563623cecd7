#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Fails when cmake/sources.cmake and the files on disk disagree: a .cc
under lib/ or tools/ (and their subfolders, as tools/bench/) that is not
listed (it would not be built), or a listed file that does not exist. Usage: sources_check.py PROJECT_ROOT"""
import glob
import os
import re
import sys

root = sys.argv[1]
text = open(os.path.join(root, "cmake", "sources.cmake")).read()
listed = set(re.findall(r"\$\{PROJECT_SOURCE_DIR\}/(\S+\.cc)", text))
on_disk = {os.path.relpath(p, root)
           for pattern in ("lib/*/*.cc", "tools/*.cc", "tools/*/*.cc")
           for p in glob.glob(os.path.join(root, pattern))}
bad = 0
for f in sorted(on_disk - listed):
    print(f"sources: {f} is not listed in cmake/sources.cmake (it is not built)")
    bad = 1
for f in sorted(listed - on_disk):
    print(f"sources: cmake/sources.cmake lists {f}, which does not exist")
    bad = 1
if not bad:
    print(f"sources: OK ({len(listed)} files listed)")
sys.exit(bad)
