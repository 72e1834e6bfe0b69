#!/usr/bin/env bash
# ferry over an S3 store (issue 19) beside rclone, on the same 3-node Garage cluster
# (replication factor 3, scripts/garage-cluster.sh) inside the benchmark namespace, on emulated
# links (bench/lib.sh): 1gbit shapes the namespace's loopback; wan puts every S3 endpoint behind
# its own toxiproxy proxy (20 ms each way, 25 MB/s per TCP connection), as bench/run.sh does for
# ferryd.
#
#   bench/s3.sh [--links wan,1gbit] [--methods LIST] [--repeat N] [--file PATH] [--out FILE]
#   (FERRY_ARGS: extra options for the ferry mounts, e.g. "--chunk-size 4096";
#    FERRY_BIN: another ferry binary to compare against;
#    FERRY_MIRROR_ARGS: for ferry mirror, e.g. "--s3-metadata off")
#
# Data (made once in bench/out/s3-data, uploaded with rclone copy each run of the script):
#   big.bin  1 GiB of random bytes (S3 sends bytes as stored: compression plays no part);
#            --file PATH puts that file there instead (e.g. a real PostgreSQL datafile)
#   src      a real source tree: /usr/include and the Python standard library (bench/lib.sh)
# Methods:
#   ferry-cp        cp of big.bin out of `ferry mount s3://…` (all three endpoints)
#   rclone-mount    cp of big.bin out of `rclone mount --vfs-cache-mode full` (one endpoint)
#   rclone-copy     `rclone copy --multi-thread-streams 8` of big.bin
#   ferry-get       `ferry mirror s3://…/big` (big.bin with no FUSE in between)
#   ferry-mirror    `ferry mirror s3://…/src`
#   rclone-tree     `rclone copy --transfers 32` of src
#   ferry-tree-cp, rclone-tree-cp   `cp -r` of src out of each mount (tree prediction)
#   ferry-fio, rclone-fio   16 KiB random reads, 4 jobs, 20 s, through each mount (IOPS)
#   ferry-fio-cache the same through `ferry mount --cache-dir --mirror` (a local copy filled in
#                   the background, as rclone's full cache mode downloads around the reads)
#   ferry-kill      ferry-cp with node 2 of 3 killed 1 s into the copy (restarted after)
# Every copy is checked (MD5 against the source's, per file for the tree); the page cache is
# dropped and each mount is fresh before every run; medians of --repeat runs. Output: a
# markdown report (default bench/out/s3.md), with where the CPU went during each method (the
# Garage nodes, toxiproxy, the rest, idle: on 2 cores the cluster itself is often the limit)
# and the requests the nodes served meanwhile (GET, HEAD and LIST lines of their logs).
# No namespace, mount or process is left behind.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD

links=wan,1gbit
methods=ferry-cp,rclone-mount,rclone-copy,ferry-mirror,rclone-tree,ferry-fio,rclone-fio,ferry-kill
repeat=1
out=bench/out/s3.md
while [ $# -gt 0 ]; do
    case "$1" in
        --links) links=$2; shift 2 ;;
        --methods) methods=$2; shift 2 ;;
        --repeat) repeat=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        --file) big_file=$2; shift 2 ;;
        *) echo "s3.sh: unknown argument $1 (see the header of this script)" >&2; exit 2 ;;
    esac
done
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
[ -z "$(git status --porcelain 2>/dev/null)" ] || commit="$commit (+ uncommitted changes)"
log() { printf '[%s] %s\n' "$(date +%T)" "$*" >&2; }
die() { log "s3.sh: $*"; exit 1; }
# shellcheck source=bench/lib.sh
. bench/lib.sh

[ "$(id -u)" -eq 0 ] || die "run as root: it creates a network namespace, mounts FUSE and drops caches"
bash scripts/prereqs.sh
bash scripts/prereqs-garage.sh
ns_install ip:iproute2 tc:iproute2 nsenter:util-linux curl:curl rclone:rclone fio:fio
ns_toxiproxy "$links"
log "building ferry (release)"
cargo build --release --bins -q
DATA=$ROOT/bench/out/s3-data
real_trees "$DATA" src
BIG=$DATA/big
if [ -n "${big_file:-}" ]; then
    [ -f "$big_file" ] || die "--file $big_file: no such file"
    BIG=$DATA/big-file
    rm -rf "$BIG"; mkdir -p "$BIG"
    ln "$big_file" "$BIG/big.bin" 2>/dev/null || cp "$big_file" "$BIG/big.bin"
elif [ ! -f "$DATA/big/big.bin" ]; then
    mkdir -p "$DATA/big"
    head -c 1G /dev/urandom > "$DATA/big/big.bin.tmp" && mv "$DATA/big/big.bin.tmp" "$DATA/big/big.bin"
fi
objects=$(find "$DATA/src" -type f | wc -l)
# What a copy of src must hold: its regular files (S3 keeps no symlinks or empty directories).
if [ ! -s "$DATA/src.md5" ]; then
    (cd "$DATA/src" && find . -type f -print0 | sort -z | xargs -0 md5sum) > "$DATA/src.md5.tmp"
    mv "$DATA/src.md5.tmp" "$DATA/src.md5"
fi
check_tree() {  # check_tree DIR: every regular file of src, with its bytes, and no other
    [ "$(find "$1" -type f | wc -l)" = "$objects" ] && (cd "$1" && md5sum -c --quiet "$DATA/src.md5" >/dev/null 2>&1)
}

ns_start
# Copies land on a fresh ext4 made for the run (see fresh_fs in bench/lib.sh).
fresh_fs "$WORK/dst" 8
# Ethernet's MTU on the namespace's loopback (65536 by default). With a 64 KiB MTU a response
# smaller than one segment (a 16 KiB ranged GET) waits for the client's delayed ACK (40 ms)
# behind the server's Nagle at every hop (Garage's gateway and its node-to-node RPC): 88 ms
# per small GET through a 3-node cluster, against 4.9 ms with MTU 1500 (measured with boto3).
# A real LAN or WAN has 1500; S3_MTU=65536 measures the loopback as it is.
ip -n "$NS" link set lo mtu "${S3_MTU:-1500}"
GARAGE_DIR=$WORK/garage
bench_extra_cleanup() {
    in_ns bash "$ROOT/scripts/garage-cluster.sh" stop "$GARAGE_DIR" >/dev/null 2>&1 || true
}
log "starting a 3-node Garage cluster in the namespace"
in_ns bash "$ROOT/scripts/garage-cluster.sh" start "$GARAGE_DIR" 3 >/dev/null
# shellcheck disable=SC1091
. "$GARAGE_DIR/env"
export AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY AWS_REGION
IFS=, read -r -a NODE_EPS <<<"$FERRY_S3_ENDPOINTS"

# rclone's remote "g", by environment (no config file). rclone 1.60 fails on AWS_CA_BUNDLE
# with its own transport ("unsupported transport"): the endpoints are plain http here.
unset AWS_CA_BUNDLE
rclone_env() {
    export RCLONE_CONFIG_G_TYPE=s3 RCLONE_CONFIG_G_PROVIDER=Other RCLONE_CONFIG_G_REGION=garage \
        RCLONE_CONFIG_G_ACCESS_KEY_ID=$AWS_ACCESS_KEY_ID \
        RCLONE_CONFIG_G_SECRET_ACCESS_KEY=$AWS_SECRET_ACCESS_KEY \
        RCLONE_CONFIG_G_FORCE_PATH_STYLE=true RCLONE_CONFIG_G_ENDPOINT=$1
}
rclone_env "${NODE_EPS[0]}"
log "uploading big.bin and src ($objects objects) with rclone"
in_ns rclone copy --transfers 32 "$BIG" g:ferry-test/bench/big
in_ns rclone copy --transfers 32 "$DATA/src" g:ferry-test/bench/src
big_md5=$(md5sum < "$BIG/big.bin" | cut -d' ' -f1)
big_mb=$(echo "$(stat -c %s "$BIG/big.bin") / 1000000" | bc -l)

ROWS=$WORK/rows   # link|method|value|unit
CPU_ROWS=$WORK/cpu-rows   # link|method|garage|toxiproxy|rest|idle (ticks)|requests, every run
: > "$ROWS"; : > "$CPU_ROWS"

# The endpoints clients use on LINK: the nodes themselves, or on wan a toxiproxy proxy each.
client_endpoints() {
    local i port eps=()
    if [ "$1" != wan ]; then
        EPS=$FERRY_S3_ENDPOINTS
        return
    fi
    for i in "${!NODE_EPS[@]}"; do
        port=${NODE_EPS[$i]##*:}
        wan_proxy "s3n$i" "$((15000 + i))" "$port"
        eps+=("http://127.0.0.1:$((15000 + i))")
    done
    EPS=$(IFS=,; echo "${eps[*]}")
}

ferry_s3_mount() {  # ferry_s3_mount MNT
    mkdir -p "$1"
    # shellcheck disable=SC2086 # FERRY_ARGS: extra mount options, split on purpose
    in_ns "${FERRY_BIN:-$ROOT/target/release/ferry}" mount s3://ferry-test "$1" --endpoint "$EPS" --region garage \
        --log-file "$WORK/logs/ferry-s3-$link.log" ${FERRY_ARGS:-} || return 1
    for _ in $(seq 100); do grep -q " $1 " /proc/self/mountinfo && return 0; sleep 0.1; done
    return 1
}
rclone_mount() {  # rclone_mount MNT
    mkdir -p "$1"
    rm -rf "$WORK/rclone-cache"
    bg_ns rclone mount g:ferry-test "$1" --vfs-cache-mode full --cache-dir "$WORK/rclone-cache" \
        --log-file "$WORK/logs/rclone-$link.log"
    for _ in $(seq 100); do grep -q " $1 " /proc/self/mountinfo && return 0; sleep 0.1; done
    return 1
}
unmount() {
    fusermount3 -u "$1" 2>/dev/null || fusermount -u "$1" 2>/dev/null || umount -l "$1" 2>/dev/null || true
    for _ in $(seq 100); do grep -q " $1 " /proc/self/mountinfo || return 0; sleep 0.1; done
}

check_big() { [ "$(md5sum < "$1" | cut -d' ' -f1)" = "$big_md5" ]; }

# CPU ticks (USER_HZ) of the processes whose command line matches $1 (pgrep -f), summed.
ticks_of() {
    local p t=0 f
    for p in $(pgrep -f -- "$1"); do
        f=$(cut -d' ' -f14,15 "/proc/$p/stat" 2>/dev/null) || continue
        t=$((t + ${f% *} + ${f#* }))
    done
    echo "$t"
}
# "GARAGE TOXIPROXY BUSY IDLE": ticks so far of the Garage nodes, of toxiproxy, and the
# machine's busy and idle (+ iowait) ticks, all cores. A node killed during a run (ferry-kill)
# is missing from the second sample, so that method's Garage figure is low and its "rest"
# high by as much.
cpu_now() {
    echo "$(ticks_of "$GARAGE_DIR/node") $(ticks_of "$BIN/toxiproxy-server")" \
        "$(awk '/^cpu /{print $2+$3+$4+$7+$8+$9, $5+$6}' /proc/stat)"
}
# Requests the Garage nodes have answered so far: the GET and HEAD lines of their logs (a LIST
# is a GET of the bucket), error answers included.
requests_now() {
    cat "$GARAGE_DIR"/node*/log 2>/dev/null \
        | grep -cE 'generic_server: [0-9.:]+ (\(key [^)]*\) )?(GET|HEAD) ' || true
}

# run_once METHOD: one run; prints "VALUE UNIT" or "failed (why)".
run_once() {
    local m=$1 mnt=$WORK/mnt/s3 t0 t1 dst=$WORK/dst/run
    rm -rf "$dst" "$WORK/state"; mkdir -p "$dst"
    drop_caches
    rm -rf "$WORK/ferry-cache"
    case "$m" in
        ferry-cp|ferry-kill|ferry-fio|ferry-tree-cp) ferry_s3_mount "$mnt" || { echo "failed (mount)"; return 0; } ;;
        ferry-fio-cache)
            mkdir -p "$WORK/ferry-cache"
            FERRY_ARGS="${FERRY_ARGS:-} --cache-dir $WORK/ferry-cache --mirror" ferry_s3_mount "$mnt" \
                || { echo "failed (mount)"; return 0; } ;;
        rclone-mount|rclone-fio|rclone-tree-cp) rclone_mount "$mnt" || { echo "failed (mount)"; return 0; } ;;
    esac
    local c0 q0; c0=$(cpu_now); q0=$(requests_now)
    t0=$(date +%s.%N)
    local ok=1 killer=""
    case "$m" in
        ferry-cp|rclone-mount)
            cp "$mnt/bench/big/big.bin" "$dst/big.bin" || ok=0 ;;
        ferry-kill)
            ( sleep 1; in_ns bash "$ROOT/scripts/garage-cluster.sh" kill-node "$GARAGE_DIR" 2 >/dev/null ) &
            killer=$!
            cp "$mnt/bench/big/big.bin" "$dst/big.bin" || ok=0
            wait "$killer" || true ;;
        ferry-get)
            # shellcheck disable=SC2086 # FERRY_MIRROR_ARGS: extra options, split on purpose
            in_ns "${FERRY_BIN:-$ROOT/target/release/ferry}" mirror s3://ferry-test/bench/big "$dst/get" --quiet \
                --endpoint "$EPS" --region garage ${FERRY_MIRROR_ARGS:-} && mv "$dst/get/big.bin" "$dst/big.bin" || ok=0 ;;
        rclone-copy)
            in_ns rclone copy --multi-thread-streams 8 g:ferry-test/bench/big/big.bin "$dst" || ok=0 ;;
        ferry-mirror)
            # shellcheck disable=SC2086 # FERRY_MIRROR_ARGS: extra options, split on purpose
            in_ns "${FERRY_BIN:-$ROOT/target/release/ferry}" mirror s3://ferry-test/bench/src "$dst/src" --quiet \
                --endpoint "$EPS" --region garage ${FERRY_MIRROR_ARGS:-} || ok=0 ;;
        rclone-tree)
            in_ns rclone copy --transfers 32 g:ferry-test/bench/src "$dst/src" || ok=0 ;;
        ferry-tree-cp|rclone-tree-cp)
            cp -r "$mnt/bench/src" "$dst/src" || ok=0 ;;
        ferry-fio|ferry-fio-cache|rclone-fio)
            fio_randread "$mnt/bench/big/big.bin" 20 "$WORK/fio.json" || ok=0 ;;
    esac
    t1=$(date +%s.%N)
    local secs; secs=$(echo "$t1 - $t0" | bc -l)
    # Where the machine's CPU went meanwhile: Garage, toxiproxy, everything else busy (the
    # tool, cp, the kernel), idle.
    local a b
    read -r -a a <<<"$c0"; read -r -a b <<<"$(cpu_now)"
    echo "$link|$m|$(( b[0] - a[0] ))|$(( b[1] - a[1] ))|$(( b[2] - a[2] - (b[0] - a[0]) - (b[1] - a[1]) ))|$(( b[3] - a[3] ))|$(( $(requests_now) - q0 ))" >> "$CPU_ROWS"
    case "$m" in
        ferry-cp|rclone-mount|rclone-copy|ferry-kill|ferry-get)
            [ "$ok" = 1 ] && check_big "$dst/big.bin" || ok=0 ;;
        ferry-mirror|rclone-tree|ferry-tree-cp|rclone-tree-cp)
            [ "$ok" = 1 ] && check_tree "$dst/src" || ok=0 ;;
    esac
    case "$m" in
        ferry-*|rclone-mount|rclone-fio|rclone-tree-cp) unmount "$mnt" ;;
    esac
    if [ "$m" = ferry-kill ]; then
        in_ns bash "$ROOT/scripts/garage-cluster.sh" restart-node "$GARAGE_DIR" 2 >/dev/null \
            || log "node 2 did not come back"
    fi
    [ "$ok" = 1 ] || { echo "failed (copy or check)"; return 0; }
    case "$m" in
        ferry-fio|ferry-fio-cache|rclone-fio)
            python3 -c 'import json,sys; print("%.0f IOPS" % json.load(open(sys.argv[1]))["jobs"][0]["read"]["iops"])' "$WORK/fio.json" ;;
        ferry-mirror|rclone-tree|ferry-tree-cp|rclone-tree-cp) printf '%.2f s\n' "$secs" ;;
        *) printf '%.1f MB/s\n' "$(echo "$big_mb / $secs" | bc -l)" ;;
    esac
}

for link in ${links//,/ }; do
    log "link $link"
    set_link "$link"
    client_endpoints "$link"
    rclone_env "${EPS%%,*}"
    for m in ${methods//,/ }; do
        for r in $(seq "$repeat"); do
            v=$(run_once "$m")
            log "  $m run $r: $v"
            echo "$link|$m|$v" >> "$ROWS"
        done
    done
done

mkdir -p "$(dirname "$out")"
{
    echo "# ferry over S3 beside rclone ($(date -u +%Y-%m-%d), $commit)"
    echo
    echo "3-node Garage 2.5.0 cluster, replication 3, in the benchmark namespace on this machine;"
    echo "ferry uses all three endpoints, rclone $(rclone version 2>/dev/null | head -1 | cut -d' ' -f2) one. big.bin: ${big_file:-1 GiB random};"
    echo "src: $objects objects. Median of $repeat; page cache dropped before each run; every copy checked;"
    echo "MTU ${S3_MTU:-1500} on the namespace's loopback; copies written to $DST_FS."
    echo
    echo "| link | method | median | runs |"
    echo "| --- | --- | ---: | --- |"
    python3 - "$ROWS" <<'EOF'
import sys, statistics, collections
rows = collections.OrderedDict()
for line in open(sys.argv[1]):
    link, method, value = line.rstrip("\n").split("|", 2)
    rows.setdefault((link, method), []).append(value)
for (link, method), vals in rows.items():
    nums = [float(v.split()[0]) for v in vals if not v.startswith("failed")]
    unit = next((v.split()[1] for v in vals if not v.startswith("failed")), "")
    med = f"{statistics.median(nums):.2f} {unit}" if nums else "failed"
    print(f"| {link} | {method} | {med} | {', '.join(vals)} |")
EOF
    echo
    echo "Where the CPU went during each run (both cores; seconds, median of the runs): the three"
    echo "Garage nodes, toxiproxy, everything else busy (the tool, cp, the kernel), idle; and the"
    echo "requests the nodes answered (GET and HEAD lines of their logs, LISTs included; median)."
    echo
    echo "| link | method | Garage | toxiproxy | rest | idle | requests |"
    echo "| --- | --- | ---: | ---: | ---: | ---: | ---: |"
    python3 - "$CPU_ROWS" "$(getconf CLK_TCK)" <<'EOF'
import sys, statistics, collections
rows = collections.OrderedDict()
hz = float(sys.argv[2])
for line in open(sys.argv[1]):
    link, method, *ticks, requests = line.rstrip("\n").split("|")
    rows.setdefault((link, method), []).append([int(t) / hz for t in ticks] + [int(requests)])
for (link, method), runs in rows.items():
    med = [statistics.median(col) for col in zip(*runs)]
    print(f"| {link} | {method} | " + " | ".join(f"{v:.1f}" for v in med[:-1]) + f" | {med[-1]:.0f} |")
EOF
} > "$out"
log "report: $out"
cat "$out"
