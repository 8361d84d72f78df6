#!/usr/bin/env bash
# Install-and-link test: installs the build tree into a temporary prefix, then builds the README's
# example (extracted from README.md, so the README cannot drift) three ways: find_package with the
# shared library, find_package with the static library, and pkg-config; runs each.  Then moves the
# prefix elsewhere and runs an installed tool from it, without LD_LIBRARY_PATH: the tools find the
# library through their install RPATH ($ORIGIN/../lib), wherever the prefix lies.
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
mv "$work/prefix" "$work/moved"
tools=$(ls "$work/moved/bin")
[ -n "$tools" ] || { echo "no tools installed (configure with CASTLE_BUILD_TOOLS=ON)"; exit 1; }
for t in $tools; do # every installed tool resolves the installed library
    deps=$(env -u LD_LIBRARY_PATH ldd "$work/moved/bin/$t")
    grep -q "libcastle\.so[^ ]* => $work/moved/" <<<"$deps" || { echo "$t does not load libcastle from its prefix:"; echo "$deps"; exit 1; }
done
env -u LD_LIBRARY_PATH "$work/moved/bin/castle-run" random --shape 1,2,40,8 --out "$work/in"
env -u LD_LIBRARY_PATH "$work/moved/bin/castle-run" forward --in "$work/in" --out "$work/out"
test -s "$work/out/o.npy" && test -s "$work/out/lse.npy" || { echo "installed castle-run wrote no outputs"; exit 1; }
echo "install-and-link: shared, static and pkg-config builds ran; installed castle-run ran from a moved prefix"
