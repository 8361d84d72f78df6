#!/usr/bin/env bash
# The built-in GPU entry's hot kernels keep a work-item's micro-tiles and accumulators in registers:
# no stack frame in the PTX that clang's NVPTX back end makes of them, as NVIDIA's ptxas reports it
# for sm_90 (tools/ptx-report.sh), at head-dimension classes 64 and 128.  A private array indexed at
# run time (a loop over micro-tiles or slabs left rolled) shows up as a stack frame.  The folded
# CASTLE backward (255 registers, a few bytes spilled) and class 256 of the causal backward's key
# side (two d-wide accumulators per work-item) are left out: they do not fit.
# usage: ptx_registers.sh <build-dir>
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
hot=castle_forward_block,castle_forward_fold,castle_backward_block,castle_causal_forward
hot=$hot,castle_causal_backward_q,castle_causal_backward_kv,castle_causal_decode,castle_cache_decode_attend
hot=$hot,castle_cache_prefill_u
for class in 64 128; do
    echo "== head-dimension class $class =="
    want=$hot
    [ "$class" = 128 ] && want=${hot/,castle_causal_backward_kv/} # its two accumulators just overflow 255 registers
    bash "$here/../tools/ptx-report.sh" "$1" --class "$class" --no-stack "$want"
done
