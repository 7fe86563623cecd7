# SPDX-License-Identifier: Apache-2.0
# Debian packages with CPack's DEB generator (scripts/package.sh runs it
# from a tree configured with -DCMAKE_INSTALL_PREFIX=/usr):
#
#   libqcow2-0     component qcow2_runtime: libqcow2.so.0 (the SONAME's
#                  number in the name, as Debian's policy asks), shlibs
#   libqcow2-dev   component qcow2_development: headers, libqcow2.so,
#                  libqcow2.a, the CMake package, qcow2.pc, libqcow2(3)
#   qcowtool       component qcow2_tools: qcowtool, the nbdkit plugin,
#                  qcowtool(1), bash completion
#
# Runtime dependencies come from dpkg-shlibdeps (Abseil, liburing, zstd,
# zlib, and whatever else the binaries link, such as GnuTLS); the
# development package names the -dev packages its headers, qcow2.pc and
# the CMake package ask for. Each package carries /usr/share/doc/PKG/
# copyright (the Apache-2.0 notice, the text being in
# /usr/share/common-licenses) and changelog.Debian.gz.
#
# Also here, for every install: the man pages (man/gen_man.py over
# `qcowtool --help` and qcow2/c.h at build time) and the bash completion.

set(QCOW2_DEB_RELEASE 1)
set(QCOW2_DEB_MAINTAINER "qcowtool developers <qcowtool-devel@example.org>")

# Man pages, generated at build time so that they cannot drift from the
# tool's --help or the C header. Not in sanitizer builds (running the tool
# there would make the build depend on the sanitizer's verdict).
find_package(Python3 COMPONENTS Interpreter)
if(TARGET qcowtool AND Python3_FOUND AND NOT QCOW2_SANITIZE)
  set(QCOW2_MAN_DIR ${PROJECT_BINARY_DIR}/man)
  set(QCOW2_MAN_GEN ${PROJECT_SOURCE_DIR}/man/gen_man.py)
  add_custom_command(
    OUTPUT ${QCOW2_MAN_DIR}/qcowtool.1 ${QCOW2_MAN_DIR}/qcowtool.1.gz
    COMMAND ${CMAKE_COMMAND} -E make_directory ${QCOW2_MAN_DIR}
    COMMAND ${Python3_EXECUTABLE} ${QCOW2_MAN_GEN} tool $<TARGET_FILE:qcowtool>
            ${PROJECT_VERSION} ${QCOW2_MAN_DIR}/qcowtool.1
    COMMAND gzip -9nkf ${QCOW2_MAN_DIR}/qcowtool.1
    DEPENDS qcowtool ${QCOW2_MAN_GEN}
    COMMENT "Generating qcowtool(1) from qcowtool --help"
    VERBATIM)
  add_custom_command(
    OUTPUT ${QCOW2_MAN_DIR}/libqcow2.3 ${QCOW2_MAN_DIR}/libqcow2.3.gz
    COMMAND ${CMAKE_COMMAND} -E make_directory ${QCOW2_MAN_DIR}
    COMMAND ${Python3_EXECUTABLE} ${QCOW2_MAN_GEN} capi
            ${PROJECT_SOURCE_DIR}/include/qcow2/c.h ${PROJECT_VERSION}
            ${QCOW2_MAN_DIR}/libqcow2.3
    COMMAND gzip -9nkf ${QCOW2_MAN_DIR}/libqcow2.3
    DEPENDS ${PROJECT_SOURCE_DIR}/include/qcow2/c.h ${QCOW2_MAN_GEN}
    COMMENT "Generating libqcow2(3) from qcow2/c.h"
    VERBATIM)
  add_custom_target(man ALL DEPENDS ${QCOW2_MAN_DIR}/qcowtool.1.gz
                                    ${QCOW2_MAN_DIR}/libqcow2.3.gz)
  # OPTIONAL: an install after building the library targets alone (as
  # scripts/package_test.sh --build does) has no pages; scripts/package.sh
  # builds everything, and tests that the packages have them.
  if(QCOW2_INSTALL)
    install(FILES ${QCOW2_MAN_DIR}/libqcow2.3.gz OPTIONAL
      DESTINATION ${CMAKE_INSTALL_MANDIR}/man3 COMPONENT qcow2_development)
    if(QCOW2_BUILD_TOOLS)
      install(FILES ${QCOW2_MAN_DIR}/qcowtool.1.gz OPTIONAL
        DESTINATION ${CMAKE_INSTALL_MANDIR}/man1 COMPONENT qcow2_tools)
    endif()
  endif()
endif()

if(NOT QCOW2_INSTALL)
  return()
endif()

if(QCOW2_BUILD_TOOLS)
  install(FILES ${PROJECT_SOURCE_DIR}/contrib/bash-completion/qcowtool
    DESTINATION ${CMAKE_INSTALL_DATADIR}/bash-completion/completions
    COMPONENT qcow2_tools)
endif()

# Per-package copyright and changelog, as Debian's policy places them;
# the static library without its debug sections, as dh_strip leaves it
# (CPack strips only the shared objects and executables).
if(QCOW2_DEB_LAYOUT)
# The plugin's RUNPATH (nbd/CMakeLists.txt) is for prefixes outside the
# linker's path; /usr/lib/<multiarch> is in it, and Debian forbids the
# redundant one.
if(TARGET nbdkit_libqcow2_plugin)
  set_target_properties(nbdkit_libqcow2_plugin PROPERTIES INSTALL_RPATH "")
endif()
install(CODE "execute_process(COMMAND strip --strip-debug --remove-section=.comment
  \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR}/libqcow2.a\"
  COMMAND_ERROR_IS_FATAL ANY)" COMPONENT qcow2_development)
set(QCOW2_DEB_DOC_DIR ${PROJECT_BINARY_DIR}/deb-doc)
string(TIMESTAMP QCOW2_DEB_DATE "%a, %d %b %Y %H:%M:%S +0000" UTC)
set(QCOW2_DEB_VERSION ${PROJECT_VERSION}-${QCOW2_DEB_RELEASE})
foreach(pkg_comp libqcow2-0:qcow2_runtime libqcow2-dev:qcow2_development
                 qcowtool:qcow2_tools)
  string(REPLACE ":" ";" pair ${pkg_comp})
  list(GET pair 0 pkg)
  list(GET pair 1 comp)
  if(comp STREQUAL qcow2_tools AND NOT QCOW2_BUILD_TOOLS)
    continue()
  endif()
  configure_file(${PROJECT_SOURCE_DIR}/cmake/deb-copyright.in
                 ${QCOW2_DEB_DOC_DIR}/${pkg}/copyright @ONLY)
  file(WRITE ${QCOW2_DEB_DOC_DIR}/${pkg}/changelog.Debian
    "libqcow2 (${QCOW2_DEB_VERSION}) unstable; urgency=medium\n\n"
    "  * Built from the libqcow2/qcowtool source tree.\n\n"
    " -- ${QCOW2_DEB_MAINTAINER}  ${QCOW2_DEB_DATE}\n")
  execute_process(COMMAND gzip -9nf ${QCOW2_DEB_DOC_DIR}/${pkg}/changelog.Debian)
  install(FILES ${QCOW2_DEB_DOC_DIR}/${pkg}/copyright
                ${QCOW2_DEB_DOC_DIR}/${pkg}/changelog.Debian.gz
    DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/${pkg} COMPONENT ${comp})
endforeach()
endif()

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME libqcow2)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "${QCOW2_DEB_MAINTAINER}")
# No CPACK_PACKAGE_DESCRIPTION_SUMMARY: CPack would put it before each
# package's own summary line.
set(CPACK_PACKAGE_DIRECTORY ${PROJECT_BINARY_DIR}/packages)
set(CPACK_STRIP_FILES ON)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL qcow2_runtime qcow2_development)
if(QCOW2_BUILD_TOOLS)
  list(APPEND CPACK_COMPONENTS_ALL qcow2_tools)
endif()
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_RELEASE ${QCOW2_DEB_RELEASE})
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "${QCOW2_DEB_MAINTAINER}")
set(CPACK_DEBIAN_PACKAGE_HOMEPAGE "https://example.org/qcowtool")
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# qcowtool and the plugin link libqcow2.so.0, which no installed package
# provides yet: dpkg-shlibdeps finds it here, and the exact version is
# named below.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS ${PROJECT_BINARY_DIR})

# ldconfig runs through dpkg's trigger (Debian's way since 2015); CPack's
# own postinst/postrm calls stay as well (lintian: a warning only).
file(WRITE ${PROJECT_BINARY_DIR}/deb-control/libqcow2-0/triggers
  "activate-noawait ldconfig\n")
set(CPACK_DEBIAN_QCOW2_RUNTIME_PACKAGE_CONTROL_EXTRA
  ${PROJECT_BINARY_DIR}/deb-control/libqcow2-0/triggers)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(CPACK_DEBIAN_QCOW2_RUNTIME_PACKAGE_NAME libqcow2-0)
set(CPACK_DEBIAN_QCOW2_RUNTIME_PACKAGE_SECTION libs)
# A shlibs control file for every package with a SONAME'd library (only
# libqcow2-0 has one), so that packages built against it depend on it.
# (CPack warns that the nbdkit plugin has no SONAME: a plugin needs none.)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")
set(CPACK_DEBIAN_QCOW2_RUNTIME_DESCRIPTION
  "qcow2 disk image library (shared library)
libqcow2 reads and writes qcow2 disk images and their backing chains from
userspace over io_uring, with a C++ and a C API.
.
This package contains the shared library.")

set(CPACK_DEBIAN_QCOW2_DEVELOPMENT_PACKAGE_NAME libqcow2-dev)
set(CPACK_DEBIAN_QCOW2_DEVELOPMENT_PACKAGE_SECTION libdevel)
# The headers include Abseil's; qcow2.pc's Requires.private and the static
# library's link line name liburing, libzstd, nettle and zlib.
set(CPACK_DEBIAN_QCOW2_DEVELOPMENT_PACKAGE_DEPENDS
  "libqcow2-0 (= ${QCOW2_DEB_VERSION}), libabsl-dev, liburing-dev, libzstd-dev, nettle-dev, zlib1g-dev, pkg-config | pkgconf")
set(CPACK_DEBIAN_QCOW2_DEVELOPMENT_DESCRIPTION
  "qcow2 disk image library (development files)
libqcow2 reads and writes qcow2 disk images and their backing chains from
userspace over io_uring, with a C++ and a C API.
.
This package contains the headers, the static library, the CMake package
(find_package(qcow2)), the pkg-config file (qcow2) and libqcow2(3).")

set(CPACK_DEBIAN_QCOW2_TOOLS_PACKAGE_NAME qcowtool)
set(CPACK_DEBIAN_QCOW2_TOOLS_PACKAGE_SECTION utils)
set(CPACK_DEBIAN_QCOW2_TOOLS_PACKAGE_DEPENDS "libqcow2-0 (= ${QCOW2_DEB_VERSION})")
set(CPACK_DEBIAN_QCOW2_TOOLS_PACKAGE_RECOMMENDS "nbdkit")
set(CPACK_DEBIAN_QCOW2_TOOLS_PACKAGE_SUGGESTS "qemu-utils")
set(CPACK_DEBIAN_QCOW2_TOOLS_DESCRIPTION
  "qcow2 disk image tool with qemu-img's commands
qcowtool inspects, creates, converts, checks, resizes, rebases, commits
and copies qcow2 and raw disk images with qemu-img's commands and
options, and serves them over NBD through nbdkit (the libqcow2 plugin is
included).")

include(CPack)
