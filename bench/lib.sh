# shellcheck shell=bash
# Shared by the loopback benchmark scripts (source it): a ferryd on 127.0.0.1 and a cleanup
# that leaves no mount, process or temporary directory behind.
#
#   bench_start WORKDIR_PREFIX           sets $work (a new temp dir) and traps EXIT/INT/TERM
#   bench_mountpoint DIR                 a mount point the cleanup unmounts
#   bench_ferryd EXPORT [ARGS...]        starts ferryd, sets $ferryd_pid and $ferryd_addr
#                                        (FERRYD_BIN=PATH: another ferryd binary)

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
    # Destinations' state (journal, status) in the work directory, removed with it.
    export FERRY_STATE_DIR=$work/state
    trap bench_cleanup EXIT INT TERM
}

bench_mountpoint() {
    mkdir -p "$1"
    bench_mounts+=("$1")
}

bench_ferryd() {
    local export=$1
    shift
    "${FERRYD_BIN:-target/release/ferryd}" --export "$export" --listen 127.0.0.1:0 --port-file "$work/port" "$@" 2>"$work/ferryd.log" &
    ferryd_pid=$!
    for _ in $(seq 100); do [ -s "$work/port" ] && break; sleep 0.1; done
    [ -s "$work/port" ] || { echo "ferryd did not start: $(cat "$work/ferryd.log")" >&2; exit 1; }
    ferryd_addr=$(cat "$work/port")
}

# ---------------------------------------------------------------- emulated links
# Shared by bench/run.sh and bench/readers.sh: a private network namespace whose loopback is
# shaped into a link, ferryd inside it, mounts from it, and a cleanup that leaves nothing
# behind. The caller sets ROOT (the repository) and defines log and die.
#
#   ns_install CMD:PKG...              apt-get installs the packages of missing commands
#   ns_toxiproxy LINKS                 builds toxiproxy into bench/out/bin if LINKS has wan
#   ns_start                           sets $NS (a new namespace) and $WORK (a temp dir with
#                                      logs/ and mnt/); traps EXIT to ns_cleanup, which first
#                                      calls bench_extra_cleanup when the caller defines it
#                                      (BENCH_LOGS=DIR: logs/ is copied there at exit)
#   in_ns CMD..., bg_ns CMD...         run CMD in the namespace (bg_ns: in the background,
#                                      killed by the cleanup)
#   wan_proxy NAME LISTEN UPSTREAM     a toxiproxy proxy with the WAN profile
#   ns_ferryd EXPORT                   ferryd on 127.0.0.1:7070 in the namespace; $ferryd_pid
#                                      (FERRYD_BIN=PATH: another ferryd binary, e.g. an older
#                                      build to compare against; FERRYD_ARGS: extra options)
#   set_link LINK                      loopback, 1gbit or wan; sets $P_FERRY (and the ports of
#                                      the other services) and, on wan, $WAN_RTT_MS
#   drop_caches, kill_tree PID
#   cpu_busy                           CPU seconds the machine has been busy (not idle, not
#                                      waiting for I/O), from /proc/stat
#   cpu_of PID                         CPU seconds process PID has used (0 when it is gone)
#   fio_randread FILE SECONDS JSON     16 KiB random reads, 4 jobs (psync, fadvise random)
#   ferry_mount_at MNT [OPTIONS...]    ferry mount of 127.0.0.1:$P_FERRY with $FERRY_ARGS
#                                      (FERRY_BIN=PATH: another ferry binary to compare against)
#   ferry_unmount MNT                  unmounts and waits for the mount's process to exit
#                                      (killed, and status 1, after 30 s)
BIN=${ROOT:-.}/bench/out/bin
TOXI_VERSION=v2.12.0
TOXI=127.0.0.1:8474
WAN_RTT_MS=""

ns_install() {
    local need=() pair cmd pkg
    for pair in "$@"; do
        cmd=${pair%%:*} pkg=${pair#*:}
        command -v "$cmd" >/dev/null 2>&1 || need+=("$pkg")
    done
    [ ${#need[@]} -gt 0 ] || return 0
    log "installing ${need[*]}"
    if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null; }; then
        die "could not install ${need[*]} with apt-get"
    fi
}

ns_toxiproxy() {
    [[ ",$1," == *",wan,"* ]] || return 0
    [ -x "$BIN/toxiproxy-server" ] && [ -x "$BIN/toxiproxy-cli" ] && return 0
    command -v go >/dev/null 2>&1 || die "the wan link needs toxiproxy, built with Go: install Go or leave out --links wan"
    log "building toxiproxy $TOXI_VERSION with go install"
    mkdir -p "$BIN"
    local tmp; tmp=$(mktemp -d)
    if ! { GOBIN=$tmp go install "github.com/Shopify/toxiproxy/v2/cmd/server@$TOXI_VERSION" \
        && GOBIN=$tmp go install "github.com/Shopify/toxiproxy/v2/cmd/cli@$TOXI_VERSION"; }; then
        rm -rf "$tmp"; die "go install of toxiproxy $TOXI_VERSION failed"
    fi
    mv "$tmp/server" "$BIN/toxiproxy-server"; mv "$tmp/cli" "$BIN/toxiproxy-cli"; rm -rf "$tmp"
}

ns_cleanup() {
    set +e
    declare -F bench_extra_cleanup >/dev/null && bench_extra_cleanup
    for m in $(awk -v w="$WORK" 'index($5, w) == 1 {print $5}' /proc/self/mountinfo | sort -r); do
        fusermount3 -u -z "$m" 2>/dev/null || fusermount -u -z "$m" 2>/dev/null || umount -l "$m" 2>/dev/null
    done
    while read -r pid; do kill "$pid" 2>/dev/null; done < "$WORK/pids"
    sleep 0.3
    while read -r pid; do kill -9 "$pid" 2>/dev/null; done < "$WORK/pids"
    # Processes started in the namespace that we did not track (daemonised mounts).
    for pid in $(ip netns pids "$NS" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
    ip netns del "$NS" 2>/dev/null
    # BENCH_LOGS=DIR keeps the run's logs (the mounts', ferryd's; RUST_LOG reaches them).
    if [ -n "${BENCH_LOGS:-}" ]; then mkdir -p "$BENCH_LOGS" && cp -r "$WORK/logs/." "$BENCH_LOGS/"; fi
    rm -rf "$WORK"
}

ns_start() {
    NS=ferrybench-$$
    WORK=$(mktemp -d /tmp/ferry-bench.XXXXXX)
    export FERRY_STATE_DIR=$WORK/state
    mkdir -p "$WORK/mnt" "$WORK/logs"
    : > "$WORK/pids"
    trap ns_cleanup EXIT
    trap 'exit 130' INT TERM
    ip netns add "$NS"
    ip -n "$NS" link set lo up
}

in_ns() { nsenter --net="/var/run/netns/$NS" "$@"; }
# nsenter called directly (not through in_ns): $! is then the program itself, as nsenter
# execs it, so the cleanup kills the right process.
bg_ns() { nsenter --net="/var/run/netns/$NS" "$@" & echo $! >> "$WORK/pids"; }

ns_ferryd() {
    # shellcheck disable=SC2086 # FERRYD_ARGS: extra ferryd options, split on purpose
    bg_ns "${FERRYD_BIN:-$ROOT/target/release/ferryd}" --export "$1" --listen 127.0.0.1:7070 ${FERRYD_ARGS:-} 2>"$WORK/logs/ferryd.log"
    sleep 0.5
    ferryd_pid=$(pgrep -f -- "ferryd --export $1 --listen 127.0.0.1:7070" | head -1)
    [ -n "$ferryd_pid" ] || die "ferryd did not start: $(cat "$WORK/logs/ferryd.log")"
}

toxi() { in_ns "$BIN/toxiproxy-cli" -h "$TOXI" "$@" >/dev/null; }
# wan_proxy NAME LISTEN UPSTREAM: a toxiproxy proxy 127.0.0.1:LISTEN -> 127.0.0.1:UPSTREAM with
# the WAN profile: 20 ms each way, 25 MB/s per connection (toxiproxy's bandwidth is in KB/s).
wan_proxy() {
    toxi delete "$1" 2>/dev/null || true
    toxi create -l "127.0.0.1:$2" -u "127.0.0.1:$3" "$1"
    for dir in -d -u; do
        toxi toxic add -t latency -a latency=20 "$dir" -n "lat$dir" "$1"
        toxi toxic add -t bandwidth -a rate=25000 "$dir" -n "bw$dir" "$1"
    done
}
set_link() {
    tc -n "$NS" qdisc del dev lo root 2>/dev/null || true
    # shellcheck disable=SC2034 # the other ports are used by bench/run.sh's methods
    P_FERRY=7070 P_FERRY_TLS=7071 P_SSH=2222 P_NC=9000
    case "$1" in
        loopback) ;;
        1gbit) tc -n "$NS" qdisc add dev lo root tbf rate 1gbit burst 2mb latency 100ms ;;
        # Through toxiproxy every byte crosses the loopback twice (client → proxy → server),
        # so 2 Gbit/s on the qdisc is 1 Gbit/s end to end.
        wan) tc -n "$NS" qdisc add dev lo root tbf rate 2gbit burst 4mb latency 100ms ;;
        *) die "unknown link '$1' (loopback, 1gbit, wan)" ;;
    esac
    if [ "$1" = wan ]; then
        if ! in_ns curl -s "http://$TOXI/version" >/dev/null 2>&1; then
            bg_ns "$BIN/toxiproxy-server" -host 127.0.0.1 -port 8474 >"$WORK/logs/toxiproxy.log" 2>&1
            for _ in $(seq 50); do in_ns curl -s "http://$TOXI/version" >/dev/null 2>&1 && break; sleep 0.1; done
        fi
        for p in ferry:17070:7070 tls:17071:7071 ssh:12222:2222 nc:19000:9000 probe:19100:9100; do
            IFS=: read -r name listen upstream <<<"$p"
            wan_proxy "$name" "$listen" "$upstream"
        done
        # shellcheck disable=SC2034 # the other ports are used by bench/run.sh's methods
        P_FERRY=17070 P_FERRY_TLS=17071 P_SSH=12222 P_NC=19000
        # The random-read bound: J jobs / the measured round trip of one 16 KiB read.
        if [ -z "$WAN_RTT_MS" ]; then
            bg_ns python3 "$ROOT/bench/rtt_probe.py" server 9100
            sleep 0.3
        fi
        WAN_RTT_MS=$(in_ns python3 "$ROOT/bench/rtt_probe.py" client 19100 100)
        log "  measured round trip of a 16 KiB read: $WAN_RTT_MS ms"
    fi
}

cpu_busy() { awk -v hz="$(getconf CLK_TCK)" '/^cpu / { printf "%.3f\n", ($2 + $3 + $4 + $7 + $8) / hz; exit }' /proc/stat; }
cpu_of() { awk -v hz="$(getconf CLK_TCK)" '{ sub(/.*\) /, ""); printf "%.3f\n", ($12 + $13) / hz }' "/proc/$1/stat" 2>/dev/null || echo 0; }
drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches; }

# median_of_lines: the median of the numbers on stdin, one a line (of an even count, the mean
# of the middle two), with two decimals; nothing for none. The rounds' own ratios of
# --interleave (bench/trees.sh, bench/compression.sh).
median_of_lines() {
    sort -g | awk '{ r[++n] = $1 } END { if (n) printf "%.2f", (n % 2) ? r[(n + 1) / 2] : (r[n / 2] + r[n / 2 + 1]) / 2 }'
}

# fresh_fs DIR GIB: DIR becomes a new journaled ext4 of GIB GiB (a sparse image under $WORK on
# a loop device; the cleanup unmounts it and the loop device goes with it). Copies of trees
# land there, not on whatever file system holds /tmp: creating files on this VM's root file
# system (its inode allocator checks candidates for a recent delete, `recently_deleted`, as
# ext4 does without a journal) slows down with every tree deleted before (tar -x of the
# 9,300-file source tree took 0.46 s, then 3.3, 5.0, 8.8 s over four deletes and
# re-extractions, the last after an 11 s pause; 0.41-0.51 s every time on a fresh ext4), so
# whatever ran after more deletes looked slower. Its inode tables and journal are written at
# mkfs, not by the kernel's lazy init after the mount: with lazy init, the first copy of the
# 100,000-file flat directory, creating its inodes while `ext4lazyinit` zeroed the tables,
# took 243 and 54 s where the next ones took 28-30 s. Where a loop mount is refused, DIR
# stays a plain directory and the report says so.
fresh_fs() {
    local dir=$1 gib=$2 img=$WORK/dst-fs.img
    mkdir -p "$dir"
    if truncate -s "${gib}G" "$img" && mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$img" >/dev/null 2>&1 \
        && mount -o loop "$img" "$dir" 2>/dev/null; then
        DST_FS="a fresh ext4 (journaled) of ${gib} GiB on a loop device"
    else
        rm -f "$img"
        DST_FS="the file system of $WORK (a loop mount was refused)"
        log "destinations on $DST_FS"
    fi
}

# Kills a process and all its descendants (a copy runs as shell functions, nsenter and the
# tool itself; killing only the top shell would leave the tool running).
kill_tree() {
    local child
    for child in $(pgrep -P "$1"); do kill_tree "$child"; done
    kill -TERM "$1" 2>/dev/null || true
}

fio_randread() {  # fio_randread FILE SECONDS JSON
    fio --name=randread --filename="$1" --readonly --rw=randread --bs=16k --numjobs=4 \
        --ioengine=psync --fadvise_hint=random --invalidate=1 --time_based --runtime="$2" \
        --group_reporting --output-format=json --output="$3" >/dev/null 2>&1
}

ferry_mount_at() {  # ferry_mount_at MOUNT [OPTIONS...]
    local mnt=$1; shift
    mkdir -p "$mnt"
    # shellcheck disable=SC2086 # FERRY_ARGS: extra mount options, split on purpose
    in_ns "${FERRY_BIN:-$ROOT/target/release/ferry}" mount "127.0.0.1:$P_FERRY" "$mnt" \
        --log-file "$WORK/logs/ferry-$(basename "$mnt")-${link:-}.log" ${FERRY_ARGS:-} "$@" || return 1
    for _ in $(seq 100); do grep -q " $mnt " /proc/self/mountinfo && return 0; sleep 0.1; done
    return 1
}

ferry_unmount() {  # ferry_unmount MOUNT: the mount's process records what its mirror wrote, then exits
    local mnt=$1
    fusermount3 -u "$mnt" 2>/dev/null || fusermount -u "$mnt" 2>/dev/null || umount -l "$mnt"
    for _ in $(seq 300); do pgrep -f -- "ferry mount 127.0.0.1:$P_FERRY $mnt" >/dev/null || return 0; sleep 0.1; done
    # Still there after 30 s: this mount's process, found by its own mount point, is killed.
    local pid
    for pid in $(pgrep -f -- "ferry mount 127.0.0.1:$P_FERRY $mnt "); do kill -9 "$pid" 2>/dev/null; done
    return 1
}

# ---------------------------------------------------------------- trees of real shapes
# real_trees DIR LIST: makes the trees named in LIST (comma-separated) that DIR lacks, each
# built in DIR/NAME.tmp and renamed when complete:
#   src     /usr/include and the Python standard library (Debian's, else the running python3's)
#   pgdata  a PostgreSQL data directory: initdb + pgbench -i -s ${PG_SCALE:-10}, cleanly stopped
#   git     a git working tree with its .git: a clone of this repository
#   flat    one directory of 100,000 small files (scripts/gen-flat.py)
real_trees() {
    local data=$1 t
    mkdir -p "$data"
    for t in ${2//,/ }; do
        [ -d "$data/$t" ] && continue
        rm -rf "${data:?}/$t.tmp"
        case "$t" in
            src)
                local py
                py=$(find /usr/lib -maxdepth 1 -name 'python3.[0-9]*' -type d | sort | tail -1)
                [ -n "$py" ] || py=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
                mkdir -p "$data/src.tmp" && cp -a /usr/include "$data/src.tmp/include" && cp -a "$py" "$data/src.tmp/python" ;;
            pgdata)
                local pgbin sock
                pgbin=${PGBIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | tail -1)}
                [ -x "$pgbin/initdb" ] || die "PostgreSQL not found (apt-get install postgresql, or set PGBIN)"
                sock=$(mktemp -d /tmp/ferry-real-pg.XXXXXX); chown postgres: "$sock"
                mkdir -p "$data/pgdata.tmp" && chown postgres: "$data/pgdata.tmp"
                runuser -u postgres -- "$pgbin/initdb" -D "$data/pgdata.tmp" -U postgres -A trust --no-sync >/dev/null
                runuser -u postgres -- "$pgbin/pg_ctl" -D "$data/pgdata.tmp" -o "-k $sock -p 5497 -c listen_addresses=''" -w start >/dev/null
                # A pgbench that fails (a full disk, a cluster that died) leaves no half-filled
                # data directory behind as if it were the real one: the cluster is stopped and
                # the run ends, naming what to look at.
                local pg_ok=1
                "$pgbin/pgbench" -h "$sock" -p 5497 -U postgres -i -q -s "${PG_SCALE:-10}" postgres \
                    >"$data/pgbench.log" 2>&1 || pg_ok=0
                runuser -u postgres -- "$pgbin/pg_ctl" -D "$data/pgdata.tmp" -w stop >/dev/null
                rm -rf "$sock"
                [ "$pg_ok" = 1 ] || die "pgbench -i -s ${PG_SCALE:-10} failed making $data/pgdata.tmp (its output: $data/pgbench.log; free space: df -h $data)"
                rm -f "$data/pgbench.log" ;;
            git) git clone -q --no-local "${ROOT:-.}" "$data/git.tmp" ;;
            flat) python3 "${ROOT:-.}/scripts/gen-flat.py" "$data/flat.tmp" 100000 ;;
            sparse)
                # One 8 GiB file holding 6 MiB of data in three 2 MiB islands (a sparse
                # datafile or VM image).
                mkdir -p "$data/sparse.tmp"
                truncate -s 8G "$data/sparse.tmp/image.raw"
                for at in 0 3000 8000; do
                    dd if=/dev/urandom of="$data/sparse.tmp/image.raw" bs=1M seek="$at" count=2 \
                        conv=notrunc status=none
                done ;;
            fsimage)
                # A real sparse VM disk image: 8 GiB formatted by mkfs.ext4, its metadata
                # (superblock copies, group descriptors, inode tables, journal) where the
                # file system put them, the rest holes.
                mkdir -p "$data/fsimage.tmp"
                truncate -s 8G "$data/fsimage.tmp/disk.img"
                mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$data/fsimage.tmp/disk.img" ;;
            *) die "unknown tree '$t' (src, pgdata, git, flat, sparse, fsimage)" ;;
        esac
        mv "$data/$t.tmp" "$data/$t"
    done
}
