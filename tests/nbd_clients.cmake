# SPDX-License-Identifier: Apache-2.0
# nbd_clients (label "interop"): tests/nbd_clients_test.py, libnbd's Python
# binding (python3-libnbd, nbdsh's library) and nbdinfo against `qcowtool
# serve` and qemu-nbd on copies of one chain; every answer must be equal
# (~15 s). The system Python: python3-libnbd installs there, not into a
# pyenv. Skipped (exit 77) without the binding, qemu-nbd or qemu-img.
find_program(QCOW2_SYSTEM_PYTHON3 python3 PATHS /usr/bin NO_DEFAULT_PATH)
if(QCOW2_SYSTEM_PYTHON3)
  add_test(NAME nbd_clients
    COMMAND ${QCOW2_SYSTEM_PYTHON3} ${CMAKE_CURRENT_SOURCE_DIR}/nbd_clients_test.py
            $<TARGET_FILE:qcowtool>
    WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
  set_tests_properties(nbd_clients PROPERTIES
    LABELS interop TIMEOUT 300 SKIP_RETURN_CODE 77)
endif()

# nbd_tls (label "interop"): tests/nbd_tls_test.py, TLS with PSK and x509
# (credentials made by psktool and certtool) through nbdinfo, qemu-img and
# qemu-io, against `qcowtool serve` and qemu-nbd alike; plain clients
# refused (~10 s). Skipped (exit 77) without gnutls-bin or qemu-nbd.
find_package(Python3 COMPONENTS Interpreter)
if(Python3_Interpreter_FOUND)
  add_test(NAME nbd_tls
    COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/nbd_tls_test.py
            $<TARGET_FILE:qcowtool>
    WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
  set_tests_properties(nbd_tls PROPERTIES
    LABELS interop TIMEOUT 300 SKIP_RETURN_CODE 77)
endif()

# nbd_kernel (label "interop"): tests/nbd_kernel_test.sh, ext4 on a loop
# device over nbdfuse over `qcowtool serve`: a file tree written and read
# back, fsck clean; the server killed with SIGKILL mid-write, qemu-img
# check, the synced files intact after a restart (~30 s). Skipped (77)
# unless root with /dev/fuse, loop devices and nbdfuse.
add_test(NAME nbd_kernel
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/nbd_kernel_test.sh
          $<TARGET_FILE:qcowtool>)
set_tests_properties(nbd_kernel PROPERTIES
  LABELS interop TIMEOUT 600 SKIP_RETURN_CODE 77 RUN_SERIAL TRUE)

# nbd_codec_test (a gtest like the others, globbed from *_test.cc): the
# server's codec needs the server library too.
target_link_libraries(nbd_codec_test PRIVATE qcow2_nbd_server qcow2_static)

# nbd_backup (label "interop"): tests/nbd_backup_test.py, incremental
# backup end to end through qemu:dirty-bitmap:b0 on `qcowtool serve
# --bitmap b0` and `qemu-nbd -B b0` alike (~10 s). The system Python (for
# python3-libnbd); skipped (77) without it, qemu-nbd or nbdinfo.
if(QCOW2_SYSTEM_PYTHON3)
  add_test(NAME nbd_backup
    COMMAND ${QCOW2_SYSTEM_PYTHON3} ${CMAKE_CURRENT_SOURCE_DIR}/nbd_backup_test.py
            $<TARGET_FILE:qcowtool>
    WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
  set_tests_properties(nbd_backup PROPERTIES
    LABELS interop TIMEOUT 300 SKIP_RETURN_CODE 77)
endif()

# nbd_nbdsh (label "interop"): tests/nbd_nbdsh_test.sh, the nbdsh scripts
# of tests/nbdsh/ (every option and command in strict mode, structured
# replies on and off, the error paths, a read-only export, CACHE's
# copy-on-read) against `qcowtool serve` and qemu-nbd, outputs equal; then
# qemu-io random I/O through the export equal to the same script on a copy
# (qemu-img compare). About 10 s (25 s at load 12). Skipped (77) without
# nbdsh (python3-libnbd), nbdinfo, qemu-nbd or qemu-io.
add_test(NAME nbd_nbdsh
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/nbd_nbdsh_test.sh
          $<TARGET_FILE:qcowtool>)
set_tests_properties(nbd_nbdsh PROPERTIES
  LABELS interop TIMEOUT 300 SKIP_RETURN_CODE 77)
