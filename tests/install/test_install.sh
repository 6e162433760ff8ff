#!/usr/bin/env bash
# test_install.sh BUILD_DIR CONSUMER_SRC - install, then build and run a consumer both ways.
set -euo pipefail
build=$1 src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
unset DTRAIN_RANK DTRAIN_WORLD_SIZE RANK WORLD_SIZE OMPI_COMM_WORLD_RANK SLURM_PROCID
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
libdir=$(ls -d "$tmp"/prefix/lib*/ | head -1)
test -f "$tmp/prefix/include/dtrain/comm.h"
test -x "$tmp/prefix/bin/dtrain"
# 1. pkg-config
export PKG_CONFIG_PATH="$libdir/pkgconfig"
cc -std=c11 -Wall -Werror -o "$tmp/consumer-pc" "$src/main.c" $(pkg-config --cflags --libs dtrain)
LD_LIBRARY_PATH="$libdir" "$tmp/consumer-pc"
# 2. find_package
cmake -S "$src" -B "$tmp/cb" -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/cb" >/dev/null
LD_LIBRARY_PATH="$libdir" "$tmp/cb/consumer"
echo "install test passed"
