#!/usr/bin/env bash
# Runs the kernels under Oclgrind, an OpenCL device simulator that reports data races, out-of-bounds,
# misaligned loads (the GPU mappings' typed float2 / float4 fragment loads and their float4 accesses
# to global memory, cl/common.cl; the GPU entry also at d = 18, whose rows are not aligned) and invalid
# API use: castle-info's forward self-test (three shapes against the fp64 reference,
# guard regions included), a forward + backward through castle-run, folded and per-diagonal, under
# the CPU mapping (with its staging order, stage=1), its backward on fewer work-items than block
# rows (bthreads < block), 4 x 4 scalar register micro-tiles (tm=4 tn=4 vector=1) and the built-in
# GPU entry (with 48 KiB of local memory; both stage=2; the backward also on 1 x 4 tiles, btm=1), a
# prefill + decode through the UQ-KV cache (on each), a prefill of ragged prompts (the cache's gated
# U pass, each), and the causal baseline's four operations (its backward also on the 4 x 4 tiles, all four on
# the GPU entry), and the causal kernels and the U pass in pieces under a small CASTLE_LOOP_LIMIT.
# Oclgrind's device has 32 KiB of local memory, so this also runs the library's shrunk tuning.
# usage: oclgrind.sh <build-dir>
set -euo pipefail
build=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export CASTLE_CACHE_DIR=off
unset CASTLE_DEVICE # under oclgrind the simulator is the only platform: its device is 0:0
log=$work/oclgrind.log
og() {
    local rc=0
    oclgrind --data-races --check-api --log "$log.part" "$@" || rc=$?
    cat "$log.part" >>"$log"
    return $rc
}
report() { # to stderr: also from inside $(...)
    {
        [ -s "$log" ] && { head -c 20000 "$log"; echo; echo "Oclgrind reported the problems above"; }
        echo "$1"
    } >&2
    exit 1
}
og "$build/tools/castle-info" >"$work/info.txt" || true
grep -q "self-test: PASS" "$work/info.txt" || { cat "$work/info.txt"; report "castle-info self-test failed under Oclgrind"; }
"$build/tools/castle-run" random --shape 2,2,70,16 --out "$work/in" >/dev/null
# backward_folds <name> <tuning> <runner> <what>: castle-run backward per diagonal (fold=0) and folded
# (fold=8) under the tuning (empty: the library's), run by og or og48, outputs in $work/<name>0 and
# <name>8; they must agree.  <what> names the mapping in the messages.
backward_folds() {
    local name=$1 tuning=$2 runner=$3 what=$4 fold
    for fold in 0 8; do
        CASTLE_TUNING=${tuning:+$tuning,}fold=$fold $runner "$build/tools/castle-run" backward --in "$work/in" \
            --out "$work/$name$fold" --window 5 || report "castle-run backward${what:+ $what} (fold=$fold) failed under Oclgrind"
    done
    cmp -s "$work/${name}0/dqu.npy" "$work/${name}8/dqu.npy" ||
        report "folded and per-diagonal backward differ under Oclgrind${what:+ ($what)}"
}
backward_folds out "" og "" # the library's own tuning for this device
# the GPU mapping (4 x 4 register micro-tiles, scalar columns) at a block that fits 32 KiB, folded and not
gpu=block=16,threads=16,dchunk=16,vector=1,tm=4,tn=4
backward_folds gpu "$gpu" og "under the GPU mapping"
# the CPU entries' backward shape at a block that fits 32 KiB: fewer work-items than block rows
# (bthreads=8 < block=16, each work-item two micro-tiles and two rows of Delta), row-major broadcast
# operands (vector=8), folded and not
few=block=16,threads=16,dchunk=16,vector=8,tm=2,tn=1,bthreads=8
backward_folds few "$few" og "on bthreads < block"
# the UQ-KV cache: prefill 30 tokens, decode the rest one and three at a time
for chunk in 1 3; do
    og "$build/tools/castle-run" decode --in "$work/in" --out "$work/dec$chunk" --prompt 30 --chunk $chunk --window 5 ||
        report "castle-run decode (chunk $chunk) failed under Oclgrind"
done
# decode on the GPU mapping's shape: 128 work-items, 8 lanes to a cache row, two rows per team per pass
CASTLE_TUNING=block=16,threads=128,dchunk=16,vector=1,tm=1,tn=1 og "$build/tools/castle-run" decode --in "$work/in" \
    --out "$work/decgpu" --prompt 30 --chunk 3 --window 5 || report "castle-run decode (GPU mapping) failed under Oclgrind"
# the built-in GPU entry itself (castle-info --table's nvidia-gpu, which AMD, Intel and the default
# share), with the 48 KiB of local memory it needs: 2 x 4 tiles of float4 columns in the block
# kernels (folded and per-diagonal), the team decode (decode=2) on float4 columns (and both at d = 18,
# whose rows are not 16-byte aligned), the causal baseline
entry=$("$build/tools/castle-info" --table | awk -F'\t' '$1 == "nvidia-gpu" { print $2 }')
[ -n "$entry" ] || report "castle-info --table lists no nvidia-gpu entry"
og48() { og --local-mem-size 49152 "$@"; }
# its backward on 2 x 4 tiles (btm=2): 32 x 32 slabs of the d-wide products, wider than dchunk (and
# than d = 16); then on the 1 x 4 tiles the H200 timed (btm=1), dchunk's 32 x 16 slabs
backward_folds ent "$entry" og48 "under the GPU entry"
backward_folds ent1 "$entry,btm=1" og48 "under the GPU entry with btm=1"
CASTLE_TUNING=$entry og48 "$build/tools/castle-run" decode --in "$work/in" --out "$work/decent" --prompt 30 --chunk 3 \
    --window 5 || report "castle-run decode (GPU entry) failed under Oclgrind"
# rows that are not 16-byte aligned (d = 18): the GPU mappings' global float4 accesses
# (cl/common.cl's gload4) must take their float-by-float path there, or Oclgrind reports them
# a tuning whose decode kernel needs more local memory than the device has (8 KiB here; the host's
# formulas count only the block kernels'): exit 1 with the kernel named, not CL_OUT_OF_RESOURCES at
# the enqueue
rc=0
err=$(CASTLE_TUNING=block=8,threads=8,dchunk=4,vector=4,tm=1,tn=1,decode=2,bthreads=16,btm=1,fthreads=16,fdchunk=8 \
    oclgrind --local-mem-size 8192 "$build/tools/castle-run" decode --in "$work/in" --out "$work/declm" --prompt 11 \
    2>&1 >/dev/null) || rc=$?
[ "$rc" = 1 ] && grep -q 'CASTLE_ERR_BAD_TUNING: kernel castle_cache_decode_attend needs [0-9]* bytes of local memory' <<<"$err" ||
    report "a decode kernel larger than the device's local memory: exit status $rc, expected 1 naming it: $err"
"$build/tools/castle-run" random --shape 1,2,21,18 --out "$work/in18" >/dev/null
CASTLE_TUNING=$entry og48 "$build/tools/castle-run" backward --in "$work/in18" --out "$work/ent18" ||
    report "castle-run backward at d = 18 (GPU entry) failed under Oclgrind"
CASTLE_TUNING=$entry og48 "$build/tools/castle-run" decode --in "$work/in18" --out "$work/dec18" --prompt 9 --chunk 3 ||
    report "castle-run decode at d = 18 (GPU entry) failed under Oclgrind"
CASTLE_TUNING=$entry og48 "$build/tools/castle-bench" --impls causal --L 40 --t 40 --heads 2 --repeat 1 --gemm 0 \
    >/dev/null || report "castle-bench (causal, GPU entry) failed under Oclgrind"
# prompts of different lengths: the cache's gated U pass (castle_cache_prefill_u), on both mappings
for t in "" "$gpu"; do
    CASTLE_TUNING=$t og "$build/tools/castle-bench" --ops prefill --ragged --impls castle,swl --L 40 --batch 2 \
        --heads 2 --window 5 --repeat 1 --gemm 0 >/dev/null || report "castle-bench --ragged (tuning '$t') failed under Oclgrind"
done
CASTLE_TUNING=$entry og48 "$build/tools/castle-bench" --ops prefill --ragged --impls castle,swl --L 40 --batch 2 \
    --heads 2 --window 5 --repeat 1 --gemm 0 >/dev/null || report "castle-bench --ragged (GPU entry) failed under Oclgrind"
# the causal baseline: forward, backward, prefill, decode
og "$build/tools/castle-bench" --impls causal --L 40 --t 40 --heads 2 --repeat 1 --gemm 0 >/dev/null ||
    report "castle-bench (causal) failed under Oclgrind"
# its backward on the GPU mapping: the score operands staged once per work-group (d = 20 fits), ragged d
CASTLE_TUNING=$gpu og "$build/tools/castle-bench" --impls causal --ops backward --L 40 --d 20 --heads 2 --repeat 1 \
    --gemm 0 >/dev/null || report "castle-bench (causal backward, GPU mapping) failed under Oclgrind"
# the loops in pieces (host/loops.c), as llvmpipe runs them: under a small CASTLE_LOOP_LIMIT the causal
# backward's two sides in launches over ranges of their loops (1000 at d = 16: ranges of 2 query
# blocks on the key side, 14 key blocks on the query side, of 20), adding to the sums, the causal
# forward's keys split 3 ways and merged (500), and the ragged prefill's U pass in ranges of 2 blocks
CASTLE_LOOP_LIMIT=1000 CASTLE_TUNING=$gpu og "$build/tools/castle-bench" --impls causal --ops backward,prefill --L 320 \
    --d 16 --heads 1 --repeat 1 --gemm 0 >/dev/null || report "castle-bench (causal, loops in pieces) failed under Oclgrind"
CASTLE_LOOP_LIMIT=500 CASTLE_TUNING=$gpu og "$build/tools/castle-bench" --impls causal --ops forward --L 320 --d 16 \
    --heads 1 --repeat 1 --gemm 0 >/dev/null || report "castle-bench (causal forward split) failed under Oclgrind"
CASTLE_LOOP_LIMIT=1000 CASTLE_TUNING=$gpu og "$build/tools/castle-bench" --impls castle,swl --ops prefill --ragged --L 200 \
    --d 16 --batch 2 --heads 1 --window 5 --repeat 1 --gemm 0 >/dev/null ||
    report "castle-bench --ragged (U pass in pieces) failed under Oclgrind"
[ -s "$log" ] && report "Oclgrind found problems"
# The shape of the GPU mappings, counted (deterministic, any machine): local-memory load instructions
# (load local, vloadN from __local) per FMA, an FMA on an N-wide vector (llvm.fmuladd.vNf32) counted
# N times.  Every block kernel under the GPU entry issues at most 0.5 (its 1 x 4 and 2 x 4 tiles of
# float4 columns need 0.5 and 0.25 for a product alone, less where two products share an operand:
# common.cl's mt_product_2a and _2b), and under the 4 x 4 scalar tiles at most 0.25 (their products
# need 0.125; the former one-row mapping about 2).
counts() { # <tuning> <oclgrind options...>: per kernel, local loads per FMA over the folded and unfolded runs
    local t=$1 fold
    shift
    for fold in 0 8; do
        CASTLE_TUNING=$t,fold=$fold oclgrind --inst-counts "$@" "$build/tools/castle-bench" --ops forward,backward,prefill \
            --ragged --impls castle,causal --L 48 --batch 2 --heads 1 --repeat 1 --gemm 0 >"$work/counts$fold.txt" 2>&1 ||
            report "castle-bench under oclgrind --inst-counts (tuning $t, fold=$fold) failed"
    done
    cat "$work/counts0.txt" "$work/counts8.txt" | awk '
        /^Instructions executed for kernel / { k = $5; gsub(/[^A-Za-z0-9_]/, "", k); next }
        k != "" && $2 == "-" && ($3 == "load" && $4 == "local" || $3 ~ /^call$/ && $4 ~ /^_Z[0-9]+vload[0-9]+mPU3AS3K/) { ld[k] += $1 }
        k != "" && $2 == "-" && $4 ~ /^llvm\.fmuladd/ {
            w = 1; s = $4
            if (s ~ /\.v[0-9]+f32/) { sub(/.*\.v/, "", s); sub(/f32.*/, "", s); w = s + 0 }
            fma[k] += $1 * w }
        END { for (k in fma) if (fma[k] > 0) printf "%s %.4f\n", k, ld[k] / fma[k] }' | sort
}
hot="castle_forward_block castle_forward_fold castle_backward_block castle_backward_off castle_backward_fold
    castle_causal_forward castle_causal_backward_kv castle_causal_backward_q castle_cache_prefill_u"
limit() { # <ratios> <tuning> <most>: every hot kernel counted, at most <most> local loads per FMA
    local k r
    for k in $hot; do
        r=$(awk -v k="$k" '$1 == k { print $2 }' <<<"$1")
        [ -n "$r" ] || report "no instruction counts for $k under $2"
        awk -v r="$r" -v m="$3" 'BEGIN { exit !(r <= m) }' || report "$k: $r local-memory loads per FMA under $2 (at most $3)"
    done
}
ratios=$(counts "$entry" --local-mem-size 49152)
echo "local-memory loads per FMA, GPU entry $entry:"
echo "$ratios"
limit "$ratios" "$entry" 0.5
ratios=$(counts "$gpu")
echo "local-memory loads per FMA, tuning $gpu:"
echo "$ratios"
limit "$ratios" "$gpu" 0.25
echo "oclgrind: no data races, out-of-bounds accesses or API errors (CPU mapping, 4 x 4 tiles, the GPU entry); self-test PASS; every block kernel at most 0.5 local loads per FMA under the GPU entry and 0.25 on 4 x 4 tiles"
