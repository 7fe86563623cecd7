# SPDX-License-Identifier: Apache-2.0
# vhost_guest (label "interop"): tests/vhost_guest_test.sh, a real QEMU
# (TCG) guest on `qcowtool serve --vhost-user-blk`, qemu-storage-daemon's
# export as the oracle, a SIGKILL of QEMU and a reconnect, an overlay.
# Six guest boots, about 4 to 5 minutes on a loaded 2-CPU machine; the
# kernel package is in <build>/vhost-guest, put there by
# scripts/bootstrap.sh (else the first run fetches it: apt-get download).
# Skipped (exit 77) without qemu-system-x86_64 or qemu-storage-daemon
# (scripts/bootstrap.sh installs them).
add_test(NAME vhost_guest
  COMMAND bash ${PROJECT_SOURCE_DIR}/tests/vhost_guest_test.sh
          $<TARGET_FILE:qcowtool> ${PROJECT_SOURCE_DIR}
          ${CMAKE_BINARY_DIR}/vhost-guest)
set_tests_properties(vhost_guest PROPERTIES
  LABELS interop TIMEOUT 1800 SKIP_RETURN_CODE 77)

# The unit test of serve/vhost/'s decoder and ring walker links the
# back-end's library (tests/CMakeLists.txt made the binary).
if(TARGET vhost_ring_test AND TARGET qcow2_vhost)
  target_link_libraries(vhost_ring_test PRIVATE qcow2_vhost)
endif()

# bench/vhost_bench.cc: the front-end behind bench/vhost_bench.sh (ours
# against qemu-storage-daemon, docs/vhost-user-blk.md); built here, run by
# hand.
add_executable(vhost_bench ${PROJECT_SOURCE_DIR}/bench/vhost_bench.cc)
target_include_directories(vhost_bench PRIVATE ${PROJECT_SOURCE_DIR})
target_link_libraries(vhost_bench PRIVATE absl::status absl::statusor
  absl::span Threads::Threads)

# vhost_cli (label "interop", a few seconds): the CLI's rules (no probing,
# the lock, --fork), a malformed message and a broken ring closing only
# their connection, vhost_bench's pattern read back through qemu-img.
add_test(NAME vhost_cli
  COMMAND bash ${PROJECT_SOURCE_DIR}/tests/vhost_cli_test.sh
          $<TARGET_FILE:qcowtool> $<TARGET_FILE:vhost_bench>)
set_tests_properties(vhost_cli PROPERTIES LABELS interop TIMEOUT 300)
