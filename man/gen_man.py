#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Generates the man pages from the texts they document, at build time.

  gen_man.py tool QCOWTOOL VERSION OUT.1    qcowtool(1) from `QCOWTOOL --help`
                                            and every `QCOWTOOL VERB --help`
  gen_man.py capi C_H VERSION OUT.3         libqcow2(3) from qcow2/c.h

Nothing is written by hand twice: each verb's section is its --help text
(options in bold), the C API page is c.h's comments and declarations. So
the pages cannot drift from the tool or the header (tests/man_help_test.py
checks the rendered page against --help).
"""
import re
import subprocess
import sys


def roff_escape(text):
    """Escapes text for a no-fill block: backslashes, minus signs, and
    lines that would start a request."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    if text.startswith((".", "'")):
        text = "\\&" + text
    return text


# An option line of a --help text: two spaces, then -x or --long.
OPTION_LINE = re.compile(r"^(  )(-\S+(?:,? -\S+)*(?: [A-Z][A-Z_]*)?)(.*)$")


def help_to_roff(text):
    """A --help text as a no-fill block, option names in bold."""
    out = [".nf"]
    for line in text.rstrip("\n").split("\n"):
        m = OPTION_LINE.match(line)
        if m:
            out.append(m.group(1) + "\\fB" + roff_escape(m.group(2)) +
                       "\\fR" + roff_escape(m.group(3)))
        else:
            out.append(roff_escape(line) if line else "")
    out.append(".fi")
    return out


def run_help(tool, *args):
    r = subprocess.run([tool, *args, "--help"], capture_output=True,
                       text=True, check=False)
    if r.returncode != 0:
        sys.exit(f"gen_man.py: '{tool} {' '.join(args)} --help' exited "
                 f"{r.returncode}: {r.stderr.strip()}")
    return r.stdout


def parse_main_help(text):
    """The verbs and their one-line summaries, and the lines after the
    command list (the exit status)."""
    verbs, tail, state = [], [], "head"
    for line in text.split("\n"):
        if state == "head" and line == "Commands:":
            state = "commands"
        elif state == "commands":
            m = re.match(r"^  (\S+)\s+(.*)$", line)
            if m:
                verbs.append((m.group(1), m.group(2)))
            elif not line:
                state = "tail"
        elif state == "tail" and line:
            tail.append(line)
    return verbs, tail


def tool_page(tool, version):
    main_help = run_help(tool)
    verbs, tail = parse_main_help(main_help)
    if not verbs:
        sys.exit("gen_man.py: no commands found in 'qcowtool --help'")
    out = [
        f'.TH QCOWTOOL 1 "" "qcowtool {version}" "User Commands"',
        ".SH NAME",
        "qcowtool \\- inspect, create, convert, check and serve qcow2 disk "
        "images",
        ".SH SYNOPSIS",
        ".B qcowtool",
        ".I COMMAND",
        "[\\fIoptions\\fR] \\fIARGS\\fR...",
        ".br",
        ".B qcowtool help",
        "[\\fICOMMAND\\fR]",
        ".br",
        ".B qcowtool",
        "\\fB\\-V\\fR|\\fB\\-\\-version\\fR",
        ".SH DESCRIPTION",
        "qcowtool works with qcow2 and raw disk images and their backing "
        "chains through libqcow2, with the commands, options and exit "
        "status of",
        ".BR qemu\\-img (1)",
        "and",
        ".BR qemu\\-io (1).",
        "Images it writes are read back identically by QEMU.",
        ".PP",
        "Each command prints its own usage with",
        ".BR \"qcowtool \\fICOMMAND\\fB \\-\\-help\" ;",
        "the sections below are those texts.",
        ".SH OPTIONS",
        ".TP",
        '.BR \\-V ", " \\-\\-version',
        "print qcowtool's version and the version of the libqcow2 it runs "
        "with",
        ".TP",
        '.BR \\-h ", " \\-\\-help',
        "list the commands",
        ".SH COMMANDS",
    ]
    for verb, summary in verbs:
        out += [".TP", f".B {verb}", roff_escape(summary)]
    for verb, _ in verbs:
        out.append(f'.SH "qcowtool {verb.upper()}"')
        out += help_to_roff(run_help(tool, verb))
    out.append(".SH \"EXIT STATUS\"")
    out += [roff_escape(line) for line in tail
            if not line.startswith("'qcowtool COMMAND")]
    out += [
        "Commands that follow qemu\\-img's own statuses (such as compare, "
        "check, resize and dd) say so in their sections.",
        '.SH "SEE ALSO"',
        ".BR qemu\\-img (1),",
        ".BR qemu\\-io (1),",
        ".BR nbdkit (1),",
        ".BR libqcow2 (3)",
    ]
    return "\n".join(out) + "\n"


def c_comment_text(block):
    """The words of a /* ... */ comment, without the markers."""
    lines = []
    for line in block.split("\n"):
        line = line.strip()
        line = re.sub(r"^/\*+\s?", "", line)
        line = re.sub(r"\s?\*+/$", "", line)
        line = re.sub(r"^\*\s?", "", line)
        lines.append(line)
    return lines


def next_token(text, pos):
    """The comment, preprocessor line or declaration (up to its ';' at
    brace depth 0, comments inside kept) at `pos`; returns (token, end)."""
    if text.startswith("/*", pos):
        end = text.index("*/", pos) + 2
        return text[pos:end], end
    if text.startswith("#", pos):
        end = text.find("\n", pos)
        end = len(text) if end < 0 else end
        return text[pos:end], end
    if text.startswith('extern "C"', pos):
        end = text.index("{", pos) + 1
        return text[pos:end], end
    depth, i = 0, pos
    while i < len(text):
        if text.startswith("/*", i):
            i = text.index("*/", i) + 2
            continue
        c = text[i]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth < 0:  # the closing brace of extern "C"
                return text[pos:i + 1], i + 1
        elif c == ";" and depth == 0:
            return text[pos:i + 1], i + 1
        i += 1
    return text[pos:], len(text)


def unexport(code):
    """A declaration without QCOW2_EXPORT, its continuation lines moved
    left by as much."""
    marker = "QCOW2_EXPORT "
    if marker not in code:
        return code
    lines = code.replace(marker, "").split("\n")
    pad = " " * len(marker)
    return "\n".join([lines[0]] + [
        line[len(pad):] if line.startswith(pad) else line
        for line in lines[1:]])


def parse_header(text):
    """c.h as (kind, payload) items: ('intro', lines), ('section', title),
    ('entry', (comment lines, code)). Declarations that follow one another
    with no comment between share the comment before the first."""
    items, pending, pos = [], None, 0
    while True:
        ws = re.match(r"\s*", text[pos:])
        pos += ws.end()
        if pos >= len(text):
            break
        tok, pos = next_token(text, pos)
        if tok.startswith("/*"):
            if "SPDX-License-Identifier" in tok:
                continue
            sec = re.match(r"/\* -+ (.*?) -+ \*/", tok)
            if sec:
                items.append(("section", sec.group(1)))
                pending = None
            elif not items:
                items.append(("intro", c_comment_text(tok)))
            else:
                pending = c_comment_text(tok)
            continue
        code = tok.strip()
        if code.startswith(("#", "extern", "}")):
            pending = None
            continue
        code = unexport(code)
        if items and items[-1][0] == "entry" and pending is None:
            comment, prev = items[-1][1]
            items[-1] = ("entry", (comment, prev + "\n" + code))
        else:
            items.append(("entry", (pending or [], code)))
        pending = None
    return items


def paragraphs(lines):
    """Comment lines as roff: runs of text filled, indented lines kept."""
    out = []
    for line in lines:
        if not line:
            out.append(".PP")
        elif line.startswith(" "):
            out += [".nf", roff_escape(line), ".fi"]
        else:
            out.append(roff_escape(line))
    return out


def capi_page(header, version):
    with open(header, encoding="utf-8") as f:
        items = parse_header(f.read())
    out = [
        f'.TH LIBQCOW2 3 "" "libqcow2 {version}" "Library Functions Manual"',
        ".SH NAME",
        "libqcow2 \\- read, write and manage qcow2 disk images (C API)",
        ".SH SYNOPSIS",
        ".nf",
        ".B #include <qcow2/c.h>",
        ".PP",
        "Link with \\fI$(pkg\\-config \\-\\-cflags \\-\\-libs qcow2)\\fR,",
        "or in CMake: \\fIfind_package(qcow2)\\fR and the target",
        "\\fIqcow2::qcow2\\fR.",
        ".fi",
        ".SH DESCRIPTION",
    ]
    for kind, payload in items:
        if kind == "intro":
            out += paragraphs(payload)
        elif kind == "section":
            out.append(f'.SH "{payload.upper()}"')
        else:
            comment, code = payload
            out += [".PP", ".nf", "\\fB" + "\n".join(
                roff_escape(line) for line in code.split("\n")) + "\\fR",
                    ".fi", ".RS"]
            out += paragraphs(comment)
            out.append(".RE")
    out += ['.SH "SEE ALSO"', ".BR qcowtool (1),",
            ".BR qemu\\-img (1)"]
    return "\n".join(out) + "\n"


def main(argv):
    if len(argv) != 5 or argv[1] not in ("tool", "capi"):
        sys.exit(__doc__)
    page = (tool_page if argv[1] == "tool" else capi_page)(argv[2], argv[3])
    with open(argv[4], "w", encoding="utf-8") as f:
        f.write(page)


if __name__ == "__main__":
    main(sys.argv)
