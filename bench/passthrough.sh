#!/usr/bin/env bash
# Reading a complete local copy through the mount (FUSE passthrough) against reading the
# same local file directly: `ferry mount --cache-dir`, one read to fill and verify the
# copy, then timed reads of both (`cp FILE /dev/null`, or dd with 1 MiB blocks), page cache
# dropped before each; which of the two goes first alternates from run to run.
#
#   bench/passthrough.sh [--size-mib N] [--runs N] [--kinds random,db] [--tool cp|dd]
#
# Prints one line per read and the ratio of the medians. Needs root (drops caches, FUSE
# passthrough needs CAP_SYS_ADMIN). Nothing is left mounted or running.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

size=1024 runs=3 kinds=random,db tool=cp
while [ $# -gt 0 ]; do
    case "$1" in
        --tool) tool=$2; shift 2 ;;
        --size-mib) size=$2; shift 2 ;;
        --runs) runs=$2; shift 2 ;;
        --kinds) kinds=$2; shift 2 ;;
        *) echo "passthrough.sh: unknown argument $1 (see the header of this script)" >&2; exit 2 ;;
    esac
done
[ "$(id -u)" -eq 0 ] || { echo "passthrough.sh: run as root (drops the page cache; passthrough needs CAP_SYS_ADMIN)" >&2; exit 1; }
bash scripts/prereqs.sh
cargo build --release --bins >/dev/null 2>&1 || cargo build --release --bins
data=bench/out/data
mkdir -p "$data"
python3 scripts/gen-data.py "$data" --size-mib "$size" --only "$kinds" >/dev/null

# shellcheck source=bench/lib.sh
. bench/lib.sh
bench_start ferry-pt
mnt=$work/mnt cache=$work/cache
bench_mountpoint "$mnt"
mkdir -p "$cache"
bench_ferryd "$data"
target/release/ferry mount "$ferryd_addr" "$mnt" --cache-dir "$cache" --log-file "$work/ferry.log" -v

secs() { # secs FILE: seconds to read FILE with cp (or dd), cold
    sync; echo 3 > /proc/sys/vm/drop_caches
    local t0 t1; t0=$(date +%s.%N)
    if [ "$tool" = dd ]; then dd if="$1" of=/dev/null bs=1M status=none; else cp "$1" /dev/null; fi
    t1=$(date +%s.%N)
    awk -v a="$t0" -v z="$t1" 'BEGIN { printf "%.3f", z - a }'
}
median() { tr ' ' '\n' | sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }

echo "ferry $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(date -u +%F), $(nproc) cores, kernel $(uname -r), reads with $tool"
IFS=, read -ra kind_list <<<"$kinds"
for kind in "${kind_list[@]}"; do
    case "$kind" in random) f=random.bin ;; db) f=db.dat ;; mixed) f=mixed.bin ;; *) echo "unknown kind $kind" >&2; exit 2 ;; esac
    bytes=$(stat -c %s "$data/$f")
    # Fill the local copy, then wait until it is recorded and verified.
    dd if="$mnt/$f" of=/dev/null bs=1M status=none
    for _ in $(seq 300); do grep -q "verified /$f\$" "$work/ferry.log" && break; sleep 0.2; done
    grep -q "verified /$f\$" "$work/ferry.log" || { echo "passthrough.sh: $f was not verified within 60 s" >&2; exit 1; }
    sleep 1.5   # the verified record is committed within the syncer's 1 s interval
    cmp "$data/$f" "$cache/$f"
    via=() direct=()
    for r in $(seq "$runs"); do
        if [ $((r % 2)) = 1 ]; then
            s=$(secs "$mnt/$f"); d=$(secs "$cache/$f")
        else
            d=$(secs "$cache/$f"); s=$(secs "$mnt/$f")
        fi
        via+=("$s") direct+=("$d")
        awk -v b="$bytes" -v s="$s" -v d="$d" -v f="$f" -v r="$r" \
            'BEGIN { printf "%-10s run %d: through the mount %.2f s (%.0f MB/s), local file %.2f s (%.0f MB/s)\n", f, r, s, b/s/1e6, d, b/d/1e6 }'
    done
    ms=$(echo "${via[*]}" | median) md=$(echo "${direct[*]}" | median)
    awk -v s="$ms" -v d="$md" -v f="$f" 'BEGIN { printf "%-10s median: through the mount / local = %.2f (speed ratio)\n", f, d / s }'
done
fusermount3 -u "$mnt"
sleep 0.5
grep -o 'local copy: .*' "$work/ferry.log" | tail -1
