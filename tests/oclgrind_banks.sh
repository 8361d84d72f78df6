#!/usr/bin/env bash
# oclgrind_banks.sh BUILD_DIR: tools/oclgrind-banks.sh, checked and then used.
# 1. Its counts for tests/banks_probe.c's five kernels, whose costs on 32 four-byte banks are known:
#    a request of 32 consecutive words takes 1 wavefront, of every other word 2, of words 32 apart 32,
#    of one word read by all (a broadcast) 1, of 32 consecutive float4s 4.
# 2. The GPU entry's kernels (castle-info --table's nvidia-gpu line), CASTLE's forward and backward
#    and the causal forward at L = 128 with 48 KiB of local memory: the forwards' local loads
#    conflict-free (ratio 1.000: their micro-tiles read k-major rows), the backward's within 1.1
#    times the conflict-free count (1.05 on its 2 x 4 tiles; 1.37 and 1.61 on the 1 x 4 tiles of
#    btm = 1, whose one-row fragments read row-major tiles), and the causal forward's stores, most of
#    them the transposing copies of cl/common.cl's copy_tile, within 1.5 times (1.43 with copy_tile's
#    16 x 2 blocks; 7.4 when a warp's transposing stores all fell in one bank, 2.3 with 8 x 4 blocks),
#    and castle_transpose_blocks's stores (copy_tile at the padded stride KS) conflict-free (2.0
#    under 8 x 4 blocks); the backward's stores off the diagonal within 1.5 times (1.45 with the
#    k-major copies of its tiles of D_j, G and dZ written a tile row pair per store, store_tile_t;
#    1.82 a lane at a time, store_column).
set -euo pipefail
build=$1
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export CASTLE_CACHE_DIR=off
unset CASTLE_DEVICE # under oclgrind the simulator is the only platform
bad() { echo "oclgrind_banks.sh: $*" >&2; exit 1; }

"$here/../tools/oclgrind-banks.sh" "$build/tests/banks_probe" 2>"$work/probe.txt" || { cat "$work/probe.txt"; bad "banks_probe failed"; }
expect() { # <kernel> <loads|stores> <requests> <wavefronts>
    grep -Eq "^banks: $1 +$2 +requests $3 wavefronts $4 " "$work/probe.txt" ||
        { cat "$work/probe.txt"; bad "$1 $2: expected $3 requests and $4 wavefronts"; }
}
for op in loads stores; do
    expect banks_linear $op 2 2
    expect banks_stride2 $op 2 4
    expect banks_stride32 $op 2 64
    expect banks_float4 $op 2 8
done
expect banks_broadcast loads 2 2
echo "banks_probe: the five patterns counted as expected"
# --rank total --top 2: each probe kernel's two instructions by their wavefronts, conflict-free ones
# too (the default rank lists only instructions above the conflict-free count: none of banks_linear's)
"$here/../tools/oclgrind-banks.sh" --rank total --top 2 "$build/tests/banks_probe" 2>"$work/total.txt" ||
    { cat "$work/total.txt"; bad "banks_probe under --rank total failed"; }
for kw in banks_linear:2:1.00 banks_stride32:64:32.00; do
    IFS=: read -r k w each <<<"$kw"
    n=$(awk -v k="$k" -v w="$w" -v e="$each" '$1 == "banks:" && $2 != "" && $2 != "total" { cur = $2 }
            $1 == "banks:" && $2 == "total" && cur == k && $3 == w && $6 == e { n++ } END { print n + 0 }' "$work/total.txt")
    [ "$n" = 2 ] || { cat "$work/total.txt"; bad "--rank total: $k's load and store not listed at $w wavefronts ($each each)"; }
done
grep -q "excess" "$work/total.txt" && bad "--rank total printed excess lines"
n=$(awk '$1 == "banks:" && $2 != "excess" { cur = $2 } $2 == "excess" && cur == "banks_linear" { n++ } END { print n + 0 }' "$work/probe.txt")
[ "$n" = 0 ] || bad "the default rank listed banks_linear's conflict-free instructions"
n=$(awk '$1 == "banks:" && $2 != "excess" { cur = $2 } $2 == "excess" && cur == "banks_stride32" { n++ } END { print n + 0 }' "$work/probe.txt")
[ "$n" = 2 ] || bad "the default rank did not list banks_stride32's two instructions"
for a in "--top 0" "--top x" "--rank most"; do
    # shellcheck disable=SC2086 # the option and its value
    if "$here/../tools/oclgrind-banks.sh" $a true 2>/dev/null; then bad "oclgrind-banks.sh $a was accepted"; fi
done
echo "banks_probe: --rank total and --top list the traffic, bad values refused"

entry=$("$build/tools/castle-info" --table | awk '$1 == "nvidia-gpu" { print $2 }')
[ -n "$entry" ] || bad "castle-info --table has no nvidia-gpu entry"
CASTLE_TUNING=$entry,fold=0 "$here/../tools/oclgrind-banks.sh" "$build/tools/castle-bench" --ops forward,backward \
    --impls castle,causal --L 128 --batch 1 --heads 1 --repeat 1 --gemm 0 >/dev/null 2>"$work/gpu.txt" ||
    { cat "$work/gpu.txt"; bad "castle-bench under Oclgrind failed"; }
grep '^banks: castle' "$work/gpu.txt"
ratio() { # <kernel> <loads|stores>
    awk -v k="$1" -v op="$2" '$1 == "banks:" && $2 == k && $3 == op { print $NF; found = 1 } END { if (!found) print "none" }' "$work/gpu.txt"
}
check() { # <kernel> <loads|stores> <at most>
    local r
    r=$(ratio "$1" "$2")
    [ "$r" != none ] || bad "no count for $1's $2"
    awk -v r="$r" -v m="$3" 'BEGIN { exit !(r <= m) }' || bad "$1's $2: $r times the conflict-free wavefronts (at most $3)"
}
check castle_forward_block loads 1.0
check castle_causal_forward loads 1.0
check castle_causal_forward stores 1.5
check castle_transpose_blocks stores 1.0
check castle_backward_off loads 1.1
check castle_backward_block loads 1.1
check castle_backward_off stores 1.5
echo "oclgrind_banks.sh: passed"
