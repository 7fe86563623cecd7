#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The bash completion (contrib/bash-completion/qcowtool) completes the
# commands, each command's options as its --help lists them, dd's operands,
# formats and image files.
#   completion_check.sh QCOWTOOL COMPLETION_FILE
set -uo pipefail
tool=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
# shellcheck disable=SC1090
source "$2"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cd "$dir" && touch disk.qcow2 other.raw
failures=0

# complete WORDS...: completes the last word of the command line.
complete_line() {
  COMP_WORDS=("$@")
  COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
  COMPREPLY=()
  _qcowtool "$tool" "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"
  printf '%s\n' "${COMPREPLY[@]}" | sort
}

expect() {  # expect NAME WANTED_LINES GOT_LINES
  if [ "$2" != "$3" ]; then
    echo "FAIL $1: expected [$(echo $2)], got [$(echo $3)]"
    failures=$((failures + 1))
  else
    echo "ok $1"
  fi
}

verbs=$("$tool" --help | sed -n '/^Commands:/,/^$/s/^  \([a-z]*\) .*/\1/p')
expect "commands" "$(printf '%s\n' $verbs help | sort)" "$(complete_line qcowtool '')"
expect "top-level options" "$(printf '%s\n' --help --version | sort)" \
  "$(complete_line qcowtool --)"
for verb in $verbs; do
  want=$("$tool" "$verb" --help | grep -oE '(^|[ ,[|])--?[A-Za-z][A-Za-z0-9-]*=?' |
         sed 's/^[ ,[|]//' | sort -u)
  expect "$verb options" "$want" "$(complete_line qcowtool "$verb" -)"
done
expect "dd operands" "$(printf '%s\n' bs= count= if= of= skip=)" \
  "$(complete_line qcowtool dd '')"
expect "dd if= files" "$(printf '%s\n' disk.qcow2 other.raw)" \
  "$(complete_line qcowtool dd if=)"
expect "image files" "disk.qcow2" "$(complete_line qcowtool info d)"
expect "formats" "$(printf '%s\n' qcow2 raw)" "$(complete_line qcowtool convert -O '')"
expect "help COMMAND" "$(printf '%s\n' $verbs | grep '^c' | sort)" \
  "$(complete_line qcowtool help c)"
echo "$failures failures"
[ "$failures" -eq 0 ]
