# SPDX-License-Identifier: Apache-2.0
# nbd_bench_small (label "bench"): bench/nbd_bench.py --small, fio through
# NBD against `qcowtool serve`, qemu-nbd, nbdkit's file plugin and the
# bench-only O_DIRECT ceiling (nbdkit-rawdirect-plugin.so) on a
# 64 MiB image, 1 s per job; one job of each kind (sequential, random from
# 16 threads, a fresh overlay) keeps the script's every path in use at
# about half the time of all ten.
# Skipped (exit 77) without nbdkit, qemu-nbd or fio's nbd engine;
# registered only with the nbdkit plugin.
if(TARGET nbdkit_libqcow2_plugin)
  find_package(Python3 COMPONENTS Interpreter)
  if(Python3_Interpreter_FOUND)
    # The O_DIRECT ceiling server is named, so that its absence fails.
    set(rawdirect_arg)
    if(TARGET nbdkit_rawdirect_plugin)
      set(rawdirect_arg
          --rawdirect-plugin $<TARGET_FILE:nbdkit_rawdirect_plugin>)
    endif()
    add_test(NAME nbd_bench_small
      COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/bench/nbd_bench.py
              --small --qcowtool $<TARGET_FILE:qcowtool> ${rawdirect_arg}
              --jobs SEQ1M-Q8T1,RND4K-Q32T16,ovl-RND4K-Q32T1
              --json ${CMAKE_BINARY_DIR}/nbd_bench_small.json
              --table ${CMAKE_BINARY_DIR}/nbd_bench_small.md)
    set_tests_properties(nbd_bench_small PROPERTIES
      LABELS bench TIMEOUT 600 SKIP_RETURN_CODE 77)
  endif()
endif()
