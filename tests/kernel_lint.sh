#!/usr/bin/env bash
# kernel_lint.sh KERNEL_LINT CLANG: compiles every kernel program the library builds under its
# built-in tuning table and under the test suites' own tunings (tests/kernel_lint.c writes them)
# with CLANG as OpenCL C 1.2 for the SPIR target, syntax and semantics only, under -Wall -Wextra
# -Werror.  -Wno-unused-parameter: a kernel takes the arguments of every configuration its family
# has, and some tunings leave some unread.
# The library builds with -w (host/program.h, CASTLE_BUILD_QUIET), so this is where the kernels'
# warnings are seen.  Exit status 0 when every program compiles without a warning, else 1 with the
# first warnings of each failing program.  Each program also defines at most CASTLE_MAX_PROGRAM_KERNELS
# kernels (host/program.h: the context's kernel slots are sized by it), counted after preprocessing,
# and reads dimension 1 only through BH_INDEX (cl/common.cl).
set -euo pipefail
lint=${1:?usage: kernel_lint.sh KERNEL_LINT CLANG}
clang=${2:?usage: kernel_lint.sh KERNEL_LINT CLANG}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$lint" "$work"
n=0 bad=0 max=$(cat "$work/max_kernels")
cl=(-x cl -cl-std=CL1.2 -target spir64 -Xclang -finclude-default-header) # as OpenCL C 1.2, one program
while read -r id entry family class; do
    n=$((n + 1))
    # shellcheck disable=SC2207 # the options file holds one build option per word
    opt=($(cat "$work/$id.opt"))
    ok=1
    if ! "$clang" "${cl[@]}" -fsyntax-only -Wall -Wextra -Wno-unused-parameter -Werror "${opt[@]}" "$work/$id.cl" \
        >"$work/$id.log" 2>&1; then
        ok=0
        echo "FAIL $entry $family (head-dimension class $class): ${opt[*]}"
        grep -E 'error|warning' "$work/$id.log" | head -5
    fi
    "$clang" "${cl[@]}" -E -P "${opt[@]}" "$work/$id.cl" >"$work/$id.i" 2>/dev/null || true
    k=$(grep -Eo '\b__kernel\b' "$work/$id.i" | wc -l)
    if [ "$k" -gt "$max" ] || [ "$k" -lt 1 ]; then
        ok=0
        echo "FAIL $entry $family (head-dimension class $class): $k kernels, at most $max (CASTLE_MAX_PROGRAM_KERNELS)"
    fi
    # dimension 1 only as BH_INDEX expands, (bh0 + (int)get_group_id(1))
    if sed -E 's/\(bh0 \+ \(int\)get_group_id\(1\)\)//g' "$work/$id.i" |
        grep -Eq 'get_(group_id|num_groups|global_id|global_offset) *\( *1 *\)'; then
        ok=0
        echo "FAIL $entry $family (head-dimension class $class): dimension 1 read other than as BH_INDEX" \
            "(host/launch.c cuts it into launches, each told its first batch entry x head, bh0)"
    fi
    bad=$((bad + 1 - ok))
done <"$work/index"
[ "$n" -gt 0 ] || { echo "kernel_lint.sh: no programs" >&2; exit 1; }
echo "kernel_lint.sh: $((n - bad)) of $n programs compile without warnings ($("$clang" --version | head -1))"
[ "$bad" = 0 ]
