#!/usr/bin/env bash
# Install-and-link test: installs the build tree into a temporary prefix, then builds the README's
# example (extracted from README.md, so the README cannot drift) three ways: find_package with the
# shared library, find_package with the static library, and pkg-config; runs each.
# usage: run.sh <build-dir> <source-dir>
set -euo pipefail
build=$1
src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
mkdir "$work/consumer"
cp "$src/tests/install/CMakeLists.txt" "$work/consumer/"
# The first ```c block of the README is the example.
awk '/^```c$/ {on=1; next} /^```$/ && on {exit} on' "$src/README.md" >"$work/consumer/example.c"
test -s "$work/consumer/example.c" || { echo "no C example found in README.md"; exit 1; }
cmake -S "$work/consumer" -B "$work/consumer/build" -DCMAKE_PREFIX_PATH="$work/prefix" \
    -DCMAKE_C_FLAGS="-Wall -Wextra -Werror" >/dev/null
cmake --build "$work/consumer/build" >/dev/null
export CASTLE_CACHE_DIR="$work/cache"
"$work/consumer/build/example_shared"
"$work/consumer/build/example_static"
libdir=$(ls -d "$work/prefix"/lib*/pkgconfig | head -n1)
export PKG_CONFIG_PATH="$libdir"
cc -std=c11 -Wall -Wextra -Werror "$work/consumer/example.c" -o "$work/example_pc" $(pkg-config --cflags --libs castle) \
    -Wl,-rpath,"$(pkg-config --variable=libdir castle)"
"$work/example_pc"
echo "install-and-link: shared, static and pkg-config builds ran"
