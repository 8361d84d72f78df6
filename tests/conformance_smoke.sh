#!/usr/bin/env bash
# castle-conformance end to end on the quick tier: one PASS line per operation in the documented
# format, a valid --json report (device name, vendor, driver, tuning), exit 2 on bad usage.
# The device is CASTLE_DEVICE's (default 0:0).
# usage: conformance_smoke.sh <castle-conformance>
set -euo pipefail
tool=$1
out=$("$tool" --quick)
echo "$out"
n=$(grep -cE '^device=[0-9]+:[0-9]+ op=(forward|backward|decode|decode_chunked|causal_forward|causal_backward|causal_decode) cases=[1-9][0-9]* worst_err=[0-9.e+-]+ tol=[0-9.e+-]+ result=PASS seconds=[0-9.]+$' <<<"$out")
[ "$n" = 7 ] || { echo "expected 7 PASS lines, found $n"; exit 1; }
json=$("$tool" --quick --ops forward,causal_decode --json)
python3 -c '
import json, sys
d = json.loads(sys.argv[1])
assert d["pass"] is True and d["mode"] == "quick" and len(d["devices"]) == 1, d
dev = d["devices"][0]
assert dev["name"] and dev["vendor"] and dev["driver_version"] and dev["tuning"]["block"] > 0, dev
assert [o["op"] for o in dev["ops"]] == ["forward", "causal_decode"], dev["ops"]
assert all(o["pass"] and o["cases"] > 0 and 0 <= o["worst_err"] <= o["tol"] for o in dev["ops"]), dev["ops"]
' "$json" || { echo "bad JSON: $json"; exit 1; }
for bad in "--bogus" "--device x:y" "--ops sideways" "--all --device 0:0" "stray"; do
    rc=0
    # shellcheck disable=SC2086
    "$tool" $bad >/dev/null 2>&1 || rc=$?
    [ "$rc" = 2 ] || { echo "castle-conformance $bad: exit status $rc, expected 2"; exit 1; }
done
echo "castle-conformance smoke test passed"
