# CPack: Debian packages split the usual way. libwsync0 carries the shared library (soname
# libwsync.so.0), libwsync-dev the header, the link name, the static library, pkg-config and
# CMake files, and wsync-tools the command-line tool (and its man page). Binaries are stripped;
# their debug symbols go to -dbgsym packages (.ddeb), as Debian's own builds do. libwsync0 has a
# shlibs file so packages built against it get "libwsync0 (>= <this version>)" from
# dpkg-shlibdeps. `lintian` checks the result in scripts/test-all.sh (overrides, each with its
# reason, in cmake/debian/*.lintian-overrides).
if(NOT CMAKE_INSTALL_LIBDIR MATCHES "^lib/${CMAKE_LIBRARY_ARCHITECTURE}$" AND CMAKE_LIBRARY_ARCHITECTURE)
  message(STATUS "Packaging: CMAKE_INSTALL_LIBDIR is '${CMAKE_INSTALL_LIBDIR}', not the multiarch "
                 "lib/${CMAKE_LIBRARY_ARCHITECTURE}: .deb packages made from this build would "
                 "put the library where Debian's loader does not look")
endif()
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME libwsync)
set(CPACK_PACKAGE_VENDOR "libwsync developers")
set(CPACK_PACKAGE_CONTACT "libwsync developers <dev@libwsync.invalid>")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "${PROJECT_DESCRIPTION}")
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL runtime dev tools)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# Stripping: CPackDeb's debuginfo step copies each unstripped ELF file's debug sections into
# <package>-dbgsym (/usr/lib/debug/.build-id/xx/yyyy.debug), then strips the file
# (objcopy --strip-unneeded) and adds a debug link. CPACK_STRIP_FILES would strip before that
# step and leave the -dbgsym packages empty, so it stays off; the archive libwsync.a, which
# that step does not handle, is stripped of debug sections (strip --strip-debug, as dh_strip
# does) by debian/strip-static.cmake. scripts/test-all.sh checks that both are stripped.
set(CPACK_STRIP_FILES OFF)
set(CPACK_DEBIAN_DEBUGINFO_PACKAGE ON)
configure_file(${CMAKE_CURRENT_LIST_DIR}/debian/strip-static.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/debian/strip-static.cmake @ONLY)
set(CPACK_PRE_BUILD_SCRIPTS ${CMAKE_CURRENT_BINARY_DIR}/debian/strip-static.cmake)
# shlibs: "libwsync 0 libwsync0 (>= <version>)". Every 0.x minor adds calls (never removes or
# changes one; the soname changes when that happens), so a dependant needs at least the
# version it was built against; a symbols file would let it ask for less, per symbol, which
# needs the version each symbol appeared in recorded somewhere (not yet done).
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")
# wsync-tools links libwsync.so.0, which is not installed while packaging: let dpkg-shlibdeps
# find it in the build tree (the dependency itself is declared below).
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS ${CMAKE_BINARY_DIR})
set(CPACK_DEBIAN_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME libwsync${PROJECT_VERSION_MAJOR})
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_DEV_PACKAGE_NAME libwsync-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "libwsync${PROJECT_VERSION_MAJOR} (= ${PROJECT_VERSION})")
set(CPACK_DEBIAN_TOOLS_PACKAGE_NAME wsync-tools)
set(CPACK_DEBIAN_TOOLS_PACKAGE_SECTION utils)
set(CPACK_DEBIAN_TOOLS_PACKAGE_DEPENDS "libwsync${PROJECT_VERSION_MAJOR} (= ${PROJECT_VERSION})")
# The extended descriptions (CPackDeb puts CPACK_PACKAGE_DESCRIPTION_SUMMARY first as the
# synopsis, indents the rest and turns empty lines into " .").
set(_wsync_about "libwsync moves model weights from RL trainers to inference engines: chunks of\ntensors over shared memory, CUDA IPC or NCCL, behind a stable C ABI.")
set(CPACK_DEBIAN_RUNTIME_DESCRIPTION "${_wsync_about}\n\nThis package contains the shared library.")
set(CPACK_DEBIAN_DEV_DESCRIPTION "${_wsync_about}\n\nThis package contains the header, the static library, and the pkg-config and\nCMake package files.")
set(CPACK_DEBIAN_TOOLS_DESCRIPTION "${_wsync_about}\n\nThis package contains the wsync tool: demo, bench, inspect, kinds, options.")
# The ldconfig trigger Debian policy asks of a shared library package.
set(CPACK_DEBIAN_RUNTIME_PACKAGE_CONTROL_EXTRA ${CMAKE_CURRENT_LIST_DIR}/debian/triggers)

# What Debian asks of every binary package: a copyright file and a changelog under
# /usr/share/doc/<package> (gzipped with -9n, changelog.gz as these are native packages), and a
# man page for each program; plus lintian overrides where a warning is deliberate.
string(TIMESTAMP WSYNC_CHANGELOG_DATE "%a, %d %b %Y %H:%M:%S +0000" UTC)
set(_wsync_deb ${CMAKE_CURRENT_BINARY_DIR}/debian)
configure_file(${CMAKE_CURRENT_LIST_DIR}/debian/changelog.in ${_wsync_deb}/changelog @ONLY)
configure_file(${CMAKE_CURRENT_LIST_DIR}/debian/wsync.1.in ${_wsync_deb}/wsync.1 @ONLY)
foreach(_f changelog wsync.1)
  execute_process(COMMAND gzip -9nf -k ${_wsync_deb}/${_f} RESULT_VARIABLE _rc)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "gzip ${_wsync_deb}/${_f} failed")
  endif()
endforeach()
foreach(_comp RUNTIME DEV TOOLS)
  string(TOLOWER ${_comp} _c)
  set(_pkg ${CPACK_DEBIAN_${_comp}_PACKAGE_NAME})
  install(FILES ${CMAKE_CURRENT_LIST_DIR}/debian/copyright ${_wsync_deb}/changelog.gz
    DESTINATION ${CMAKE_INSTALL_DATAROOTDIR}/doc/${_pkg} COMPONENT ${_c})
  if(EXISTS ${CMAKE_CURRENT_LIST_DIR}/debian/${_pkg}.lintian-overrides)
    install(FILES ${CMAKE_CURRENT_LIST_DIR}/debian/${_pkg}.lintian-overrides
      DESTINATION ${CMAKE_INSTALL_DATAROOTDIR}/lintian/overrides RENAME ${_pkg} COMPONENT ${_c})
  endif()
endforeach()
configure_file(${CMAKE_CURRENT_LIST_DIR}/debian/fix-dbgsym.cmake.in ${_wsync_deb}/fix-dbgsym.cmake @ONLY)
set(CPACK_POST_BUILD_SCRIPTS ${_wsync_deb}/fix-dbgsym.cmake)
install(FILES ${_wsync_deb}/wsync.1.gz DESTINATION ${CMAKE_INSTALL_MANDIR}/man1 COMPONENT tools)
include(CPack)
