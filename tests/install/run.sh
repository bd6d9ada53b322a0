#!/bin/sh
# Installs the built library into a scratch prefix, then builds and runs a C consumer twice:
# once with pkg-config, once with CMake's find_package(wsync CONFIG).
set -eu
src="$1"
bin="$2"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix="$work/prefix"
cmake --install "$bin" --prefix "$prefix" >/dev/null
pcdir=$(dirname "$(find "$prefix" -name wsync.pc)")
libdir=$(dirname "$pcdir")
test -f "$prefix/include/wsync.h"
test -f "$libdir/cmake/wsync/wsyncConfig.cmake"
test -L "$libdir/libwsync.so"
test -f "$libdir/libwsync.so.0"
test -f "$libdir/libwsync.a"
version=$(sed -n 's/^#define WSYNC_VERSION_\(MAJOR\|MINOR\) \([0-9]*\).*/\2/p' "$src/include/wsync.h" | paste -sd.)
next_major=$(( ${version%%.*} + 1 )).0

echo "--- pkg-config"
export PKG_CONFIG_PATH="$pcdir"
pkg-config --exact-version="$(pkg-config --modversion wsync)" wsync
pkg-config --atleast-version="$version" wsync
echo "pkg-config --atleast-version=$version wsync: yes"
if pkg-config --atleast-version="$next_major" wsync; then
  echo "pkg-config claims wsync >= $next_major"; exit 1
fi
flags=$(pkg-config --cflags --libs wsync)
echo "pkg-config --cflags --libs wsync: $flags"
# The paths are the prefix installed into, as written (C++ user trial: ${pcfiledir}/../../..
# paths were printed verbatim, and a system prefix's were not recognised as the system's).
[ "$(pkg-config --variable=prefix wsync)" = "$prefix" ] || { echo "wsync.pc: prefix is not $prefix"; exit 1; }
case "$flags" in *..*) echo "pkg-config flags with '..': $flags"; exit 1 ;; esac
case "$flags" in *"-I$prefix/include"*"-L$libdir"*) ;; *) echo "pkg-config flags do not name $prefix"; exit 1 ;; esac
cc -std=c99 -Wall -Werror "$src/tests/install/consumer/consumer.c" $flags -o "$work/consumer-pc"
LD_LIBRARY_PATH="$libdir" "$work/consumer-pc"
if [ -x "$prefix/bin/wsync" ]; then
  echo "--- the installed tool finds the library of its prefix (no LD_LIBRARY_PATH)"
  env -u LD_LIBRARY_PATH "$prefix/bin/wsync" --version
fi
echo "--- pkg-config --static (libwsync.a)"
static_libs=$(pkg-config --static --libs-only-l wsync | sed 's/-lwsync/-l:libwsync.a/')
cc -std=c99 -Wall -Werror "$src/tests/install/consumer/consumer.c" $(pkg-config --cflags wsync) \
  -L"$libdir" $static_libs -o "$work/consumer-static"
if readelf -d "$work/consumer-static" | grep -q libwsync; then
  echo "the static consumer needs libwsync.so"; exit 1
fi
"$work/consumer-static"

echo "--- find_package"
cmake -S "$src/tests/install/consumer" -B "$work/build" -DCMAKE_PREFIX_PATH="$prefix" \
  -DWSYNC_WANT_VERSION="$version" >/dev/null
echo "find_package(wsync $version): found"
if cmake -S "$src/tests/install/consumer" -B "$work/build-next" -DCMAKE_PREFIX_PATH="$prefix" \
     -DWSYNC_WANT_VERSION="$next_major" >/dev/null 2>&1; then
  echo "find_package(wsync $next_major) accepted a $version library"; exit 1
fi
cmake --build "$work/build" >/dev/null
LD_LIBRARY_PATH="$libdir" "$work/build/consumer"
echo "--- find_package: wsync::wsync_static"
if readelf -d "$work/build/consumer-static" | grep -q libwsync; then
  echo "the wsync::wsync_static consumer needs libwsync.so"; exit 1
fi
"$work/build/consumer-static"
echo "install_and_consume: OK"
