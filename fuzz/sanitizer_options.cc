// SPDX-License-Identifier: Apache-2.0
// Sanitizer defaults for the fuzz targets, so that running a fuzzer binary
// by hand behaves like scripts/fuzz.sh: any UndefinedBehaviorSanitizer
// report is fatal (libFuzzer saves the input) and comes with a stack trace,
// except the reported library findings listed in fuzz/ubsan.supp.
// UBSAN_OPTIONS in the environment still overrides these.
extern "C" const char* __ubsan_default_options() {
  return "halt_on_error=1:print_stacktrace=1:"
         "suppressions=" QCOW2_FUZZ_UBSAN_SUPP;
}
