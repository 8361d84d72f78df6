#!/usr/bin/env bash
# gpu-run.sh: runs the build that tools/gpu-bundle.sh packed, on the GPU machine (the bundle holds
# this file as .bundle/run.sh; run it from the checkout's root there).
#
# usage: bash .bundle/run.sh [COMMAND [ARG...]]
#   COMMAND  a tool of the build (castle-info, castle-bench, ...) or any command, run with the
#            bundle's libraries; none: castle-info (self-test), castle-bench at B = 2, H = 16
#            (L = 1024, 4096, 8192; decode at t = 4096, 32768; SGEMM n = 4096), then the ctest suites
#            but the Oclgrind, install and castle-bench ones (each step under a time limit)
# Puts the build back at /tmp/castle-gpu (where it was built), points the OpenCL ICD loader at the
# NVIDIA driver's OpenCL library when no vendor file names one, and sets CASTLE_CACHE_DIR (default
# /tmp/castle-gpu/kernel-cache) and CASTLE_DEVICE (default 0:0).  With $OUT set, everything printed
# also goes to $OUT/run.log.  Exit status: the command's, or the default steps' last failure.
set -uo pipefail
case ${1:-} in -h | --help)
    sed -n '/^# usage:/,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
    exit 0 ;;
esac
here=$(cd "$(dirname "$0")" && pwd)
stage=/tmp/castle-gpu
[ -d "$here/build" ] && [ -d "$here/src" ] || { echo "gpu-run.sh: $here has no build (tools/gpu-bundle.sh)" >&2; exit 2; }
[ -n "${OUT:-}" ] && exec > >(tee -a "$OUT/run.log") 2>&1
rm -rf "$stage" && mkdir -p "$stage" && cp -r "$here/src" "$here/build" "$stage/"
export LD_LIBRARY_PATH=$here/lib:$stage/build${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export CASTLE_CACHE_DIR=${CASTLE_CACHE_DIR:-$stage/kernel-cache} CASTLE_DEVICE=${CASTLE_DEVICE:-0:0}
# the ICD loader finds drivers through /etc/OpenCL/vendors; a container may have the driver's
# library without a vendor file for it
if ! grep -qs nvidia /etc/OpenCL/vendors/*.icd 2>/dev/null; then
    for lib in /usr/lib/x86_64-linux-gnu/libnvidia-opencl.so.1 /usr/local/nvidia/lib64/libnvidia-opencl.so.1 \
        /usr/lib64/libnvidia-opencl.so.1; do
        if [ -e "$lib" ]; then
            mkdir -p "$stage/icd" && echo "$lib" >"$stage/icd/nvidia.icd"
            export OCL_ICD_VENDORS=$stage/icd
            break
        fi
    done
fi
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader
fi
tools=$stage/build/tools
if [ $# -gt 0 ]; then
    cmd=$1
    shift
    [ -x "$tools/$cmd" ] && cmd=$tools/$cmd
    exec "$cmd" "$@"
fi
rc=0
echo "== castle-info"
timeout 120 "$tools/castle-info" || rc=$?
echo "== castle-bench"
timeout 300 "$tools/castle-bench" --batch 2 --heads 16 --L 1024,4096,8192 --t 4096,32768 --repeat 5 --gemm 4096 || rc=$?
echo "== ctest"
(cd "$stage/build" && timeout 400 ctest -j8 --timeout 300 -E "test_install|test_oclgrind|bench" --output-on-failure) || rc=$?
exit "$rc"
