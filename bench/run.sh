#!/usr/bin/env bash
# ferry's link benchmark: ferry side by side with the tools people use today, on emulated
# links, from real kernel parts.
#
#   bench/run.sh [--quick] [--links 1gbit,wan,loopback] [--methods LIST] [--datasets LIST] [--size-mib N]
#                [--small-files N] [--fio-seconds N] [--copy-timeout SECS] [--repeat N]
#                [--out FILE]
#   FERRY_ARGS="--streams 16" bench/run.sh ...   extra options for ferry mount
#   FERRY_MIRROR_ARGS=..., FERRYD_ARGS=...        extra options for ferry mirror, ferryd
#   FERRY_MIRROR_MOUNT_ARGS="--bwlimit 30M"       extra options for fio-mirror's mount --mirror
#
# Links (all inside a network namespace this script creates; traffic stays on its loopback):
#   loopback  unshaped
#   1gbit     tbf qdisc on the namespace's loopback: 1 Gbit/s
#   wan       1 Gbit/s end to end plus toxiproxy on every connection: 20 ms latency each way
#             and a cap of 25 MB/s per TCP connection (how one stream with a limited window
#             behaves on a long fat pipe). The tbf rate is 2 Gbit/s because every byte crosses
#             the loopback twice, once on each side of the proxy.
# Methods: ferry, ferry-tls (TLS to a second, TLS-only ferryd; pinned self-signed certificate),
#   nc-raw, nc-lz4, scp, rsync, sshfs, sshfs4 (max_conns=4), rclone (mount over
#   sftp); for directory data sets also mirror (`ferry mirror`) and rsync8 (fpart + 8 parallel
#   rsync over ssh). Data sets (scripts/gen-data.py): db.dat (database-like, lz4 ratio ~11),
#   mixed.bin (lz4 ratio ~2), random.bin, tree/ (many small files); dbdir/ (a PostgreSQL-like
#   data directory) when asked for with --datasets.
#   Issue-4 comparison: --links 1gbit,wan --methods mirror,nc-lz4,rsync,rsync8 --datasets tree,dbdir
#   fio-mirror: fio random reads through a plain mount, then through a mount whose background
#   mirror (--cache-dir --mirror) is filling a local copy of the whole data directory; pairs
#   run --repeat times. Issue 4: --links wan --methods fio-mirror --datasets random
#   (Readers during the mirror in depth, with latency percentiles, cp and pg_restore, issue 13:
#   bench/readers.sh, on the same links.)
# Every copy starts with the page cache dropped and is verified (cmp, diff -r), and is run
# --repeat times (default 3; once if it takes over 30 s); the median run is reported. CPU seconds
# are the whole machine's busy time during the copy (both ends, kernel included). fio random
# reads (16 KiB, 4 jobs) run through each mount.
#
# Output: a markdown report (default docs/BENCHMARKS.md; --quick: bench/out/quick.md) with
# the date and commit, one table per link, the fio results, and the issue's targets checked.
# No namespace, mount or process is left behind, even on Ctrl-C.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD

quick=0
links=""
methods=""
size=1024
small=10000
fio_secs=15
copy_timeout=300
repeat=3
datasets=db.dat,mixed.bin,random.bin,tree
out=""
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) quick=1; shift ;;
        --links) links=$2; shift 2 ;;
        --methods) methods=$2; shift 2 ;;
        --size-mib) size=$2; shift 2 ;;
        --small-files) small=$2; shift 2 ;;
        --fio-seconds) fio_secs=$2; shift 2 ;;
        --copy-timeout) copy_timeout=$2; shift 2 ;;
        --repeat) repeat=$2; shift 2 ;;
        --datasets) datasets=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        -h|--help) sed -n '2,38p' "$0"; exit 0 ;;
        *) echo "bench/run.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
    esac
done
if [ "$quick" = 1 ]; then
    size=64; small=1000; fio_secs=3; repeat=1
    links=${links:-1gbit,wan}
    methods=${methods:-ferry,nc-raw,nc-lz4}
    out=${out:-bench/out/quick.md}
fi
links=${links:-loopback,1gbit,wan}
methods=${methods:-ferry,nc-raw,nc-lz4,scp,rsync,sshfs,sshfs4,rclone}
out=${out:-docs/BENCHMARKS.md}

die() { echo "bench/run.sh: $*" >&2; exit 1; }
# The code measured is the code at the start (the tree may change during a long run).
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
[ -z "$(git status --porcelain 2>/dev/null)" ] || commit="$commit (+ uncommitted changes)"
started=$(date -u '+%Y-%m-%d %H:%M')
log() { printf '[%s] %s\n' "$(date +%T)" "$*" >&2; }
# shellcheck source=bench/lib.sh
. bench/lib.sh

# ---------------------------------------------------------------- prerequisites
[ "$(id -u)" -eq 0 ] || die "run as root: it creates a network namespace, shapes it with tc, mounts FUSE and drops caches"
[ -e /dev/fuse ] || die "/dev/fuse is missing: FUSE is needed for the mount methods"
bash scripts/prereqs.sh
need=(sshd:openssh-server ssh:openssh-client sshfs:sshfs rclone:rclone fio:fio nc:netcat-openbsd
      ip:iproute2 tc:iproute2 nsenter:util-linux jq:jq curl:curl)
[ -x /usr/bin/time ] || need+=(time:time)
[[ ",$methods," == *",rsync8,"* ]] && need+=(fpart:fpart)
ns_install "${need[@]}"
nc -h 2>&1 | grep -q -- '-N' || die "nc must be netcat-openbsd (needs -N): apt-get install netcat-openbsd"
ns_toxiproxy "$links"
log "building ferry (release)"
cargo build --release --bins -q
# Quick runs use their own smaller data set, so switching modes does not regenerate files.
DATA=$ROOT/bench/out/data
[ "$quick" = 1 ] && DATA=$ROOT/bench/out/data-quick
mkdir -p "$DATA" "$(dirname "$out")"
log "data sets: ${size} MiB files, ${small} small files"
python3 scripts/gen-data.py "$DATA" --size-mib "$size" --small-files "$small" --only "$(echo "$datasets" | sed 's/\.dat//g; s/\.bin//g')" >&2

# ---------------------------------------------------------------- sandbox and cleanup
ns_start
mkdir -p "$WORK/dst" "$WORK/ssh"
# sshd for scp, rsync, sshfs and rclone: its own keys and config, nothing global touched.
ssh-keygen -q -t ed25519 -N '' -f "$WORK/ssh/host_key"
ssh-keygen -q -t ed25519 -N '' -f "$WORK/ssh/id"
cp "$WORK/ssh/id.pub" "$WORK/ssh/authorized_keys"
cat > "$WORK/ssh/sshd_config" <<EOF
ListenAddress 127.0.0.1:2222
HostKey $WORK/ssh/host_key
AuthorizedKeysFile $WORK/ssh/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
UsePAM no
StrictModes no
PidFile $WORK/ssh/sshd.pid
Subsystem sftp internal-sftp
EOF
mkdir -p /run/sshd
SSH_OPTS=(-i "$WORK/ssh/id" -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR)
bg_ns "$(command -v sshd)" -D -f "$WORK/ssh/sshd_config" -E "$WORK/logs/sshd.log"
ns_ferryd "$DATA"
# A second ferryd, TLS only, for the ferry-tls method (a self-signed certificate, pinned).
TLS_FP=""
if [[ ",$methods," == *",ferry-tls,"* ]]; then
    TLS_FP=$("$ROOT/target/release/ferryd" gen-cert --cert "$WORK/cert.pem" --key "$WORK/key.pem" 2>/dev/null)
    # shellcheck disable=SC2086 # FERRYD_ARGS: extra ferryd options, split on purpose
    bg_ns "$ROOT/target/release/ferryd" --export "$DATA" --listen 127.0.0.1:7071 \
        --tls-cert "$WORK/cert.pem" --tls-key "$WORK/key.pem" ${FERRYD_ARGS:-} 2>"$WORK/logs/ferryd-tls.log"
    sleep 0.3
fi

# ---------------------------------------------------------------- links
# ---------------------------------------------------------------- measurement
ROWS=$WORK/rows   # link|dataset|method|seconds|MBps|cpu
: > "$ROWS"
FIO=$WORK/fio     # link|method|iops
: > "$FIO"
FIOM=$WORK/fiom   # link|iops alone|iops during mirror|reads|reads served locally|mirror MB/s|mirror state
: > "$FIOM"
RSS=$WORK/rss     # link|ferryd MiB|ferry MiB
: > "$RSS"

size_of() { if [ -d "$1" ]; then du -sb "$1" | cut -f1; else stat -c %s "$1"; fi; }

# copy_once LINK DATASET METHOD COMMAND... : times one copy into $WORK/dst and verifies it.
# Prints "SECONDS|CPU" or "failed (why)" or "timed out (> N s)".
copy_once() {
    local link=$1 ds=$2 method=$3; shift 3
    rm -rf "${WORK:?}/dst/$ds" 2>/dev/null || { sleep 1; rm -rf "${WORK:?}/dst/$ds"; }
    drop_caches
    local c0 t0 t1 c1 status=0
    c0=$(cpu_busy); t0=$(date +%s.%N)
    # A copy that takes longer than --copy-timeout is stopped and reported as such (some
    # peers need tens of minutes for a tree over the WAN profile).
    "$@" >"$WORK/logs/copy.log" 2>&1 &
    local job=$!
    ( sleep "$copy_timeout"; kill_tree "$job" ) &
    local watchdog=$!
    wait "$job" || status=$?
    kill_tree "$watchdog"; wait "$watchdog" 2>/dev/null || true
    t1=$(date +%s.%N); c1=$(cpu_busy)
    if [ $status -ne 0 ] && awk -v a="$t0" -v z="$t1" -v l="$copy_timeout" 'BEGIN { exit !(z - a >= l) }'; then
        echo "timed out (> ${copy_timeout} s)"
        return 0
    fi
    # scp follows symlinks (and fails on dangling ones) and rclone skips them: for those
    # two, the tree is verified without its links/ directory, and scp's exit status for the
    # dangling links is expected.
    local no_links=0
    if [ -d "$DATA/$ds" ] && { [ "$method" = scp ] || [ "$method" = rclone ]; }; then
        no_links=1
        [ "$method" = scp ] && status=0
    fi
    if [ $status -ne 0 ]; then
        local why; why=$(grep -v '^$' "$WORK/logs/copy.log" | head -1 | cut -c1-80 | tr '|' '/')
        echo "failed ($status: $why)"
        return 0
    fi
    if [ -d "$DATA/$ds" ] && [ $no_links = 1 ]; then
        diff -r -x links "$DATA/$ds" "$WORK/dst/$ds" >/dev/null || die "$method: copy of $ds differs from the source"
    elif [ -d "$DATA/$ds" ]; then
        diff -r --no-dereference "$DATA/$ds" "$WORK/dst/$ds" >/dev/null || die "$method: copy of $ds differs from the source"
    else
        cmp -s "$DATA/$ds" "$WORK/dst/$ds" || die "$method: copy of $ds differs from the source"
    fi
    awk -v a="$t0" -v z="$t1" -v c0="$c0" -v c1="$c1" 'BEGIN { printf "%.2f|%.1f\n", z - a, c1 - c0 }'
}

# copy LINK DATASET METHOD COMMAND... : runs the copy --repeat times (once when the first run
# takes over $ONCE_ABOVE s: long copies vary little, and some take minutes) and records the
# median run. Every run is verified.
ONCE_ABOVE=30
copy() {
    local link=$1 ds=$2 method=$3
    local runs=() r i
    for ((i = 1; i <= repeat; i++)); do
        r=$(copy_once "$@")
        case "$r" in
            failed*|timed*)
                log "  $method $ds $r"
                echo "$link|$ds|$method|$r||" >> "$ROWS"
                return 0 ;;
        esac
        runs+=("$r")
        awk -v s="${r%%|*}" -v l="$ONCE_ABOVE" 'BEGIN { exit !(s > l) }' && break
    done
    local med
    med=$(printf '%s\n' "${runs[@]}" | sort -t'|' -k1,1g | awk '{ a[NR] = $0 } END { print a[int((NR + 1) / 2)] }')
    local bytes; bytes=$(size_of "$DATA/$ds")
    local row
    row=$(awk -v b="$bytes" -v m="$med" 'BEGIN { split(m, x, "|"); printf "%.2f|%.1f|%.1f", x[1], b / x[1] / 1e6, x[2] }')
    echo "$link|$ds|$method|$row" >> "$ROWS"
    local all; all=$(printf '%s ' "${runs[@]%%|*}")
    log "  $(printf '%-8s %-10s' "$method" "$ds") ${row//|/  }  (s, MB/s, cpu s; median of: ${all% })"
}

# Mount methods: mount once per link, copy with cp, unmount.
mount_method() {
    local method=$1 mnt=$WORK/mnt/$1
    mkdir -p "$mnt"
    case "$method" in
        ferry)
            # shellcheck disable=SC2086 # FERRY_ARGS: extra mount options, split on purpose
            in_ns "$ROOT/target/release/ferry" mount "127.0.0.1:$P_FERRY" "$mnt" \
                --log-file "$WORK/logs/ferry-$link.log" ${FERRY_ARGS:-} ;;
        ferry-tls)
            # shellcheck disable=SC2086 # FERRY_ARGS: extra mount options, split on purpose
            in_ns "$ROOT/target/release/ferry" mount "127.0.0.1:$P_FERRY_TLS" "$mnt" \
                --tls-fingerprint "$TLS_FP" --log-file "$WORK/logs/ferry-tls-$link.log" ${FERRY_ARGS:-} ;;
        sshfs|sshfs4)
            local extra=""; [ "$method" = sshfs4 ] && extra=",max_conns=4"
            in_ns sshfs -p "$P_SSH" "root@127.0.0.1:$DATA" "$mnt" \
                -o "ro,IdentityFile=$WORK/ssh/id,StrictHostKeyChecking=no,UserKnownHostsFile=/dev/null$extra" ;;
        rclone)
            RCLONE_CONFIG_BENCH_TYPE=sftp RCLONE_CONFIG_BENCH_HOST=127.0.0.1 RCLONE_CONFIG_BENCH_PORT=$P_SSH \
            RCLONE_CONFIG_BENCH_USER=root RCLONE_CONFIG_BENCH_KEY_FILE=$WORK/ssh/id \
                in_ns rclone mount "bench:$DATA" "$mnt" --read-only --daemon --config /dev/null \
                    --log-file "$WORK/logs/rclone-$link.log" ;;
    esac
    for _ in $(seq 100); do grep -q " $mnt " /proc/self/mountinfo && break; sleep 0.1; done
    grep -q " $mnt " /proc/self/mountinfo
}
unmount_method() {
    local mnt=$WORK/mnt/$1
    fusermount3 -u "$mnt" 2>/dev/null || fusermount -u "$mnt" 2>/dev/null || umount -l "$mnt"
}

cp_from() { local mnt=$1 ds=$2; cp -r "$mnt/$ds" "$WORK/dst/$ds"; }
nc_copy() {  # nc_copy DATASET lz4|raw
    local ds=$1 mode=$2 port=9000
    if [ -d "$DATA/$ds" ]; then
        mkdir -p "$WORK/dst/$ds"
        if [ "$mode" = lz4 ]; then
            in_ns sh -c "nc -l 127.0.0.1 $port | lz4 -d | tar -x -C '$WORK/dst/$ds'" &
            local r=$!; sleep 0.2
            tar -c -C "$DATA/$ds" . | lz4 -1 | in_ns nc -N 127.0.0.1 "$P_NC"
        else
            in_ns sh -c "nc -l 127.0.0.1 $port | tar -x -C '$WORK/dst/$ds'" &
            local r=$!; sleep 0.2
            tar -c -C "$DATA/$ds" . | in_ns nc -N 127.0.0.1 "$P_NC"
        fi
    else
        if [ "$mode" = lz4 ]; then
            in_ns sh -c "nc -l 127.0.0.1 $port | lz4 -d > '$WORK/dst/$ds'" &
            local r=$!; sleep 0.2
            lz4 -1 -c "$DATA/$ds" | in_ns nc -N 127.0.0.1 "$P_NC"
        else
            in_ns sh -c "nc -l 127.0.0.1 $port > '$WORK/dst/$ds'" &
            local r=$!; sleep 0.2
            in_ns nc -N 127.0.0.1 "$P_NC" < "$DATA/$ds"
        fi
    fi
    wait "$r"
}
mirror_copy() {
    # shellcheck disable=SC2086 # FERRY_MIRROR_ARGS: extra options, split on purpose
    in_ns "$ROOT/target/release/ferry" mirror "127.0.0.1:$P_FERRY:/$1" "$WORK/dst/$1" --quiet ${FERRY_MIRROR_ARGS:-}
}
rsync8_copy() {  # fpart splits the tree into 8 lists of about equal size; 8 rsyncs pull them
    rm -f "$WORK"/parts.*
    (cd "$DATA/$1" && fpart -n 8 -z -o "$WORK/parts" . >/dev/null)
    mkdir -p "$WORK/dst/$1"
    # shellcheck disable=SC2016 # expanded by the inner shell
    ls "$WORK"/parts.* | xargs -P 8 -I{} sh -c 'exec "$@"' _ nsenter --net="/var/run/netns/$NS" \
        rsync -a --files-from={} -e "ssh -p $P_SSH ${SSH_OPTS[*]}" "root@127.0.0.1:$DATA/$1/" "$WORK/dst/$1/"
}
scp_copy() { in_ns scp -q -r -P "$P_SSH" "${SSH_OPTS[@]}" "root@127.0.0.1:$DATA/$1" "$WORK/dst/$1"; }
rsync_copy() {
    in_ns rsync -a -e "ssh -p $P_SSH ${SSH_OPTS[*]}" "root@127.0.0.1:$DATA/$1" "$WORK/dst/"
}

fio_run() {  # fio_run LINK METHOD MOUNT
    local json=$WORK/logs/fio.json
    fio_randread "$3/random.bin" "$fio_secs" "$json" || {
        log "  fio through $2 failed"; echo "$1|$2|failed" >> "$FIO"; return 0; }
    local iops; iops=$(jq '.jobs[0].read.iops' "$json")
    printf '%s|%s|%.1f\n' "$1" "$2" "$iops" >> "$FIO"
    log "  fio 16k randread x4 via $2: $(printf '%.1f' "$iops") IOPS"
}

# fio_json MOUNT: one fio run; prints "IOPS READS".
fio_json() {
    local json=$WORK/logs/fio.json
    fio_randread "$1/random.bin" "$fio_secs" "$json" || return 1
    jq -r '.jobs[0].read | "\(.iops) \(.total_ios)"' "$json"
}
status_field() { jq -r "$2" <<<"$1"; }
# fio_mirror_pair LINK: fio through a plain mount, then through a mount with --mirror running
# (started 3 s before fio, on a fresh cache directory).
fio_mirror_pair() {
    local link=$1 mnt=$WORK/mnt/fm cache=$WORK/cache base iops ios s0 s1
    drop_caches
    ferry_mount_at "$mnt" || { log "  fio-mirror: mount failed"; return 1; }
    read -r base _ < <(fio_json "$mnt") || true
    unmount_method fm
    rm -rf "$cache"; mkdir -p "$cache"
    drop_caches
    # shellcheck disable=SC2086 # FERRY_MIRROR_MOUNT_ARGS: e.g. "--bwlimit 30M", split on purpose
    ferry_mount_at "$mnt" --cache-dir "$cache" --mirror ${FERRY_MIRROR_MOUNT_ARGS:-} \
        || { log "  fio-mirror: mount --mirror failed"; return 1; }
    sleep 3
    s0=$("$ROOT/target/release/ferry" status "$mnt" --json)
    read -r iops ios < <(fio_json "$mnt") || true
    s1=$("$ROOT/target/release/ferry" status "$mnt" --json)
    ferry_unmount "$mnt" || log "  fio-mirror: the mount did not exit within 30 s"
    rm -rf "$cache"
    local local0 local1 f0 f1 state mbps
    local0=$(status_field "$s0" .mount.chunks_served_locally); local1=$(status_field "$s1" .mount.chunks_served_locally)
    f0=$(status_field "$s0" .bytes_fetched); f1=$(status_field "$s1" .bytes_fetched)
    state=$(status_field "$s1" .state)
    mbps=$(awk -v a="$f0" -v b="$f1" -v t="$fio_secs" 'BEGIN { printf "%.1f", (b - a) / t / 1e6 }')
    [ -n "${base:-}" ] && [ -n "${iops:-}" ] || { log "  fio-mirror: fio failed"; return 1; }
    echo "$link|$base|$iops|$ios|$((local1 - local0))|$mbps|$state" >> "$FIOM"
    log "  fio alone $(printf '%.1f' "$base") IOPS; during the mirror $(printf '%.1f' "$iops") IOPS ($((local1 - local0)) of $ios reads from the local copy; mirror $mbps MB/s, $state)"
}

IFS=, read -ra DATASETS <<<"$datasets"
IFS=, read -ra LINKS <<<"$links"
IFS=, read -ra METHODS <<<"$methods"
for link in "${LINKS[@]}"; do
    log "link: $link"
    set_link "$link"
    for method in "${METHODS[@]}"; do
        case "$method" in
            ferry|ferry-tls|sshfs|sshfs4|rclone)
                if ! mount_method "$method" 2>"$WORK/logs/mount.log"; then
                    log "  $method did not mount: $(head -1 "$WORK/logs/mount.log")"
                    for ds in "${DATASETS[@]}"; do echo "$link|$ds|$method|failed (did not mount)||" >> "$ROWS"; done
                    continue
                fi
                for ds in "${DATASETS[@]}"; do copy "$link" "$ds" "$method" cp_from "$WORK/mnt/$method" "$ds"; done
                [[ " ${DATASETS[*]} " == *" random.bin "* ]] && fio_run "$link" "$method" "$WORK/mnt/$method"
                if [ "$method" = ferry ]; then
                    fpid=$(pgrep -f -- "ferry mount 127.0.0.1:$P_FERRY $WORK/mnt/ferry" | head -1)
                    echo "$link|$(awk '/VmHWM/ {print int($2/1024)}' "/proc/$ferryd_pid/status")|$(awk '/VmHWM/ {print int($2/1024)}' "/proc/$fpid/status")" >> "$RSS"
                fi
                unmount_method "$method" ;;
            nc-raw) for ds in "${DATASETS[@]}"; do copy "$link" "$ds" "$method" nc_copy "$ds" raw; done ;;
            nc-lz4) for ds in "${DATASETS[@]}"; do copy "$link" "$ds" "$method" nc_copy "$ds" lz4; done ;;
            scp) for ds in "${DATASETS[@]}"; do copy "$link" "$ds" "$method" scp_copy "$ds"; done ;;
            rsync) for ds in "${DATASETS[@]}"; do copy "$link" "$ds" "$method" rsync_copy "$ds"; done ;;
            fio-mirror)
                for ((i = 1; i <= repeat; i++)); do fio_mirror_pair "$link" || true; done ;;
            mirror|rsync8)  # whole directories only
                for ds in "${DATASETS[@]}"; do
                    [ -d "$DATA/$ds" ] && copy "$link" "$ds" "$method" "${method}_copy" "$ds"
                done ;;
            *) die "unknown method '$method'" ;;
        esac
    done
done

# ---------------------------------------------------------------- report
secs() { awk -F'|' -v l="$1" -v d="$2" -v m="$3" '$1 == l && $2 == d && $3 == m {print $4}' "$ROWS"; }
ratio() {  # ratio LINK DATASET BASE [METHOD]: METHOD's (default ferry) speed over BASE's
    local f b; f=$(secs "$1" "$2" "${4:-ferry}"); b=$(secs "$1" "$2" "$3")
    [ -n "$f" ] && [ -n "$b" ] && [ "$f" != failed ] && [ "$b" != failed ] \
        && awk -v f="$f" -v b="$b" 'BEGIN { printf "%.2f", b / f }' || echo "n/a"
}
{
    echo "# Benchmarks"
    echo
    echo "Produced by \`bench/run.sh$([ "$quick" = 1 ] && echo ' --quick')\` from $started to $(date -u '+%H:%M UTC'), binaries built at commit $commit,"
    echo "$(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB, kernel $(uname -r). Files of $size MiB; tree of $small small files"
    echo "($(du -sh "$DATA/tree" 2>/dev/null | cut -f1)). Page cache dropped before every copy; every copy verified."
    echo "Each figure is the median of $repeat runs of the copy (one run when the first took over $ONCE_ABOVE s)."
    echo "CPU s: busy time of the whole machine during the copy (both ends and the kernel)."
    echo "scp follows symlinks and rclone skips them: their tree copies are verified without tree/links/."
    echo "vs ferry: that method's speed relative to ferry's (below 1: slower than ferry)."
    for link in "${LINKS[@]}"; do
        echo
        case "$link" in
            loopback) echo "## loopback (unshaped)" ;;
            1gbit) echo "## 1gbit (tbf 1 Gbit/s)" ;;
            wan) echo "## wan (1 Gbit/s, 20 ms each way, 25 MB/s per TCP connection via toxiproxy)" ;;
        esac
        echo
        echo "| data set | method | seconds | MB/s | vs ferry | CPU s |"
        echo "| --- | --- | ---: | ---: | ---: | ---: |"
        for ds in "${DATASETS[@]}"; do
            awk -F'|' -v l="$link" -v d="$ds" '$1 == l && $2 == d' "$ROWS" | while IFS='|' read -r _ _ m s mbps cpu; do
                f=$(secs "$link" "$ds" ferry)
                vs=$(awk -v f="$f" -v s="$s" 'BEGIN { if (f + 0 > 0 && s + 0 > 0) printf "%.2f", f / s; else print "n/a" }')
                echo "| $ds | $m | $s | $mbps | $vs | $cpu |"
            done
        done
        r=$(awk -F'|' -v l="$link" '$1 == l {print $2 " MiB ferryd + " $3 " MiB ferry"}' "$RSS")
        [ -n "$r" ] && { echo; echo "Peak resident memory of ferry's processes: $r (ferry: its mount for this link; ferryd serves every link, so its figure is the peak so far)."; }
        if grep -q "^$link|" "$FIO"; then
            echo
            echo "fio random reads through the mounts (16 KiB, 4 jobs, ${fio_secs} s, random.bin):"
            echo
            echo "| mount | IOPS |"
            echo "| --- | ---: |"
            awk -F'|' -v l="$link" '$1 == l {print "| " $2 " | " $3 " |"}' "$FIO"
        fi
        if grep -q "^$link|" "$FIOM"; then
            echo
            echo "fio random reads (16 KiB, 4 jobs, ${fio_secs} s, random.bin) through a mount alone, then through a"
            echo "mount whose background mirror (\`--cache-dir --mirror\`, fresh cache) fills a copy of the whole data"
            echo "directory ($(du -sh "$DATA" | cut -f1)), started 3 s before fio. Reads that found their chunk already in the"
            echo "local copy are counted; the network ratio counts only the others, as if local reads took no time."
            echo
            echo "| IOPS alone | IOPS during mirror | ratio | reads from local copy | network ratio | mirror MB/s during fio | mirror at end |"
            echo "| ---: | ---: | ---: | ---: | ---: | ---: | --- |"
            awk -F'|' -v l="$link" '$1 == l { r = $3 / $2; n = r * (1 - ($4 > 0 ? $5 / $4 : 0));
                printf "| %.1f | %.1f | %.2f | %d of %d | %.2f | %s | %s |\n", $2, $3, r, $5, $4, n, $6, $7 }' "$FIOM"
        fi
    done
    echo
    echo "## Targets"
    echo
    echo "| target | measured | met |"
    echo "| --- | ---: | --- |"
    target() {  # target LABEL VALUE MIN
        local met; met=$(awk -v v="$2" -v m="$3" 'BEGIN { if (v == "n/a") print "n/a"; else if (v + 0 >= m) print "yes"; else print "**no**" }')
        echo "| $1 | $2 | $met |"
    }
    if [[ " ${LINKS[*]} " == *" 1gbit "* ]] && [[ " ${DATASETS[*]} " == *" random.bin "* ]] && [[ ",$methods," == *",ferry,"* ]] && [[ ",$methods," == *",nc-raw,"* ]]; then
        target "1gbit: ferry ÷ nc raw, random (≥ 0.95)" "$(ratio 1gbit random.bin nc-raw)" 0.95
        target "1gbit: ferry ÷ nc\|lz4, mixed (≥ 1.0)" "$(ratio 1gbit mixed.bin nc-lz4)" 1.0
        target "1gbit: ferry ÷ nc\|lz4, db (≥ 1.0)" "$(ratio 1gbit db.dat nc-lz4)" 1.0
    fi
    if [[ " ${LINKS[*]} " == *" wan "* ]] && [[ " ${DATASETS[*]} " == *" random.bin "* ]] && [[ ",$methods," == *",ferry,"* ]] && [[ ",$methods," == *",nc-raw,"* ]]; then
        target "wan: ferry ÷ nc raw, random (≥ 4)" "$(ratio wan random.bin nc-raw)" 4
        target "wan: ferry ÷ nc\|lz4, mixed (≥ 4)" "$(ratio wan mixed.bin nc-lz4)" 4
        iops=$(awk -F'|' '$1 == "wan" && $2 == "ferry" {print $3}' "$FIO")
        # Round-trip bound: 4 jobs, each read one measured round trip (bench/rtt_probe.py).
        bound=$(awk -v r="${WAN_RTT_MS:-40}" 'BEGIN { printf "%.1f", 4000 / r }')
        target "wan: ferry fio IOPS ÷ round-trip bound $bound (4 jobs ÷ ${WAN_RTT_MS:-40} ms measured) (≥ 0.95)" \
            "$(awk -v i="${iops:-0}" -v b="$bound" 'BEGIN { printf "%.2f", i / b }')" 0.95
    fi
    if [[ " ${LINKS[*]} " == *" loopback "* ]] && [[ " ${DATASETS[*]} " == *" random.bin "* ]] && [[ ",$methods," == *",ferry,"* ]] && [[ ",$methods," == *",nc-raw,"* ]]; then
        target "loopback: ferry ÷ nc raw, random (≥ 0.8)" "$(ratio loopback random.bin nc-raw)" 0.8
    fi
    if grep -q "^wan|" "$FIOM"; then
        med=$(awk -F'|' '$1 == "wan" { print ($3 / $2) * (1 - ($4 > 0 ? $5 / $4 : 0)) }' "$FIOM" | sort -g | awk '{ a[NR] = $0 } END { printf "%.2f", a[int((NR + 1) / 2)] }')
        target "wan: fio IOPS while the mount's mirror runs ÷ IOPS without it, network reads only, median of $(grep -c '^wan|' "$FIOM") (≥ 0.8)" "$med" 0.8
    fi
    if [[ ",$methods," == *",ferry-tls,"* ]] && [[ ",$methods," == *",ferry,"* ]]; then
        for ds in "${DATASETS[@]}"; do
            [ -f "$DATA/$ds" ] || continue
            [[ " ${LINKS[*]} " == *" 1gbit "* ]] && target "1gbit: ferry TLS ÷ ferry, $ds (≥ 0.9)" "$(ratio 1gbit "$ds" ferry ferry-tls)" 0.9
            [[ " ${LINKS[*]} " == *" loopback "* ]] && target "loopback: ferry TLS ÷ ferry, $ds (reported)" "$(ratio loopback "$ds" ferry ferry-tls)" 0
        done
    fi
    if [[ ",$methods," == *",mirror,"* ]]; then
        for ds in "${DATASETS[@]}"; do
            [ -d "$DATA/$ds" ] || continue
            [[ " ${LINKS[*]} " == *" 1gbit "* ]] && target "1gbit: ferry mirror ÷ tar\|lz4\|nc, $ds (≥ 1.0)" "$(ratio 1gbit "$ds" nc-lz4 mirror)" 1.0
            [[ " ${LINKS[*]} " == *" wan "* ]] && target "wan: ferry mirror ÷ tar\|lz4\|nc, $ds (≥ 1.5)" "$(ratio wan "$ds" nc-lz4 mirror)" 1.5
        done
    fi
} > "$out"
log "report written to $out"
cat "$out"
