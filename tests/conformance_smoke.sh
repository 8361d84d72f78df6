#!/usr/bin/env bash
# castle-conformance end to end on the quick tier: one PASS line per operation in the documented
# format, a valid --json report (device name, vendor, driver, tuning), exit 2 on bad usage; then the
# quick tier again under every distinct tuning of the built-in table (castle-info --table) forced
# through CASTLE_TUNING, so that each kernel mapping the table can pick for some device (the CPU and
# the GPU mapping) is checked on this one; an entry too large for the device is said, not hidden.
# Then --random: cases drawn from a seed, the same ones run after run, with their numbers; under a
# copy of cl/ whose causal kernels scale their outputs by 1.001 (CASTLE_CL_DIR) it fails, naming the
# failed case, and --seed S --random K+1 fails at that case again.
# The device is CASTLE_DEVICE's (default 0:0).
# usage: conformance_smoke.sh <castle-conformance> <castle-info> <the kernels' directory, cl/>
set -euo pipefail
tool=$1
info=$2
cldir=$3
TMPDIR_CASES=$(mktemp -d)
trap 'rm -rf "$TMPDIR_CASES"' EXIT
pass_lines() { # <output>: the number of well-formed PASS lines
    grep -cE '^device=[0-9]+:[0-9]+ op=(forward|backward|decode|decode_chunked|causal_forward|causal_backward|causal_decode) cases=[1-9][0-9]* worst_err=[0-9.e+-]+ tol=[0-9.e+-]+ result=PASS seconds=[0-9.]+$' <<<"$1" || true
}
out=$("$tool" --quick)
echo "$out"
n=$(pass_lines "$out")
[ "$n" = 7 ] || { echo "expected 7 PASS lines, found $n"; exit 1; }
json=$("$tool" --quick --ops forward,causal_decode --json)
python3 -c '
import json, sys
d = json.loads(sys.argv[1])
assert d["pass"] is True and d["mode"] == "quick" and len(d["devices"]) == 1, d
dev = d["devices"][0]
assert dev["name"] and dev["vendor"] and dev["driver_version"] and dev["tuning"]["block"] > 0 and dev["tuning"]["decode"] in (1, 2) and dev["tuning"]["stage"] in (1, 2) and dev["tuning"]["prefetch"] in (0, 1) and dev["tuning"]["accum"] in (1, 2), dev
assert [o["op"] for o in dev["ops"]] == ["forward", "causal_decode"], dev["ops"]
assert all(o["pass"] and o["cases"] > 0 and 0 <= o["worst_err"] <= o["tol"] for o in dev["ops"]), dev["ops"]
' "$json" || { echo "bad JSON: $json"; exit 1; }
# --ops , and --ops= name no operation: a run that checks nothing must not pass (it reported PASS)
for bad in "--bogus" "--device x:y" "--ops sideways" "--ops ," "--ops=" "--ops forward,,backward" "--all --device 0:0" \
    "stray" "--random 0" "--random x" "--random -1" "--random +2" "--random" "--quick --random 2" "--seed 3" \
    "--random 1 --seed x" "--random 1 --seed 18446744073709551616"; do
    rc=0
    # shellcheck disable=SC2086
    "$tool" $bad >/dev/null 2>&1 || rc=$?
    [ "$rc" = 2 ] || { echo "castle-conformance $bad: exit status $rc, expected 2"; exit 1; }
done
table=$("$info" --table)
entries=$(awk -F'\t' 'NF == 2 && !seen[$2]++' <<<"$table")
[ "$(wc -l <<<"$entries")" -ge 2 ] || { echo "castle-info --table: expected at least two distinct tunings: $table"; exit 1; }
while IFS=$'\t' read -r name tuning; do
    rc=0
    out=$(CASTLE_TUNING=$tuning "$tool" --quick 2>&1) || rc=$?
    if [ "$rc" != 0 ] && grep -q 'CASTLE_ERR_BAD_TUNING' <<<"$out" && [ "$(pass_lines "$out")" = 0 ]; then
        echo "table entry $name ($tuning) does not fit this device: $(grep -m1 CASTLE_ERR_BAD_TUNING <<<"$out")"
        continue
    fi
    echo "$out"
    grep -q "tuning environment ($tuning)" <<<"$out" || { echo "table entry $name: the run was not under $tuning"; exit 1; }
    n=$(pass_lines "$out")
    [ "$rc" = 0 ] && [ "$n" = 7 ] || { echo "table entry $name ($tuning): exit status $rc, $n PASS lines of 7"; exit 1; }
done <<<"$entries"

# --random: every op passes, the header names the draw, the same seed gives the same cases
out=$("$tool" --random 2 --seed 5 --verbose 2>"$TMPDIR_CASES/a")
echo "$out"
[ "$(pass_lines "$out")" = 7 ] || { echo "--random 2: expected 7 PASS lines"; exit 1; }
grep -q '^# device .*, random, 2 cases per operation, seed 5$' <<<"$out" || { echo "--random: no header naming the draw"; exit 1; }
"$tool" --random 2 --seed 5 --verbose >/dev/null 2>"$TMPDIR_CASES/b"
strip() { sed -E 's/ \([0-9.]+ s\)$//; s/err=[0-9.e+-]+ //' "$1"; } # the times and errors may differ
[ "$(grep -c ' case [01]: ' "$TMPDIR_CASES/a")" = 14 ] || { echo "--random 2 --verbose: expected 14 numbered cases"; cat "$TMPDIR_CASES/a"; exit 1; }
diff <(strip "$TMPDIR_CASES/a") <(strip "$TMPDIR_CASES/b") || { echo "--seed 5: another draw the second time"; exit 1; }
"$tool" --random 2 --seed 6 --verbose >/dev/null 2>"$TMPDIR_CASES/c"
! diff -q <(strip "$TMPDIR_CASES/a") <(strip "$TMPDIR_CASES/c") >/dev/null || { echo "--seed 6 drew seed 5's cases"; exit 1; }
json=$("$tool" --random 1 --seed 9 --ops causal_forward --json)
python3 -c '
import json, sys
d = json.loads(sys.argv[1])
assert d["mode"] == "random" and d["random"] == 1 and d["seed"] == 9 and d["pass"] is True, d
assert d["devices"][0]["mode"] == "random" and d["devices"][0]["ops"][0]["cases"] == 1, d
' "$json" || { echo "bad --random JSON: $json"; exit 1; }
# under a small loop limit and the table's block of 16 (the rusticl entry, compiled above) the
# causal kernels and the prefill's U pass run in pieces (host/loops.c): random cases still pass
small=$(awk -F'\t' '$1 == "rusticl-llvmpipe" {print $2}' <<<"$table")
if [ -n "$small" ]; then
    rc=0
    out=$(CASTLE_TUNING=$small CASTLE_LOOP_LIMIT=2500 "$tool" --random 4 --seed 13 2>&1) || rc=$?
    if [ "$rc" != 0 ] && grep -q 'CASTLE_ERR_BAD_TUNING' <<<"$out" && [ "$(pass_lines "$out")" = 0 ]; then
        echo "the rusticl entry does not fit this device: loop limit run skipped"
    else
        echo "$out"
        [ "$rc" = 0 ] && [ "$(pass_lines "$out")" = 7 ] || { echo "--random under CASTLE_LOOP_LIMIT=2500: exit status $rc"; exit 1; }
    fi
fi
# a broken kernel fails, and the failed case comes back under its number
mkdir "$TMPDIR_CASES/cl"
cp "$cldir"/* "$TMPDIR_CASES/cl/"
sed -i 's|const vfloat x = acc\[(ci \* FUPC + m) \* MT_ACC + e\] \* sc|& * 1.001f|' "$TMPDIR_CASES/cl/causal.cl"
! cmp -s "$cldir/causal.cl" "$TMPDIR_CASES/cl/causal.cl" || { echo "the broken copy of causal.cl is not broken"; exit 1; }
rc=0
out=$(CASTLE_CL_DIR=$TMPDIR_CASES/cl "$tool" --random 3 --seed 11 --ops causal_forward) || rc=$?
echo "$out"
[ "$rc" = 1 ] || { echo "a broken causal forward: exit status $rc, expected 1"; exit 1; }
k=$(grep -m1 -oE '^  FAIL case [0-9]+:' <<<"$out" | grep -oE '[0-9]+') || { echo "no failed case named"; exit 1; }
rc=0
again=$(CASTLE_CL_DIR=$TMPDIR_CASES/cl "$tool" --random $((k + 1)) --seed 11 --ops causal_forward) || rc=$?
[ "$rc" = 1 ] && grep -q "^  FAIL case $k:" <<<"$again" || { echo "--seed 11 --random $((k + 1)): case $k did not fail again: $again"; exit 1; }
echo "castle-conformance smoke test passed"
