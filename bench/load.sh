#!/usr/bin/env bash
# Load: N clients (default 32) mirror the same data set from one ferryd at once, over
# loopback. Reports every client's time and rate (min, median, max), ferryd's peak resident
# memory, and checks that every mirror completed verified (`ferry mirror` exits 0 only then)
# and, with `diff -r`, that a few of them equal the source.
#
#   bench/load.sh [--clients N] [--streams N] [--dataset dbdir] [--out FILE]
#
# Needs the data set generated (bench/out/data, made by bench/run.sh or
# scripts/gen-data.py) and free disk space for N copies. Nothing is left running.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

clients=32 streams=4 dataset=dbdir out=""
while [ $# -gt 0 ]; do
    case "$1" in
        --clients) clients=$2; shift 2 ;;
        --streams) streams=$2; shift 2 ;;
        --dataset) dataset=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        *) echo "load.sh: unknown argument $1 (see the header of this script)" >&2; exit 2 ;;
    esac
done
data=bench/out/data
[ -d "$data/$dataset" ] || python3 scripts/gen-data.py "$data" --only "$dataset" >&2
cargo build --release --bins -q

# shellcheck source=bench/lib.sh
. bench/lib.sh
bench_start ferry-load
bench_ferryd "$data"
addr=$ferryd_addr
bytes=$(du -sb "$data/$dataset" | cut -f1)
# The source is read once before, so that every client is served from the page cache and
# the run measures ferry, not the first reader's disk.
find "$data/$dataset" -type f -exec cat {} + >/dev/null

log() { printf '[%s] %s\n' "$(date +%T)" "$*" >&2; }
log "$clients clients × $streams streams mirroring $dataset ($(numfmt --to=iec "$bytes")) from ferryd at $addr"
t0=$(date +%s.%N)
: > "$work/results"
pids=()
for i in $(seq "$clients"); do
    (
        s=$(date +%s.%N)
        if target/release/ferry mirror "$addr:/$dataset" "$work/c$i" -q --streams "$streams" 2>"$work/c$i.log"; then
            e=$(date +%s.%N); echo "$i ok $(awk -v a="$s" -v z="$e" 'BEGIN { print z - a }')" >> "$work/results"
        else
            echo "$i failed" >> "$work/results"
        fi
    ) &
    pids+=($!)
done
peak=0
while [ "$(wc -l < "$work/results")" -lt "$clients" ]; do
    kb=$(awk '/VmHWM/ {print $2}' "/proc/$ferryd_pid/status")
    [ "$kb" -gt "$peak" ] && peak=$kb
    sleep 0.5
done
wait "${pids[@]}"
t1=$(date +%s.%N)
peak=$(awk '/VmHWM/ {print $2}' "/proc/$ferryd_pid/status")
failed=$(grep -c failed "$work/results" || true)
checked=0
for i in 1 $((clients / 2)) "$clients"; do
    [ -d "$work/c$i" ] || continue
    diff -r --no-dereference "$data/$dataset" "$work/c$i" >/dev/null || { echo "load.sh: client $i differs from the source" >&2; exit 1; }
    checked=$((checked + 1))
done
report=$(
    echo "ferry $(git rev-parse --short HEAD), $(date -u '+%F %H:%M UTC'), $(nproc) cores, kernel $(uname -r)"
    echo "$clients clients × $streams streams, each mirroring $dataset ($bytes bytes) from one ferryd over loopback"
    grep ' ok ' "$work/results" | sort -k3 -g | awk -v b="$bytes" -v n="$clients" -v wall="$(awk -v a="$t0" -v z="$t1" 'BEGIN { print z - a }')" '
        { t[++k] = $3 }
        END {
            printf "completed and verified: %d of %d; wall time %.1f s; aggregate %.0f MB/s\n", k, n, wall, k * b / wall / 1e6
            printf "per-client time: min %.1f s, median %.1f s, max %.1f s\n", t[1], t[int((k + 1) / 2)], t[k]
            printf "per-client rate: min %.1f MB/s, median %.1f MB/s, max %.1f MB/s\n", b / t[k] / 1e6, b / t[int((k + 1) / 2)] / 1e6, b / t[1] / 1e6
        }'
    echo "ferryd peak resident memory: $((peak / 1024)) MiB"
    echo "failed clients: $failed; copies compared with diff -r: $checked (all identical)"
)
echo "$report"
[ -n "$out" ] && echo "$report" > "$out"
[ "$failed" = 0 ]
