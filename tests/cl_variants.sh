#!/usr/bin/env bash
# test_cl_variants: tools/cl-variants.sh runs castle-bench under the source as it is and under a copy
# whose define breaks the build (every barrier() call renamed to an undeclared function, so only the
# define can make it fail): the first runs and is tagged, the second fails and is listed, exit
# status 1; --keep leaves the copy with the defines on top of the file and the file after them;
# bad usage exits 2.  usage: cl_variants.sh SOURCE_DIR CASTLE_BENCH
set -u
root=$1 bench=$2 tool=$1/tools/cl-variants.sh
fail() { echo "test_cl_variants: $*" >&2; exit 1; }
out=$(bash "$tool" base 'broken:common.cl:barrier=castle_no_such_function' -- \
    "$bench" --ops decode --impls causal --t 64 --heads 1 --repeat 1 --gemm 0 2>&1)
rc=$?
[ "$rc" -eq 1 ] || fail "exit status $rc, expected 1:
$out"
grep -q '^op=decode impl=causal .* variant=base$' <<<"$out" || fail "no decode line of variant base:
$out"
! grep -q '^op=decode.* variant=broken$' <<<"$out" || fail "variant broken ran:
$out"
grep -q '^== variant broken (common.cl:barrier=castle_no_such_function)$' <<<"$out" || fail "no header of variant broken:
$out"
grep -q 'the command failed under: broken (exit status 1)$' <<<"$out" || fail "variant broken is not listed:
$out"
keep=$(mktemp -d)
trap 'rm -rf "$keep"' EXIT
bash "$tool" --keep "$keep" k:cache.cl:DLN=8,DRP=2 -- true >/dev/null || fail "--keep: the command failed"
[ "$(head -n 2 "$keep/k/cache.cl")" = $'#define DLN 8\n#define DRP 2' ] || fail "--keep: no defines on top of cache.cl"
tail -n +3 "$keep/k/cache.cl" | cmp -s - "$root/cl/cache.cl" || fail "--keep: cache.cl after the defines is not cl/cache.cl"
cmp -s "$keep/k/causal.cl" "$root/cl/causal.cl" || fail "--keep: causal.cl changed"
for args in "" "base" "base --" "-x base -- true" "x:nofile.cl:A=1 -- true" "x:../cl/cache.cl:A=1 -- true" \
    "x:cache.cl:1A=2 -- true" "x:cache.cl -- true" "x:cache.cl: -- true" "a a -- true" "a/b -- true" ". -- true" \
    ".. -- true"; do
    # shellcheck disable=SC2086 # word splitting wanted
    bash "$tool" $args >/dev/null 2>&1
    r=$?
    [ "$r" -eq 2 ] || fail "cl-variants.sh $args: exit status $r, expected 2"
done
echo "test_cl_variants: ok"
