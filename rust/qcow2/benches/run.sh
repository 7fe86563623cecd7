#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The Rust binding's micro-benchmark: random 4 KiB reads and writes at
# depth 32 on a tmpfs image through C (c_queue_bench) and through Rust
# (queue_bench, safe owned buffers and unsafe borrowed ones), in turns, so
# that all run under the same load. Prints the CPU time per request of
# each run and the median ratio of Rust to C.
#   run.sh C_BENCH RUST_BENCH [REQUESTS [ROUNDS]]
# C_BENCH and RUST_BENCH are the built programs (tests/rust.cmake builds
# both; `cargo bench --no-run` prints the Rust one's path).
# QCOW2_BENCH_VALGRIND=1 adds user-space instructions per hole read,
# counted by valgrind (lackey) as the difference between 10,000 and
# 30,000 requests: exact, where CPU times vary with the machine's load.
set -euo pipefail
c_bench=$1 rust_bench=$2 requests=${3:-200000} rounds=${4:-5}
dir=$(mktemp -d /dev/shm/qcow2-rs-bench.XXXXXX)
trap 'rm -rf "$dir"' EXIT
img=$dir/bench.qcow2
qemu-img create -q -f qcow2 -o preallocation=metadata "$img" 256M
# "hole": reads of a disk with nothing allocated, which finish inside the
# submit with no file I/O: the library and the binding alone.
holes=$dir/holes.qcow2
qemu-img create -q -f qcow2 "$holes" 256M

declare -A runs users
for mode in read write hole; do
  for ((r = 1; r <= rounds; r++)); do
    for who in c owned borrowed; do
      file=$img op=$mode
      [ "$mode" = hole ] && file=$holes op=read
      if [ "$who" = c ]; then
        line=$("$c_bench" "$file" "$op" "$requests")
      else
        line=$("$rust_bench" "$file" "$op" "$requests" "$who")
      fi
      echo "$line"
      ns=$(echo "$line" | sed -E 's/.*: ([0-9]+) ns.*/\1/')
      user=$(echo "$line" | sed -E 's/.*user ([0-9]+).*/\1/')
      runs[$who-$mode]="${runs[$who-$mode]:-} $ns"
      users[$who-$mode]="${users[$who-$mode]:-} $user"
    done
  done
done

median() { tr ' ' '\n' | grep . | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
least() { tr ' ' '\n' | grep . | sort -n | head -1; }
# The least of the runs is the cost with the least interference from other
# load; the median the typical one. "user" is the user-space part: the
# binding's own work is there, the kernel's I/O is the rest.
report() { # title, array name
  echo "$1 ($rounds rounds of $requests), median and least:"
  local -n arr=$2
  for mode in read write hole; do
    c=$(echo "${arr[c-$mode]}" | median)
    cl=$(echo "${arr[c-$mode]}" | least)
    for who in owned borrowed; do
      r=$(echo "${arr[$who-$mode]}" | median)
      rl=$(echo "${arr[$who-$mode]}" | least)
      awk -v m="$mode" -v w="$who" -v c="$c" -v r="$r" -v cl="$cl" -v rl="$rl" \
        'BEGIN {printf "  %-5s C %6d  Rust-%-8s %6d (%+.1f%%)   least: C %6d  Rust %6d (%+.1f%%)\n", m, c, w, r, (r - c) * 100 / c, cl, rl, (rl - cl) * 100 / cl}'
    done
  done
}
report "CPU ns per 4 KiB request (depth 32, tmpfs)" runs
report "user-space CPU ns per request" users

if [ "${QCOW2_BENCH_VALGRIND:-0}" = 1 ]; then
  instructions() { # program args...: guest instructions of one run
    valgrind --tool=lackey --basic-counts=yes "$@" 2>&1 >/dev/null |
      sed -n 's/.*guest instrs: *\([0-9,]*\)$/\1/p' | tr -d ,
  }
  echo "user-space instructions per hole read (valgrind):"
  for who in c owned borrowed; do
    for n in 10000 30000; do
      if [ "$who" = c ]; then
        count[$n]=$(instructions "$c_bench" "$holes" read "$n")
      else
        count[$n]=$(instructions "$rust_bench" "$holes" read "$n" "$who")
      fi
    done
    echo "  $who $(( (count[30000] - count[10000]) / 20000 ))"
  done
fi
