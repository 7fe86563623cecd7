# SPDX-License-Identifier: Apache-2.0
# kill_lock_* (label "interop"): tests/kill_lock_test.py, issue 48. A
# writer on an overlay chain is killed with SIGKILL at a random instant and
# reaped; at once `qemu-img info` (no -U) and a read-write qemu-io must open
# the top, and `qemu-img check` must find no errors. One test per kind of
# writer; a new kind (another server) is one more line here.
#
# Default: 50 rounds of the io_uring O_DIRECT writer (the one that left
# its locks behind before issue 48), 10 to 25 of each other kind: 160 in
# all, about 2 minutes one after the other on a loaded 2-CPU machine,
# mostly waiting. A round fails if nothing is written before the kill
# (a writer or client that exits first, or 10 s without a write). QCOW2_LONG_TESTS=1: 200 rounds of each. Skipped (exit 77) without
# qemu-img and qemu-io, where the temporary directory refuses O_DIRECT
# (the direct kinds), and for the NBD servers without nbdkit or nbdcopy.
find_package(Python3 COMPONENTS Interpreter)
if(Python3_Interpreter_FOUND)
  # kind, rounds, extra script flags, writer, client (servers only)
  set(bench_writer
      "{qcowtool} bench pattern -q -w -c 100000000 -d 64 -s 256k")
  set(nbd_client "nbdcopy {data} nbd+unix:///?socket={socket}")
  set(kill_lock_kinds
      "direct|50|--needs-direct|${bench_writer} -t none {top}|"
      "pagecache|25||${bench_writer} -t writeback {top}|")
  # The own NBD server (serve/nbd/), O_DIRECT and through the page cache.
  list(APPEND kill_lock_kinds
    "serve_direct|25|--needs-direct --needs nbdcopy|{qcowtool} serve --socket {socket} --direct {top}|${nbd_client}"
    "serve_cached|15|--needs nbdcopy|{qcowtool} serve --socket {socket} {top}|${nbd_client}")
  # The vhost-user-blk back-end (serve/vhost/), written by vhost_bench's
  # front-end on two queues.
  list(APPEND kill_lock_kinds
    "serve_vhost|25||{qcowtool} serve --vhost-user-blk {socket} --num-queues 2 {top}|$<TARGET_FILE:vhost_bench> --socket {socket} --queues 2 --depth 32 --rw randwrite --seconds 60")
  # The nbdkit plugin (`serve --nbdkit`), in its two threading modes.
  if(TARGET nbdkit_libqcow2_plugin)
    list(APPEND kill_lock_kinds
      "nbdkit_queue|10|--needs nbdkit --needs nbdcopy|{qcowtool} serve --nbdkit --socket {socket} --queue {top}|${nbd_client}"
      "nbdkit_sync|10|--needs nbdkit --needs nbdcopy|{qcowtool} serve --nbdkit --socket {socket} --sync {top}|${nbd_client}")
  endif()
  foreach(kind ${kill_lock_kinds})
    string(REPLACE "|" ";" fields "${kind}")
    list(GET fields 0 name)
    list(GET fields 1 rounds)
    list(GET fields 2 flags)
    list(GET fields 3 writer)
    list(GET fields 4 client)
    separate_arguments(flags UNIX_COMMAND "${flags}")
    set(client_args)
    if(client)
      set(client_args --client "${client}")
    endif()
    add_test(NAME kill_lock_${name}
      COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tests/kill_lock_test.py
              --qcowtool $<TARGET_FILE:qcowtool> --name ${name}
              --rounds ${rounds} --long-rounds 200 ${flags}
              --writer "${writer}" ${client_args})
    set_tests_properties(kill_lock_${name} PROPERTIES
      LABELS interop TIMEOUT 900 SKIP_RETURN_CODE 77)
  endforeach()
endif()
