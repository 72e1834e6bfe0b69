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
mkdir -p "$data"
if [ ! -d "$data/src" ]; then
    # Debian's Python standard library (falls back to the running python3's).
    py=$(find /usr/lib -maxdepth 1 -name 'python3.[0-9]*' -type d | sort | tail -1)
    [ -n "$py" ] || py=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
    mkdir -p "$data/src.tmp" && cp -a /usr/include "$data/src.tmp/include" && cp -a "$py" "$data/src.tmp/python"
    mv "$data/src.tmp" "$data/src"
fi
if [ ! -d "$data/pgdata" ]; then
    pgbin=${PGBIN:-$(ls -d /usr/lib/postgresql/*/bin | tail -1)}
    [ -x "$pgbin/initdb" ] || { echo "cp-real.sh: PostgreSQL not found (apt-get install postgresql, or set PGBIN)" >&2; exit 1; }
    sock=$(mktemp -d /tmp/ferry-real-pg.XXXXXX); chown postgres: "$sock"
    mkdir -p "$data/pgdata.tmp" && chown postgres: "$data/pgdata.tmp"
    runuser -u postgres -- "$pgbin/initdb" -D "$data/pgdata.tmp" -U postgres -A trust --no-sync >/dev/null
    runuser -u postgres -- "$pgbin/pg_ctl" -D "$data/pgdata.tmp" -o "-k $sock -p 5497 -c listen_addresses=''" -w start >/dev/null
    "$pgbin/pgbench" -h "$sock" -p 5497 -U postgres -i -q -s "$scale" postgres >/dev/null 2>&1 || true
    runuser -u postgres -- "$pgbin/pg_ctl" -D "$data/pgdata.tmp" -w stop >/dev/null
    rm -rf "$sock"; mv "$data/pgdata.tmp" "$data/pgdata"
fi

w=$(mktemp -d /tmp/ferry-real.XXXXXX); mkdir -p "$w/mnt" "$w/dst"
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
