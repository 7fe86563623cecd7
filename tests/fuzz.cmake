# SPDX-License-Identifier: Apache-2.0
# fuzz_smoke (label "fuzz"): scripts/fuzz.sh --smoke, i.e. a clang build of
# the libFuzzer targets in its own tree (<build>/fuzz-smoke), seeds made with
# qemu-img, the regression inputs replayed and ~20 s of fuzzing per target.
# Registered only when clang++ is installed; the test reports "skipped" when
# the libFuzzer runtime is missing (Debian 12: clang and libclang-rt-14-dev).
find_program(QCOW2_CLANGXX NAMES clang++ clang++-14)
if(QCOW2_CLANGXX)
  add_test(NAME fuzz_smoke
    COMMAND bash ${PROJECT_SOURCE_DIR}/scripts/fuzz.sh --smoke
            --skip-if-unavailable --build-dir ${CMAKE_BINARY_DIR}/fuzz-smoke
    WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(fuzz_smoke PROPERTIES
    LABELS fuzz TIMEOUT 900 SKIP_RETURN_CODE 77)
else()
  message(STATUS "clang++ not found: the fuzz_smoke test is not registered "
                 "(Debian 12: apt-get install clang libclang-rt-14-dev)")
endif()
