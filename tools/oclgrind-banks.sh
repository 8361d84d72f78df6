#!/usr/bin/env bash
# oclgrind-banks.sh: runs a command under Oclgrind with tools/oclgrind-banks/banks.cpp, a plugin that
# counts the local-memory traffic of each kernel as a GPU's shared memory would serve it: 32 banks of
# four bytes, 128 bytes a cycle (NVIDIA's shared memory; AMD's LDS likewise).  It needs no GPU:
# bank conflicts are a property of the addresses a warp's work-items touch together, which Oclgrind
# sees.  Work-items 32 w .. 32 w + 31 of a group are taken as warp w, and the n-th execution of one
# load or store by them as one request (the kernels' control flow is uniform across a warp).  A
# request takes as many wavefronts as the most distinct four-byte words one bank holds (a word read
# by several work-items is one: a broadcast), at least ceil(distinct words / 32).
#
# usage: tools/oclgrind-banks.sh [--local-mem-size BYTES] [--top N] [--rank excess|total] [--] COMMAND [ARG...]
#   --local-mem-size  Oclgrind's local memory per group (default 49152, an NVIDIA GPU's 48 KiB, so
#                     that the library keeps a GPU tuning unshrunk; Oclgrind's own default is 32 KiB)
#   --top N           list N instructions per kernel (default 6)
#   --rank R          excess (default): those with the most wavefronts above the conflict-free
#                     count; total: those with the most wavefronts (where the traffic goes)
#   COMMAND           any OpenCL program, e.g. build/tools/castle-bench under CASTLE_TUNING
# Prints to stderr, when the command exits, for each kernel and for its loads and its stores:
#   banks: KERNEL loads|stores requests R wavefronts W conflict-free M ratio W/M
# then the instructions (loads and stores) --rank puts first, each as "excess E" or "total W", its
# requests and wavefronts per request, its file:line and the lines it was inlined at, innermost
# first (libcastle's programs carry #line directives), and the opening words of its LLVM IR.
# Exit status: the command's; 2 on a usage error or where the plugin cannot be built.
# Needs Oclgrind 21.10 (Debian 12's package; the plugin declares that version's interface itself, as
# Debian packages no Oclgrind headers) and a C++ compiler ($CXX, default c++).  Example, the causal
# forward under the GPU entry:
#   CASTLE_CACHE_DIR=off CASTLE_TUNING="$(build/tools/castle-info --table | awk '$1 == "nvidia-gpu" { print $2 }')" \
#     tools/oclgrind-banks.sh build/tools/castle-bench --ops forward --impls causal --L 128 --heads 1 --gemm 0
set -euo pipefail
usage() { # [status]: 0 to stdout (--help), else to stderr
    local status=${1:-2}
    sed -n '/^# usage:/,/^# Exit status/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&$((status == 0 ? 1 : 2))
    exit "$status"
}
lms=49152
while [ $# -gt 0 ]; do
    case $1 in
    -h | --help) usage 0 ;;
    --local-mem-size)
        [[ ${2:-} =~ ^[1-9][0-9]*$ ]] || { echo "oclgrind-banks.sh: --local-mem-size needs a positive number of bytes" >&2; exit 2; }
        lms=$2; shift 2 ;;
    --top)
        [[ ${2:-} =~ ^[1-9][0-9]*$ ]] || { echo "oclgrind-banks.sh: --top needs a positive integer" >&2; exit 2; }
        export BANKS_TOP=$2; shift 2 ;;
    --rank)
        [[ ${2:-} =~ ^(excess|total)$ ]] || { echo "oclgrind-banks.sh: --rank is excess or total" >&2; exit 2; }
        export BANKS_RANK=$2; shift 2 ;;
    --) shift; break ;;
    -*) echo "oclgrind-banks.sh: unknown option $1" >&2; usage ;;
    *) break ;;
    esac
done
[ $# -gt 0 ] || usage
command -v oclgrind >/dev/null || { echo "oclgrind-banks.sh: oclgrind not found (Debian: apt-get install oclgrind)" >&2; exit 2; }
version=$(oclgrind --version 2>&1 | awk '/Oclgrind/ { print $2; exit }')
[ "$version" = 21.10 ] || {
    echo "oclgrind-banks.sh: Oclgrind ${version:-of unknown version} found; the plugin declares 21.10's interface" >&2
    exit 2
}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# -fno-rtti: Oclgrind is built without run-time type information, so its Plugin has no typeinfo
"${CXX:-c++}" -std=c++17 -O2 -fPIC -fno-rtti -shared -o "$work/banks.so" "$here/oclgrind-banks/banks.cpp" ||
    { echo "oclgrind-banks.sh: cannot build the plugin" >&2; exit 2; }
OCLGRIND_PLUGINS=$work/banks.so oclgrind --local-mem-size "$lms" "$@"
