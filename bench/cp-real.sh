#!/usr/bin/env bash
# `cp -r` of trees of real shapes out of a loopback mount: a real source tree (/usr/include and
# the Python standard library) and a real PostgreSQL data directory (initdb + pgbench -i), made
# once in --data. The page cache is dropped before each copy; each copy is checked with
# `diff -r --no-dereference`. Uses target/release binaries (built if missing).
#
#   bench/cp-real.sh [--data DIR] [--runs N] [--pg-scale N]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
data=bench/out/real-data runs=3 scale=10
while [ $# -gt 0 ]; do
    case "$1" in
        --data) data=$2; shift 2 ;;
        --runs) runs=$2; shift 2 ;;
        --pg-scale) scale=$2; shift 2 ;;
        *) echo "cp-real.sh: unknown argument $1 (see the header of this script)" >&2; exit 2 ;;
    esac
done
[ "$(id -u)" -eq 0 ] || { echo "cp-real.sh: run as root (drops the page cache, mounts FUSE)" >&2; exit 1; }
[ -x target/release/ferryd ] && [ -x target/release/ferry ] || cargo build --release --bins
data=$(realpath -m "$data")
die() { echo "cp-real.sh: $*" >&2; exit 1; }
ROOT=$PWD
# shellcheck source=bench/lib.sh
. bench/lib.sh
PG_SCALE=$scale real_trees "$data" src,pgdata

w=$(mktemp -d /tmp/ferry-real.XXXXXX); mkdir -p "$w/mnt" "$w/dst"
export FERRY_STATE_DIR=$w/state
fd=""
cleanup() {
    fusermount3 -u "$w/mnt" 2>/dev/null || umount -l "$w/mnt" 2>/dev/null || true
    [ -n "$fd" ] && kill "$fd" 2>/dev/null; wait 2>/dev/null || true
    rm -rf "$w"
}
trap cleanup EXIT INT TERM
target/release/ferryd --export "$data" --listen 127.0.0.1:0 --port-file "$w/port" 2>"$w/ferryd.log" & fd=$!
for _ in $(seq 50); do [ -s "$w/port" ] && break; sleep 0.1; done
target/release/ferry mount "$(cat "$w/port")" "$w/mnt" --log-file "$w/ferry.log"
echo "ferry $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(date -u +%F), loopback; src: $(find "$data/src" -type f | wc -l) files, pgdata: $(du -sm "$data/pgdata" | cut -f1) MiB"
for r in $(seq "$runs"); do
    for t in src pgdata; do
        rm -rf "${w:?}/dst/$t"; sync; echo 3 > /proc/sys/vm/drop_caches
        t0=$(date +%s.%N); cp -r "$w/mnt/$t" "$w/dst/$t"; t1=$(date +%s.%N)
        diff -r --no-dereference "$data/$t" "$w/dst/$t" >/dev/null || { echo "cp-real.sh: $t differs from the source" >&2; exit 1; }
        printf 'cp -r %-6s run %d: %6.2f s (diff -r identical)\n' "$t" "$r" "$(echo "$t1 - $t0" | bc)"
    done
done
