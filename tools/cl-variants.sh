#!/usr/bin/env bash
# cl-variants.sh: runs one command under several variants of the kernels' source, each a copy of
# cl/ with #define lines put at the top of the files named, which the library reads through
# CASTLE_CL_DIR (host/program.c; the binary cache keys on the source, so each variant builds once).
# It is how the decode kernels' shapes were chosen on a GPU (docs/performance.md, "Decode shapes"):
# a kernel's compile-time constants written `#ifndef X / #define X ... / #endif` may be predefined.
#
# usage: tools/cl-variants.sh [--keep DIR] VARIANT... -- COMMAND [ARG...]
#   VARIANT    NAME, or NAME:FILE:DEFS[:FILE:DEFS...]: FILE one of cl/'s files (cache.cl), DEFS a
#              comma list of MACRO=VALUE (DLN=8,DRP=2); a bare NAME runs the source as it is
#   --keep DIR write the copies under DIR/NAME and keep them (default: a temporary folder)
# Runs COMMAND once per variant, in the order given, with CASTLE_CL_DIR set to its copy; prints
# "== variant NAME (DEFS)" before its output and appends " variant=NAME" to each line of it (so
# castle-bench's lines can be sorted and compared).  The copies start from $CASTLE_CL_DIR where it
# is set, else from the cl/ beside this script.  Exit status: 0 when the command succeeded under
# every variant, 1 when it failed under one or more (listed at the end), 2 bad usage.
# Example (the decode shapes on the default device):
#   tools/cl-variants.sh base w8:cache.cl:DLN=8 c4:causal.cl:CD_LN=4,CD_RP=2 -- \
#       build/tools/castle-bench --ops decode --impls castle,causal --t 32768 --batch 2 --heads 16
set -uo pipefail
usage() { # [status]: 0 to stdout (--help), else to stderr
    local status=${1:-2}
    sed -n '8,16p' "$0" | sed 's/^# \{0,1\}//' >&$((status == 0 ? 1 : 2))
    exit "$status"
}
bad() { echo "cl-variants.sh: $*" >&2; exit 2; }
src=${CASTLE_CL_DIR:-$(cd "$(dirname "$0")/../cl" && pwd)}
keep=
variants=()
while [ $# -gt 0 ]; do
    case $1 in
    -h | --help) usage 0 ;;
    --keep) [ $# -ge 2 ] || bad "--keep needs a folder"; keep=$2; shift 2 ;;
    --) shift; break ;;
    -*) bad "unknown option $1" ;;
    *) variants+=("$1"); shift ;;
    esac
done
[ ${#variants[@]} -gt 0 ] || { echo "cl-variants.sh: no variant given" >&2; usage; }
[ $# -gt 0 ] || { echo "cl-variants.sh: no command after --" >&2; usage; }
[ -f "$src/common.cl" ] || bad "no kernel source in $src"
if [ -n "$keep" ]; then
    mkdir -p "$keep" || bad "cannot create $keep"
    work=$keep
else
    work=$(mktemp -d) || exit 1
    trap 'rm -rf "$work"' EXIT
fi

# Check every variant before running any: names, files, MACRO=VALUE lists.
declare -A seen=()
for v in "${variants[@]}"; do
    IFS=: read -r -a part <<<"$v"
    name=${part[0]}
    [[ $name =~ ^[A-Za-z0-9_.-]+$ && $name != . && $name != .. ]] || bad "variant name '$name' (letters, digits, _ . - only; not . or ..)"
    [ -z "${seen[$name]:-}" ] || bad "variant $name given twice"
    seen[$name]=1
    [ $(( ${#part[@]} % 2 )) -eq 1 ] || bad "variant '$v': give NAME:FILE:DEFS[:FILE:DEFS...]"
    for ((i = 1; i < ${#part[@]}; i += 2)); do
        file=${part[i]} defs=${part[i + 1]}
        [[ $file != */* && -f $src/$file ]] || bad "variant $name: no file $file in $src"
        IFS=, read -r -a def <<<"$defs"
        [ ${#def[@]} -gt 0 ] || bad "variant $name: no MACRO=VALUE for $file"
        for d in "${def[@]}"; do
            [[ $d =~ ^[A-Za-z_][A-Za-z0-9_]*=[^[:space:]]*$ ]] || bad "variant $name: '$d' is not MACRO=VALUE"
        done
    done
done

failed=()
for v in "${variants[@]}"; do
    IFS=: read -r -a part <<<"$v"
    name=${part[0]} dir=$work/${part[0]}
    if ! { rm -rf "$dir" && mkdir -p "$dir" && cp "$src"/* "$dir"/; }; then
        echo "cl-variants.sh: cannot copy $src to $dir" >&2
        exit 1
    fi
    for ((i = 1; i < ${#part[@]}; i += 2)); do
        file=${part[i]}
        IFS=, read -r -a def <<<"${part[i + 1]}"
        { for d in "${def[@]}"; do echo "#define ${d%%=*} ${d#*=}"; done; cat "$src/$file"; } >"$dir/$file"
    done
    defs=${v#"$name"}
    defs=${defs#:}
    echo "== variant $name (${defs:-the source as it is})"
    CASTLE_CL_DIR=$dir "$@" 2>&1 | sed "s/\$/ variant=$name/"
    rc=${PIPESTATUS[0]}
    [ "$rc" -eq 0 ] || failed+=("$name (exit status $rc)")
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "cl-variants.sh: the command failed under: ${failed[*]}" >&2
    exit 1
fi
