#!/usr/bin/env bash
# castle-bench end to end on small sizes: one line per (op, impl, size) in the documented format,
# the gemm line, valid JSON with --json, exit 2 on bad usage.
# usage: bench_smoke.sh <castle-bench>
set -euo pipefail
bench=$1
out=$("$bench" --L 64,96 --t 100 --heads 2 --repeat 2 --gemm 64)
echo "$out"
n=$(grep -cE '^op=(forward|backward|prefill) impl=(castle|swl|causal) B=1 H=2 L=(64|96) d=64 W=[0-9]+ median_ms=[0-9.]+ gflops=[0-9.]+ clock=(device|host)$' <<<"$out")
[ "$n" = 18 ] || { echo "expected 18 forward/backward/prefill lines, found $n"; exit 1; }
n=$(grep -cE '^op=decode impl=(castle|swl|causal) B=1 H=2 t=100 d=64 W=[0-9]+ median_ms=[0-9.]+ gflops=[0-9.]+ clock=(device|host)$' <<<"$out")
[ "$n" = 3 ] || { echo "expected 3 decode lines, found $n"; exit 1; }
grep -qE '^op=gemm impl=clblast n=64 median_ms=[0-9.]+ gflops=[0-9.]+ clock=(device|host)$' <<<"$out" || { echo "no gemm line"; exit 1; }
json=$("$bench" --ops forward --impls castle,causal --L 64 --heads 1 --repeat 1 --gemm 0 --json)
python3 -c 'import json,sys; d=json.loads(sys.argv[1]); assert len(d)==2 and {x["impl"] for x in d}=={"castle","causal"} and all(x["median_ms"]>0 and x["clock"] in ("device","host") for x in d)' "$json" ||
    { echo "bad JSON: $json"; exit 1; }
if "$bench" --ops sideways >/dev/null 2>&1; then echo "bad --ops accepted"; exit 1; fi
rc=0; "$bench" --ops sideways >/dev/null 2>&1 || rc=$?
[ "$rc" = 2 ] || { echo "bad usage exit status $rc, expected 2"; exit 1; }
echo "castle-bench smoke test passed"
