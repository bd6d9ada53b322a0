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

echo "--- pkg-config"
export PKG_CONFIG_PATH="$pcdir"
pkg-config --exact-version="$(pkg-config --modversion wsync)" wsync
flags=$(pkg-config --cflags --libs wsync)
echo "pkg-config --cflags --libs wsync: $flags"
cc -std=c99 -Wall -Werror "$src/tests/install/consumer/consumer.c" $flags -o "$work/consumer-pc"
LD_LIBRARY_PATH="$libdir" "$work/consumer-pc"

echo "--- find_package"
cmake -S "$src/tests/install/consumer" -B "$work/build" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$work/build" >/dev/null
LD_LIBRARY_PATH="$libdir" "$work/build/consumer"
echo "install_and_consume: OK"
