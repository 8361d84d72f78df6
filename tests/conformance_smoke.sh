#!/usr/bin/env bash
# castle-conformance end to end on the quick tier: one PASS line per operation in the documented
# format, a valid --json report (device name, vendor, driver, tuning), exit 2 on bad usage; then the
# quick tier again under every distinct tuning of the built-in table (castle-info --table) forced
# through CASTLE_TUNING, so that each kernel mapping the table can pick for some device (the CPU and
# the GPU mapping) is checked on this one; an entry too large for the device is said, not hidden.
# The device is CASTLE_DEVICE's (default 0:0).
# usage: conformance_smoke.sh <castle-conformance> <castle-info>
set -euo pipefail
tool=$1
info=$2
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
    "stray"; do
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
echo "castle-conformance smoke test passed"
