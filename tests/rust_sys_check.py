#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Checks that rust/qcow2-sys/src/lib.rs declares include/qcow2/c.h: every
function with the same parameters (count and types) and return type, every
struct with the same fields in the same order and of the same types, every
opaque handle and function-pointer type; and nothing the header lacks.

  rust_sys_check.py C_H LIB_RS     prints the differences, exits 1 on any
"""
import re
import sys

# C scalar types and the Rust spelling the -sys crate uses for each.
C_SCALARS = {
    "void": "c_void", "char": "c_char", "int": "c_int", "size_t": "usize",
    "uint8_t": "u8", "int32_t": "i32", "uint32_t": "u32", "int64_t": "i64",
    "uint64_t": "u64", "double": "f64", "float": "f32",
}


def strip_c_comments(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def c_type(decl):
    """The Rust spelling of C type `decl` (no name), e.g. const char** ->
    *mut *const c_char."""
    decl = decl.replace("struct ", " ").replace("*", " * ")
    words = decl.split()
    stars = words.count("*")
    base_words = [w for w in words if w not in ("*", "const")]
    if len(base_words) != 1:
        raise ValueError("cannot read C type %r" % decl)
    base = C_SCALARS.get(base_words[0], base_words[0])
    if stars == 0:
        return "()" if base == "c_void" else base
    # `const` before the first star qualifies the pointee.
    first_star = words.index("*")
    inner_const = "const" in words[:first_star]
    out = ("*const " if inner_const else "*mut ") + base
    for _ in range(stars - 1):
        out = "*mut " + out
    return out


def c_param(text):
    """(type) of one C parameter `const char* path`."""
    text = text.strip()
    m = re.match(r"(.*?)(\w+)$", text)
    if not m or not m.group(1).strip():
        raise ValueError("cannot read C parameter %r" % text)
    return c_type(m.group(1))


def c_params(text):
    text = text.strip()
    if text in ("", "void"):
        return []
    return [c_param(p) for p in text.split(",")]


def parse_c(text):
    text = strip_c_comments(text)
    funcs, structs, opaque, fnptrs = {}, {}, set(), {}
    for m in re.finditer(r"QCOW2_EXPORT\s+([^;(]*?)\b(qcow2_\w+)\s*\(([^)]*)\)\s*;", text):
        funcs[m.group(2)] = (c_params(m.group(3)), c_type(m.group(1)))
    for m in re.finditer(r"typedef\s+struct\s+(\w+)\s*\{(.*?)\}\s*(\w+)\s*;", text, re.S):
        fields = []
        for f in m.group(2).split(";"):
            f = f.strip()
            if f:
                fm = re.match(r"(.*?)(\w+)$", f)
                fields.append((fm.group(2), c_type(fm.group(1))))
        structs[m.group(3)] = fields
    for m in re.finditer(r"typedef\s+struct\s+(\w+)\s+(\w+)\s*;", text):
        opaque.add(m.group(2))
    for m in re.finditer(r"typedef\s+([^;(]*?)\(\s*\*\s*(\w+)\s*\)\s*\(([^)]*)\)\s*;", text):
        fnptrs[m.group(2)] = (c_params(m.group(3)), c_type(m.group(1)))
    return funcs, structs, opaque, fnptrs


def rust_type(text):
    text = re.sub(r"\s+", " ", text.strip())
    text = re.sub(r"\*\s*(const|mut)\s+", r"*\1 ", text)
    return text


def rust_params(text):
    params = []
    for p in text.split(","):
        p = p.strip()
        if p:
            params.append(rust_type(p.split(":", 1)[1]))
    return params


def parse_rust(text):
    text = re.sub(r"//[^\n]*", " ", text)
    funcs, structs, opaque, fnptrs = {}, {}, set(), {}
    for block in re.finditer(r'extern\s+"C"\s*\{(.*?)\n\}', text, re.S):
        for m in re.finditer(r"pub\s+fn\s+(\w+)\s*\((.*?)\)\s*(?:->\s*([^;]+?))?\s*;", block.group(1), re.S):
            ret = rust_type(m.group(3)) if m.group(3) else "()"
            funcs[m.group(1)] = (rust_params(m.group(2)), ret)
    for m in re.finditer(r"pub\s+struct\s+(\w+)\s*\{(.*?)\}", text, re.S):
        fields = re.findall(r"(?:pub\s+)?(\w+)\s*:\s*([^,]+),", m.group(2))
        if fields and all(name.startswith("_") for name, _ in fields):
            opaque.add(m.group(1))
        else:
            structs[m.group(1)] = [(n, rust_type(t)) for n, t in fields]
    for m in re.finditer(r'pub\s+type\s+(\w+)\s*=\s*Option<\s*unsafe\s+extern\s+"C"\s+fn\s*\((.*?)\)\s*(?:->\s*([^>]+))?>\s*;', text, re.S):
        ret = rust_type(m.group(3)) if m.group(3) else "()"
        fnptrs[m.group(1)] = (rust_params(m.group(2)), ret)
    return funcs, structs, opaque, fnptrs


def compare(kind, c_items, rust_items, errors):
    for name in sorted(set(c_items) - set(rust_items)):
        errors.append("%s %s: in c.h, not in the -sys crate" % (kind, name))
    for name in sorted(set(rust_items) - set(c_items)):
        errors.append("%s %s: in the -sys crate, not in c.h" % (kind, name))
    for name in sorted(set(c_items) & set(rust_items)):
        if c_items[name] != rust_items[name]:
            errors.append("%s %s differs:\n  c.h:  %s\n  Rust: %s" % (kind, name, c_items[name], rust_items[name]))


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    c = parse_c(open(sys.argv[1]).read())
    r = parse_rust(open(sys.argv[2]).read())
    # iovec is <sys/uio.h>'s, declared in the -sys crate only.
    r[1].pop("iovec", None)
    errors = []
    compare("function", c[0], r[0], errors)
    compare("struct", c[1], r[1], errors)
    compare("opaque type", {n: None for n in c[2]}, {n: None for n in r[2]}, errors)
    compare("function pointer", c[3], r[3], errors)
    for e in errors:
        print(e)
    print("%d functions, %d structs, %d opaque types, %d function pointers: %s" % (
        len(c[0]), len(c[1]), len(c[2]), len(c[3]), "differences" if errors else "match"))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
