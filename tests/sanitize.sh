#!/usr/bin/env bash
# The sanitizer tier: builds a separate tree and runs the fast suites under the sanitizers (ctest
# label "asan", or "tsan").
#   bash tests/sanitize.sh        ASan + UBSan (-DCASTLE_SANITIZE=ON) in build-sanitize/
#   bash tests/sanitize.sh tsan   ThreadSanitizer (-DCASTLE_TSAN=ON) in build-tsan/: test_threads
#   bash tests/sanitize.sh fuzz [SECONDS]   the .npy reader under libFuzzer (default 300 s)
# Leaks inside OpenCL drivers are suppressed by library name (tests/sanitize/lsan.supp); any
# report in libcastle, the tests or the tools fails the run.  POCL_DEVICES defaults to pthread, and
# only PoCL's ICD is loaded (OCL_ICD_VENDORS; Mesa's clover leaks from a library it unloads, which
# no suppression can name): set OCL_ICD_VENDORS to a folder of .icd files to test other drivers.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-asan}
targets=()
export POCL_DEVICES=${POCL_DEVICES:-pthread}
if [ -z "${OCL_ICD_VENDORS:-}" ] && [ -f /etc/OpenCL/vendors/pocl.icd ]; then
    export OCL_ICD_VENDORS=/etc/OpenCL/vendors/pocl.icd
fi
case "$mode" in
asan)
    build=${CASTLE_BUILD_DIR:-build-sanitize}
    cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCASTLE_SANITIZE=ON >/dev/null
    ;;
tsan)
    build=${CASTLE_BUILD_DIR:-build-tsan}
    cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCASTLE_TSAN=ON >/dev/null
    targets=(--target test_threads)
    ;;
fuzz)
    exec bash tests/sanitize/fuzz_npy.sh "${CASTLE_BUILD_DIR:-build-fuzz}" "${2:-300}"
    ;;
*)
    echo "usage: bash tests/sanitize.sh [asan|tsan|fuzz [SECONDS]]" >&2
    exit 2
    ;;
esac
export CASTLE_CACHE_DIR=${CASTLE_CACHE_DIR:-$PWD/$build/kernel-cache}
cmake --build "$build" -j"$(nproc)" ${targets[@]+"${targets[@]}"}
ctest --test-dir "$build" -L "$mode" --output-on-failure
