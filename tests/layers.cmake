# SPDX-License-Identifier: Apache-2.0
# tests/layers_check.py can fail: probes in tools/, nbd/, examples/,
# serve/ and a low lib/ layer, each including what it must not, are
# refused on a copy of the tree (the `layers` test runs it on the tree).
add_test(NAME layers_probe
  COMMAND python3 ${PROJECT_SOURCE_DIR}/tests/layers_check_test.py
          ${PROJECT_SOURCE_DIR})
set_tests_properties(layers_probe PROPERTIES LABELS unit)
