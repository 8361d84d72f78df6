#!/usr/bin/env bash
# Fuzzes the .npy reader (tools/npy.c) with libFuzzer for SECONDS seconds (default 20), under
# AddressSanitizer and UndefinedBehaviorSanitizer.  Needs clang with its fuzzer runtime (Debian:
# clang and libclang-rt-<version>-dev).  The corpus grows in BUILD/fuzz-npy-corpus across runs;
# a crashing input is saved in BUILD/ as crash-<sha1> and the script exits non-zero.
#   bash tests/sanitize/fuzz_npy.sh BUILD [SECONDS] [extra libFuzzer flags, e.g. -jobs=2]
# ctest runs it for 20 s as test_fuzz_npy (label fuzz) when clang is found; for a longer run:
#   bash tests/sanitize/fuzz_npy.sh build 600
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
build=$(mkdir -p "$1" && cd "$1" && pwd)
seconds=${2:-20}
shift $(($# < 2 ? $# : 2))
clang=${CLANG:-clang}

bin=$build/fuzz_npy
if [ ! -x "$bin" ] || [ "$bin" -ot "$src/tools/npy.c" ] || [ "$bin" -ot "$here/fuzz_npy.c" ]; then
    "$clang" -std=c11 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
        -I"$src/tools" "$here/fuzz_npy.c" "$src/tools/npy.c" -o "$bin"
fi

# Seeds: valid files of each format version and shape kind, written here so none is checked in.
seeds=$build/fuzz-npy-seeds
corpus=$build/fuzz-npy-corpus
rm -rf "$seeds"
mkdir -p "$seeds" "$corpus"
# npy MAJOR DICT NFLOATS: magic, version, header length (2 bytes for 1.x, 4 for 2.x/3.x), the dict
# padded with spaces and ended by '\n' so the data starts at a multiple of 64, then the floats.
npy() {
    local major=$1 dict=$2 nfloats=$3 lenbytes=2
    [ "$major" -ge 2 ] && lenbytes=4
    local pre=$((8 + lenbytes)) hlen=$((${#dict} + 1))
    hlen=$(((pre + hlen + 63) / 64 * 64 - pre))
    printf '\x93NUMPY\\x%02x\\x00' "$major" | xargs -0 printf
    local lo=$((hlen & 255)) hi=$((hlen >> 8))
    if [ "$lenbytes" = 2 ]; then
        printf "\\x$(printf %02x $lo)\\x$(printf %02x $hi)"
    else
        printf "\\x$(printf %02x $lo)\\x$(printf %02x $hi)\\x00\\x00"
    fi
    printf '%s' "$dict"
    printf '%*s' $((hlen - ${#dict} - 1)) ''
    printf '\n'
    head -c $((4 * nfloats)) /dev/urandom
}
npy 1 "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }" 6 >"$seeds/v1_2x3.npy"
npy 1 "{'descr': '<f4', 'fortran_order': False, 'shape': (), }" 1 >"$seeds/v1_scalar.npy"
npy 1 "{'descr': '<f4', 'fortran_order': False, 'shape': (5,), }" 5 >"$seeds/v1_vector.npy"
npy 1 "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2, 0, 3), }" 0 >"$seeds/v1_empty.npy"
npy 2 "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 1, 2, 1, 1, 1, 1, 2), }" 8 >"$seeds/v2_8d.npy"
npy 3 "{'descr': '=f4', 'fortran_order': False, 'shape': (3, 1), }" 3 >"$seeds/v3_3x1.npy"
npy 1 "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }" 4 >"$seeds/v1_fortran.npy"
npy 1 "{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }" 2 >"$seeds/v1_bigendian.npy"

cd "$build"
"$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=4096 -print_final_stats=1 "$@" \
    "$corpus" "$seeds"
