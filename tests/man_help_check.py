#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""qcowtool(1) says what --help says: for every command `qcowtool --help`
lists, the options in the man page's section for it (rendered by man(1),
as a reader sees it) are exactly those of `qcowtool COMMAND --help`, and
the page lists every command and the top-level options.

  man_help_check.py QCOWTOOL MANPAGE
"""
import os
import re
import subprocess
import sys

OPTION = re.compile(r"(?<![\w-])(--?[A-Za-z][A-Za-z0-9-]*)")


def options(text):
    return set(OPTION.findall(text))


def render(page):
    env = dict(os.environ, MANWIDTH="250", MAN_KEEP_FORMATTING="",
               LC_ALL="C.UTF-8")
    r = subprocess.run(["man", "-l", page], capture_output=True, text=True,
                       env=env, check=True)
    # Strip any overstrike formatting (man writes plain text into a pipe,
    # but a MANPAGER or configuration might not).
    return re.sub(r".\x08", "", r.stdout)


def sections(rendered):
    """The man page's top-level sections by title."""
    out, title = {}, None
    for line in rendered.split("\n"):
        if line and not line[0].isspace():
            title = line.strip()
            out[title] = []
        elif title is not None:
            out[title].append(line)
    return {t: "\n".join(lines) for t, lines in out.items()}


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    tool, page = sys.argv[1], sys.argv[2]
    main_help = subprocess.run([tool, "--help"], capture_output=True,
                               text=True, check=True).stdout
    verbs = re.findall(r"^  ([a-z]+) ", main_help.split("Commands:")[1],
                       re.M)
    secs = sections(render(page))
    failures = []
    for verb in verbs:
        help_text = subprocess.run([tool, verb, "--help"], capture_output=True,
                                   text=True, check=True).stdout
        title = f"qcowtool {verb.upper()}"
        if title not in secs:
            failures.append(f"{verb}: no section '{title}' in the man page")
            continue
        want, got = options(help_text), options(secs[title])
        if want != got:
            failures.append(f"{verb}: --help only {sorted(want - got)}, "
                            f"man page only {sorted(got - want)}")
        else:
            print(f"ok {verb}: {len(want)} options")
        if f"\n       {verb}" not in "\n" + secs.get("COMMANDS", ""):
            failures.append(f"{verb}: not in the COMMANDS list")
    top = {"-V", "--version", "-h", "--help"}
    if not top <= options(secs.get("OPTIONS", "")):
        failures.append(f"OPTIONS lacks {sorted(top - options(secs.get('OPTIONS', '')))}")
    for f in failures:
        print("FAIL", f)
    print(f"{len(verbs)} commands, {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
