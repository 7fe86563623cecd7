# SPDX-License-Identifier: Apache-2.0
# The C API's test (tests/c_api_test.c): compiled as strict C11 with
# -Wall -Wextra -Werror -pedantic, linked to libqcow2.so as an outside C
# program would be, run in a scratch directory. It runs qemu-img itself
# (check, convert) and exits 77 (skipped) without it.
add_executable(c_api_test ${CMAKE_CURRENT_SOURCE_DIR}/c_api_test.c)
set_target_properties(c_api_test PROPERTIES
  C_STANDARD 11
  C_STANDARD_REQUIRED ON
  C_EXTENSIONS OFF)
target_compile_options(c_api_test PRIVATE -Wall -Wextra -Werror -pedantic)
target_link_libraries(c_api_test PRIVATE qcow2_shared)
if(QCOW2_SANITIZE)
  # A sanitized libqcow2.so needs the sanitizers' C++ runtime (UBSan's
  # type checks), which only the C++ driver links: a sanitized build
  # links the C test as C++. An ordinary build links it as C.
  set_target_properties(c_api_test PROPERTIES LINKER_LANGUAGE CXX)
endif()
add_test(NAME c_api
  COMMAND sh -c "d=$(mktemp -d) && \"$0\" \"$d\"; rc=$?; rm -rf \"$d\"; exit $rc"
          $<TARGET_FILE:c_api_test>)
set_tests_properties(c_api PROPERTIES LABELS interop SKIP_RETURN_CODE 77)

# The public C header alone, as strict C11 and as C++: it must need
# nothing but itself (no feature macros, no C++).
add_test(NAME c_api_header
  COMMAND sh -c "for lang in 'cc -std=c11 -x c' 'c++ -std=c++17 -x c++'; do \
    echo '#include \"qcow2/c.h\"
#include \"qcow2/version.h\"
int main(void) { return qcow2_version_string() == 0 || QCOW2_VERSION_MAJOR < 0; }' | \
    $lang -Wall -Wextra -Werror -pedantic -fsyntax-only -I\"$0\" -I\"$1\" - || exit 1; done"
  ${PROJECT_SOURCE_DIR}/include ${QCOW2_GENERATED_INCLUDE_DIR})
set_tests_properties(c_api_header PROPERTIES LABELS unit)

# libqcow2.so exports the public API only: qcow2:: and the C calls
# qcow2_*; nothing of qcow2::internal and no test double (MemoryFile,
# FaultFile, GateFile, Model). scripts/package_test.sh checks the
# installed copy the same way.
add_test(NAME library_symbols
  COMMAND sh -c "syms=$(nm -D --defined-only -C \"$0\" | cut -d' ' -f3-) || exit 1; \
    names=$(echo \"$syms\" | sed -E 's/^(typeinfo name for|typeinfo for|vtable for|VTT for|guard variable for) //; s/\\(.*//'); \
    bad=$( { echo \"$names\" | grep -E '^qcow2::internal::'; \
             echo \"$syms\" | grep -E 'MemoryFile|FaultFile|GateFile|\\bModel\\b|qcow2::testing'; \
             echo \"$names\" | grep -vE '^qcow2::|^qcow2_[a-z0-9_]+$'; } | sort -u); \
    c=$(echo \"$names\" | grep -cE '^qcow2_'); \
    echo \"$(echo \"$syms\" | wc -l) symbols, $c C calls\"; \
    if [ -n \"$bad\" ] || [ \"$c\" -lt 20 ]; then echo \"not public API:\"; echo \"$bad\"; exit 1; fi"
  $<TARGET_FILE:qcow2_shared>)
set_tests_properties(library_symbols PROPERTIES LABELS unit)

# The C API's maintenance calls (tests/c_api_maintenance_test.c): check and
# repair, bitmaps, measure, commit, snapshots, against qemu-img; strict C11
# as above.
add_executable(c_api_maintenance_test
  ${CMAKE_CURRENT_SOURCE_DIR}/c_api_maintenance_test.c)
set_target_properties(c_api_maintenance_test PROPERTIES
  C_STANDARD 11
  C_STANDARD_REQUIRED ON
  C_EXTENSIONS OFF)
target_compile_options(c_api_maintenance_test PRIVATE
  -Wall -Wextra -Werror -pedantic)
target_link_libraries(c_api_maintenance_test PRIVATE qcow2_shared)
if(QCOW2_SANITIZE)
  set_target_properties(c_api_maintenance_test PROPERTIES LINKER_LANGUAGE CXX)
endif()
add_test(NAME c_api_maintenance
  COMMAND sh -c "d=$(mktemp -d) && \"$0\" \"$d\"; rc=$?; rm -rf \"$d\"; exit $rc"
          $<TARGET_FILE:c_api_maintenance_test>)
set_tests_properties(c_api_maintenance PROPERTIES LABELS interop
  SKIP_RETURN_CODE 77)
