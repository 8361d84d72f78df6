#!/usr/bin/env bash
# test_gpu_session: tools/gpu-session.sh on the test device at a tiny shape, its --before set a copy
# of cl/ that cannot build (every barrier() renamed to an undeclared function): the steps of the
# built kernels pass and land in summary.txt (block kernels in two rounds, each launch's JSON,
# decode, and PyTorch's anchors where torch is importable), those of the broken set fail and are
# reported, exit status 1; a --tuning set (fold=0: the same programs, launched per anti-diagonal)
# is timed and listed in summary.txt; under --pack only summary.txt and gpu-session.tgz are left, the archive
# holding every step's file and the caches; --prepare writes a revision's cl/ (where git can); bad
# usage exits 2.  The steps' limits are scaled by 4 and the budget raised: a kernel set's first step
# compiles its programs, and on PoCL with a cold cache, beside other suites on two cores, the
# per-diagonal (fold=0) CPU kernels took over 200 s.
# usage: gpu_session.sh SOURCE_DIR CASTLE_BENCH
set -u
root=$1 tool=$1/tools/gpu-session.sh
fail() { echo "test_gpu_session: $*" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp -r "$root/cl" "$tmp/broken"
sed -i '1i #define barrier castle_no_such_function' "$tmp/broken/common.cl"
mkdir -p "$tmp/out"
echo keep >"$tmp/out/other.txt" # a file of someone else's in OUT: --pack leaves it alone
out=$(CASTLE_TOOLS=$(dirname "$2") OUT=$tmp/out bash "$tool" --before "$tmp/broken" --tuning fold=0 --L 32 --t 64 --batch 1 \
    --heads 1 --many-heads 3 --limit-scale 4 --budget 1500 --pack 2>&1)
rc=$?
[ "$rc" -eq 1 ] || fail "exit status $rc, expected 1:
$out"
for s in info bench_now_1 bench_now_2 launches decode bench_t1_1 bench_t1_2 decode_t1 many_heads pieces; do
    grep -q "^-- $s: ok in " <<<"$out" || fail "step $s did not pass:
$out"
done
for s in bench_before_1 bench_before_2 decode_before; do
    grep -q "^-- $s: FAILED (exit 1)" <<<"$out" || fail "step $s (the broken kernels) was not reported failed:
$out"
done
grep -q "^gpu-session.sh: 3 step(s) failed" <<<"$out" || fail "no count of the failed steps:
$out"
left=$(cd "$tmp/out" && ls | tr '\n' ' ')
[ "$left" = "gpu-session.tgz other.txt summary.txt " ] || fail "--pack left '$left' in OUT"
mkdir "$tmp/unpacked" && tar -xzf "$tmp/out/gpu-session.tgz" -C "$tmp/unpacked" || fail "gpu-session.tgz does not unpack"
! [ -e "$tmp/unpacked/other.txt" ] || fail "--pack took a file it did not write"
cmp -s "$tmp/out/summary.txt" "$tmp/unpacked/summary.txt" || fail "the packed summary.txt differs"
sum=$tmp/unpacked/summary.txt
for w in "op=forward impl=castle .* step=bench_now_1" "op=backward impl=causal .* step=bench_now_2" \
    "op=decode impl=swl .*t=64 .* step=decode" "set=t1 tuning=fold=0" "op=backward impl=castle .* step=bench_t1_2"; do
    grep -q "^$w\$" "$sum" || fail "summary.txt has no line '$w':
$(cat "$sum")"
done
! grep -q "step=bench_before" "$sum" || fail "summary.txt has lines of the broken set"
grep -q '"launch_ms"' "$tmp/unpacked/launches.txt" || fail "launches.txt has no per-launch times"
grep -q "^castle-conformance: 1 device, PASS$" "$tmp/unpacked/pieces.txt" || fail "pieces.txt has no PASS:
$(cat "$tmp/unpacked/pieces.txt")"
grep -qx "t1 fold=0" "$tmp/unpacked/tunings.txt" || fail "tunings.txt does not list the --tuning set"
if python3 -c "import torch" 2>/dev/null; then # PyTorch's anchors (tools/torch-anchors.py) at the same shape
    grep -q "^-- anchors: ok in " <<<"$out" || fail "step anchors did not pass:
$out"
    for w in "anchor=[a-z-]* op=forward dtype=fp32 B=1 H=1 L=32 d=64 .* step=anchors" \
        "anchor=castle-parallel op=forward dtype=fp32 .* step=anchors"; do
        grep -q "^$w\$" "$sum" || fail "summary.txt has no line '$w':
$(cat "$sum")"
    done
fi
ls "$tmp/unpacked/kc_now"/*.bin >/dev/null 2>&1 || fail "no binary cache entries in kc_now"
[ -f "$tmp/unpacked/bench_before_1.txt" ] || fail "the failed steps' files are not in the archive"
if git -C "$root" rev-parse --verify -q HEAD >/dev/null; then
    bash "$tool" --prepare HEAD "$tmp/prep" >/dev/null || fail "--prepare HEAD failed"
    [ -f "$tmp/prep/common.cl" ] && [ -f "$tmp/prep/forward.cl" ] || fail "--prepare HEAD wrote no cl/ copy"
fi
bash "$tool" --help | grep -q "^usage: tools/gpu-session.sh" || fail "--help prints no usage"
for args in "--L x" "--L 0" "--limit-scale 0" "--before $tmp/none" "--bogus" "--prepare" "--budget" "--tuning"; do
    # shellcheck disable=SC2086
    bash "$tool" $args >/dev/null 2>&1
    rc=$?
    [ "$rc" -eq 2 ] || fail "'$args': exit status $rc, expected 2"
done
# the bundle's tools: usage and refusals (making a bundle is a whole Release build: not here)
bash "$root/tools/gpu-bundle.sh" --help | grep -q "^usage: tools/gpu-bundle.sh" || fail "gpu-bundle.sh --help prints no usage"
bash "$root/tools/gpu-bundle.sh" --jobs x >/dev/null 2>&1
[ $? -eq 2 ] || fail "gpu-bundle.sh --jobs x: expected exit status 2"
bash "$root/tools/gpu-run.sh" --help | grep -q "^usage: bash .bundle/run.sh" || fail "gpu-run.sh --help prints no usage"
bash "$root/tools/gpu-run.sh" castle-info >/dev/null 2>&1 # beside tools/, not in a bundle: no build there
[ $? -eq 2 ] || fail "gpu-run.sh outside a bundle: expected exit status 2"
if command -v python3 >/dev/null; then
    python3 "$root/tools/torch-anchors.py" --help | grep -q "^usage: torch-anchors.py" ||
        fail "torch-anchors.py --help prints no usage"
    python3 "$root/tools/torch-anchors.py" --L 0 >/dev/null 2>&1
    [ $? -eq 2 ] || fail "torch-anchors.py --L 0: expected exit status 2"
fi
echo "test_gpu_session: passed"
