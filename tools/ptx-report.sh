#!/usr/bin/env bash
# ptx-report.sh: registers, stack frame and spills of every kernel of the library under a tuning,
# as NVIDIA's ptxas reports them for the PTX that clang's NVPTX back end (with libclc's nvptx64
# library) makes of the kernels' OpenCL source.  It needs no GPU: it tells whether a work-item's
# micro-tiles and accumulators stay in registers (a private array indexed at run time shows up as a
# stack frame; one that does not fit, as spills).  NVIDIA's own OpenCL compiler allocates registers
# its own way, so these are a proxy for the driver's numbers, not the numbers themselves.
#
# usage: tools/ptx-report.sh BUILD_DIR [--tuning T] [--class C] [--arch SM] [--max-regs N] [--no-stack K1,K2,...]
#        tools/ptx-report.sh --from-cache DIR [--arch SM] [--max-regs N] [--no-stack K1,K2,...]
#   BUILD_DIR  a build of the library (its castle-info gives the tuning table)
#   --from-cache DIR  instead, the PTX that NVIDIA's own OpenCL compiler made: the program binaries
#              of a library binary cache (CASTLE_CACHE_DIR=DIR on the GPU machine, then DIR copied
#              here; NVIDIA's program binaries are PTX), one line per kernel, the entry's file
#              (its key hash) in place of the family; entries that are not PTX are skipped
#   --tuning T a tuning in CASTLE_TUNING's syntax over the built-in nvidia-gpu entry: the keys
#              given replace its values, a later key an earlier one (tm=4,bthreads=64 or a whole
#              castle-info --table line); keys left out keep the entry's values, not derived again
#              as the library would; an unknown key or a value not decimal: exit status 2
#   --class C  head-dimension class of the causal and cache programs under accum = 2 (64, 128 or
#              256; default 64); ignored under accum = 1, where every program serves every d
#   --arch SM  ptxas target (default sm_90)
#   --max-regs N  registers per work-item at most (ptxas -maxrregcount): what a kernel spills under a
#              cap, such as the 128 NVIDIA's OpenCL compiler gave the forward and backward of the GPU
#              entry on an H200 (docs/performance.md); default: the tuning's own caps, fregs for the
#              forwards and regs for the rest (the library's -cl-nv-maxrregcount), where they are
#              not 0, else no cap
#   --no-stack exit 1 unless each kernel named has a stack frame of 0 bytes
# Prints one line per kernel: family, kernel, stack bytes, spill-store bytes, registers, and the
# static instruction mix of its PTX: fma (fma.rn.f32), lds=S/V2/V4, its loads from local memory
# one, two and four floats wide (a vload4 from local memory that the compiler cannot prove 16-byte
# aligned becomes four scalar loads; cl/common.cl's LM_ALIGNED), and ldg=S/V2/V4, its loads from
# global memory by width (cl/common.cl's gload4), and smem=B, its local memory in bytes (a
# work-group's static __local arrays; with the registers, what sets how many groups share a
# compute unit); a kernel's counts, stack frame and spill stores include those of the functions it
# calls (cl/common.cl's FOLD_PAIR), which ptxas lists apart.
# PTX_KEEP=DIR keeps the sources, PTX, logs and cubins there.
# Needs clang 15 (Debian's clang-15), libclc-15 (its nvptx64--nvidiacl.bc) and ptxas (the CUDA
# toolkit); PTX_CLANG, PTX_LIBCLC and PTXAS name them where they are elsewhere.  The program of a
# family is assembled as the library assembles it (host/program.c): cl/local_memory.h,
# cl/common.cl, then the family's file, each after a #line directive (messages name the file and
# its line), with one -D option per parameter of castle.h's
# CASTLE_TUNING_PARAMS (the backward family under bthreads and btm as threads and tm, the forward
# under fthreads and fdchunk as threads and dchunk); causal_forward is cl/causal.cl's forward kernel
# alone (-DCC_FORWARD_ONLY) under the forward's parameters, the program the library runs it from where
# they differ from threads and dchunk (the GPU entries).
set -euo pipefail
usage() { # [status]: 0 to stdout (--help), else to stderr
    local status=${1:-2}
    sed -n '/^# usage:/,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&$((status == 0 ? 1 : 2))
    exit "$status"
}
case ${1:--h} in -h | --help) usage 0 ;; esac
value() { # <option> <value...>: the value, or bad usage (exit 2) when it is missing or empty
    [ $# -ge 2 ] && [ -n "$2" ] || { echo "ptx-report.sh: $1 needs a value" >&2; usage; }
    printf '%s' "$2"
}
build= cache=
if [ "$1" = --from-cache ]; then
    cache=$(value "$@") || exit 2
    shift 2
else
    build=$1
    shift
    [ -d "$build" ] || { echo "ptx-report.sh: $build is not a build directory" >&2; usage; }
fi
tuning= class=64 arch=sm_90 nostack= maxregs=()
while [ $# -gt 0 ]; do
    case $1 in
    --tuning) tuning=$(value "$@") || exit 2; shift 2 ;;
    --class) class=$(value "$@") || exit 2; shift 2 ;;
    --arch) arch=$(value "$@") || exit 2; shift 2 ;;
    --max-regs)
        [[ ${2:-} =~ ^[1-9][0-9]*$ ]] || { echo "ptx-report.sh: --max-regs needs a positive number" >&2; exit 2; }
        maxregs=(-maxrregcount="$2"); shift 2 ;;
    --no-stack) nostack=$(value "$@") || exit 2; shift 2 ;;
    -h | --help) usage 0 ;;
    *) echo "ptx-report.sh: unknown option $1" >&2; usage ;;
    esac
done
ptxas=${PTXAS:-$(command -v ptxas || echo /usr/local/cuda/bin/ptxas)}
work=${PTX_KEEP:-$(mktemp -d)}
[ -n "${PTX_KEEP:-}" ] || trap 'rm -rf "$work"' EXIT
mkdir -p "$work"
: >"$work/report" # this run's lines only (--no-stack reads them), also in a kept folder
status=0
report_log() { # <label> <ptxas -v log> <PTX>: one line per kernel, also kept in $work/report
    # the PTX's static instruction mix per entry: fma.rn.f32, ld.shared and ld.global by width (1, 2,
    # 4), with those of the functions it calls, directly or not (.func: cl/common.cl's FOLD_PAIR),
    # added to the caller's, each function once however many paths reach it; then those functions
    # (calls=)
    awk 'BEGIN { stmt = "-" } # "-": outside a call statement
         /\.(entry|func)[ \t]/ { k = $0; sub(/.*\.(entry|func)[ \t]+/, "", k)
                                sub(/^\([^)]*\)[ \t]*/, "", k); sub(/[( \t].*/, "", k) # a .func: (results) name(params
                                if ($0 ~ /\.entry/) entry[k] = 1; next }
         # a call statement, on one line or several up to its ";": call[.uni] [(results),] callee, (args)
         k && /^[ \t]*(@!?%p[0-9]+[ \t]+)?call(\.uni)?([ \t]|$)/ { stmt = "" }
         k && stmt != "-" { stmt = stmt " " $0
                            if (index($0, ";")) { c = stmt; stmt = "-"
                                                  sub(/^[ \t]*(@!?%p[0-9]+[ \t]+)?call(\.uni)?[ \t]*/, "", c)
                                                  sub(/^\([^)]*\)[ \t]*,[ \t]*/, "", c); sub(/[ \t,(;].*/, "", c)
                                                  if (c != "") calls[k, c] = 1 } }
         k && /^[ \t]*(@!?%p[0-9]+[ \t]+)?fma\.rn\.f32/ { n[k, "f"]++ }
         k && /^[ \t]*(@!?%p[0-9]+[ \t]+)?ld\.shared/ { n[k, "s" (/\.v4\./ ? 4 : /\.v2\./ ? 2 : 1)]++ }
         k && /^[ \t]*(@!?%p[0-9]+[ \t]+)?ld\.global\.(nc\.)?(v[24]\.)?f32/ { n[k, "g" (/\.v4\./ ? 4 : /\.v2\./ ? 2 : 1)]++ }
         function reach(u, depth,   e, a) { # the functions u calls, directly or not, each once, into seen[]
             if (depth < 8) for (e in calls) { split(e, a, SUBSEP)
                                               if (a[1] == u && !(a[2] in seen)) { seen[a[2]] = 1; reach(a[2], depth + 1) } } }
         function tot(u, c,   f, t) { t = n[u, c] + 0; for (f in seen) t += n[f, c]; return t }
         END { for (e in entry) { split("", seen); reach(e, 0); t = ""; for (f in seen) t = t "," f
                   printf "%s fma=%d lds=%d/%d/%d ldg=%d/%d/%d calls=%s\n", e, tot(e, "f"), tot(e, "s1"),
                          tot(e, "s2"), tot(e, "s4"), tot(e, "g1"), tot(e, "g2"), tot(e, "g4"), t } }' \
        "$3" >"$work/mix"
    # ptxas -v: each function's stack frame and spill stores ("Function properties for F"), each
    # entry's registers (those of the functions it calls included); an entry's stack and spill are
    # its own plus those of every function it calls, which ptxas lists apart
    awk -v fam="$1" -v mixfile="$work/mix" '
        BEGIN { while ((getline line < mixfile) > 0) { split(line, a, " ")
                                                        mix[a[1]] = a[2] " " a[3] " " a[4]; sub(/^calls=/, "", a[5]); calls[a[1]] = a[5] } }
        /Function properties for/ { f = $NF; gsub(/\047/, "", f) }
        /Compiling entry function/ { k = $0; sub(/.*function .\047?/, "", k); sub(/\047.*/, "", k); order[++nk] = k }
        /bytes stack frame/ { st[f] = $1; sp[f] = $5 } # frame bytes, spill-store bytes
        /Used [0-9]+ registers/ { for (i = 1; i <= NF; ++i) { if ($i == "Used") r[k] = $(i + 1)
                                                              if ($i ~ /^smem,?$/) sm[k] = $(i - 2) } }
        END { for (i = 1; i <= nk; ++i) { k = order[i]; s = st[k] + 0; p = sp[k] + 0
                  nc = split(calls[k], c, ","); for (j = 1; j <= nc; ++j) if (c[j] != "") { s += st[c[j]]; p += sp[c[j]] }
                  m = (k in mix) ? mix[k] : "fma=0 lds=0/0/0 ldg=0/0/0"
                  printf "%-9s %-28s stack=%-5s spill=%-5s regs=%-4s %s smem=%d\n", fam, k, s, p, r[k], m, sm[k] } }' \
        "$2" | tee -a "$work/report"
}
if [ -n "$cache" ]; then
    [ -d "$cache" ] || { echo "ptx-report.sh: $cache is not a directory" >&2; exit 2; }
    [ -e "$ptxas" ] || { echo "ptx-report.sh: $ptxas not found (the CUDA toolkit's ptxas)" >&2; exit 2; }
    n=0
    for f in "$cache"/*.bin; do
        [ -e "$f" ] || continue
        # an entry (host/bincache.c): "CASTLEBIN2\0", key hash, size and checksum (35 bytes), then
        # the driver's program binary, for NVIDIA's the PTX text and a terminating zero
        tail -c +36 "$f" | tr -d '\000' >"$work/entry.ptx"
        grep -q '\.entry' "$work/entry.ptx" || continue
        n=$((n + 1))
        name=$(basename "$f" .bin)
        if ! "$ptxas" -arch="$arch" "${maxregs[@]}" -v "$work/entry.ptx" -o "$work/entry.cubin" 2>"$work/entry.log"; then
            echo "ptx-report.sh: ptxas failed on $f:" >&2
            head -5 "$work/entry.log" >&2
            status=1
            continue
        fi
        report_log "${name:0:12}" "$work/entry.log" "$work/entry.ptx"
    done
    [ "$n" -gt 0 ] || { echo "ptx-report.sh: no PTX program among $cache/*.bin" >&2; exit 1; }
else
    case $class in 64 | 128 | 256) ;; *) echo "ptx-report.sh: --class must be 64, 128 or 256" >&2; exit 2 ;; esac
    root=$(cd "$(dirname "$0")/.." && pwd)
    clang=${PTX_CLANG:-$(command -v clang-15 || echo /usr/lib/llvm-15/bin/clang)}
    clc=${PTX_LIBCLC:-/usr/lib/clc/nvptx64--nvidiacl.bc}
    for f in "$clang" "$clc" "$ptxas"; do
        [ -e "$f" ] || { echo "ptx-report.sh: $f not found (clang-15, libclc-15 and the CUDA toolkit's ptxas)" >&2; exit 2; }
    done
    # the tuning: the nvidia-gpu entry, then --tuning's keys over it in order (a later one wins, as
    # in CASTLE_TUNING; keys left out keep the entry's values, which are not derived again)
    entry=$("$build/tools/castle-info" --table | awk -F'\t' '$1 == "nvidia-gpu" { print $2 }')
    [ -n "$entry" ] || { echo "ptx-report.sh: castle-info --table lists no nvidia-gpu entry" >&2; exit 1; }
    declare -A tv
    for kv in ${entry//,/ }; do tv[${kv%%=*}]=${kv#*=}; done
    for kv in ${tuning//,/ }; do
        [[ $kv =~ ^([a-z]+)=([0-9]+)$ ]] || { echo "ptx-report.sh: --tuning: '$kv' is not key=decimal" >&2; exit 2; }
        [ -n "${tv[${BASH_REMATCH[1]}]+set}" ] ||
            { echo "ptx-report.sh: --tuning: no tuning parameter '${BASH_REMATCH[1]}'" >&2; exit 2; }
        tv[${BASH_REMATCH[1]}]=${BASH_REMATCH[2]}
    done
    value() { # <param>: its value in the tuning
        [ -n "${tv[$1]+set}" ] || { echo "ptx-report.sh: the nvidia-gpu entry gives no $1" >&2; exit 1; }
        echo "${tv[$1]}"
    }
    # the kernel macros of castle.h's list: X(field, "MACRO", ...)
    mapfile -t params < <(grep -oE 'X\([a-z]+, "[A-Z]+"' "$root/lib/include/castle/castle.h" | sed -E 's/X\(([a-z]+), "([A-Z]+)"/\1 \2/')
    [ "${#params[@]}" -ge 5 ] || { echo "ptx-report.sh: cannot read CASTLE_TUNING_PARAMS from castle.h" >&2; exit 1; }
    const() { grep -m1 -E "^#define $1 " "$2" | awk '{ print $3 }'; }
    maxd=$(const CASTLE_MAX_HEAD_DIM "$root/lib/include/castle/castle.h")
    rows=$(const CASTLE_DECODE_ROWS "$root/host/causal.h")
    group=$(const CASTLE_DECODE_GROUP "$root/host/causal.h")
    for family in forward backward causal causal_forward cache; do
        file=${family%_forward} opts=() # causal_forward: cl/causal.cl
        if [ "$family" = causal_forward ]; then opts+=(-DCC_FORWARD_ONLY=1); fi
        for p in "${params[@]}"; do
            name=${p% *} macro=${p#* }
            v=$(value "$name")
            # the family's own parameters, as host/program.c's castle__family_tuning gives them
            case $family/$name in
            backward/threads) v=$(value bthreads) ;;
            backward/tm) v=$(value btm) ;;
            forward/threads | causal_forward/threads) v=$(value fthreads) ;;
            forward/dchunk | causal_forward/dchunk) v=$(value fdchunk) ;;
            esac
            opts+=("-D$macro=$v")
        done
        # the tuning's register cap of the family (fregs for the forwards, else regs; 0 or absent:
        # none), unless --max-regs gives one for all
        cap=()
        if [ ${#maxregs[@]} -eq 0 ]; then
            r=$(value regs) fr=$(value fregs)
            case $family in forward | causal_forward) [ "${fr:-0}" = 0 ] || r=$fr ;; esac
            [ "${r:-0}" = 0 ] || cap=(-maxrregcount="$r")
        fi
        dclass=$maxd
        if [ "$(value accum)" = 2 ] && [ "$family" != forward ] && [ "$family" != backward ]; then
            dclass=$class
        fi
        # with host/program.c's #line directives, so that compiler messages name cl/ files and lines
        {
            printf '/* libcastle */\n#line 1 "local_memory.h"\n'
            cat "$root/cl/local_memory.h"
            printf '\n#line 1 "common.cl"\n'
            cat "$root/cl/common.cl"
            printf '\n#line 1 "%s.cl"\n' "$file"
            cat "$root/cl/$file.cl"
        } >"$work/$family.cl"
        # OpenCL C's plain `inline` is C99's: clang may leave a call to it unresolved; the drivers inline
        "$clang" -x cl -cl-std=CL1.2 -target nvptx64--nvidiacl -Xclang -mlink-builtin-bitcode -Xclang "$clc" \
            -Xclang -finclude-default-header -O3 -S "-Dinline=__attribute__((always_inline)) inline" \
            "${opts[@]}" -DCASTLE_MAX_HEAD_DIM="$maxd" -DCASTLE_HEAD_DIM_CLASS="$dclass" \
            -DCASTLE_DECODE_ROWS="$rows" -DCASTLE_DECODE_GROUP="$group" -Wno-pass-failed \
            -o "$work/$family.ptx" "$work/$family.cl"
        # ptxas wants a PTX version and target it knows
        sed -i -E "s/^\.version .*/.version 7.8/; s/^\.target .*/.target $arch/" "$work/$family.ptx"
        "$ptxas" -arch="$arch" "${maxregs[@]}" "${cap[@]}" -v "$work/$family.ptx" -o "$work/$family.cubin" 2>"$work/$family.log"
        report_log "$family" "$work/$family.log" "$work/$family.ptx"
    done
fi
if [ -n "$nostack" ]; then
    for k in ${nostack//,/ }; do
        line=$(awk -v k="$k" '$2 == k' "$work/report")
        if [ -z "$line" ]; then
            echo "ptx-report.sh: no kernel $k" >&2
            status=1
        elif grep -qv "stack=0 " <<<"$line"; then # every program that has the kernel
            echo "ptx-report.sh: $k has a stack frame: $line" >&2
            status=1
        fi
    done
fi
exit $status
