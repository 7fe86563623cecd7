# SPDX-License-Identifier: Apache-2.0
# The Rust crates in rust/ (qcow2-sys, qcow2), built and tested with
# Debian's cargo (/usr/bin/cargo, rustc 1.63) against the libqcow2.so of
# this build tree: nothing installed, no registry contacted (--offline
# --locked; the crates have no dependencies), CARGO_HOME and the target
# directory inside the build tree.
#   rust_sys_decls  the -sys declarations match include/qcow2/c.h (python)
#   rust            cargo test: unit, integration (qemu-img, qemu-io) and
#                   doc tests
#   rust_example    the virtio-blk-style epoll example, run
#   rust_doc        cargo doc with RUSTDOCFLAGS=-Dwarnings
#   rust_pkg_config the example built against an installed prefix found
#                   through pkg-config
#   rust_bench      4 KiB requests at depth 32 on tmpfs, Rust against C
#                   (label bench; prints CPU time per request)
# Not in sanitizer builds (a sanitized libqcow2.so needs its runtime in
# the Rust binaries).
add_test(NAME rust_sys_decls
  COMMAND python3 ${PROJECT_SOURCE_DIR}/tests/rust_sys_check.py
          ${PROJECT_SOURCE_DIR}/include/qcow2/c.h
          ${PROJECT_SOURCE_DIR}/rust/qcow2-sys/src/lib.rs)
set_tests_properties(rust_sys_decls PROPERTIES LABELS unit)

if(EXISTS /usr/bin/cargo)
  set(QCOW2_CARGO_DEFAULT /usr/bin/cargo)
else()
  find_program(QCOW2_CARGO_DEFAULT cargo)
endif()
set(QCOW2_CARGO "${QCOW2_CARGO_DEFAULT}" CACHE FILEPATH
    "cargo for the Rust crates' tests (default: Debian's /usr/bin/cargo)")

if(QCOW2_CARGO AND NOT QCOW2_SANITIZE)
  # The rustc and rustdoc beside that cargo, whatever PATH says (a rustup
  # toolchain first on PATH would otherwise build with Debian's cargo).
  get_filename_component(cargo_dir ${QCOW2_CARGO} DIRECTORY)
  set(rust_dir ${CMAKE_BINARY_DIR}/rust)
  set(rust_env
    CARGO_HOME=${rust_dir}/cargo-home
    CARGO_TARGET_DIR=${rust_dir}/target
    CARGO_NET_OFFLINE=true
    RUSTC=${cargo_dir}/rustc
    RUSTDOC=${cargo_dir}/rustdoc
    QCOW2_DIR=$<TARGET_FILE_DIR:qcow2_shared>
    LD_LIBRARY_PATH=$<TARGET_FILE_DIR:qcow2_shared>
    QCOW2_TEST_TMPDIR=${rust_dir}/tmp)
  set(cargo ${CMAKE_COMMAND} -E env ${rust_env} ${QCOW2_CARGO})
  set(manifest --manifest-path ${PROJECT_SOURCE_DIR}/rust/Cargo.toml)
  file(MAKE_DIRECTORY ${rust_dir}/tmp)

  # One test at a time: a test thread forking qemu-img while another holds
  # a freshly created image open lends the child that file's OFD lock
  # until its exec, and the other's open then fails with EBUSY.
  add_test(NAME rust COMMAND ${cargo} test --offline --locked ${manifest} -- --test-threads=1)
  add_test(NAME rust_example
    COMMAND sh -c "d=$(mktemp -d) && \"$@\" \"$d\"; rc=$?; rm -rf \"$d\"; exit $rc" sh
            ${cargo} run --offline --locked ${manifest} -p qcow2 --example virtio_blk --)
  add_test(NAME rust_doc
    COMMAND ${CMAKE_COMMAND} -E env RUSTDOCFLAGS=-Dwarnings
            ${cargo} doc --offline --locked --no-deps ${manifest})
  # The other way build.rs finds the library: pkg-config and the qcow2.pc
  # of an installed prefix (no QCOW2_DIR); the example built and run
  # against it.
  add_test(NAME rust_pkg_config
    COMMAND sh -c "build=$0 target=$1; shift; d=$(mktemp -d) && trap 'rm -rf \"$d\"' EXIT && \
      for c in qcow2_runtime qcow2_development; do \
        cmake --install \"$build\" --prefix \"$d/prefix\" --component $c >/dev/null || exit 1; done && \
      lib=$(dirname $(find \"$d/prefix\" -name qcow2.pc))/.. && mkdir \"$d/vm\" && \
      env -u QCOW2_DIR PKG_CONFIG_PATH=\"$lib/pkgconfig\" LD_LIBRARY_PATH=\"$lib\" \
        CARGO_TARGET_DIR=\"$target\" \"$@\" \"$d/vm\""
      ${CMAKE_BINARY_DIR} ${rust_dir}/target-pkg-config
      ${CMAKE_COMMAND} -E env CARGO_HOME=${rust_dir}/cargo-home CARGO_NET_OFFLINE=true
        RUSTC=${cargo_dir}/rustc RUSTDOC=${cargo_dir}/rustdoc
      ${QCOW2_CARGO} run --offline --locked ${manifest} -p qcow2 --example virtio_blk --)

  # The benchmark: the C side built here, the Rust side by cargo (release),
  # both run in turns by rust/qcow2/benches/run.sh (about 30 s).
  add_executable(rust_c_queue_bench ${PROJECT_SOURCE_DIR}/rust/qcow2/benches/c_queue_bench.c)
  set_target_properties(rust_c_queue_bench PROPERTIES C_STANDARD 11)
  target_link_libraries(rust_c_queue_bench PRIVATE qcow2_shared)
  add_test(NAME rust_bench
    COMMAND sh -c "run=$0 c=$1; shift; \"$@\" >/dev/null 2>&1 || exit 1; \
      b=$(ls -t \"$CARGO_TARGET_DIR\"/release/deps/queue_bench-* | grep -v '[.]d$' | head -1); \
      exec \"$run\" \"$c\" \"$b\" 30000 3"
      ${PROJECT_SOURCE_DIR}/rust/qcow2/benches/run.sh $<TARGET_FILE:rust_c_queue_bench>
      ${cargo} bench --offline --locked --no-run ${manifest} -p qcow2 --bench queue_bench)
  set_tests_properties(rust_bench PROPERTIES
    ENVIRONMENT "CARGO_TARGET_DIR=${rust_dir}/target;LD_LIBRARY_PATH=$<TARGET_FILE_DIR:qcow2_shared>")

  # cargo locks its target directory: the entries run one at a time.
  set_tests_properties(rust rust_example rust_doc rust_pkg_config PROPERTIES
    LABELS interop RESOURCE_LOCK rust_cargo TIMEOUT 900)
  set_tests_properties(rust_bench PROPERTIES
    LABELS bench RESOURCE_LOCK rust_cargo TIMEOUT 900)
endif()
