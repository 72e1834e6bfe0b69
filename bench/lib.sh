# Shared by the loopback benchmark scripts (source it): a ferryd on 127.0.0.1 and a cleanup
# that leaves no mount, process or temporary directory behind.
#
#   bench_start WORKDIR_PREFIX           sets $work (a new temp dir) and traps EXIT/INT/TERM
#   bench_mountpoint DIR                 a mount point the cleanup unmounts
#   bench_ferryd EXPORT [ARGS...]        starts ferryd, sets $ferryd_pid and $ferryd_addr

bench_mounts=()
ferryd_pid=""
bench_cleanup() {
    local m
    for m in "${bench_mounts[@]}"; do
        if grep -q " $m " /proc/self/mountinfo 2>/dev/null; then
            fusermount3 -u "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
        fi
        pkill -f -- "ferry mount .* $m" 2>/dev/null || true
    done
    pkill -f -- "ferry mirror .* $work/" 2>/dev/null || true
    [ -n "$ferryd_pid" ] && kill "$ferryd_pid" 2>/dev/null || true
    rm -rf "$work"
}

bench_start() {
    work=$(mktemp -d "/tmp/$1.XXXXXX")
    trap bench_cleanup EXIT INT TERM
}

bench_mountpoint() {
    mkdir -p "$1"
    bench_mounts+=("$1")
}

bench_ferryd() {
    local export=$1
    shift
    target/release/ferryd --export "$export" --listen 127.0.0.1:0 --port-file "$work/port" "$@" 2>"$work/ferryd.log" &
    ferryd_pid=$!
    for _ in $(seq 100); do [ -s "$work/port" ] && break; sleep 0.1; done
    [ -s "$work/port" ] || { echo "ferryd did not start: $(cat "$work/ferryd.log")" >&2; exit 1; }
    ferryd_addr=$(cat "$work/port")
}
