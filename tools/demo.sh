#!/usr/bin/env bash
# Sets up a fresh Debian/Ubuntu machine (apt-get, when packages are missing), builds libcastle,
# lists the OpenCL devices with castle-info (which self-tests each), and on the default device
# (CASTLE_DEVICE, else 0:0) runs a demo: forward and backward at B=1, H=8, L=1024, d=64 with their
# outputs kept as .npy files, device times and GFLOP/s of CASTLE, CASTLE-SWL and the standard causal
# attention baseline side by side (castle-bench), then a generation loop (prefill 1024 tokens, decode
# 16 one at a time through the UQ-KV cache).
# usage: bash tools/demo.sh [output folder, default build/demo]
set -euo pipefail
case "${1:-}" in
-h | --help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
-*) echo "demo.sh: unknown option $1 (usage: bash tools/demo.sh [output folder])" >&2; exit 2 ;;
esac
[ $# -le 1 ] || { echo "demo.sh: one output folder at most (usage: bash tools/demo.sh [output folder])" >&2; exit 2; }
cd "$(dirname "$0")/.."
say() { printf '\n== %s\n' "$*"; }

pkgs="build-essential cmake pkg-config ocl-icd-opencl-dev opencl-headers pocl-opencl-icd libclblast-dev clinfo check oclgrind mesa-opencl-icd python3 python3-numpy python3-pytest python3-torch python3-matplotlib python3-pyopencl python3-venv libopenblas0-pthread"
missing=$(dpkg-query -W -f='${Package} ${Status}\n' $pkgs 2>/dev/null | grep -vc "install ok installed" || true)
if [ "$missing" != 0 ] || ! dpkg-query -W $pkgs >/dev/null 2>&1; then
    say "Installing the packages libcastle needs with apt-get (a few minutes on a fresh machine): $pkgs"
    sudo=""
    [ "$(id -u)" = 0 ] || sudo=sudo
    $sudo apt-get update
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y --no-install-recommends $pkgs
fi

say "Building libcastle, its tools and tests in build/ (about a minute on 2 cores; less when up to date)"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" >/dev/null

out=$(mkdir -p "${1:-build/demo}" && cd "${1:-build/demo}" && pwd)
cache=${CASTLE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/castle}
say "OpenCL devices, each with a forward self-test against the fp64 reference (castle-info)"
echo "The first use of a kernel family on a device compiles it: about 40 s per family on PoCL, once."
echo "The compiled programs are cached in $cache (CASTLE_CACHE_DIR), so later runs start in seconds."
build/tools/castle-info

say "Forward and backward, B=1 H=8 L=1024 d=64 (CASTLE), outputs kept in $out"
build/tools/castle-run random --shape 1,8,1024,64 --out "$out/in"
build/tools/castle-run forward --in "$out/in" --out "$out/forward"
build/tools/castle-run forward --in "$out/in" --out "$out/forward-swl128" --window 128
build/tools/castle-run backward --in "$out/in" --out "$out/backward"
echo "inputs  $out/in: qu ku vu qc kc vc do .npy, (1, 8, 1024, 64) float32"
echo "outputs $out/forward, $out/forward-swl128 (CASTLE-SWL, W = 128): o.npy (1, 8, 1024, 64), lse.npy (1, 8, 1024)"
echo "        $out/backward: dqu.npy .. dvc.npy, (1, 8, 1024, 64)"

say "Device time per call (median of 3) and GFLOP/s (nominal FLOPs, docs/algorithm.md section 6): CASTLE, CASTLE-SWL and causal attention"
echo "(the causal baseline's kernels compile on first use too: about 40 s once)"
build/tools/castle-bench --L 1024 --heads 8 --ops forward,backward --impls castle,swl,causal --window 128 \
    --repeat 3 --gemm 0 | tee "$out/bench.txt" |
    awk '{ delete f; for (i = 1; i <= NF; ++i) { split($i, kv, "="); f[kv[1]] = kv[2] }
           if (f["median_ms"] == "") { print; next }
           name = f["impl"] == "swl" ? "castle-swl W=" f["W"] : f["impl"]
           printf "  %-9s %-16s %9.2f ms %9.2f GFLOP/s\n", f["op"], name, f["median_ms"], f["gflops"] }'
echo "(machine-readable lines in $out/bench.txt; castle-bench --help for other shapes and operations)"

say "Generation loop through the UQ-KV cache: prefill 1024 tokens, then decode 16 one at a time"
build/tools/castle-generate --prompt 1024 --tokens 16 --heads 8
say "Done.  Outputs: $out"
