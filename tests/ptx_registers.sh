#!/usr/bin/env bash
# The built-in GPU entry's hot kernels keep a work-item's micro-tiles and accumulators in registers:
# no stack frame in the PTX that clang's NVPTX back end makes of them, as NVIDIA's ptxas reports it
# for sm_90 (tools/ptx-report.sh), at head-dimension classes 64 and 128.  A private array indexed at
# run time (a loop over micro-tiles or slabs left rolled) shows up as a stack frame; so does a value
# spilled (ptx-report.sh's stack column is ptxas's frame; its spill column the spill stores).  The
# folded kernels are among them (the backward's block pair is a call, cl/common.cl's FOLD_PAIR:
# inlined, it took 255 registers, a 32-byte frame and 48 bytes of spill stores).  Class 256 of
# the causal backward's key side (two d-wide accumulators per work-item) is left out: it does not
# fit.  And their loads from local memory are vector loads, and those that read tiles or cache rows
# from global memory have a float4 path for them (see below); under a cap of 128 registers the block
# kernels spill nothing.  Then a tuning's own register caps (regs, fregs), 4 x 4 tiles (no frame
# either), and --from-cache on a cache entry of the library's format (host/bincache.c) that holds
# PTX, beside one that does not, and on one whose functions call each other.
# usage: ptx_registers.sh <build-dir>
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
hot=castle_forward_block,castle_forward_fold,castle_backward_block,castle_backward_off,castle_backward_fold
hot=$hot,castle_causal_forward
hot=$hot,castle_causal_backward_q,castle_causal_backward_kv,castle_causal_decode,castle_cache_decode_attend
hot=$hot,castle_cache_prefill_u
value_of() { # <family> <kernel> <column> <report>: the value of that column (regs, smem, ...) on the kernel's line
    awk -v f="$1" -v k="$2" -v c="$3" '$1 == f && $2 == k { for (i = 3; i <= NF; ++i) if (index($i, c "=") == 1) {
                                                              print substr($i, length(c) + 2); exit } }' <<<"$4"
}
widths() { # <kernel> <lds|ldg> <report>: the kernel's S V2 V4 counts of that column
    awk -v k="$1" -v f="$2" '$2 == k { for (i = 1; i <= NF; ++i) if (index($i, f "=") == 1) {
                                           split($i, a, /[=\/]/); print a[2], a[3], a[4]; exit } }' <<<"$3"
}
for class in 64 128; do
    echo "== head-dimension class $class =="
    want=$hot
    [ "$class" = 128 ] && want=${hot/,castle_causal_backward_kv/} # its two accumulators just overflow 255 registers
    out=$(bash "$here/../tools/ptx-report.sh" "$1" --class "$class" --no-stack "$want")
    echo "$out"
    # Every hot kernel loads at least 2/3 of the floats it reads from local memory in float2 or float4
    # loads (lds=S/V2/V4): the fragments' vector loads were not split into scalar ones, which they are
    # where the compiler cannot prove their alignment (cl/common.cl, LM_ALIGNED; 0% before it).
    for k in ${hot//,/ }; do
        read -r s v2 v4 <<<"$(widths "$k" lds "$out")"
        w=$((2 * ${v2:-0} + 4 * ${v4:-0}))
        echo "$k: $w of $((${s:-0} + w)) floats from local memory in vector loads"
        [ -n "$s" ] && [ $((s + w)) -gt 0 ] && [ $((3 * w)) -ge $((2 * (s + w))) ] ||
            { echo "class $class: $k loads less than 2/3 of its local-memory floats in vector loads"; exit 1; }
    done
    # The kernels that stage tiles or stream cache rows from global memory have float4 global loads
    # (ldg=S/V2/V4, V4 > 0): cl/common.cl's gload4 for 16-byte aligned rows.  A typed load and a
    # vload4 of the same address merged into one load of a float's alignment would leave none.
    for k in castle_forward_block castle_backward_block castle_causal_forward castle_causal_backward_q \
        castle_causal_backward_kv castle_cache_decode_attend castle_cache_prefill_u; do
        read -r _ _ v4 <<<"$(widths "$k" ldg "$out")"
        echo "$k: ${v4:-0} float4 global loads"
        [ "${v4:-0}" -gt 0 ] || { echo "class $class: $k has no float4 loads from global memory"; exit 1; }
    done
    # A program for a class of heads sizes the causal kernels' local memory for that class
    # (local_memory.h's _CLASS forms, the DACC strides of the causal decode).  At class 64 (bytes,
    # with the sizes for every head they had before): the forward's own program (fdchunk 32) 31104
    # (43392: five groups on an H200 SM's 228 KiB, seven now), the backward's query and key sides
    # 37120 and 41216 (43136, 47232), the decode 6272 (21632)
    if [ "$class" = 64 ]; then
        for want in causal_forward:castle_causal_forward:31104 causal:castle_causal_backward_q:37120 \
            causal:castle_causal_backward_kv:41216 causal:castle_causal_decode:6272; do
            IFS=: read -r fam k most <<<"$want"
            sm=$(value_of "$fam" "$k" smem "$out")
            echo "$k ($fam): ${sm:-no} bytes of local memory"
            [ -n "$sm" ] && [ "$sm" -le "$most" ] ||
                { echo "class 64: $k takes ${sm:-no} bytes of local memory, more than $most"; exit 1; }
        done
    fi
done
# NVIDIA's OpenCL compiler capped the forward and the backward of the GPU entry at 128 registers on
# an H200 (four work-groups of 128 work-items per SM, as many as their local memory allows; it spilled
# 4 bytes of the backward before its sums became one chain per output, cl/common.cl's mt_product).
# Under ptxas's cap of 128 the block kernels of the forward, the backward's pairs off the diagonal
# (castle_backward_off: every launch but one of a backward), the causal forward and the causal
# backward's query side still have no stack frame: nothing spilled.  The backward's kernel of any
# pair (castle_backward_block, launched for the diagonal k = 0 alone) spills under the entry's 2 x 4
# tiles (btm = 2) and not under 1 x 4 (btm = 1), where castle_backward_off fits too.
echo "== at most 128 registers =="
capped=castle_forward_block,castle_backward_off,castle_causal_forward,castle_causal_backward_q
bash "$here/../tools/ptx-report.sh" "$1" --max-regs 128 --no-stack "$capped"
entry=$("$1/tools/castle-info" --table | awk -F'\t' '$1 == "nvidia-gpu" { print $2 }')
# the entry with other values of some keys, written out whole (independent of ptx-report.sh's own
# --tuning merge, which the 4 x 4 section below checks against it)
set_keys() { # <tuning> <key=value>...: the tuning with those values
    local t=$1 kv
    shift
    for kv in "$@"; do t=$(sed -E "s/(^|,)${kv%%=*}=[0-9]+/\1$kv/" <<<"$t"); done
    echo "$t"
}
echo "== at most 128 registers, btm = 1 =="
bash "$here/../tools/ptx-report.sh" "$1" --tuning "$(set_keys "$entry" btm=1)" --max-regs 128 \
    --no-stack castle_backward_block,castle_backward_off
# A tuning's own register caps (the library's -cl-nv-maxrregcount): fregs for the forwards, regs for
# the rest, as ptxas's -maxrregcount.  At fregs = 96 the forwards still spill nothing (docs/performance.md).
echo "== the tuning's caps: fregs = 96, regs = 128 =="
out=$(bash "$here/../tools/ptx-report.sh" "$1" --tuning "$(set_keys "$entry" regs=128 fregs=96)" \
    --no-stack castle_forward_block,castle_causal_forward,castle_backward_off)
echo "$out"
for fk in "forward castle_forward_block 96" "causal_forward castle_causal_forward 96" "backward castle_backward_off 128"; do
    read -r f k cap <<<"$fk"
    r=$(value_of "$f" "$k" regs "$out")
    [ -n "$r" ] && [ "$r" -le "$cap" ] || { echo "$f $k: ${r:-no} registers under a cap of $cap"; exit 1; }
done
# 4 x 4 tiles (tm = 4 for the forwards and the cache, btm = 4 for the backward; fewer work-items to
# match): a tile's loop over its rows (cl/common.cl's mt_outer) once began at a row the caller
# passes, which clang unrolled by two at run time before the caller's constant reached it; under
# TM = 4 that left every accumulator array in a stack frame (the forward's 272 bytes, the
# backward's 608, the causal forward's 208, the prefill pass's 208; none under TM = 2).
# At class 64; the causal backward's key side spills there (255 registers).
echo "== 4 x 4 tiles =="
t44=$(set_keys "$entry" tm=4 threads=32 fthreads=64 btm=4 bthreads=64)
case $t44 in *,tm=4,*bthreads=64,btm=4,*fthreads=64,*) ;; *) echo "no 4 x 4 tuning made of $entry: $t44"; exit 1 ;; esac
out44=$(bash "$here/../tools/ptx-report.sh" "$1" --tuning "$t44" --no-stack \
    castle_forward_block,castle_forward_fold,castle_backward_block,castle_backward_off,castle_backward_fold,castle_causal_forward,castle_causal_backward_q,castle_cache_prefill_u) ||
    { echo "$out44"; exit 1; }
echo "$out44"
# --tuning's keys go over the nvidia-gpu entry, a later key winning (CASTLE_TUNING's rule): the same
# tuning given as its changes alone, and as the whole entry followed by them, reports as above (the
# report once took the first of two values of a key, so the second form reported the entry); a key
# that is no tuning parameter, or a value that is not decimal, is refused (exit status 2)
echo "== --tuning over the nvidia-gpu entry =="
for form in tm=4,threads=32,fthreads=64,btm=4,bthreads=64 "$entry,tm=4,threads=32,fthreads=64,btm=4,bthreads=64"; do
    [ "$(bash "$here/../tools/ptx-report.sh" "$1" --tuning "$form")" = "$out44" ] ||
        { echo "--tuning $form does not report as $t44"; exit 1; }
done
for bad in blok=32 tm=x "tm=4,,tn"; do
    rc=0
    bash "$here/../tools/ptx-report.sh" "$1" --tuning "$bad" >/dev/null 2>&1 || rc=$?
    [ "$rc" = 2 ] || { echo "--tuning $bad: exit status $rc, expected 2"; exit 1; }
done
echo "== --from-cache =="
cache=$(mktemp -d)
trap 'rm -rf "$cache"' EXIT
entry() { # <file> <payload file>: the library's header (magic, key hash, size, checksum), then the payload
    { printf 'CASTLEBIN2\0'; head -c 24 /dev/zero; cat "$2"; printf '\0'; } >"$1"
}
cat >"$cache/probe.ptx" <<'PTX'
.version 7.8
.target sm_90
.address_size 64
.visible .entry castle_probe(.param .u64 out)
{
    .reg .b64 %rd<2>;
    .reg .b32 %r<2>;
    ld.param.u64 %rd1, [out];
    cvta.to.global.u64 %rd1, %rd1;
    mov.u32 %r1, 7;
    st.global.u32 [%rd1], %r1;
    ret;
}
PTX
entry "$cache/0123456789abcdef.bin" "$cache/probe.ptx"
head -c 64 /dev/urandom >"$cache/other.payload"
entry "$cache/fedcba9876543210.bin" "$cache/other.payload"
out=$(bash "$here/../tools/ptx-report.sh" --from-cache "$cache" --no-stack castle_probe)
echo "$out"
grep -qE '^0123456789ab +castle_probe +stack=0 +spill=0 +regs=[0-9]+ +fma=0 lds=0/0/0 ldg=0/0/0 smem=0$' <<<"$out" ||
    { echo "--from-cache: no line for the PTX entry"; exit 1; }
[ "$(wc -l <<<"$out")" = 1 ] || { echo "--from-cache: a line for the entry that is not PTX"; exit 1; }
# A private array indexed at run time: a 64-byte stack frame and no spill (ptxas -v: "64 bytes stack
# frame, 0 bytes spill stores"); stack= is the frame, spill= the spill stores, and --no-stack refuses
# it (the report once took the spill stores for the frame, which hid such arrays).
rm "$cache"/*.bin
cat >"$cache/stack.ptx" <<'PTX'
.version 7.8
.target sm_90
.address_size 64
.visible .entry castle_probe_stack(.param .u64 out, .param .u32 i)
{
    .local .align 4 .b8 depot[64];
    .reg .b64 %rd<6>;
    .reg .b32 %r<4>;
    ld.param.u64 %rd1, [out];
    ld.param.u32 %r1, [i];
    cvta.to.global.u64 %rd1, %rd1;
    mov.u64 %rd2, depot;
    mul.wide.u32 %rd3, %r1, 4;
    add.s64 %rd4, %rd2, %rd3;
    st.local.u32 [%rd4], %r1;
    ld.local.u32 %r2, [depot+8];
    st.global.u32 [%rd1], %r2;
    ret;
}
PTX
entry "$cache/0123456789abcdef.bin" "$cache/stack.ptx"
if out=$(bash "$here/../tools/ptx-report.sh" --from-cache "$cache" --no-stack castle_probe_stack); then
    echo "$out"; echo "--no-stack took a kernel with a 64-byte stack frame"; exit 1
fi
echo "$out"
grep -qE '^0123456789ab +castle_probe_stack +stack=64 +spill=0 ' <<<"$out" ||
    { echo "the private array's 64-byte frame is not the stack column"; exit 1; }
# Calls: an entry calls two functions that return a value, one of them under a negated predicate, and
# both call a third, which holds the one FMA.  The count takes the third function once (the report
# once missed every call with results, and counted a function once per path that reached it).
rm "$cache"/*.bin
{
    printf '.version 7.8\n.target sm_90\n.address_size 64\n'
    printf '.visible .func (.param .b32 r) castle_g(.param .b32 x)\n{\n    .reg .f32 %%f<3>;\n'
    printf '    ld.param.f32 %%f1, [x];\n    fma.rn.f32 %%f2, %%f1, %%f1, %%f1;\n    st.param.f32 [r], %%f2;\n    ret;\n}\n'
    for f in castle_f1 castle_f2; do
        printf '.visible .func (.param .b32 r) %s(.param .b32 x)\n{\n    .reg .f32 %%f<3>;\n' "$f"
        printf '    ld.param.f32 %%f1, [x];\n    {\n    .param .b32 a;\n    st.param.f32 [a], %%f1;\n'
        printf '    .param .b32 b;\n    call.uni (b), \n    castle_g, \n    (a);\n    ld.param.f32 %%f2, [b];\n    }\n'
        printf '    st.param.f32 [r], %%f2;\n    ret;\n}\n'
    done
    printf '.visible .entry castle_probe_calls(.param .u64 out, .param .f32 v)\n{\n'
    printf '    .reg .pred %%p<2>;\n    .reg .b64 %%rd<2>;\n    .reg .f32 %%f<4>;\n'
    printf '    ld.param.u64 %%rd1, [out];\n    ld.param.f32 %%f1, [v];\n    cvta.to.global.u64 %%rd1, %%rd1;\n'
    printf '    setp.gt.f32 %%p1, %%f1, 0f00000000;\n    mov.f32 %%f3, %%f1;\n'
    printf '    {\n    .param .b32 a;\n    st.param.f32 [a], %%f1;\n    .param .b32 b;\n'
    printf '    call.uni (b), castle_f1, (a);\n    ld.param.f32 %%f2, [b];\n    }\n'
    printf '    {\n    .param .b32 a;\n    st.param.f32 [a], %%f2;\n    .param .b32 b;\n'
    printf '    @!%%p1 call (b), \n    castle_f2, \n    (\n    a\n    );\n    ld.param.f32 %%f3, [b];\n    }\n'
    printf '    st.global.f32 [%%rd1], %%f3;\n    ret;\n}\n'
} >"$cache/calls.ptx"
entry "$cache/0123456789abcdef.bin" "$cache/calls.ptx"
out=$(bash "$here/../tools/ptx-report.sh" --from-cache "$cache")
echo "$out"
grep -qE '^0123456789ab +castle_probe_calls +stack=0 +spill=0 +regs=[0-9]+ +fma=1 lds=0/0/0 ldg=0/0/0 smem=0$' <<<"$out" ||
    { echo "calls: the called functions' FMA is not counted once"; exit 1; }
rc=0
bash "$here/../tools/ptx-report.sh" --from-cache "$cache/none" 2>/dev/null || rc=$?
[ "$rc" = 2 ] || { echo "--from-cache on a missing directory: exit status $rc, expected 2"; exit 1; }
