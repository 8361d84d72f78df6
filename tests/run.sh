#!/usr/bin/env bash
# The project's test command (README "Tests", .ci/run): configure, build, and run the suites with
# ctest on every OpenCL implementation present, each found by its platform name (never by index):
#   1. PoCL, POCL_DEVICES=pthread (multi-threaded CPU device): every suite;
#   2. PoCL, POCL_DEVICES=basic (the single-threaded one): every suite that uses a device, on the
#      device's own tuning (the cases under other tunings, label variants, run on the first only);
#   3. Mesa's rusticl on llvmpipe (RUSTICL_ENABLE=llvmpipe; package mesa-opencl-icd): the quick tier
#      (every operation on small shapes, the CLI and error suites); CASTLE_RUSTICL_TIER=full for all.
# Oclgrind, the fourth, runs inside the suites (test_oclgrind).  The suites that do not use the
# implementation, or whose subject is a tool (label host: references, .npy, install, exports, Oclgrind,
# cl-variants.sh, gpu-session.sh; tests/CMakeLists.txt lists them) run once, on the first,
# and so do the test cases under tunings other than the device's entry (label variants:
# tests/CMakeLists.txt), whose every tuning builds its own kernels (minutes each on PoCL).
#
# usage: bash tests/run.sh [--quick]
#   --quick  the quick tier only (ctest label quick, about two minutes per implementation)
# With CASTLE_DEVICE set, only that device is tested (full or quick tier).
set -euo pipefail
cd "$(dirname "$0")/.."
tier=full
case "${1:-}" in
--quick) tier=quick ;;
"") ;;
*) echo "usage: bash tests/run.sh [--quick]" >&2; exit 2 ;;
esac
build=${CASTLE_BUILD_DIR:-build}
echo "== configure and build ($build) =="
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j"$(nproc)" >/dev/null
export CASTLE_CACHE_DIR=${CASTLE_CACHE_DIR:-$PWD/$build/kernel-cache}

# ctest with progress: each suite's start, then its result and time as it finishes.
run_ctest() { # <what> <ctest selection args...>
    local what=$1 t0=$SECONDS
    shift
    echo "== $what =="
    # one suite per core: most of a cold run is single-threaded kernel compilation
    ctest --test-dir "$build" --output-on-failure --no-tests=error -j "$(nproc)" "$@"
    echo "== $what: passed in $((SECONDS - t0)) s =="
}
tier_args() { # <tier> <first implementation: yes|no>
    local args=()
    [ "$1" = quick ] && args+=(-L quick)
    [ "$2" = no ] && args+=(-LE 'host|variants')
    echo "${args[@]}"
}

if [ -n "${CASTLE_DEVICE:-}" ]; then
    # shellcheck disable=SC2046
    run_ctest "ctest ($tier) on CASTLE_DEVICE=$CASTLE_DEVICE" $(tier_args "$tier" yes)
    exit 0
fi

# The platform index of the OpenCL platform named $1 that has a device (castle-info's listing).
platform_named() {
    "$build/tools/castle-info" --no-self-test 2>/dev/null |
        awk -v want="$1" '/^Platform [0-9]+: / { p = $2; sub(":", "", p); name = substr($0, index($0, ": ") + 2); next }
                          /^  Device / && name == want { print p; exit }'
}

pocl=$(POCL_DEVICES=pthread platform_named "Portable Computing Language")
if [ -z "$pocl" ]; then
    echo "PoCL (pocl-opencl-icd) not found: the tests need it" >&2
    exit 1
fi
for driver in pthread basic; do
    first=no
    [ "$driver" = pthread ] && first=yes
    # shellcheck disable=SC2046
    POCL_DEVICES=$driver CASTLE_DEVICE=$pocl:0 run_ctest "ctest ($tier) on PoCL $driver, device $pocl:0" \
        $(tier_args "$tier" $first)
done
rusticl=$(RUSTICL_ENABLE=llvmpipe platform_named rusticl)
if [ -n "$rusticl" ]; then
    rtier=$tier
    [ "$tier" = full ] && rtier=${CASTLE_RUSTICL_TIER:-quick}
    # shellcheck disable=SC2046
    RUSTICL_ENABLE=llvmpipe CASTLE_DEVICE=$rusticl:0 run_ctest "ctest ($rtier) on rusticl llvmpipe, device $rusticl:0" \
        $(tier_args "$rtier" no)
else
    echo "== rusticl on llvmpipe not found (install mesa-opencl-icd to test it): skipped =="
fi
