#!/usr/bin/env bash
# kernel_lint.sh KERNEL_LINT CLANG: compiles every kernel program the library builds under its
# built-in tuning table and under the test suites' own tunings (tests/kernel_lint.c writes them)
# with CLANG as OpenCL C 1.2 for the SPIR target, syntax and semantics only, under -Wall -Wextra
# -Werror.  -Wno-unused-parameter: a kernel takes the arguments of every configuration its family
# has, and some tunings leave some unread.
# The library builds with -w (host/program.h, CASTLE_BUILD_QUIET), so this is where the kernels'
# warnings are seen.  Exit status 0 when every program compiles without a warning, else 1 with the
# first warnings of each failing program.  Each program also defines at most CASTLE_MAX_PROGRAM_KERNELS
# kernels (host/program.h: the context's kernel slots are sized by it), counted after preprocessing.
set -euo pipefail
lint=${1:?usage: kernel_lint.sh KERNEL_LINT CLANG}
clang=${2:?usage: kernel_lint.sh KERNEL_LINT CLANG}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$lint" "$work"
n=0 bad=0
while read -r id entry family class; do
    n=$((n + 1))
    # shellcheck disable=SC2046 # the options file holds one build option per word
    if ! "$clang" -x cl -cl-std=CL1.2 -target spir64 -Xclang -finclude-default-header -fsyntax-only \
        -Wall -Wextra -Wno-unused-parameter -Werror $(cat "$work/$id.opt") "$work/$id.cl" >"$work/$id.log" 2>&1; then
        bad=$((bad + 1))
        echo "FAIL $entry $family (head-dimension class $class): $(cat "$work/$id.opt")"
        grep -E 'error|warning' "$work/$id.log" | head -5
    fi
    # shellcheck disable=SC2046
    k=$("$clang" -x cl -cl-std=CL1.2 -target spir64 -Xclang -finclude-default-header -E -P $(cat "$work/$id.opt") \
        "$work/$id.cl" 2>/dev/null | grep -Eo '\b__kernel\b' | wc -l)
    if [ "$k" -gt "$(cat "$work/max_kernels")" ] || [ "$k" -lt 1 ]; then
        bad=$((bad + 1))
        echo "FAIL $entry $family (head-dimension class $class): $k kernels, at most $(cat "$work/max_kernels")" \
            "(CASTLE_MAX_PROGRAM_KERNELS)"
    fi
done <"$work/index"
[ "$n" -gt 0 ] || { echo "kernel_lint.sh: no programs" >&2; exit 1; }
echo "kernel_lint.sh: $((n - bad)) of $n programs compile without warnings ($("$clang" --version | head -1))"
[ "$bad" = 0 ]
