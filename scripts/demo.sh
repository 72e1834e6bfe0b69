#!/usr/bin/env bash
# make demo: export generated data with ferryd on 127.0.0.1, mount it with `ferry mount`,
# copy each data set out of the mount with cp, time it and check it against the source.
#
#   FERRY_DEMO_MIB=N   size of db.dat, mixed.bin and random.bin in MiB (default 512)
#
# Everything lives under .demo/ in the repository: data/ (generated once, reused by later runs),
# mnt/ (the mount point), out/ (copies, removed at the end), ferryd.log and ferry.log.
# On any exit (success, failure, Ctrl-C) the trap unmounts, stops ferryd and the mount process.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

DEMO=$ROOT/.demo
DATA=$DEMO/data
MNT=$DEMO/mnt
OUT=$DEMO/out
PORT_FILE=$DEMO/port
# The mirror's state (journal, status) beside its copy, removed with it.
export FERRY_STATE_DIR=$OUT/state
MIB=${FERRY_DEMO_MIB:-512}
SMALL_FILES=3000
FERRYD=$ROOT/target/release/ferryd
FERRY=$ROOT/target/release/ferry

FERRYD_PID=""
MOUNT_PIDS=""
SUMMARY=()

log() { printf '\n==> %s\n' "$*"; }
die() {
    printf 'demo: error: %s\n' "$*" >&2
    exit 1
}

# True if $1 is a mount point (read from mountinfo: works on a dead FUSE mount too).
is_mounted() { awk -v m="$1" '$5 == m { found = 1 } END { exit !found }' /proc/self/mountinfo; }

unmount() {
    fusermount3 -u "$1" 2>/dev/null || umount -l "$1" 2>/dev/null || true
}

# TERM a process, wait up to 5 s, then KILL.
stop_pid() {
    local pid=$1 i
    kill -0 "$pid" 2>/dev/null || return 0
    kill -TERM "$pid" 2>/dev/null || return 0
    for ((i = 0; i < 50; i++)); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
}

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    set +e
    if is_mounted "$MNT"; then
        unmount "$MNT"
    fi
    local pid
    for pid in $MOUNT_PIDS; do
        stop_pid "$pid"
    done
    if [ -n "$FERRYD_PID" ]; then
        stop_pid "$FERRYD_PID"
        wait "$FERRYD_PID" 2>/dev/null
    fi
    rm -rf "$OUT" "$PORT_FILE"
    if [ "$rc" -ne 0 ]; then
        echo "demo: failed (exit $rc); logs: .demo/ferryd.log, .demo/ferry.log" >&2
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

now() { date +%s.%N; }
# elapsed seconds between two `now` stamps
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }

drop_caches() {
    sync
    if [ -w /proc/sys/vm/drop_caches ]; then
        { echo 3 >/proc/sys/vm/drop_caches; } 2>/dev/null || true
    fi
}

case $MIB in
'' | *[!0-9]*) die "FERRY_DEMO_MIB must be a whole number of MiB, got '$MIB'" ;;
esac

log "Prerequisites"
bash "$ROOT/scripts/prereqs.sh"
if ! command -v cargo >/dev/null 2>&1 && [ -f "$HOME/.cargo/env" ]; then
    # shellcheck disable=SC1091
    . "$HOME/.cargo/env"
fi
command -v cargo >/dev/null 2>&1 || die "cargo not found: install a Rust toolchain (rustup)"
command -v python3 >/dev/null 2>&1 || die "python3 not found (needed by scripts/gen-data.py)"

log "Building (cargo build --release --bins)"
cargo build --release --bins
[ -x "$FERRYD" ] || die "$FERRYD was not built"
[ -x "$FERRY" ] || die "$FERRY was not built"

mkdir -p "$DATA" "$MNT"
if is_mounted "$MNT"; then
    echo "unmounting a leftover mount on .demo/mnt"
    unmount "$MNT"
    is_mounted "$MNT" && die "cannot unmount leftover mount on $MNT"
fi
rm -rf "$OUT"
mkdir -p "$OUT"

log "Generating data in .demo/data (${MIB} MiB per file, ${SMALL_FILES} small files; reused when present)"
python3 "$ROOT/scripts/gen-data.py" "$DATA" --size-mib "$MIB" --small-files "$SMALL_FILES"

log "Starting ferryd"
rm -f "$PORT_FILE"
"$FERRYD" --export "$DATA" --listen 127.0.0.1:0 --port-file "$PORT_FILE" >"$DEMO/ferryd.log" 2>&1 &
FERRYD_PID=$!
ADDR=""
for ((i = 0; i < 100; i++)); do
    if ! kill -0 "$FERRYD_PID" 2>/dev/null; then
        tail -n 20 "$DEMO/ferryd.log" >&2 || true
        die "ferryd exited before it was listening (log: .demo/ferryd.log)"
    fi
    if [ -s "$PORT_FILE" ]; then
        # Accept the address once it is complete and stable (the file may be mid-write).
        a=$(tr -d '[:space:]' <"$PORT_FILE")
        if [[ $a =~ ^[0-9.]+:[0-9]+$ ]] && [ "$a" = "${ADDR}" ]; then
            break
        fi
        ADDR=$a
    fi
    sleep 0.1
done
[[ $ADDR =~ ^[0-9.]+:[0-9]+$ ]] || die "ferryd did not write its address to .demo/port within 10 s"
echo "ferryd (pid $FERRYD_PID) exports .demo/data on $ADDR"

log "Mounting $ADDR on .demo/mnt"
"$FERRY" mount "$ADDR" "$MNT" >"$DEMO/ferry.log" 2>&1 || {
    tail -n 20 "$DEMO/ferry.log" >&2 || true
    die "ferry mount failed (log: .demo/ferry.log)"
}
MOUNT_PIDS=$(pgrep -f -- "ferry mount ${ADDR} " | paste -sd ' ' || true)
is_mounted "$MNT" || die "ferry mount returned but .demo/mnt is not mounted"
echo "mounted (ferry pid ${MOUNT_PIDS:-unknown})"

log "Copying large files out of the mount (page cache dropped before each copy)"
for name in db.dat mixed.bin random.bin; do
    bytes=$(stat -c %s "$DATA/$name")
    drop_caches
    t0=$(now)
    cp "$MNT/$name" "$OUT/$name"
    t1=$(now)
    secs=$(elapsed "$t0" "$t1")
    size_mib=$(awk -v b="$bytes" 'BEGIN { printf "%.0f", b / 1048576 }')
    rate=$(awk -v b="$bytes" -v s="$secs" 'BEGIN { if (s <= 0) s = 0.001; printf "%.0f", b / 1e6 / s }')
    printf '%s: %s MiB in %.2f s = %s MB/s\n' "$name" "$size_mib" "$secs" "$rate"
    cmp "$OUT/$name" "$DATA/$name" || die "$name: the copy differs from the source"
    echo "$name: cmp OK"
    SUMMARY+=("$(printf '%-11s %14s %9.2f %14s  %s' "$name" "$size_mib MiB" "$secs" "$rate MB/s" OK)")
done

log "Copying tree/ out of the mount (cp -r)"
nfiles=$(find "$DATA/tree" -type f | wc -l)
tree_mib=$(du -sb "$DATA/tree" | awk '{ printf "%.0f", $1 / 1048576 }')
drop_caches
t0=$(now)
cp -r "$MNT/tree" "$OUT/tree"
t1=$(now)
secs=$(elapsed "$t0" "$t1")
fps=$(awk -v n="$nfiles" -v s="$secs" 'BEGIN { if (s <= 0) s = 0.001; printf "%.0f", n / s }')
printf 'tree/: %s files (%s MiB) in %.2f s = %s files/s\n' "$nfiles" "$tree_mib" "$secs" "$fps"
diff -r --no-dereference "$DATA/tree" "$OUT/tree" >/dev/null || {
    diff -r --no-dereference "$DATA/tree" "$OUT/tree" | head -n 20 >&2 || true
    die "tree/: the copy differs from the source"
}
echo "tree/: diff -r OK"
SUMMARY+=("$(printf '%-11s %14s %9.2f %14s  %s' "tree/" "$nfiles files" "$secs" "$fps files/s" OK)")

log "Mirroring the whole export without a mount (ferry mirror) into .demo/out/mirror"
drop_caches
t0=$(now)
"$FERRY" mirror "$ADDR" "$OUT/mirror" --quiet || die "ferry mirror failed"
t1=$(now)
secs=$(elapsed "$t0" "$t1")
all_mib=$(du -sb "$OUT/mirror" | awk '{ printf "%.0f", $1 / 1048576 }')
rate=$(awk -v b="$(du -sb "$OUT/mirror" | cut -f1)" -v s="$secs" 'BEGIN { if (s <= 0) s = 0.001; printf "%.0f", b / 1e6 / s }')
printf 'mirror: %s MiB in %.2f s = %s MB/s, every file verified (BLAKE3)\n' "$all_mib" "$secs" "$rate"
diff -r --no-dereference "$DATA" "$OUT/mirror" >/dev/null || die "mirror: the copy differs from the source"
echo "mirror: diff -r OK"
"$FERRY" status "$OUT/mirror"
SUMMARY+=("$(printf '%-11s %14s %9.2f %14s  %s' "mirror" "$all_mib MiB" "$secs" "$rate MB/s" OK)")

log "Unmounting and stopping ferryd"
unmount "$MNT"
is_mounted "$MNT" && die "could not unmount .demo/mnt"
for pid in $MOUNT_PIDS; do
    stop_pid "$pid"
done
MOUNT_PIDS=""
stop_pid "$FERRYD_PID"
wait "$FERRYD_PID" 2>/dev/null || true
FERRYD_PID=""
rm -rf "$OUT"

log "Summary (ferryd and ferry mount on 127.0.0.1, $(nproc) cores)"
printf '%-11s %14s %9s %14s  %s\n' "data set" "size" "seconds" "rate" "check"
printf '%s\n' "${SUMMARY[@]}"
