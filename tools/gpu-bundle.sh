#!/usr/bin/env bash
# gpu-bundle.sh: packs a Release build of this checkout, with the shared libraries it links that a
# machine with only a GPU driver lacks (the OpenCL ICD loader, CLBlast, Check), into .bundle/ at the
# checkout's root, so that the build, its tools and its ctest suites run on such a machine (a lent
# GPU machine that receives only the checkout: carry .bundle along).
#
# usage: tools/gpu-bundle.sh [--jobs N]
#   --jobs N  parallel build jobs (default: nproc)
# The checkout's tracked and untracked-but-not-ignored files are copied to /tmp/castle-gpu/src and
# built in /tmp/castle-gpu/build; .bundle/ receives both, lib/ (the libraries) and run.sh
# (tools/gpu-run.sh), which on the GPU machine puts the build back at /tmp/castle-gpu (the path
# compiled into ctest's files) and runs it:
#     bash .bundle/run.sh                       castle-info, castle-bench at the GPU shape, ctest
#     bash .bundle/run.sh castle-bench --L 4096 --batch 2 --heads 16
#     bash .bundle/run.sh bash tools/gpu-session.sh --pack
# .bundle/ is in .gitignore.  Exit status: 0 done, 1 the build failed, 2 bad usage.
set -euo pipefail
usage() { # [status]: 0 to stdout (--help), else to stderr
    local status=${1:-2}
    sed -n '/^# usage:/,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&$((status == 0 ? 1 : 2))
    exit "$status"
}
jobs=$(nproc)
while [ $# -gt 0 ]; do
    case $1 in
    -h | --help) usage 0 ;;
    --jobs)
        [ $# -ge 2 ] && [[ $2 =~ ^[1-9][0-9]*$ ]] || { echo "gpu-bundle.sh: --jobs needs a positive integer" >&2; exit 2; }
        jobs=$2
        shift 2 ;;
    *) echo "gpu-bundle.sh: unknown option $1" >&2; usage 2 ;;
    esac
done
root=$(cd "$(dirname "$0")/.." && pwd)
stage=/tmp/castle-gpu bundle=$root/.bundle
rm -rf "$stage" && mkdir -p "$stage/src"
(cd "$root" && git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$stage/src")
echo "gpu-bundle.sh: building $(git -C "$root" rev-parse --short HEAD)$(git -C "$root" diff --quiet HEAD || echo +changes)" \
    "in $stage/build"
if ! { cmake -S "$stage/src" -B "$stage/build" -DCMAKE_BUILD_TYPE=Release &&
    cmake --build "$stage/build" -j"$jobs"; } >"$stage/build.log" 2>&1; then
    tail -20 "$stage/build.log" >&2
    echo "gpu-bundle.sh: the build failed ($stage/build.log)" >&2
    exit 1
fi
rm -rf "$bundle" && mkdir -p "$bundle/lib"
cp -r "$stage/src" "$stage/build" "$bundle/"
cp "$root/tools/gpu-run.sh" "$bundle/run.sh"
# the first of each in the linker's cache (awk reads it all: an early exit would end ldconfig with
# SIGPIPE, a failure under pipefail); Check and subunit are linked statically by some distributions
for soname in libOpenCL.so.1 libclblast.so.1 libcheck.so.0 libsubunit.so.0; do
    path=$(ldconfig -p | awk -v n="$soname" '$1 == n && p == "" { p = $NF } END { print p }')
    if [ -n "$path" ]; then
        cp -L "$path" "$bundle/lib/"
    elif [ "$soname" = libOpenCL.so.1 ] || [ "$soname" = libclblast.so.1 ]; then
        echo "gpu-bundle.sh: $soname not found here; the GPU machine must have it" >&2
    fi
done
echo "gpu-bundle.sh: $(du -sh "$bundle" | cut -f1) in $bundle (lib: $(ls "$bundle/lib" | tr '\n' ' '))"
