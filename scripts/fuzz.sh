#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds the libFuzzer targets (fuzz/) with clang, makes seed corpora with
# qemu-img, replays fuzz/regressions/, then fuzzes each target for a bounded
# time. Exits non-zero on any crash, leak, timeout or sanitizer report.
#
#   bash scripts/fuzz.sh [--smoke]          ~20 s per target (default)
#   bash scripts/fuzz.sh --long SECONDS     SECONDS per target
#   options:
#     --build-dir DIR        clang build tree (default: build-fuzz; relative
#                            paths are taken from the repository root)
#     --target NAME          fuzz only NAME (repeatable; default: all)
#     --keep-going           libFuzzer fork mode: carry on after crashes
#                            (-ignore_crashes=1 ...); every crash is saved
#     --no-build             use the fuzzers already built in DIR
#     --skip-if-unavailable  exit 77 (ctest: skipped) without clang++ or
#                            libFuzzer instead of failing
#   environment:
#     QCOW2_FUZZ_JOBS        build parallelism (default: 2)
#     QCOW2_FUZZ_PARALLEL    fuzzers run at once (default: number of CPUs)
#     QCOW2_FUZZ_ARGS        extra libFuzzer arguments for every run
#
# Output (inside the build tree, never committed):
#   fuzz-corpus/<target>/     corpus kept between runs
#   fuzz-seeds/<target>/      seeds, regenerated every run
#   fuzz-artifacts/<target>/  crashing inputs of the last run
#   fuzz-logs/<target>.log    libFuzzer output of the last run
# A crash: copy the artifact to fuzz/regressions/<target>/ with a name that
# says what it is, and describe it in fuzz/regressions/README.md.
set -euo pipefail
cd "$(dirname "$0")/.."
src=$PWD

mode=smoke
seconds=20
build_dir=build-fuzz
targets=()
keep_going=0
do_build=1
skip_unavailable=0
all_targets=(fuzz_open_read fuzz_decompress fuzz_ops fuzz_nbd fuzz_vhost fuzz_luks)

usage() { sed -n '2,/^set -euo/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; }

while [ $# -gt 0 ]; do
  case "$1" in
    --smoke) mode=smoke; seconds=20 ;;
    --long) mode=long; seconds="${2:?--long needs SECONDS}"; shift ;;
    --build-dir) build_dir="${2:?}"; shift ;;
    --target) targets+=("${2:?}"); shift ;;
    --keep-going) keep_going=1 ;;
    --no-build) do_build=0 ;;
    --skip-if-unavailable) skip_unavailable=1 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "fuzz.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
[ ${#targets[@]} -eq 0 ] && targets=("${all_targets[@]}")
case "$seconds" in ''|*[!0-9]*) echo "fuzz.sh: --long wants whole seconds" >&2; exit 2 ;; esac

unavailable() {
  echo "fuzz.sh: $*" >&2
  if [ "$skip_unavailable" -eq 1 ]; then
    echo "fuzz.sh: skipped"
    exit 77
  fi
  exit 2
}

# --- compiler ---------------------------------------------------------------
cxx="" cc=""
for c in clang++ clang++-14; do
  if command -v "$c" >/dev/null 2>&1; then cxx=$(command -v "$c"); break; fi
done
for c in clang clang-14; do
  if command -v "$c" >/dev/null 2>&1; then cc=$(command -v "$c"); break; fi
done
[ -n "$cxx" ] && [ -n "$cc" ] || \
  unavailable "clang/clang++ not found (Debian 12: apt-get install clang libclang-rt-14-dev)"

work=$(mktemp -d "${TMPDIR:-/tmp}/qcow2-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT

probe() {
  printf '%s\n' 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' \
    >"$work/probe.cc"
  "$cxx" -fsanitize=fuzzer,address,undefined "$work/probe.cc" -o "$work/probe" \
    >"$work/probe.log" 2>&1
}
probe || unavailable "$cxx cannot link a libFuzzer target (Debian 12: apt-get install libclang-rt-14-dev):
$(tail -3 "$work/probe.log")"

# Symbolized sanitizer reports need llvm-symbolizer (Debian: llvm-14).
for s in llvm-symbolizer llvm-symbolizer-14 /usr/lib/llvm-14/bin/llvm-symbolizer; do
  if command -v "$s" >/dev/null 2>&1; then
    export ASAN_SYMBOLIZER_PATH; ASAN_SYMBOLIZER_PATH=$(command -v "$s"); break
  fi
done
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:${ASAN_OPTIONS:-}"
# The fuzzers default to these plus suppressions=fuzz/ubsan.supp (reported
# library findings; see fuzz/sanitizer_options.cc).
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:suppressions=$src/fuzz/ubsan.supp:${UBSAN_OPTIONS:-}"

# --- build ------------------------------------------------------------------
jobs="${QCOW2_FUZZ_JOBS:-2}"
if [ "$do_build" -eq 1 ]; then
  if [ -f "$build_dir/CMakeCache.txt" ] &&
     ! grep -q "^CMAKE_CXX_COMPILER:.*clang" "$build_dir/CMakeCache.txt"; then
    echo "fuzz.sh: $build_dir was configured with another compiler; remove it or pass --build-dir" >&2
    exit 2
  fi
  echo "fuzz.sh: configuring $build_dir ($cxx)"
  # -O2 without NDEBUG: assertions stay on; -O2 keeps byte loops fast
  # under the coverage instrumentation.
  CC="$cc" CXX="$cxx" cmake -S . -B "$build_dir" \
    -DQCOW2_BUILD_FUZZ=ON -DQCOW2_BUILD_TESTS=OFF -DQCOW2_BUILD_BENCH=OFF \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g" \
    >"$work/cmake.log" 2>&1 || { cat "$work/cmake.log" >&2; exit 2; }
  echo "fuzz.sh: building the fuzzers (-j$jobs)"
  start=$SECONDS
  nice -n 10 cmake --build "$build_dir" -j"$jobs" --target fuzzers \
    >"$work/build.log" 2>&1 || { tail -50 "$work/build.log" >&2; exit 2; }
  echo "fuzz.sh: built in $((SECONDS - start)) s"
fi
bin="$build_dir/fuzz"
for t in "${targets[@]}" fuzz_seed_tool; do
  [ -x "$bin/$t" ] || { echo "fuzz.sh: $bin/$t is missing" >&2; exit 2; }
done

# --- seeds ------------------------------------------------------------------
seeds="$build_dir/fuzz-seeds"
rm -rf "$seeds"
mkdir -p "$seeds"/{fuzz_open_read,fuzz_decompress,fuzz_ops,fuzz_nbd,fuzz_vhost,fuzz_luks}
"$bin/fuzz_seed_tool" synth "$seeds/fuzz_decompress" >/dev/null
"$bin/fuzz_seed_tool" random "$seeds/fuzz_ops" 16
python3 fuzz/nbd_seeds.py "$seeds/fuzz_nbd"

# Images made by QEMU: cluster sizes, v2/v3, refcount widths, extended L2,
# zlib and zstd compressed clusters, zero clusters, discards, lazy
# refcounts left dirty, internal snapshots, bitmaps, backing chains over
# the names fuzz_open_read provides (base.qcow2, mid.qcow2, base.raw,
# loop.qcow2).
make_image_seeds() {
  local d="$work/img" out="$seeds/fuzz_open_read" dec="$seeds/fuzz_decompress"
  mkdir -p "$d"
  (
    cd "$d"
    q() { qemu-img "$@" >/dev/null; }
    io() { local f=$1; shift; local a=(); for c in "$@"; do a+=(-c "$c"); done
           (qemu-io -f qcow2 "${a[@]}" "$f" >/dev/null 2>&1) 2>/dev/null || true; }
    # name  options  size  qemu-io commands...
    img() { local n=$1 o=$2 s=$3; shift 3
            q create -f qcow2 -o "$o" "$n.qcow2" "$s"; io "$n.qcow2" "$@"; }
    img c512 cluster_size=512 256k 'write -P 0xab 0 1k' 'write -P 0xcd 3000 2000' \
        'write -z 8k 4k' 'write -c -P 0x11 16k 512' 'discard 1k 512'
    img c1k-v2 compat=0.10,cluster_size=1k 256k 'write -P 0xab 0 5k' \
        'write -z 8k 2k' 'write -c -P 0x22 16k 1k'
    img c4k-zstd cluster_size=4k,compression_type=zstd 1M 'write -P 0x01 0 8k' \
        'write -c -P 0x33 64k 4k' 'write -c -P 0x34 128k 4k' 'write -z -u 8k 4k'
    img c4k-rc1 cluster_size=4k,refcount_bits=1 512k 'write -P 0x55 4k 12k' 'discard 4k 4k'
    img c4k-rc8 cluster_size=4k,refcount_bits=8 512k 'write -P 0x56 0 20k' 'write -z 20k 8k'
    img c4k-rc64 cluster_size=4k,refcount_bits=64 512k 'write -P 0x57 100k 9k'
    img c64k cluster_size=64k 4M 'write -P 0x66 0 4k' 'write -P 0x67 3M 1000' \
        'write -c -P 0x68 1M 64k'
    img ext16k cluster_size=16k,extended_l2=on 1M 'write -P 0x71 1536 1k' \
        'write -z 4k 2k' 'write -P 0x72 32k 16k' 'discard 40k 512'
    img ext32k-zstd cluster_size=32k,extended_l2=on,compression_type=zstd 1M \
        'write -P 0x73 0 3k' 'write -c -P 0x74 64k 32k' 'write -z -u 96k 32k'
    img lazy cluster_size=4k,lazy_refcounts=on 512k 'write -P 0x81 0 16k' 'abort'
    img prealloc cluster_size=4k,preallocation=metadata 128k 'write -P 0x82 0 4k'
    img snap cluster_size=4k 256k 'write -P 0x91 0 8k'
    q snapshot -c s1 snap.qcow2; io snap.qcow2 'write -P 0x92 4k 8k'
    img bitmap cluster_size=4k 256k 'write -P 0x93 0 4k'
    q bitmap --add bitmap.qcow2 b0 || true
    # Backing files under the names the fuzzer knows.
    img base cluster_size=4k 1M 'write -P 0xa1 0 64k' 'write -P 0xa2 512k 8k'
    q create -f raw base.raw 1M
    qemu-io -f raw -c 'write -P 0xa3 0 1M' base.raw >/dev/null
    q create -f qcow2 -o cluster_size=4k -b base.qcow2 -F qcow2 mid.qcow2
    io mid.qcow2 'write -P 0xb1 4k 4k'
    q create -f qcow2 -o cluster_size=4k -b base.qcow2 -F qcow2 top-base.qcow2
    io top-base.qcow2 'write -P 0xc1 1000 3000' 'write -z 64k 4k'
    q create -f qcow2 -o cluster_size=16k,extended_l2=on -b base.raw -F raw top-raw.qcow2
    io top-raw.qcow2 'write -P 0xc2 700 1000'
    q create -f qcow2 -o cluster_size=4k -b mid.qcow2 -F qcow2 top-mid.qcow2
    io top-mid.qcow2 'write -P 0xc3 8k 4k'
    q create -f qcow2 -u -o cluster_size=4k -b loop.qcow2 -F qcow2 top-loop.qcow2 1M
    # Compressed images made by convert, for their compressed clusters.
    q create -f raw src.raw 256k
    qemu-io -f raw -c 'write -P 0x41 0 16k' -c 'write -P 0x42 20k 30k' \
      -c 'write -P 0x43 100k 3k' src.raw >/dev/null
    for cs in 512 4k 64k 2M; do
      for ct in zlib zstd; do
        q convert -c -O qcow2 -o "cluster_size=$cs,compression_type=$ct" \
          src.raw "conv-$cs-$ct.qcow2"
      done
    done
    # A LUKS area for fuzz_luks (the header and the start of slot 0).
    q create --object secret,id=s0,data=pass -f qcow2 \
      -o encrypt.format=luks,encrypt.key-secret=s0,encrypt.iter-time=10,encrypt.cipher-alg=aes-128,encrypt.cipher-mode=cbc,encrypt.ivgen-alg=essiv \
      luks.img 1M || true
    q create -f raw plain.raw 64k
    qemu-io -f raw -c 'write -P 0xee 0 4k' plain.raw >/dev/null
  ) || { echo "fuzz.sh: making qemu seed images failed (continuing with what exists)" >&2; }
  local f n
  for f in "$d"/*.qcow2; do
    [ -f "$f" ] || continue
    n=$(basename "$f" .qcow2)
    "$bin/fuzz_seed_tool" extract "$f" "$dec" "$n" >/dev/null || true
    # Images up to 1 MiB are open_read seeds (-max_len).
    if [ "$(stat -c %s "$f")" -le 1048576 ]; then cp "$f" "$out/$n.qcow2"; fi
  done
  cp "$d"/plain.raw "$out/" 2>/dev/null || true
  # fuzz_luks input: the area size (BE32), then the area's first 8 KiB.
  if [ -f "$d/luks.img" ]; then
    python3 - "$d/luks.img" "$seeds/fuzz_luks/qemu-aes128-cbc-essiv" <<'PY' || true
import struct, sys
data = open(sys.argv[1], "rb").read()
at = data.find(b"LUKS\xba\xbe")
payload = struct.unpack(">I", data[at + 104:at + 108])[0]
open(sys.argv[2], "wb").write(struct.pack(">I", payload * 512) + data[at:at + 8192])
PY
  fi
}
if command -v qemu-img >/dev/null 2>&1 && command -v qemu-io >/dev/null 2>&1; then
  make_image_seeds
else
  echo "fuzz.sh: qemu-img/qemu-io not found (Debian: qemu-utils): no image seeds" >&2
fi
for t in "${all_targets[@]}"; do
  echo "fuzz.sh: $(find "$seeds/$t" -type f | wc -l) seeds for $t"
done

# --- regressions ------------------------------------------------------------
# fuzz/regressions/<target>/* must run clean. fuzz/regressions/KNOWN_FAILURES
# lists inputs (one line per case; a line with several inputs is replayed in
# that order in one process) that still fail because of reported library
# bugs: they are replayed without the harness guards and UBSan suppressions
# and only reported.
failures=0
known="fuzz/regressions/KNOWN_FAILURES"
known_lines=()
if [ -f "$known" ]; then
  while IFS= read -r line; do
    line=${line%%#*}
    read -r -a words <<<"$line"
    [ ${#words[@]} -gt 0 ] && known_lines+=("${words[*]}")
  done <"$known"
fi
is_known() {
  local l w
  for l in "${known_lines[@]}"; do
    for w in $l; do [ "$w" = "$1" ] && return 0; done
  done
  return 1
}
for t in "${targets[@]}"; do
  for l in "${known_lines[@]}"; do
    files=()
    for w in $l; do
      case "$w" in "$t"/*) files+=("fuzz/regressions/$w") ;; esac
    done
    [ ${#files[@]} -gt 0 ] || continue
    if QCOW2_FUZZ_NO_GUARDS=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:suppressions=/dev/null \
       "$bin/$t" -timeout=10 "${files[@]}" >"$work/known.log" 2>&1; then
      echo "fuzz.sh: known failure now passes: $l (delete it from $known, and its guard)"
    else
      echo "fuzz.sh: known failure still fails (reported; not counted): $l"
    fi
  done
  dir="fuzz/regressions/$t"
  [ -d "$dir" ] || continue
  normal=()
  for f in "$dir"/*; do
    [ -f "$f" ] || continue
    case "$f" in *.md|*.txt) continue ;; esac
    is_known "$t/$(basename "$f")" || normal+=("$f")
  done
  [ ${#normal[@]} -eq 0 ] && continue
  if "$bin/$t" -timeout=60 "${normal[@]}" >"$work/replay.log" 2>&1; then
    echo "fuzz.sh: $t: ${#normal[@]} regression inputs replayed clean"
  else
    echo "fuzz.sh: $t: REGRESSION: a saved input fails again:" >&2
    grep -aE "Running:|ERROR|SUMMARY|INVARIANT" "$work/replay.log" | tail -20 >&2
    failures=$((failures + 1))
  fi
done

# --- fuzzing ----------------------------------------------------------------
corpus_root="$build_dir/fuzz-corpus"
art_root="$build_dir/fuzz-artifacts"
log_root="$build_dir/fuzz-logs"
mkdir -p "$corpus_root" "$art_root" "$log_root"
declare -A execs status
total_execs=0
fuzz_start=$SECONDS
# One libFuzzer process per target, QCOW2_FUZZ_PARALLEL at a time (default:
# the number of CPUs); each writes its outcome to $work/result.<target>.
fuzz_one() {
  local t=$1 corpus="$corpus_root/$1" art="$art_root/$1" log="$log_root/$1.log"
  mkdir -p "$corpus"
  rm -rf "$art"; mkdir -p "$art"
  local args=(-max_total_time="$seconds" -print_final_stats=1 -timeout=30
              -rss_limit_mb=3072 -artifact_prefix="$art/")
  [ "$t" = fuzz_open_read ] && args+=(-max_len=1048576)
  [ -f "fuzz/$t.dict" ] && args+=(-dict="fuzz/$t.dict")
  [ "$mode" = smoke ] && args+=(-seed=1)
  if [ "$keep_going" -eq 1 ]; then
    args+=(-fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1)
  fi
  # shellcheck disable=SC2206
  args+=(${QCOW2_FUZZ_ARGS:-})
  local rc=0
  nice -n 10 "$bin/$t" "${args[@]}" "$corpus" "$seeds/$t" >"$log" 2>&1 || rc=$?
  local n
  n=$(grep -a "stat::number_of_executed_units:" "$log" | tail -1 | awk '{print $2}')
  if [ -z "$n" ]; then  # fork mode prints progress lines only
    n=$(grep -aoE '^#[0-9]+' "$log" | tail -1 | tr -d '#')
  fi
  local crashes
  crashes=$(find "$art" -type f ! -name 'slow-unit-*' | wc -l)
  echo "${n:-0} $rc $crashes" >"$work/result.$t"
}
parallel="${QCOW2_FUZZ_PARALLEL:-$(nproc)}"
running=0
for t in "${targets[@]}"; do
  if [ "$running" -ge "$parallel" ]; then wait -n || true; running=$((running - 1)); fi
  echo "fuzz.sh: $t: fuzzing for $seconds s"
  fuzz_one "$t" &
  running=$((running + 1))
done
wait || true
for t in "${targets[@]}"; do
  read -r n rc crashes <"$work/result.$t" || { n=0; rc=99; crashes=0; }
  execs[$t]=$n
  total_execs=$((total_execs + n))
  if [ "$rc" -ne 0 ] || [ "$crashes" -gt 0 ]; then
    status[$t]="FAILED (exit $rc, $crashes inputs in $art_root/$t)"
    failures=$((failures + 1))
    echo "fuzz.sh: $t FAILED; from $log_root/$t.log:" >&2
    grep -aE "ERROR: |SUMMARY: |INVARIANT BROKEN|^    #[0-9]+ .* in (qcow2|LLVMFuzzer)" "$log_root/$t.log" \
      | head -30 >&2 || true
  else
    status[$t]=ok
  fi
done

echo
echo "fuzz.sh: $mode run, $seconds s per target, $((SECONDS - fuzz_start)) s of fuzzing"
printf '  %-16s %12s  %s\n' target executions result
for t in "${targets[@]}"; do
  printf '  %-16s %12s  %s\n' "$t" "${execs[$t]}" "${status[$t]}"
done
printf '  %-16s %12s\n' total "$total_execs"
if [ "$failures" -ne 0 ]; then
  echo "fuzz.sh: FAILED ($failures)"
  exit 1
fi
echo "fuzz.sh: ok"
