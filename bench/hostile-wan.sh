#!/usr/bin/env bash
# Issue 17's mix with real WAN clients: one ferryd in a network namespace on the WAN profile
# (toxiproxy: 20 ms each way, 25 MB/s per connection; the namespace's loopback shaped at
# 2 Gbit/s, so 1 Gbit/s end to end through the proxy), and
#   F fast clients  `ferry mirror` of a 64 MiB file straight to ferryd (4 streams each),
#   W WAN clients   the same through the WAN profile,
#   K stuck clients raw connections that send 64 reads and never read (bench/hostile_client.py).
# Each group runs alone first, then all together; reports each group's per-client rates, the
# slowest client's share of its rate alone, ferryd's peak resident memory and the stuck
# connections closed. Defaults F=16, W=16, K=8.
#
#   bench/hostile-wan.sh [--fast F] [--wan W] [--stuck K] [--out FILE]
#
# Needs root (a network namespace, tc) and toxiproxy (built into bench/out/bin with Go by
# bench/run.sh --links wan if missing). Nothing is left running.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
log() { printf '[%s] %s\n' "$(date +%T)" "$*" >&2; }
die() { echo "hostile-wan.sh: $*" >&2; exit 1; }

fast=16 wan=16 stuck=8 out=""
while [ $# -gt 0 ]; do
    case "$1" in
        --fast) fast=$2; shift 2 ;;
        --wan) wan=$2; shift 2 ;;
        --stuck) stuck=$2; shift 2 ;;
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
cat "$data/h/honest.bin" "$data/big" > /dev/null
bytes=$((64 << 20))
export FERRY_STATE_DIR=$WORK/state
FERRYD_ARGS="--max-connections 1024" ns_ferryd "$data"
set_link wan
wan_port=$P_FERRY

# round PORT N TAG: N mirrors at once through PORT; one rate (MB/s) per line in $WORK/TAG.
round() {
    local port=$1 n=$2 tag=$3 i pids=()
    : > "$WORK/$tag"
    for i in $(seq "$n"); do
        (
            rm -rf "$WORK/$tag$i"
            s=$(date +%s.%N)
            if in_ns "$ROOT/target/release/ferry" mirror "127.0.0.1:$port:/h" "$WORK/$tag$i" -q --streams 4 2>"$WORK/logs/$tag$i.log"; then
                e=$(date +%s.%N)
                awk -v a="$s" -v z="$e" -v b="$bytes" 'BEGIN { printf "%.1f\n", b / (z - a) / 1e6 }' >> "$WORK/$tag"
            else
                echo failed >> "$WORK/$tag"
            fi
        ) &
        pids+=($!)
    done
    wait "${pids[@]}"
    cmp -s "$data/h/honest.bin" "$WORK/${tag}1/honest.bin" || die "a copy differs ($tag)"
}
summary() { grep -v failed | sort -g | awk '{ r[++n] = $1; s += $1 } END { printf "min %.1f, median %.1f, max %.1f, sum %.0f MB/s", r[1], r[int((n + 1) / 2)], r[n], s }'; }
median() { grep -v failed | sort -g | awk '{ r[++n] = $1 } END { print r[int((n + 1) / 2)] }'; }
worst() { grep -v failed | sort -g | head -1; }

log "alone: $fast fast clients"
round 7070 "$fast" fa
log "alone: $wan WAN clients"
round "$wan_port" "$wan" wa
log "together: $fast fast, $wan WAN and $stuck stuck clients"
bg_ns python3 "$ROOT/bench/hostile_client.py" 127.0.0.1:7070 big stuck "$stuck" 0 $((256 << 20))
sleep 3
round 7070 "$fast" ft &
f=$!
round "$wan_port" "$wan" wt &
w=$!
wait "$f" "$w"
fa=$(median < "$WORK/fa") wa=$(median < "$WORK/wa")
pct() { awk -v x="$1" -v y="$2" 'BEGIN { printf "%.0f", 100 * x / y }'; }
text=$(
    echo "ferry $(git rev-parse --short HEAD), $(date -u '+%F %H:%M UTC'), $(nproc) cores; WAN profile (measured round trip ${WAN_RTT_MS} ms); ferryd defaults but --max-connections 1024"
    echo "fast alone:     $(summary < "$WORK/fa")"
    echo "WAN alone:      $(summary < "$WORK/wa")"
    echo "fast together:  $(summary < "$WORK/ft"); failed $(grep -c failed "$WORK/ft" || true); slowest $(pct "$(worst < "$WORK/ft")" "$fa") % of the median alone"
    echo "WAN together:   $(summary < "$WORK/wt"); failed $(grep -c failed "$WORK/wt" || true); slowest $(pct "$(worst < "$WORK/wt")" "$wa") % of the median alone"
    echo "ferryd peak RSS $(awk '/VmHWM/ { printf "%d", $2 / 1024 }' "/proc/$ferryd_pid/status") MiB; stuck connections closed $(grep -c 'stopped reading its responses' "$WORK/logs/ferryd.log" || true) of $stuck"
)
echo "$text"
[ -n "$out" ] && echo "$text" > "$out"
exit 0
