# CPack: Debian packages split the usual way. libwsync0 carries the shared library (soname
# libwsync.so.0), libwsync-dev the header, the link name, pkg-config and CMake files, and
# wsync-tools the command-line tool.
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
set(CPACK_COMPONENT_RUNTIME_DESCRIPTION "libwsync shared library")
set(CPACK_COMPONENT_DEV_DESCRIPTION "libwsync development files (header, pkg-config, CMake package)")
set(CPACK_COMPONENT_TOOLS_DESCRIPTION "wsync command-line tool: demo, bench, inspect")
include(CPack)
