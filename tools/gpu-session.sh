#!/usr/bin/env bash
# gpu-session.sh: the measurements a session with a lent GPU makes, in one run, so that its few
# minutes of device time go to measuring and none to typing: the self-test, the block kernels with
# per-kernel profiles (the kernels as built and, with --before, an earlier copy of cl/ for an A/B in
# the same run), decode at a long cache, every operation past 65535 heads, random conformance cases
# with the loops in pieces (a small CASTLE_LOOP_LIMIT), and PyTorch's anchors
# (tools/torch-anchors.py) where PyTorch is installed.  Each kernel
# set builds into its own binary cache under OUT, which brings the driver's PTX back for
# tools/ptx-report.sh --from-cache.  Every step has a time limit; a step that fails or times out is
# reported and the next one runs.
#
# usage: tools/gpu-session.sh [--before DIR] [--tuning T]... [--L N] [--t N] [--batch N] [--heads N]
#                              [--many-heads N] [--budget S] [--limit-scale K] [--pack]
#   --before DIR  a copy of an earlier cl/ (tools/gpu-session.sh --prepare REV makes one) to time
#                 against the built kernels, alternating, in the same run
#   --tuning T    also time the built kernels under tuning T (passed as CASTLE_TUNING: missing keys
#                 keep the device's entry, but vector, tm, tn, decode, bthreads, btm, stage, accum,
#                 fthreads, fdchunk and fregs are derived again unless T gives them: give a whole
#                 entry and change one key, "$E,tm=4"), alternating with the others; repeatable: the sets t1,
#                 t2, ... in the order given, listed in tunings.txt
#   --L N, --t N  sequence length of the block kernels (4096) and cache length of decode (32768)
#   --batch N, --heads N  batch entries and heads (2, 16: docs/performance.md's GPU shape)
#   --many-heads N  heads of the step that runs every operation on one batch entry of N heads at
#                 L = 64 (default 70000: past 65535, the grid's limit in y on CUDA devices)
#   --budget S    skip the steps that would start after S seconds (default 420)
#   --limit-scale K  multiply every step's time limit (120 or 200 s) by K (default 1): for a device
#                 whose first run of a kernel set compiles for minutes (PoCL on a small CPU, cold)
#   --pack        at the end, move every file of the run but summary.txt into OUT/gpu-session.tgz
#                 (for a device tool that brings back only a few files from OUT)
#        tools/gpu-session.sh --prepare REV [DIR]
#   writes REV's cl/ (git archive) to DIR (default .bundle/cl_before), for --before; run it after
#   making the bundle (tools/gpu-bundle.sh), which starts from an empty .bundle
# Output: OUT (default ./gpu-session-out), one file per step (*.txt; launches.txt is castle-bench's
# JSON with each launch's work-groups and time), summary.txt (every timing line), and the caches
# kc_*; with $OUT set (the device tool's folder) everything lands there.  Tools are taken from
# CASTLE_TOOLS, else build/tools, else the bundle's build (/tmp/castle-gpu/build/tools, where
# .bundle/run.sh puts it).
# Here: tools/gpu-bundle.sh, then (for an A/B) tools/gpu-session.sh --prepare REV; on the GPU
# machine, from the checkout's root: bash .bundle/run.sh bash tools/gpu-session.sh --before .bundle/cl_before
set -uo pipefail
usage() { # [status]: 0 to stdout (--help), else to stderr
    local status=${1:-2}
    sed -n '/^# usage:/,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&$((status == 0 ? 1 : 2))
    exit "$status"
}
bad() { echo "gpu-session.sh: $*" >&2; exit 2; }
if [ "${1:-}" = --prepare ]; then
    rev=${2:-}
    [ -n "$rev" ] || bad "--prepare needs a revision"
    dir=${3:-.bundle/cl_before}
    root=$(cd "$(dirname "$0")/.." && pwd)
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    git -C "$root" archive "$rev" cl | tar -x -C "$tmp" || bad "git archive $rev cl failed"
    rm -rf "$dir" && mkdir -p "$(dirname "$dir")" && mv "$tmp/cl" "$dir" || bad "cannot write $dir"
    echo "gpu-session.sh: $rev's cl/ in $dir"
    exit 0
fi
before= L=4096 t=32768 batch=2 heads=16 many=70000 budget=420 scale=1 pack=0 tunings=()
num() { [[ $2 =~ ^[1-9][0-9]*$ ]] || bad "$1 needs a positive integer, not '$2'"; }
while [ $# -gt 0 ]; do
    case $1 in
    -h | --help) usage 0 ;;
    --before) [ $# -ge 2 ] || bad "--before needs a folder"; before=$2; shift 2 ;;
    --pack) pack=1; shift ;;
    --tuning) [ $# -ge 2 ] && [ -n "$2" ] || bad "--tuning needs a tuning"; tunings+=("$2"); shift 2 ;;
    --L | --t | --batch | --heads | --many-heads | --budget | --limit-scale)
        [ $# -ge 2 ] || bad "$1 needs a value"
        num "$1" "$2"
        case $1 in
        --L) L=$2 ;; --t) t=$2 ;; --batch) batch=$2 ;; --heads) heads=$2 ;; --many-heads) many=$2 ;;
        --budget) budget=$2 ;;
        --limit-scale) scale=$2 ;;
        esac
        shift 2 ;;
    *) bad "unknown option $1" ;;
    esac
done
[ -z "$before" ] || [ -f "$before/common.cl" ] || bad "--before $before: not a copy of cl/ (no common.cl)"
[ -z "$before" ] || before=$(cd "$before" && pwd)
tools=${CASTLE_TOOLS:-}
if [ -z "$tools" ]; then
    for d in "$(dirname "$0")/../build/tools" /tmp/castle-gpu/build/tools; do
        [ -x "$d/castle-bench" ] && { tools=$(cd "$d" && pwd); break; }
    done
fi
[ -n "$tools" ] && [ -x "$tools/castle-bench" ] || bad "no castle-bench (set CASTLE_TOOLS)"
out=${OUT:-gpu-session-out}
mkdir -p "$out" || bad "cannot create $out"
out=$(cd "$out" && pwd)
start=$SECONDS failed=0 made=() # made: the files of OUT this run writes, but summary.txt
step() { # <name> <limit s> <command...>: output to $out/<name>.txt, the outcome on stdout
    local name=$1 limit=$(($2 * scale)) rc=0 t0=$SECONDS
    shift 2
    if ((SECONDS - start >= budget)); then
        echo "-- $name: skipped (budget of $budget s spent)"
        return
    fi
    made+=("$name.txt")
    timeout "$limit" "$@" >"$out/$name.txt" 2>&1 || rc=$?
    if [ $rc = 0 ]; then
        echo "-- $name: ok in $((SECONDS - t0)) s"
    else
        failed=$((failed + 1))
        echo "-- $name: FAILED (exit $rc$([ $rc = 124 ] && echo ", over $limit s")) in $((SECONDS - t0)) s; its last lines:"
        tail -5 "$out/$name.txt" | sed 's/^/   /'
    fi
}
shape=(--batch "$batch" --heads "$heads")
bench() { # <kernel set: now|before|tN>: cmd = castle-bench on that set's kernels, tuning and binary cache
    cmd=(env CASTLE_CACHE_DIR="$out/kc_$1")
    [ "$1" = before ] && cmd+=(CASTLE_CL_DIR="$before")
    [[ $1 == t[0-9]* ]] && cmd+=(CASTLE_TUNING="${tunings[${1#t} - 1]}")
    cmd+=("$tools/castle-bench" "${shape[@]}" --gemm 0)
}
sets=(now)
[ -n "$before" ] && sets+=(before)
: >"$out/tunings.txt"
made+=(tunings.txt)
for i in "${!tunings[@]}"; do
    sets+=("t$((i + 1))")
    echo "t$((i + 1)) ${tunings[i]}" >>"$out/tunings.txt"
done
echo "gpu-session.sh: tools $tools, output $out, L=$L t=$t B=$batch H=$heads${before:+, before: $before}" \
    "${tunings[*]:+, tunings: ${tunings[*]}}"
step info 120 env CASTLE_CACHE_DIR="$out/kc_now" "$tools/castle-info"
for round in 1 2; do # alternating, so that a drift of the device's clocks shows as such
    for set in "${sets[@]}"; do
        bench "$set"
        step "bench_${set}_$round" 200 "${cmd[@]}" --L "$L" --repeat 5 --profile --ops forward,backward \
            --impls castle,swl,causal --interleave # a backward / forward ratio from the same seconds
    done
done
# each launch's work-groups and time (launch_groups, launch_ms): how the wavefront fills the device
bench now
step launches 120 "${cmd[@]}" --L "$L" --repeat 5 --profile --ops forward,backward --impls castle --json
for set in "${sets[@]}"; do
    bench "$set"
    step "decode$([ "$set" = now ] || echo "_$set")" 120 "${cmd[@]}" --t "$t" --ops decode --impls castle,swl,causal \
        --repeat 10
done
# batch x heads past 65535 (the grid's limit in y on CUDA devices, where OpenCL's dimension 1, the
# kernels' batch x head, may land; the library cuts it into launches of at most 65535 work-groups,
# host/launch.c): each operation runs or names its failure
step many_heads 120 env CASTLE_CACHE_DIR="$out/kc_now" "$tools/castle-bench" --batch 1 --heads "$many" --L 64 --t 64 \
    --gemm 0 --repeat 1 --ops forward,backward,decode --impls castle,causal
# the kernels' pieces (host/loops.c): under a small loop limit the causal kernels and the prefill's U
# pass run in launches over ranges of their loops, adding to the sums (llvmpipe needs it; other
# devices run one launch): random cases against the fp64 reference, on this device's compiler too
if [ -x "$tools/castle-conformance" ]; then
    step pieces 120 env CASTLE_CACHE_DIR="$out/kc_now" CASTLE_LOOP_LIMIT=2000 "$tools/castle-conformance" \
        --random 6 --seed 13
fi
anchors=$(dirname "$0")/torch-anchors.py
if [ -f "$anchors" ] && python3 -c "import torch" 2>/dev/null; then
    step anchors 120 python3 "$anchors" --L "$L" --batch "$batch" --heads "$heads"
fi
# the summary: the tuning sets (set=tN tuning=T), then every castle-bench line of the bench and
# decode steps, tagged by step
{
    sed 's/^\(t[0-9]*\) /set=\1 tuning=/' "$out/tunings.txt"
    for f in "$out"/bench_*.txt "$out"/decode*.txt "$out"/anchors.txt; do
        [ -f "$f" ] || continue
        grep -E '^(op=|anchor=)' "$f" | grep -v '^op=.*launch_' | sed "s/\$/ step=$(basename "$f" .txt)/"
    done
} >"$out/summary.txt"
# --pack: the files this run wrote (steps, caches), not whatever else OUT holds, into one archive
if [ "$pack" = 1 ]; then
    for set in "${sets[@]}"; do
        [ -e "$out/kc_$set" ] && made+=("kc_$set")
    done
    if tar -czf "$out/gpu-session.tgz" -C "$out" summary.txt "${made[@]}"; then
        (cd "$out" && rm -rf -- "${made[@]}")
        echo "gpu-session.sh: packed into $out/gpu-session.tgz (tar -xzf it, then tools/ptx-report.sh" \
            "--from-cache kc_now)"
    else
        echo "gpu-session.sh: --pack: tar failed; the files stay in $out"
        failed=$((failed + 1))
    fi
fi
echo "gpu-session.sh: $failed step(s) failed, $((SECONDS - start)) s; summary in $out/summary.txt" \
    "$([ "$pack" = 1 ] || echo "(then tools/ptx-report.sh --from-cache $out/kc_now here)")"
cat "$out/summary.txt"
[ $failed = 0 ]
