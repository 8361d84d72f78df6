#!/usr/bin/env bash
# Sets up a fresh Debian/Ubuntu machine (apt-get, when packages are missing), builds libcastle,
# lists the OpenCL devices with castle-info (which self-tests each), and on the default device
# (CASTLE_DEVICE, else 0:0) runs a timed demo: forward and backward at B=1, H=8, L=1024, d=64, then
# a generation loop (prefill 1024 tokens, decode 16 one at a time through the UQ-KV cache).
set -euo pipefail
cd "$(dirname "$0")/.."
pkgs="build-essential cmake pkg-config ocl-icd-opencl-dev opencl-headers pocl-opencl-icd libclblast-dev clinfo check oclgrind python3 python3-numpy python3-pytest python3-torch python3-matplotlib python3-pyopencl python3-venv"
missing=$(dpkg-query -W -f='${Package} ${Status}\n' $pkgs 2>/dev/null | grep -vc "install ok installed" || true)
if [ "$missing" != 0 ] || ! dpkg-query -W $pkgs >/dev/null 2>&1; then
    sudo=""
    [ "$(id -u)" = 0 ] || sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends $pkgs >/dev/null
fi
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" >/dev/null
build/tools/castle-info
demo=$(mktemp -d)
trap 'rm -rf "$demo"' EXIT
build/tools/castle-run random --shape 1,8,1024,64 --out "$demo/in"
echo "forward, B=1 H=8 L=1024 d=64 (CASTLE):"
build/tools/castle-run forward --in "$demo/in" --out "$demo/out" --repeat 3
echo "forward, same shape, CASTLE-SWL W=128:"
build/tools/castle-run forward --in "$demo/in" --out "$demo/out" --window 128 --repeat 3
echo "backward, same shape (CASTLE):"
build/tools/castle-run backward --in "$demo/in" --out "$demo/grad" --repeat 3
echo "outputs written: o.npy (1, 8, 1024, 64), lse.npy (1, 8, 1024), dqu.npy .. dvc.npy"
echo "generation loop through the UQ-KV cache:"
build/tools/castle-generate --prompt 1024 --tokens 16 --heads 8
