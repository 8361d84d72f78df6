#!/usr/bin/env bash
# test_backward_off: the backward launches castle_backward_off (the pairs off the diagonal, k > 0) and
# castle_backward_block (k = 0); a program without castle_backward_off (a cl/ of an earlier revision,
# through CASTLE_CL_DIR) runs every anti-diagonal on castle_backward_block, with bitwise the same
# gradients (the same operations; only whether the diagonal test is a constant differs).
# usage: backward_off.sh SOURCE_DIR CASTLE_RUN CASTLE_BENCH
set -u
root=$1 run=$2 bench=$3
fail() { echo "test_backward_off: $*" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp -r "$root/cl" "$tmp/without"
sed -i 's/^void castle_backward_off(/void castle_backward_off_absent(/' "$tmp/without/backward.cl"
grep -q '^void castle_backward_off_absent(' "$tmp/without/backward.cl" || fail "cl/backward.cl has no castle_backward_off"
export CASTLE_TUNING=fold=0 CASTLE_CACHE_DIR=$tmp/kc # one launch per anti-diagonal
"$run" random --shape 1,2,150,33 --out "$tmp/in" --seed 7 >/dev/null || fail "castle-run random failed"
for set in with without; do
    dir=$root/cl
    [ "$set" = without ] && dir=$tmp/without
    CASTLE_CL_DIR=$dir "$run" backward --in "$tmp/in" --out "$tmp/$set" --window 0 >/dev/null 2>&1 ||
        fail "castle-run backward failed under the cl/ $set castle_backward_off"
    prof=$(CASTLE_CL_DIR=$dir "$bench" --ops backward --impls castle --L 150 --heads 1 --repeat 1 --gemm 0 \
        --profile 2>/dev/null) || fail "castle-bench failed under the cl/ $set castle_backward_off"
    n=$(grep -c 'kernel=castle_backward_off ' <<<"$prof")
    if [ "$set" = with ]; then
        [ "$n" -eq 1 ] || fail "castle_backward_off was not launched:
$prof"
    else
        [ "$n" -eq 0 ] || fail "castle_backward_off launched from a program without it"
    fi
    grep -q 'kernel=castle_backward_block ' <<<"$prof" || fail "castle_backward_block was not launched ($set):
$prof"
done
for g in dqu dku dvu dqc dkc dvc; do
    cmp -s "$tmp/with/$g.npy" "$tmp/without/$g.npy" || fail "$g differs without castle_backward_off"
done
echo "test_backward_off: ok"
