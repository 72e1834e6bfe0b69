#!/usr/bin/env bash
# One ferryd, many clients, some hostile (issue 17), over loopback:
#
#   1. alone:   H honest clients (`ferry mirror` of a 64 MiB file, 4 streams each) at once;
#   2. mixed:   the same H honest clients beside S slow clients (raw protocol clients that
#               keep 64 reads in flight and read at 2 MiB/s, like clients on a WAN) and
#               K stuck clients (64 reads sent, nothing ever read);
#   3. crowded: as mixed, plus idle handshaken connections up to C connections in all;
#   4. each hostile pattern alone beside the H honest clients, with C connections in all:
#      stuck (64 reads sent, nothing read), listings (64 directory pages of 4,096 entries
#      pipelined, nothing read), dirdata (the same with the files' contents), partial (the
#      longest legal request frame but its last byte, then silence), silent (TCP opened,
#      no handshake: never authenticated), idle (handshaken, then silence).
#
# Reports each honest client's rate against its fair share (its rate when the honest
# clients are alone, less what the slow clients legitimately take, split evenly), the slow
# clients' rates, and ferryd's peak resident memory in each pattern (VmHWM of a fresh ferryd
# per pattern; --max-connections 2C). Defaults: H=16, S=16, K=8, C=512, every pattern.
#
#   bench/hostile.sh [--honest H] [--slow S] [--stuck K] [--connections C]
#                    [--patterns "mixed crowded stuck listings dirdata partial silent idle"]
#                    [--file PATH] [--out FILE]
#
# --file: the honest clients copy the first 64 MiB of PATH and the raw clients read its first
# 256 MiB (at least that long), instead of random bytes: e.g. a real database datafile or
# binaries, which ferryd compresses.
#
# The raw clients are bench/hostile_client.py (written from docs/PROTOCOL.md alone).
# Nothing is left running.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

honest=16 slow=16 stuck=8 conns=512 out="" file=/dev/urandom
patterns="mixed crowded stuck listings dirdata partial silent idle"
while [ $# -gt 0 ]; do
    case "$1" in
        --honest) honest=$2; shift 2 ;;
        --slow) slow=$2; shift 2 ;;
        --stuck) stuck=$2; shift 2 ;;
        --connections) conns=$2; shift 2 ;;
        --patterns) patterns=$2; shift 2 ;;
        --file) file=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        *) echo "hostile.sh: unknown argument $1 (see the header of this script)" >&2; exit 2 ;;
    esac
done
cargo build --release --bins -q

# shellcheck source=bench/lib.sh
. bench/lib.sh
bench_start ferry-hostile
raw_pids=()
bench_extra() {
    local p
    for p in "${raw_pids[@]}"; do kill "$p" 2>/dev/null || true; done
    raw_pids=()
}
trap 'bench_extra; bench_cleanup' EXIT INT TERM

log() { printf '[%s] %s\n' "$(date +%T)" "$*" >&2; }
data=$work/data
mkdir -p "$data/h"
head -c $((64 << 20)) "$file" > "$data/h/honest.bin"
head -c $((256 << 20)) "$file" > "$data/big"
[ "$(stat -c %s "$data/big")" -eq $((256 << 20)) ] || { echo "hostile.sh: $file is shorter than 256 MiB" >&2; exit 2; }
# A directory of 3,000 small files with long names: a page of 4,096 entries is about 1 MiB
# of names and attributes (3 MiB more with the contents).
mkdir -p "$data/d"
long=$(printf 'n%.0s' $(seq 200))
for i in $(seq 1000 3999); do printf "%01024d" "$i" > "$data/d/$i-$long"; done
cat "$data/h/honest.bin" "$data/big" > /dev/null
bytes=$((64 << 20))

# Runs the honest clients at once; prints one rate (MB/s) per line.
honest_round() {
    local i pids=()
    : > "$work/honest"
    for i in $(seq "$honest"); do
        (
            rm -rf "$work/c$i" "$work/c$i.failed"
            s=$(date +%s.%N)
            if target/release/ferry mirror "$ferryd_addr:/h" "$work/c$i" -q --streams 4 2>"$work/c$i.log"; then
                e=$(date +%s.%N)
                awk -v a="$s" -v z="$e" -v b="$bytes" 'BEGIN { printf "%.1f\n", b / (z - a) / 1e6 }' >> "$work/honest"
            else
                echo "failed" >> "$work/honest"
                touch "$work/c$i.failed"
            fi
        ) &
        pids+=($!)
    done
    wait "${pids[@]}"
    # Every copy that succeeded is the source (a failed one is left to resume).
    for i in $(seq "$honest"); do
        [ -e "$work/c$i.failed" ] && continue
        cmp -s "$data/h/honest.bin" "$work/c$i/honest.bin" || { echo "hostile.sh: honest client $i's copy differs" >&2; exit 1; }
    done
    for i in $(seq "$honest"); do
        if [ -e "$work/c$i.failed" ]; then
            echo "hostile.sh: honest client $i failed: $(tail -1 "$work/c$i.log")" >&2
            break
        fi
    done
    cat "$work/honest"
}

summary() { sort -g | awk '{ r[++n] = $1; s += $1 } END { printf "min %.1f, median %.1f, max %.1f, sum %.0f MB/s (%d clients)", r[1], r[int((n + 1) / 2)], r[n], s, n }'; }
peak() { awk '/VmHWM/ { printf "%d", $2 / 1024 }' "/proc/$ferryd_pid/status"; }
restart_ferryd() {
    [ -n "$ferryd_pid" ] && { kill "$ferryd_pid"; wait "$ferryd_pid" 2>/dev/null || true; }
    rm -f "$work/port"
    # Room for every connection of the crowded pattern: this measures sharing, not the
    # connection limit (a full server answers "busy", which clients retry).
    bench_ferryd "$data" --max-connections $((conns * 2))
}

report=()
restart_ferryd
log "1. alone: $honest honest clients"
alone=$(honest_round)
grep -q failed <<< "$alone" && { echo "hostile.sh: an honest client failed alone" >&2; exit 1; }
alone_sum=$(awk '{ s += $1 } END { printf "%.0f", s }' <<< "$alone")
report+=("alone:   honest $(summary <<< "$alone"); ferryd peak RSS $(peak) MiB")

for pattern in $patterns; do
    case "$pattern" in mixed | crowded) ;; *) continue ;; esac
    restart_ferryd
    python3 bench/hostile_client.py "$ferryd_addr" big stuck "$stuck" 0 $((256 << 20)) 2>>"$work/raw.log" &
    raw_pids+=($!)
    python3 bench/hostile_client.py "$ferryd_addr" big slow "$slow" $((2 << 20)) $((256 << 20)) > "$work/slow" 2>>"$work/raw.log" &
    slow_pid=$!
    raw_pids+=($slow_pid)
    if [ "$pattern" = crowded ]; then
        idle=$((conns - stuck - slow - honest * 4))
        python3 bench/hostile_client.py "$ferryd_addr" big idle "$idle" 2>>"$work/raw.log" &
        raw_pids+=($!)
    fi
    sleep 3
    log "2. $pattern: $honest honest beside $slow slow and $stuck stuck clients$([ "$pattern" = crowded ] && echo ", $conns connections in all")"
    got=$(honest_round)
    open=$(ss -Htn state established "( sport = :${ferryd_addr##*:} )" | wc -l)
    kill -TERM "$slow_pid"; wait "$slow_pid" 2>/dev/null || true
    slow_rates=$(awk '$1 == "slow" && $3 > 0 { printf "%.1f\n", $2 / $3 / 1e6 }' "$work/slow")
    slow_sum=$(awk '{ s += $1 } END { printf "%.1f", s }' <<< "$slow_rates")
    fair=$(awk -v a="$alone_sum" -v s="$slow_sum" -v h="$honest" 'BEGIN { printf "%.1f", (a - s) / h }')
    failed=$(grep -c failed <<< "$got" || true)
    worst=$(grep -v failed <<< "$got" | sort -g | head -1)
    report+=("$pattern: honest $(summary <<< "$(grep -v failed <<< "$got")"), failed $failed; fair share $fair MB/s each, the slowest honest client got $(awk -v w="$worst" -v f="$fair" 'BEGIN { printf "%.0f", 100 * w / f }') % of it; slow clients $(summary <<< "$slow_rates"); connections open at the end $open; ferryd peak RSS $(peak) MiB; stalled connections closed $(grep -c 'stopped reading its responses' "$work/ferryd.log" || true)")
    bench_extra
done

# 4. One hostile pattern at a time, filling the connections the honest clients leave.
hostile=$((conns - honest * 4))
alone_fair=$(awk -v a="$alone_sum" -v h="$honest" 'BEGIN { printf "%.1f", a / h }')
for pattern in $patterns; do
    case "$pattern" in
        stuck | listings | dirdata | partial | silent | idle) ;;
        mixed | crowded) continue ;;
        *) echo "hostile.sh: unknown pattern $pattern (see the header of this script)" >&2; exit 2 ;;
    esac
    restart_ferryd
    target=big
    case "$pattern" in listings | dirdata) target=d ;; esac
    python3 bench/hostile_client.py "$ferryd_addr" "$target" "$pattern" "$hostile" 0 $((256 << 20)) 2>>"$work/raw.log" &
    raw_pids+=($!)
    sleep 5
    held=$(ss -Htn state established "( sport = :${ferryd_addr##*:} )" | wc -l)
    log "3. $pattern: $honest honest beside $hostile $pattern connections ($held open)"
    got=$(honest_round)
    failed=$(grep -c failed <<< "$got" || true)
    worst=$(grep -v failed <<< "$got" | sort -g | head -1)
    report+=("$pattern x$hostile: honest $(summary <<< "$(grep -v failed <<< "$got")"), failed $failed; the slowest honest client got $(awk -v w="$worst" -v f="$alone_fair" 'BEGIN { printf "%.0f", 100 * w / f }') % of its share alone ($alone_fair MB/s); connections open before the honest ones $held; ferryd peak RSS $(peak) MiB")
    bench_extra
done

text=$(
    echo "ferry $(git rev-parse --short HEAD), $(date -u '+%F %H:%M UTC'), $(nproc) cores, kernel $(uname -r); ferryd defaults (48 MiB budget); data $file"
    printf '%s\n' "${report[@]}"
)
echo "$text"
[ -n "$out" ] && echo "$text" > "$out"
exit 0
