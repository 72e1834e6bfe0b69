#!/usr/bin/env bash
# Issue-2 benchmark: `cp` of large files from a ferry mount over plain loopback, with the
# peak resident memory (VmHWM) of ferryd and ferry during the copies.
#
#   bench/cp-loopback.sh [--size-mib N] [--runs N] [--kinds random,db,mixed] [--streams N]
#   FERRYD_ARGS="--memory-budget 48" FERRY_ARGS="--max-window 32" bench/cp-loopback.sh
#
# Uses target/release binaries (built if missing) and data from scripts/gen-data.py in
# bench/out/data. The page cache is dropped before every copy (needs root); every copy is
# verified with cmp. Prints one line per copy and a summary; nothing is left mounted or
# running, even on Ctrl-C.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

size=1024 runs=3 kinds=random streams=8
while [ $# -gt 0 ]; do
    case "$1" in
        --size-mib) size=$2; shift 2 ;;
        --runs) runs=$2; shift 2 ;;
        --kinds) kinds=$2; shift 2 ;;
        --streams) streams=$2; shift 2 ;;
        *) echo "cp-loopback.sh: unknown argument $1 (see the header of this script)" >&2; exit 2 ;;
    esac
done

[ "$(id -u)" -eq 0 ] || { echo "cp-loopback.sh: run as root (drops the page cache, mounts FUSE)" >&2; exit 1; }
bash scripts/prereqs.sh
[ -x target/release/ferryd ] && [ -x target/release/ferry ] || cargo build --release --bins

out=bench/out
data=$out/data
mkdir -p "$data"
python3 scripts/gen-data.py "$data" --size-mib "$size" --only "$kinds" >/dev/null

# shellcheck source=bench/lib.sh
. bench/lib.sh
bench_start ferry-bench
mnt=$work/mnt
bench_mountpoint "$mnt"
mkdir -p "$work/dst"
# shellcheck disable=SC2086 # word splitting of the extra arguments is intended
bench_ferryd "$data" ${FERRYD_ARGS:-}
addr=$ferryd_addr
# shellcheck disable=SC2086
target/release/ferry mount "$addr" "$mnt" --streams "$streams" --log-file "$work/ferry.log" ${FERRY_ARGS:-}
ferry_pid=$(pgrep -f -- "ferry mount $addr $mnt" | head -1)

hwm() { awk '/VmHWM/ {print int($2/1024)}' "/proc/$1/status"; }
echo "ferry $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(date -u +%F), $(nproc) cores, loopback, $streams streams, ferryd ${FERRYD_ARGS:-defaults}, ferry ${FERRY_ARGS:-defaults}"
IFS=, read -ra kind_list <<<"$kinds"
for kind in "${kind_list[@]}"; do
    case "$kind" in
        random) f=random.bin ;; db) f=db.dat ;; mixed) f=mixed.bin ;;
        *) echo "unknown kind $kind" >&2; exit 2 ;;
    esac
    bytes=$(stat -c %s "$data/$f")
    for r in $(seq "$runs"); do
        rm -f "$work/dst/$f"
        sync; echo 3 > /proc/sys/vm/drop_caches
        t0=$(date +%s.%N)
        cp "$mnt/$f" "$work/dst/$f"
        t1=$(date +%s.%N)
        cmp "$data/$f" "$work/dst/$f"
        awk -v b="$bytes" -v a="$t0" -v z="$t1" -v f="$f" -v r="$r" \
            'BEGIN { s = z - a; printf "cp %-10s run %d: %6.0f MiB in %6.2f s = %7.1f MB/s (verified)\n", f, r, b/1048576, s, b/s/1e6 }'
    done
done
echo "peak RSS: ferryd $(hwm "$ferryd_pid") MiB, ferry $(hwm "$ferry_pid") MiB, together $(( $(hwm "$ferryd_pid") + $(hwm "$ferry_pid") )) MiB"
