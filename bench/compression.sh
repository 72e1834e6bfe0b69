#!/usr/bin/env bash
# Compression that fits the link (issue 18): `cp` of one 1 GiB file out of a ferry mount with
# --compression auto, lz4 and zstd, beside `zstd -1 -T0 | nc`, on emulated links, in one run.
#
#   bench/compression.sh [--links 1gbit,100mbit,wan,loopback] [--repeat N] [--out FILE]
#                        [--cases LIST] [--windows] [--interleave]
#
# Data of real shapes, made once in bench/out/compression-data:
#   mixed.dat   1 GiB of this machine's binaries and libraries (/usr/lib, /usr/bin) laid end
#               to end (ELF code, tables, compressed resources)
#   pg.dat      a real PostgreSQL datafile: the 1 GiB segment of pgbench_accounts after
#               `pgbench -i -s 80`
#   random.dat  1 GiB from /dev/urandom
# Cases (LINK:DATA:METHODS), by default those the issue names targets for:
#   1gbit:mixed, 1gbit:pg, 100mbit:pg, wan:mixed, loopback:random
# Methods: nc-zstd (`zstd -1 -T0 -c FILE | nc`, `nc | zstd -d` at the other end), nc-lz4,
# ferry-auto, ferry-lz4, ferry-none, ferry-zstdLEVEL (ferry-zstd1, ferry-zstd-1: a fresh
# `ferry mount --compression …` per copy, `cp` of the file out of it), mirror-auto,
# mirror-lz4, mirror-zstdLEVEL (`ferry mirror --compression …` of the file's directory: the
# same engine without FUSE). The page cache is dropped before every copy, and ferryd is
# started afresh before every ferry copy: it remembers for 10 s the ranges it read past the
# page cache and reads them through it the next time (so that many clients reading one cold
# data set read the disk about twice, not once each), which the copies of one case, a few
# seconds apart on a cache the benchmark empties, would otherwise pay for (0.4-0.6 s of
# ferryd's system time per GiB in two runs of three: database pages over 100 Mbit/s took
# 2.2-2.8 s instead of 2.0-2.2). Every copy is checked with cmp. 100mbit: tbf at
# 100 Mbit/s; the other links as in bench/run.sh.
#
# Output: a markdown table (default bench/out/compression.md): seconds, MB/s of file bytes,
# and for auto the codec it ended on (from `ferry status`); beside it (*-decisions.log) each
# copy's start and auto's changes of codec with what they rested on, and with --windows
# every quarter second's reading (rates, codec, whether the server said the link set the pace).
# FERRYD_BIN=PATH and FERRY_BIN=PATH: another ferryd or ferry binary to compare against.
# --interleave: a case's methods take turns, one copy each per round, instead of each
#   method's copies one after another, so that a method and `nc | zstd` share the VM's spell
#   (its speed swings up to 2x between spells); the report adds, per case, the median of the
#   rounds' own ratios of each ferry method to nc-zstd and to ferry-lz4 (MB/s over MB/s of
#   the same round). Not with bench/alternate.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
repeat=1
out=bench/out/compression.md
cases="1gbit:mixed:nc-zstd,ferry-auto,ferry-lz4 1gbit:pg:nc-zstd,ferry-auto,ferry-lz4 100mbit:pg:nc-zstd,ferry-auto,ferry-lz4 wan:mixed:nc-zstd,ferry-auto,ferry-lz4 loopback:random:ferry-auto,ferry-lz4"
links=""
windows=""
interleave=""
while [ $# -gt 0 ]; do
    case "$1" in
        --repeat) repeat=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        --cases) cases=${2//;/ }; shift 2 ;;
        --links) links=$2; shift 2 ;;
        --windows) windows=1; shift ;;
        --interleave) interleave=1; shift ;;
        *) echo "unknown option $1 (see the header of $0)" >&2; exit 2 ;;
    esac
done
log() { echo "[$(date +%H:%M:%S)] $*" >&2; }
die() { log "error: $*"; exit 1; }
# shellcheck source=bench/lib.sh
source bench/lib.sh

[ "$(id -u)" = 0 ] || die "run as root (network namespaces, tc, dropping caches)"
if [ -n "$links" ]; then
    keep=""
    for c in $cases; do [[ ",$links," == *",${c%%:*},"* ]] && keep="$keep $c"; done
    cases=$keep
fi
ns_install zstd:zstd lz4:lz4 nc:netcat-openbsd
all_links=$(for c in $cases; do echo "${c%%:*}"; done | sort -u | paste -sd,)
ns_toxiproxy "$all_links"
cargo build --release --bins -q

DATA=$ROOT/bench/out/compression-data
mkdir -p "$DATA"
if [ ! -s "$DATA/mixed.dat" ]; then
    log "making mixed.dat from /usr/lib and /usr/bin"
    find /usr/lib /usr/bin -type f -size +16k -print0 2>/dev/null | sort -z \
        | xargs -0 cat 2>/dev/null | head -c 1G > "$DATA/mixed.tmp" || true
    mv "$DATA/mixed.tmp" "$DATA/mixed.dat"
fi
if [ ! -s "$DATA/pg.dat" ]; then
    log "making pg.dat: pgbench -i -s 80 (a minute or two)"
    rm -rf "$DATA/pg"
    PG_SCALE=80 real_trees "$DATA/pg" pgdata
    seg=$(find "$DATA/pg/pgdata/base" -type f -size +500M -printf '%s %p\n' | sort -n | tail -1 | cut -d' ' -f2)
    [ -n "$seg" ] || die "no large relation file in the PostgreSQL data directory"
    head -c 1G "$seg" > "$DATA/pg.dat"
    rm -rf "$DATA/pg"
fi
[ -s "$DATA/random.dat" ] || head -c 1G /dev/urandom > "$DATA/random.dat"

# One directory per data set (hard links), so `ferry mirror` can copy one of them.
for ds in mixed pg random; do
    mkdir -p "$DATA/sets/$ds"
    [ "$DATA/sets/$ds/$ds.dat" -ef "$DATA/$ds.dat" ] || ln -f "$DATA/$ds.dat" "$DATA/sets/$ds/$ds.dat"
done

ns_start
export FERRY_STATE_DIR=$WORK/state
ns_ferryd "$DATA/sets"
mkdir -p "$WORK/dst"
ROWS=$WORK/rows
DECISIONS=${out%.md}-decisions.log
# What goes into it: auto's changes (-v), and with --windows every window's reading (trace).
verbose=-v decisions="compression now"
if [ -n "$windows" ]; then
    export RUST_LOG=debug,ferry_client::pool::compress=trace
    decisions="compression now\|window: "
fi
: > "$DECISIONS"

set_link_more() {  # set_link plus 100mbit
    if [ "$1" = 100mbit ]; then
        set_link loopback
        tc -n "$NS" qdisc add dev lo root tbf rate 100mbit burst 256kb latency 100ms
    else
        set_link "$1"
    fi
}

fresh_ferryd() {  # ferryd started afresh, as for a first copy of the data (see the header)
    local pid
    pid=$(pgrep -f -- "ferryd --export $DATA/sets --listen 127.0.0.1:7070" | head -1)
    if [ -n "$pid" ]; then
        kill "$pid"
        for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
    ns_ferryd "$DATA/sets"
}

copy_once() {  # copy_once DATA METHOD: prints seconds and, for ferry, the codec at the end
    local ds=$1 method=$2 mnt=$WORK/mnt/m t0 t1 codec="" got=$WORK/dst/$ds.dat
    rm -rf "$WORK/dst/$ds.dat" "$WORK/dst/$ds" "$FERRY_STATE_DIR"
    case "$method" in ferry-*|mirror-*) fresh_ferryd ;; esac
    drop_caches
    case "$method" in
        nc-zstd|nc-lz4)
            local tool=${method#nc-} level=-1
            in_ns sh -c "nc -l 127.0.0.1 9000 | $tool -d -c > '$WORK/dst/$ds.dat'" &
            local r=$!; sleep 0.2
            t0=$(date +%s.%N)
            if [ "$tool" = zstd ]; then
                zstd -q $level -T0 -c "$DATA/$ds.dat" | in_ns nc -N 127.0.0.1 "$P_NC"
            else
                lz4 -q -1 -c "$DATA/$ds.dat" | in_ns nc -N 127.0.0.1 "$P_NC"
            fi
            wait "$r"
            t1=$(date +%s.%N) ;;
        ferry-*)
            local mode=${method#ferry-}
            case "$mode" in zstd*) mode=zstd:${mode#zstd} ;; esac
            rm -f "$WORK/logs/ferry-m-$link.log"
            ferry_mount_at "$mnt" --compression "$mode" $verbose || { echo "failed"; return; }
            t0=$(date +%s.%N)
            cp "$mnt/$ds/$ds.dat" "$WORK/dst/$ds.dat"
            t1=$(date +%s.%N)
            codec=$("${FERRY_BIN:-$ROOT/target/release/ferry}" status "$mnt" 2>/dev/null | awk '/compress/ {sub(",", "", $2); print $2; exit}')
            ferry_unmount "$mnt" || true
            # auto's decisions, for reading afterwards.
            { echo "== $link $ds $method (cp began $(date -u -d "@$t0" +%T.%N | cut -c1-12))"; grep -a "$decisions" "$WORK/logs/ferry-m-$link.log" || true; } >> "$DECISIONS" ;;
        mirror-*)
            local mode=${method#mirror-}
            case "$mode" in zstd*) mode=zstd:${mode#zstd} ;; esac
            got=$WORK/dst/$ds/$ds.dat
            t0=$(date +%s.%N)
            in_ns "${FERRY_BIN:-$ROOT/target/release/ferry}" mirror "127.0.0.1:$P_FERRY:/$ds" "$WORK/dst/$ds" \
                --quiet --compression "$mode" $verbose 2> "$WORK/logs/mirror.log" || { echo "failed"; return; }
            t1=$(date +%s.%N)
            codec=$("${FERRY_BIN:-$ROOT/target/release/ferry}" status "$WORK/dst/$ds" 2>/dev/null | awk '/compress/ {sub(",", "", $2); print $2; exit}')
            { echo "== $link $ds $method (mirror began $(date -u -d "@$t0" +%T.%N | cut -c1-12))"; grep -a "$decisions" "$WORK/logs/mirror.log" || true; } >> "$DECISIONS" ;;
    esac
    cmp -s "$DATA/$ds.dat" "$got" || { echo "WRONG"; return; }
    echo "$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }') $codec"
}

echo "| link | data | method | s | MB/s | codec at the end |" > "$ROWS"
echo "| --- | --- | --- | ---: | ---: | --- |" >> "$ROWS"
PAIRED=$WORK/paired   # the per-round ratios table (--interleave)
: > "$PAIRED"
for c in $cases; do
    IFS=: read -r link ds methods <<<"$c"
    log "link $link, $ds.dat"
    set_link_more "$link"
    # The copies in the order they run: METHOD ROUND pairs.
    order=()
    if [ -n "$interleave" ]; then
        for ((i = 1; i <= repeat; i++)); do
            for method in ${methods//,/ }; do order+=("$method $i"); done
        done
    else
        for method in ${methods//,/ }; do
            for ((i = 1; i <= repeat; i++)); do order+=("$method $i"); done
        done
    fi
    declare -A rate=()   # "METHOD ROUND" -> MB/s
    for job in "${order[@]}"; do
        read -r method i <<<"$job"
        read -r secs codec < <(copy_once "$ds" "$method") || true
        case "$secs" in
            failed|WRONG|"") log "  $method: ${secs:-failed}"; echo "| $link | $ds | $method | $secs | | |" >> "$ROWS"; continue ;;
        esac
        mbs=$(awk -v s="$secs" -v b="$(stat -c %s "$DATA/$ds.dat")" 'BEGIN { printf "%.0f", b / s / 1e6 }')
        rate["$method $i"]=$mbs
        log "  $(printf '%-11s' "$method") $secs s  $mbs MB/s  $codec"
        echo "| $link | $ds | $method | $secs | $mbs | $codec |" >> "$ROWS"
    done
    if [ -n "$interleave" ]; then
        for method in ${methods//,/ }; do
            case "$method" in nc-*) continue ;; esac
            for base in nc-zstd ferry-lz4; do
                [ "$method" = "$base" ] && continue
                [[ ",$methods," == *",$base,"* ]] || continue
                ratios=$(for ((i = 1; i <= repeat; i++)); do
                    a=${rate["$method $i"]:-}; b=${rate["$base $i"]:-}
                    if [ -n "$a" ] && [ -n "$b" ]; then
                        awk -v a="$a" -v b="$b" 'BEGIN { if (b > 0) printf "%.2f\n", a / b }'
                    fi
                done | sort -g)
                [ -n "$ratios" ] || continue
                med=$(median_of_lines <<<"$ratios")
                log "  $method ÷ $base per round: $med (rounds: $(tr '\n' ' ' <<<"$ratios"))"
                echo "| $link | $ds | $method ÷ $base | $med | $(tr '\n' ' ' <<<"$ratios")|" >> "$PAIRED"
            done
        done
    fi
    unset rate
done
{
    echo "# Compression benchmark ($(date -u +%Y-%m-%d), commit $(git rev-parse --short HEAD))"
    echo
    echo "\`bench/compression.sh --repeat $repeat\` on this machine ($(nproc) cores)."
    echo
    cat "$ROWS"
    if [ -s "$PAIRED" ]; then
        echo
        echo "Methods in turns (\`--interleave\`): each round's own ratio, and their median."
        echo
        echo "| link | data | ratio | median | rounds (sorted) |"
        echo "| --- | --- | --- | ---: | --- |"
        cat "$PAIRED"
    fi
} > "$out"
log "wrote $out"
cat "$out"
