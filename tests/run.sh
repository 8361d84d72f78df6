#!/usr/bin/env bash
# The project's test command (README, .ci/run): configure, build, and run every suite with ctest
# on both PoCL drivers (pthread: multi-threaded CPU device; basic: the single-threaded one).
# On a machine with another OpenCL device, set CASTLE_DEVICE=P:D and POCL_DEVICES is irrelevant.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${CASTLE_BUILD_DIR:-build}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j"$(nproc)"
export CASTLE_CACHE_DIR=${CASTLE_CACHE_DIR:-$PWD/$build/kernel-cache}
for driver in pthread basic; do
    echo "== ctest with POCL_DEVICES=$driver =="
    POCL_DEVICES=$driver ctest --test-dir "$build" --output-on-failure
done
