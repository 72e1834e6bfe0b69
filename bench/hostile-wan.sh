#!/usr/bin/env bash
# Issue 17's mix with real WAN clients: one ferryd in a network namespace on the WAN profile
# (toxiproxy: 20 ms each way, 25 MB/s per connection; the namespace's loopback shaped at
# 2 Gbit/s, so 1 Gbit/s end to end through the proxy), and
#   F fast clients  `ferry mirror` of a 1 GiB file straight to ferryd (4 streams each),
#   W WAN clients   the same through the WAN profile,
#   K stuck clients raw connections that send 64 reads and never read (bench/hostile_client.py).
# Each group runs alone first, then all together. Every client is measured over the same
# window (after a warm-up, while all of them are copying: a copy of a fixed size would let
# the first to finish leave the others the link): the bytes each ferry process wrote to its
# copy over the window (`wchar` in /proc/PID/io; its writes are bounded behind its receipts). Reports each group's rates, what
# the shaped loopback carried and the CPUs' idle time in the window, every honest client's
# share of its fair share (below), ferryd's peak resident memory and the stuck connections
# closed. At the end one complete copy through each path is compared with cmp.
#
# The fair share: the network is the shared limit here (the shaped loopback runs at its rate
# throughout while the CPUs idle about half the time), and through toxiproxy every WAN byte
# crosses that loopback twice (ferryd to the proxy, the proxy to the client). So the fair share
# is the rate all honest clients would get if they got the same: what they moved through the
# loopback together (the fast clients' bytes plus twice the WAN clients') over F + 2 W.
# Also reported: when each group's clients wrote their first bytes (a client that starts
# while the link is full takes a while to get its first responses). Defaults F=16, W=16,
# K=8, an 8 s warm-up and a 6 s window.
#
#   bench/hostile-wan.sh [--fast F] [--wan W] [--stuck K] [--warmup S] [--window S]
#                        [--file PATH] [--out FILE]
#
# --file: the file the clients copy instead of 1 GiB of random bytes (e.g. a real database
# datafile or binaries). Compressible data is not sent as written: the loopback then carries
# fewer bytes than the clients write, the network may no longer be the limit, and the fair
# share above (from bytes written) is only what every client would get if all got the same.
#
# FERRYD_BIN=PATH and FERRY_BIN=PATH: another ferryd or ferry binary (e.g. an older build, for
# a comparison; a ferryd binary must be named ferryd). EXTRA_FERRYD_ARGS: more ferryd options.
# Also reported: the namespace's SYN retransmits and retransmission timeouts during the mix
# (a handshake packet dropped by the full queue waits a second or more for its retransmit).
#
# Needs root (a network namespace, tc) and toxiproxy (built into bench/out/bin with Go by
# bench/run.sh --links wan if missing). Nothing is left running.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
log() { printf '[%s] %s\n' "$(date +%T)" "$*" >&2; }
die() { echo "hostile-wan.sh: $*" >&2; exit 1; }

fast=16 wan=16 stuck=8 warmup=8 window=6 file="" out=""
while [ $# -gt 0 ]; do
    case "$1" in
        --fast) fast=$2; shift 2 ;;
        --wan) wan=$2; shift 2 ;;
        --stuck) stuck=$2; shift 2 ;;
        --warmup) warmup=$2; shift 2 ;;
        --window) window=$2; shift 2 ;;
        --file) file=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        *) die "unknown argument $1 (see the header of this script)" ;;
    esac
done
cargo build --release --bins -q

# shellcheck source=bench/lib.sh
. bench/lib.sh
ns_toxiproxy wan
ns_start
data=$WORK/data
mkdir -p "$data/h"
head -c $((64 << 20)) /dev/urandom > "$data/h/honest.bin"
head -c $((256 << 20)) /dev/urandom > "$data/big"
mkdir -p "$data/w"
if [ -n "$file" ]; then
    [ -f "$file" ] || die "--file $file: no such file"
    ln "$file" "$data/w/stream.bin" 2>/dev/null || cp "$file" "$data/w/stream.bin"
else
    head -c $((1 << 30)) /dev/urandom > "$data/w/stream.bin"
fi
cat "$data/h/honest.bin" "$data/big" "$data/w/stream.bin" > /dev/null
export FERRY_STATE_DIR=$WORK/state
FERRYD_ARGS="--max-connections 1024 ${EXTRA_FERRYD_ARGS:-}" ns_ferryd "$data"
set_link wan
wan_port=$P_FERRY

# start PORT N TAG: N mirrors of the 1 GiB file at once through PORT, in the background; their
# process ids are added to $WORK/TAG.pids.
start() {
    local port=$1 n=$2 tag=$3 i
    : > "$WORK/$tag.pids"
    for i in $(seq "$n"); do
        rm -rf "${WORK:?}/$tag$i"
        nsenter --net="/var/run/netns/$NS" "${FERRY_BIN:-$ROOT/target/release/ferry}" mirror "127.0.0.1:$port:/w" \
            "$WORK/$tag$i" -q --streams 4 2>"$WORK/logs/$tag$i.log" &
        echo $! >> "$WORK/pids"
        echo $! >> "$WORK/$tag.pids"
    done
}
written() { awk '/^wchar/ { print $2 }' "/proc/$1/io" 2>/dev/null || echo gone; }
qdisc_bytes() { tc -n "$NS" -s qdisc show dev lo | awk '/Sent/ { print $2; exit }'; }
idle_ticks() { awk '/^cpu / { print $5 + $6, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9 }' /proc/stat; }
# measure TAG...: waits the warm-up, then reads every client's bytes written at the start and end of
# the window; one rate (MB/s) per client in $WORK/TAG, "gone" for a client that ended in
# the window (it failed: none can finish 1 GiB in it); the loopback's rate and the CPUs'
# idle share over the window in $WORK/link. Then stops the clients.
measure() {
    local tag pid t0 t1 q0 q1 i0 i1 end w
    # During the warm-up, when each client had written its first MiB (seconds after the start;
    # before that it writes only its state).
    for tag in "$@"; do : > "$WORK/$tag.first"; done
    end=$(awk -v a="$started" -v w="$warmup" 'BEGIN { printf "%.3f", a + w }')
    while awk -v e="$end" -v n="$(date +%s.%N)" 'BEGIN { exit !(n < e) }'; do
        for tag in "$@"; do
            while read -r pid; do
                grep -q "^$pid " "$WORK/$tag.first" && continue
                w=$(written "$pid")
                [ "$w" != gone ] && [ "$w" -gt $((1 << 20)) ] && echo "$pid $(awk -v a="$started" -v n="$(date +%s.%N)" 'BEGIN { printf "%.1f", n - a }')" >> "$WORK/$tag.first"
            done < "$WORK/$tag.pids"
        done
        sleep 0.2
    done
    for tag in "$@"; do
        while read -r pid; do echo "$pid $(written "$pid")"; done < "$WORK/$tag.pids" > "$WORK/$tag.r0"
    done
    t0=$(date +%s.%N) q0=$(qdisc_bytes) i0=$(idle_ticks)
    sleep "$window"
    for tag in "$@"; do
        while read -r pid; do echo "$pid $(written "$pid")"; done < "$WORK/$tag.pids" > "$WORK/$tag.r1"
    done
    t1=$(date +%s.%N) q1=$(qdisc_bytes) i1=$(idle_ticks)
    for tag in "$@"; do
        paste -d ' ' "$WORK/$tag.r0" "$WORK/$tag.r1" | awk -v a="$t0" -v z="$t1" \
            '{ if ($2 == "gone" || $4 == "gone") print "gone"; else printf "%.2f\n", ($4 - $2) / (z - a) / 1e6 }' > "$WORK/$tag"
        while read -r pid; do kill "$pid" 2>/dev/null || true; done < "$WORK/$tag.pids"
    done
    sleep 0.5
    # The copies are not needed (compressible data can fill tens of GB over a long warm-up).
    for tag in "$@"; do
        for i in $(seq "$(wc -l < "$WORK/$tag.pids")"); do rm -rf "${WORK:?}/$tag$i"; done
    done
    echo "$q0 $q1 $i0 $i1 $t0 $t1" | awk '{ printf "%.0f %.0f\n", ($2 - $1) / ($8 - $7) / 1e6, 100 * ($5 - $3) / ($6 - $4) }' > "$WORK/link"
    sleep 1
}
summary() { grep -v gone | sort -g | awk '{ r[++n] = $1; s += $1 } END { printf "min %.1f, median %.1f, max %.1f, sum %.0f MB/s", r[1], r[int((n + 1) / 2)], r[n], s }'; }
gone() { grep -c gone || true; }
# first TAG N: when the group's clients first wrote (median and last), or how many had not
# by the end of the warm-up.
first() {
    awk '{ print $2 }' "$WORK/$1.first" | sort -g | awk -v n="$2" '{ t[++k] = $1 } END {
        if (k < n) { printf "%d of %d wrote nothing in the warm-up", n - k, n; exit }
        printf "first MiB after %.1f s (median), %.1f s (last)", t[int((k + 1) / 2)], t[k] }'
}
sum() { grep -v gone | awk '{ s += $1 } END { printf "%.2f", s }'; }
worst() { grep -v gone | sort -g | head -1; }
# tcp_losses: the namespace's SYN retransmits and retransmission timeouts so far.
tcp_losses() { ip netns exec "$NS" nstat -asz TcpExtTCPSynRetrans TcpExtTCPTimeouts | awk '/^TcpExt/ { printf "%s ", $2 }'; }
pct() { awk -v x="$1" -v y="$2" 'BEGIN { printf "%.0f", 100 * x / y }'; }

log "alone: $fast fast clients"
started=$(date +%s.%N)
start 7070 "$fast" fa
measure fa
read -r fa_link fa_idle < "$WORK/link"
log "alone: $wan WAN clients"
started=$(date +%s.%N)
start "$wan_port" "$wan" wa
measure wa
read -r wa_link wa_idle < "$WORK/link"
log "together: $fast fast, $wan WAN and $stuck stuck clients"
bg_ns python3 "$ROOT/bench/hostile_client.py" 127.0.0.1:7070 big stuck "$stuck" 0 $((256 << 20))
sleep 3
tcp0=$(tcp_losses)
started=$(date +%s.%N)
start 7070 "$fast" ft
start "$wan_port" "$wan" wt
measure ft wt
read -r t_link t_idle < "$WORK/link"
tcp1=$(tcp_losses)
fair=$(awk -v f="$(sum < "$WORK/ft")" -v w="$(sum < "$WORK/wt")" -v nf="$fast" -v nw="$wan" \
    'BEGIN { printf "%.2f", (f + 2 * w) / (nf + 2 * nw) }')
log "checking one complete copy through each path"
for port in 7070 "$wan_port"; do
    rm -rf "$WORK/check"
    in_ns "$ROOT/target/release/ferry" mirror "127.0.0.1:$port:/h" "$WORK/check" -q --streams 4 2>"$WORK/logs/check.log" \
        || die "the check copy through port $port failed: $(tail -1 "$WORK/logs/check.log")"
    cmp -s "$data/h/honest.bin" "$WORK/check/honest.bin" || die "the check copy through port $port differs"
done
text=$(
    echo "ferry $(git rev-parse --short HEAD), $(date -u '+%F %H:%M UTC'), $(nproc) cores; WAN profile (measured round trip ${WAN_RTT_MS} ms); ferryd defaults but --max-connections 1024 ${EXTRA_FERRYD_ARGS:-}; ${warmup} s warm-up, ${window} s window; copying ${file:-1 GiB of random bytes}"
    echo "fast alone:     $(summary < "$WORK/fa"); ended early $(gone < "$WORK/fa"); $(first fa "$fast"); loopback $fa_link MB/s, CPUs idle $fa_idle %"
    echo "WAN alone:      $(summary < "$WORK/wa"); ended early $(gone < "$WORK/wa"); $(first wa "$wan"); loopback $wa_link MB/s, CPUs idle $wa_idle %"
    echo "fast together:  $(summary < "$WORK/ft"); ended early $(gone < "$WORK/ft"); $(first ft "$fast")"
    echo "WAN together:   $(summary < "$WORK/wt"); ended early $(gone < "$WORK/wt"); $(first wt "$wan"); loopback $t_link MB/s, CPUs idle $t_idle %"
    echo "$tcp0 $tcp1" | awk '{ printf "TCP in the namespace from the start of the mix to the end of its window: %d SYN retransmits, %d retransmission timeouts\n", $3 - $1, $4 - $2 }'
    echo "fair share $fair MB/s each; slowest fast client $(pct "$(worst < "$WORK/ft")" "$fair") % of it, slowest WAN client $(pct "$(worst < "$WORK/wt")" "$fair") %"
    echo "ferryd peak RSS $(awk '/VmHWM/ { printf "%d", $2 / 1024 }' "/proc/$ferryd_pid/status") MiB; stuck connections closed $(grep -c 'stopped reading its responses' "$WORK/logs/ferryd.log" || true) of $stuck; check copies identical"
)
echo "$text"
[ -n "$out" ] && echo "$text" > "$out"
exit 0
