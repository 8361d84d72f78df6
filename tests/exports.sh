#!/usr/bin/env bash
# Every symbol the shared library exports is defined in an object built from a file under lib/ (the
# API layer); host/ and the embedded kernels export nothing.  Every export is a castle_* name of the
# public header, none is an internal castle__* one.
# usage: exports.sh <libcastle.so> <object files of castle_objects...>
set -euo pipefail
lib=$1
shift
exports=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[A-Za-z]$/ {print $3}' | sort -u)
[ -n "$exports" ] || { echo "no exported symbols in $lib"; exit 1; }
# symbol -> source file, from the objects: .../castle_objects.dir/<source path>.o
map=$(for o in "$@"; do
    src=${o##*castle_objects.dir/}
    src=${src%.o}
    nm --defined-only --extern-only "$o" | awk -v f="$src" 'NF == 3 {print $3, f}'
done | sort -u)
fail=0
n=0
for s in $exports; do
    n=$((n + 1))
    file=$(awk -v s="$s" '$1 == s {print $2}' <<<"$map")
    case $file in
    lib/*.c) ;;
    "") echo "exported $s: defined in no object of castle_objects"; fail=1 ;;
    *) echo "exported $s: defined in $file, not under lib/"; fail=1 ;;
    esac
    case $s in
    castle__*) echo "exported $s: an internal name"; fail=1 ;;
    castle_*) ;;
    *) echo "exported $s: not a castle_ name"; fail=1 ;;
    esac
done
[ "$fail" = 0 ] || exit 1
echo "exports: all $n exported symbols are defined in lib/"
