#!/usr/bin/env bash
# castle-bench end to end on small sizes: one line per (op, impl, size) in the documented format,
# the gemm line, valid JSON with --json, decode's GB/s against the byte model, --ragged, --interleave's
# lines and their order, --profile's launch counts and shares, exit 2 on bad usage.  castle-info is taken from castle-bench's folder.
# usage: bench_smoke.sh <castle-bench> [<tests/fail_alloc.c's module>]
set -euo pipefail
bench=$1
fail_alloc=${2:-}
out=$("$bench" --L 64,96 --t 100 --heads 2 --repeat 2 --gemm 64)
echo "$out"
n=$(grep -cE '^op=(forward|backward|prefill) impl=(castle|swl|causal) B=1 H=2 L=(64|96) d=64 W=[0-9]+ median_ms=[0-9.]+ gflops=[0-9.]+ clock=(device|host)$' <<<"$out")
[ "$n" = 18 ] || { echo "expected 18 forward/backward/prefill lines, found $n"; exit 1; }
n=$(grep -cE '^op=decode impl=(castle|swl|causal) B=1 H=2 t=100 d=64 W=[0-9]+ median_ms=[0-9.]+ gflops=[0-9.]+ gbs=[0-9.]+ clock=(device|host)$' <<<"$out")
[ "$n" = 3 ] || { echo "expected 3 decode lines, found $n"; exit 1; }
grep -qE '^op=gemm impl=clblast n=64 median_ms=[0-9.]+ gflops=[0-9.]+ clock=(device|host)$' <<<"$out" || { echo "no gemm line"; exit 1; }
json=$("$bench" --ops forward --impls castle,causal --L 64 --heads 1 --repeat 1 --gemm 0 --json)
python3 -c 'import json,sys; d=json.loads(sys.argv[1]); assert len(d)==2 and {x["impl"] for x in d}=={"castle","causal"} and all(x["median_ms"]>0 and x["clock"] in ("device","host") for x in d)' "$json" ||
    { echo "bad JSON: $json"; exit 1; }
# decode's gbs: the bytes of docs/performance.md's model over the median time (B=1 H=2 t=100 d=64:
# causal 4 x 2 t d x 2 heads, CASTLE 4 x 5 t d x 2, CASTLE-SWL W=16: 4 x (3 t + 2 W) d x 2)
json=$("$bench" --ops decode --t 100 --heads 2 --window 16 --repeat 1 --gemm 0 --json)
python3 -c '
import json, sys
want = {"causal": 4 * 2 * 100 * 64 * 2, "castle": 4 * 5 * 100 * 64 * 2, "swl": 4 * (3 * 100 + 2 * 16) * 64 * 2}
d = json.loads(sys.argv[1])
assert {x["impl"] for x in d} == set(want), d
for x in d:
    gbs = want[x["impl"]] / (x["median_ms"] * 1e-3) * 1e-9
    assert abs(x["gbs"] - gbs) <= 1e-3 + 1e-3 * gbs, (x, gbs)' "$json" || { echo "bad decode gbs: $json"; exit 1; }
# --ragged: the prefill of prompts of different lengths, on its own line
n=$("$bench" --ops prefill --ragged --impls castle,causal --L 64 --batch 2 --heads 1 --repeat 1 --gemm 0 |
    grep -cE '^op=(prefill_ragged impl=castle|prefill impl=causal) B=2 H=1 L=64 ')
[ "$n" = 2 ] || { echo "expected a prefill_ragged and a causal prefill line, found $n"; exit 1; }
# --interleave: the training operations round robin, reported L by L (op, then impl, within an L),
# decode after them as without it; a ragged prefill keeps its name, the forward beside it its own
out=$("$bench" --interleave --ops forward,backward,decode --impls castle,causal --L 64,96 --t 100 --heads 2 --repeat 2 --gemm 0)
echo "$out"
got=$(grep -E '^op=' <<<"$out" | awk '{print $1, $2, $5}' | tr '\n' ';')
want="op=forward impl=castle L=64;op=forward impl=causal L=64;op=backward impl=castle L=64;op=backward impl=causal L=64;"
want+="op=forward impl=castle L=96;op=forward impl=causal L=96;op=backward impl=castle L=96;op=backward impl=causal L=96;"
want+="op=decode impl=castle t=100;op=decode impl=causal t=100;"
[ "$got" = "$want" ] || { echo "--interleave lines: got '$got', expected '$want'"; exit 1; }
n=$(grep -cE 'median_ms=[0-9.]+ gflops=[0-9.]+ (gbs=[0-9.]+ )?clock=(device|host)$' <<<"$out")
[ "$n" = 10 ] || { echo "--interleave: expected 10 measurement lines in the documented format, found $n"; exit 1; }
got=$("$bench" --interleave --ops forward,prefill --ragged --impls castle --L 64 --batch 2 --heads 1 --repeat 1 --gemm 0 |
    awk '/^op=/{print $1, $2}' | tr '\n' ';')
[ "$got" = "op=forward impl=castle;op=prefill_ragged impl=castle;" ] || { echo "--interleave --ragged lines: $got"; exit 1; }
# --profile: the device's own tuning unfolded (fold is no kernel option: the same programs) at
# L = 4 blocks: the forward is one transposition and 4 diagonals of 4 + 3 + 2 + 1 block pairs per
# head; the kernels' device times and the gaps add up to the span
tuning=$("$(dirname "$bench")/castle-info" | sed -n 's/^ *tuning: [a-z-]* (\(.*\))$/\1/p')
block=$(tr ',' '\n' <<<"$tuning" | sed -n 's/^block=//p')
[ -n "$block" ] || { echo "castle-info prints no tuning with a block"; exit 1; }
prof=$(CASTLE_TUNING=$(sed 's/fold=[0-9]*/fold=0/' <<<"$tuning") \
    "$bench" --ops forward,backward --impls castle,causal --L $((4 * block)) --heads 2 --repeat 1 --gemm 0 --profile)
echo "$prof"
python3 -c '
import re, sys
lines = [l for l in sys.argv[1].splitlines() if l.startswith("profile ")]
runs = {}
for l in lines:
    f = dict(kv.split("=", 1) for kv in l.split()[1:])
    runs.setdefault((f["op"], f["impl"]), []).append(f)
assert set(runs) == {("forward", "castle"), ("backward", "castle"), ("forward", "causal"), ("backward", "causal")}, runs
fwd = {f["kernel"]: f for f in runs[("forward", "castle")]}
assert fwd["castle_transpose_blocks"]["launches"] == "1", fwd
assert (fwd["castle_forward_block"]["launches"], fwd["castle_forward_block"]["groups"]) == ("4", "20"), fwd
assert runs[("forward", "causal")][0]["kernel"] == "castle_causal_forward", runs
for key, fs in runs.items():
    assert fs[-1]["kernel"] == "(gaps)" and all(f["kernel"] != "(gaps)" for f in fs[:-1]), fs
    if "share" in fs[0]:
        total = sum(float(f["share"]) for f in fs)
        assert abs(total - 1) < 0.01, (key, total)' "$prof" || { echo "bad --profile lines"; exit 1; }
json=$("$bench" --ops forward --impls causal --L 64 --heads 1 --repeat 1 --gemm 0 --json --profile)
python3 -c '
import json, sys
d = json.loads(sys.argv[1])
assert len(d) == 3 and "kernel" not in d[0] and [x["kernel"] for x in d[1:]] == ["castle_causal_forward", "(gaps)"]
k = d[1]
assert k["launch_groups"] == [k["groups"]] and k["launches"] == 1
assert "ms" not in k or (len(k["launch_ms"]) == 1 and abs(k["launch_ms"][0] - k["ms"]) < 1e-3)' "$json" ||
    { echo "bad --profile JSON: $json"; exit 1; }
if "$bench" --ops sideways >/dev/null 2>&1; then echo "bad --ops accepted"; exit 1; fi
rc=0; "$bench" --ops sideways >/dev/null 2>&1 || rc=$?
[ "$rc" = 2 ] || { echo "bad usage exit status $rc, expected 2"; exit 1; }
# also bad usage: a run that would measure nothing, a window that does not fit a long (it once wrapped
# to -1 and failed in the library, exit 1), a head dimension the library does not take, lists with
# an empty element (they ran what the other elements named), a batch of 0
for bad in "--ops ," "--ops=" "--impls ," "--window 18446744073709551615" "--d 257" "--ops forward,,decode" \
    "--impls causal," "--L 64,,96" "--t ,64" "--batch 0"; do
    rc=0
    # shellcheck disable=SC2086
    "$bench" --L 64 $bad --heads 1 --repeat 1 --gemm 0 >/dev/null 2>&1 || rc=$?
    [ "$rc" = 2 ] || { echo "castle-bench $bad: exit status $rc, expected 2"; exit 1; }
done
# a decode whose prompt cannot be allocated (the preloaded module refuses buffers of a prompt
# tensor's size, B=1 H=1 t=1000 d=64): exit 1 with the library's status; it once released the
# never-made buffers of the one-token problem and crashed
if [ -n "$fail_alloc" ]; then
    for impl in castle causal; do
        rc=0
        err=$(env CASTLE_TEST_FAIL_BUFFER_BYTES=256000 LD_PRELOAD="$fail_alloc${LD_PRELOAD:+:$LD_PRELOAD}" \
            ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0" \
            "$bench" --ops decode --impls $impl --t 1000 --heads 1 --repeat 1 --gemm 0 2>&1 >/dev/null) || rc=$?
        [ "$rc" = 1 ] && grep -q 'decode failed: CL_MEM_OBJECT_ALLOCATION_FAILURE' <<<"$err" ||
            { echo "decode ($impl) with its prompt refused: exit status $rc, expected 1: $err"; exit 1; }
    done
fi
echo "castle-bench smoke test passed"
