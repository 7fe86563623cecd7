#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Checks the include layering of lib/ and of the library's users.

The folders of lib/ are layered bottom to top in the order given by the
line `<!-- layers: base io ... -->` of docs/architecture.md. A file in
lib/A may include lib/B only when B is A or comes before it, every lib/
folder must appear in the order, and nothing in lib/ may include the test
doubles, tests or tools. The layers below the public facades (lib/api)
take the public value types from qcow2/types.h, never the facades'
headers (qcow2/image.h, queue.h, c.h, maintenance.h).

The library's users (tools/, nbd/, examples/, serve/) reach it through
include/qcow2/ alone: a file there may include qcow2/*.h, its own folder
and system headers, never lib/, testing/, tests/ nor another folder of
this tree; but tools/ may include serve/, the servers that `qcowtool
serve` runs (serve/ itself is held to include/qcow2/ alone).

Inside one lib/ folder, the parts include each other without a cycle: a
part is a header and the files named after it (x.h, x.cc, x_more.cc, an
x_internal.h), and no part may include, directly or through others, a
part that includes it back (KNOWN_CYCLES lists the ones left to untie).
Exits 1, naming each offending include, if not.

Usage: layers_check.py SOURCE_DIR
"""
import os
import re
import sys

ORDER_RE = re.compile(r"^<!-- layers: ([\w ]+) -->$", re.M)
INCLUDE_RE = re.compile(r'^\s*#\s*include\s+["<]([^">]+)[">]')
FORBIDDEN = ("testing/", "tests/", "tools/")
# The public headers that are facades, not value types: the layers below
# lib/api must not include them.
FACADES = ("qcow2/image.h", "qcow2/queue.h", "qcow2/c.h",
           "qcow2/maintenance.h")
FACADE_LAYER = "api"
# The folders whose files use the library only through include/qcow2/.
USERS = ("tools", "nbd", "examples", "serve")
# The other user folders a user folder may include (they are themselves
# held to include/qcow2/).
USER_DEPS = {"tools": ("serve",)}


def find_cycles(edges):
    """Returns the folder cycles in `edges`, each as [a, b, ..., a]: for
    every edge a -> b, the shortest way back from b to a, if any."""
    graph = {}
    for a, b in edges:
        graph.setdefault(a, []).append(b)
    cycles = {}
    for a, b in sorted(edges):
        prev = {b: None}
        queue = [b]
        while queue and a not in prev:
            node = queue.pop(0)
            for nxt in sorted(graph.get(node, [])):
                if nxt not in prev:
                    prev[nxt] = node
                    queue.append(nxt)
        if a not in prev:
            continue
        path = [a]
        while path[-1] != b:
            path.append(prev[path[-1]])
        ring = [a] + path[::-1][:-1]  # a, b, ..., (back to) a
        i = ring.index(min(ring))
        ring = ring[i:] + ring[:i]
        cycles.setdefault(tuple(ring), ring + [ring[0]])
    return list(cycles.values())


# Include cycles among the parts of a lib/ folder not untied yet, each as
# check_parts names it: they are reported only if they change.
KNOWN_CYCLES = {
    # Engine and the runner that advances its requests call each other.
    "lib/engine: engine -> runner -> engine",
}


def part_of(stem, headers):
    """The part a file of stem `stem` belongs to: the shortest header stem
    H among `headers` with stem == H or stem starting with H + '_', else
    the stem itself."""
    best = stem
    for h in headers:
        if (stem == h or stem.startswith(h + "_")) and len(h) < len(best):
            best = h
    return best


def check_parts(lib, root, errors):
    """Adds to `errors` every include cycle among the parts of one folder
    of lib/ (see part_of), with the includes that close it."""
    for dirpath, dirnames, names in os.walk(lib):
        dirnames.sort()
        folder = os.path.relpath(dirpath, root).replace(os.sep, "/")
        headers = {os.path.splitext(n)[0] for n in names if n.endswith(".h")}
        edges = {}  # (from part, to part) -> first include seen
        for name in sorted(names):
            src = part_of(os.path.splitext(name)[0], headers)
            with open(os.path.join(dirpath, name), encoding="utf-8",
                      errors="replace") as f:
                lines = f.read().splitlines()
            for n, line in enumerate(lines, 1):
                inc = INCLUDE_RE.match(line)
                if not inc or os.path.dirname(inc.group(1)) != folder:
                    continue
                base = os.path.basename(inc.group(1))
                dst = part_of(os.path.splitext(base)[0], headers)
                if dst != src:
                    edges.setdefault(
                        (src, dst), f"{folder}/{name}:{n}: {line.strip()}")
        for cycle in find_cycles(edges):
            if f"{folder}: {' -> '.join(cycle)}" in KNOWN_CYCLES:
                continue
            errors.append(f"include cycle in {folder}: " + " -> ".join(cycle))
            for a, b in zip(cycle, cycle[1:]):
                errors.append(f"  {a} -> {b}: {edges[(a, b)]}")


def check_users(root, errors):
    """Adds to `errors` every include of a file under USERS that reaches
    past include/qcow2/ into this tree; returns the number of files."""
    # This tree's folders (the known ones too, for a partial copy).
    tree = {d for d in os.listdir(root)
            if os.path.isdir(os.path.join(root, d)) and not d.startswith(".")}
    tree |= {"lib", "testing", "tests", "bench", "fuzz", "include"}
    tree |= set(USERS)
    files = 0
    for top in USERS:
        base = os.path.join(root, top)
        if not os.path.isdir(base):
            continue
        for dirpath, dirnames, names in os.walk(base):
            dirnames.sort()
            for name in sorted(names):
                rel = os.path.relpath(os.path.join(dirpath, name), root)
                with open(os.path.join(root, rel), encoding="utf-8",
                          errors="replace") as f:
                    lines = f.read().splitlines()
                files += 1
                for n, line in enumerate(lines, 1):
                    inc = INCLUDE_RE.match(line)
                    if not inc:
                        continue
                    first = inc.group(1).split("/")[0]
                    if ("/" not in inc.group(1) or first == top
                            or first in USER_DEPS.get(top, ())):
                        continue
                    if first in tree:
                        errors.append(
                            f"{rel}:{n}: {line.strip()}  ({top}/ uses the "
                            f"library through include/qcow2/ only, not "
                            f"{first}/)")
    return files


def main(argv):
    root = argv[1] if len(argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..")
    doc = os.path.join(root, "docs", "architecture.md")
    with open(doc, encoding="utf-8") as f:
        m = ORDER_RE.search(f.read())
    if not m:
        print(f"{doc}: no '<!-- layers: ... -->' line giving the layer order")
        return 1
    order = m.group(1).split()
    rank = {name: i for i, name in enumerate(order)}
    errors = []

    lib = os.path.join(root, "lib")
    for d in sorted(os.listdir(lib)):
        if os.path.isdir(os.path.join(lib, d)) and d not in rank:
            errors.append(f"lib/{d}: folder missing from the layer order in "
                          "docs/architecture.md")

    edges = {}  # (from folder, to folder) -> first include seen
    files = 0
    for dirpath, dirnames, names in os.walk(lib):
        dirnames.sort()
        for name in sorted(names):
            rel = os.path.relpath(os.path.join(dirpath, name), root)
            parts = rel.split(os.sep)
            src = parts[1] if len(parts) > 2 else None
            files += 1
            with open(os.path.join(root, rel), encoding="utf-8",
                      errors="replace") as f:
                lines = f.read().splitlines()
            for n, line in enumerate(lines, 1):
                inc = INCLUDE_RE.match(line)
                if not inc:
                    continue
                target = inc.group(1)
                where = f"{rel}:{n}: {line.strip()}"
                if target.startswith(FORBIDDEN):
                    errors.append(f"{where}  (lib/ must not include "
                                  f"{target.split('/')[0]}/)")
                    continue
                if (target in FACADES and src in rank and
                        FACADE_LAYER in rank and
                        rank[src] < rank[FACADE_LAYER]):
                    errors.append(f"{where}  (lib/{src} is below lib/"
                                  f"{FACADE_LAYER}: take the value types "
                                  "from qcow2/types.h)")
                    continue
                if not target.startswith("lib/") or target.count("/") < 2:
                    continue
                dst = target.split("/")[1]
                if src is None:
                    errors.append(f"{where}  (file outside a layer folder)")
                    continue
                if dst != src:
                    edges.setdefault((src, dst), where)
                if dst not in rank:
                    errors.append(f"{where}  (lib/{dst} is not in the "
                                  "layer order)")
                elif src in rank and rank[dst] > rank[src]:
                    errors.append(f"{where}  (lib/{src} includes lib/{dst}, "
                                  "a layer above it)")

    files += check_users(root, errors)
    check_parts(lib, root, errors)

    for cycle in find_cycles(edges):
        errors.append("folder cycle: " + " -> ".join(cycle))
        for a, b in zip(cycle, cycle[1:]):
            errors.append(f"  {a} -> {b}: {edges[(a, b)]}")

    for e in errors:
        print(e)
    if errors:
        print(f"layers: FAILED ({len(errors)} problems; order: "
              f"{' '.join(order)})")
        return 1
    print(f"layers: OK ({files} files; order: {' '.join(order)})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
