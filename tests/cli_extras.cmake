# SPDX-License-Identifier: Apache-2.0
# qcowtool's dd against qemu-img dd, the man page against --help, the bash
# completion, --version.

# Output bytes, sizes, messages and exit status of qemu-img dd on a matrix
# of inputs and operands (about 40 s on 2 cores).
add_test(NAME dd_compare
  COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/dd_compare.py $<TARGET_FILE:qcowtool>)
set_tests_properties(dd_compare PROPERTIES LABELS interop SKIP_RETURN_CODE 77
  TIMEOUT 600)

# Every command's man section lists the options its --help lists.
if(TARGET man)
  add_test(NAME man_help
    COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/man_help_check.py
            $<TARGET_FILE:qcowtool> ${PROJECT_BINARY_DIR}/man/qcowtool.1)
  set_tests_properties(man_help PROPERTIES LABELS unit)
endif()

add_test(NAME bash_completion
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/completion_check.sh
          $<TARGET_FILE:qcowtool>
          ${PROJECT_SOURCE_DIR}/contrib/bash-completion/qcowtool)
set_tests_properties(bash_completion PROPERTIES LABELS unit)

foreach(flag --version -V)
  add_test(NAME version${flag} COMMAND $<TARGET_FILE:qcowtool> ${flag})
  set_tests_properties(version${flag} PROPERTIES LABELS unit
    PASS_REGULAR_EXPRESSION
    "^qcowtool version ${PROJECT_VERSION} \\(libqcow2 ${PROJECT_VERSION}\\)\n$")
endforeach()
