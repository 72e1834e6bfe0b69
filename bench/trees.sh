#!/usr/bin/env bash
# Trees of real shapes out of the mount and with `ferry mirror` (issue 14), beside
# `tar | lz4 | nc` of the same tree, on emulated links (the namespace and toxiproxy set-up of
# bench/run.sh, from bench/lib.sh).
#
#   bench/trees.sh [--links 1gbit,wan] [--trees src,pgdata,git,flat] [--methods LIST]
#                  [--repeat N] [--interleave] [--copy-timeout SECS] [--out FILE]
#
# Trees (made once in bench/out/trees-data):
#   src     a real source tree: /usr/include and the Python standard library (~9,000 files)
#   pgdata  a real PostgreSQL data directory: initdb + pgbench -i -s 10 (~1,000 files, 160 MB)
#   git     a git working tree with its .git: a clone of this repository
#   flat    one directory of 100,000 small files (0-16 KiB, text-like; scripts/gen-flat.py)
#   sparse  one 8 GiB file holding 6 MiB of data (issue 16: holes never cross the wire),
#   fsimage an 8 GiB disk image formatted by mkfs.ext4 (a real sparse image's layout):
#           both not in the default list
# Methods: nc-lz4 (tar -c | lz4 -1 | nc, untarred at the other end), cp (cp -r out of the
#   mount), rsync (rsync -a out of the mount), tar (tar -cf - out of the mount, piped into
#   tar -x), mirror (ferry mirror), find and lsR (find / ls -lR over the mount, output
#   discarded), cp2 (cp -r out of the mount a second time, timed, after a first cp -r in the
#   same mount a moment before with the copy removed and the page cache dropped between: the
#   kernel's pages of the tree gone, as a `diff -r` after a copy of a tree larger than the
#   memory finds them; not in the default list), cppar (four `cp -r` at once over the tree's
#   second-level directories, after the files above them, as fpart + parallel rsync split a
#   tree; not in the default list), cpcache and cpmirror (cp -r out of a mount with
#   --cache-dir, and with --cache-dir --mirror: the local copy on the same fresh ext4 as the
#   copies, made afresh for each run; not in the default list). Each mount method gets a
#   fresh mount; the page cache is dropped before each run; every copy is checked with
#   diff -r. The mount's peak resident memory (VmHWM) is reported per run. Copies land on a
#   fresh ext4 made for the run (fresh_fs in bench/lib.sh: this VM's root file system creates
#   files slower after every tree deleted on it).
#
# Output: a markdown report (default bench/out/trees.md) with the date, commit and a table per
# link: seconds (median of --repeat runs), MB/s, the ratio to nc-lz4 (for find and lsR,
# only seconds), and the CPU time the run took on the whole machine and in ferryd (from
# /proc/stat and /proc/PID/stat: whether two cores were the limit, and whose); the log gives
# each run's seconds and CPU seconds, for A/B runs alternated with bench/alternate.sh.
# No namespace, mount or process is left behind, even on Ctrl-C.
# FERRYD_BIN=PATH and FERRY_BIN=PATH: another ferryd or ferry binary to compare against.
# --interleave: the methods take turns, one run each per round (nc-lz4, cp, rsync, …, then
#   again), instead of each method's runs one after another: this VM's speed swings up to 2x
#   between spells, and a method's ratio to nc-lz4 is then taken within one spell. The report
#   adds the median of the rounds' own ratios (nc-lz4's run over the method's run of the same
#   round). Not with bench/alternate.sh: which build a method gets would then depend on how
#   many ferry methods come before it in a round.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD

links=1gbit,wan
trees=src,pgdata,git,flat
methods=nc-lz4,cp,rsync,tar,mirror,find,lsR
repeat=1
interleave=0
copy_timeout=300
out=bench/out/trees.md
while [ $# -gt 0 ]; do
    case "$1" in
        --links) links=$2; shift 2 ;;
        --trees) trees=$2; shift 2 ;;
        --methods) methods=$2; shift 2 ;;
        --repeat) repeat=$2; shift 2 ;;
        --interleave) interleave=1; shift ;;
        --copy-timeout) copy_timeout=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        *) echo "trees.sh: unknown argument $1 (see the header of this script)" >&2; exit 2 ;;
    esac
done
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
[ -z "$(git status --porcelain 2>/dev/null)" ] || commit="$commit (+ uncommitted changes)"
log() { printf '[%s] %s\n' "$(date +%T)" "$*" >&2; }
die() { log "trees.sh: $*"; exit 1; }
# shellcheck source=bench/lib.sh
. bench/lib.sh

[ "$(id -u)" -eq 0 ] || die "run as root: it creates a network namespace, mounts FUSE and drops caches"
bash scripts/prereqs.sh
ns_install nc:netcat-openbsd ip:iproute2 tc:iproute2 nsenter:util-linux curl:curl git:git
nc -h 2>&1 | grep -q -- '-N' || die "nc must be netcat-openbsd (needs -N): apt-get install netcat-openbsd"
ns_toxiproxy "$links"
log "building ferry (release)"
cargo build --release --bins -q
DATA=$ROOT/bench/out/trees-data
real_trees "$DATA" "$trees"

ns_start
fresh_fs "$WORK/dst" 16
ns_ferryd "$DATA"
ROWS=$WORK/rows   # link|tree|method|seconds|MB/s|peak RSS MiB|CPU s|ferryd CPU s|× nc-lz4 per round
: > "$ROWS"

# run_once TREE METHOD MOUNT: one timed run; prints "SECONDS|RSS|CPU|FERRYD CPU" or
# "failed (why)".
run_once() {
    local t=$1 m=$2 mnt=$3 status=0 t0 t1 rss="" c0 d0
    rm -rf "${WORK:?}/dst/$t" "${WORK:?}/dst/.cache"
    drop_caches
    local margs=()
    case "$m" in
        cpcache) margs=(--cache-dir "$WORK/dst/.cache") ;;
        cpmirror) margs=(--cache-dir "$WORK/dst/.cache" --mirror) ;;
    esac
    case "$m" in cp|cp2|cppar|cpcache|cpmirror|rsync|tar|find|lsR)
        ferry_mount_at "$mnt" "${margs[@]}" || { echo "failed (mount)"; return 0; } ;;
    esac
    if [ "$m" = cp2 ]; then
        cp -r "$mnt/$t" "$WORK/dst/$t" || { ferry_unmount "$mnt" || true; echo "failed (first cp)"; return 0; }
        rm -rf "${WORK:?}/dst/$t"
        drop_caches
    fi
    c0=$(cpu_busy); d0=$(cpu_of "$ferryd_pid")
    t0=$(date +%s.%N)
    (
        case "$m" in
            nc-lz4)
                mkdir -p "$WORK/dst/$t"
                in_ns sh -c "nc -l 127.0.0.1 9000 | lz4 -d | tar -x -C '$WORK/dst/$t'" &
                r=$!; sleep 0.2
                tar -c -C "$DATA/$t" . | lz4 -1 | in_ns nc -N 127.0.0.1 "$P_NC"
                wait $r ;;
            cp|cp2|cpcache|cpmirror) cp -r "$mnt/$t" "$WORK/dst/$t" ;;
            rsync) rsync -a "$mnt/$t/" "$WORK/dst/$t/" ;;
            cppar)
                # Four walkers at once over the tree's second-level directories (as fpart +
                # parallel rsync split a tree), the files above them copied first.
                mkdir -p "$WORK/dst/$t"
                cd "$mnt/$t"
                find . -mindepth 1 -maxdepth 1 -type d -print0 | (cd "$WORK/dst/$t" && xargs -0 -r mkdir -p)
                find . -mindepth 1 -maxdepth 2 ! -type d -print0 | xargs -0 -r cp -P --parents -t "$WORK/dst/$t"
                find . -mindepth 2 -maxdepth 2 -type d -print0 | xargs -0 -r -P 4 -n 8 cp -r --parents -t "$WORK/dst/$t" ;;
            tar) mkdir -p "$WORK/dst/$t"; tar -cf - -C "$mnt/$t" . | tar -xf - -C "$WORK/dst/$t" ;;
            mirror) in_ns "${FERRY_BIN:-$ROOT/target/release/ferry}" mirror "127.0.0.1:$P_FERRY:/$t" "$WORK/dst/$t" --quiet ;;
            find) find "$mnt/$t" > /dev/null ;;
            lsR) ls -lR "$mnt/$t" > /dev/null ;;
        esac
    ) > "$WORK/logs/run.log" 2>&1 &
    local job=$!
    ( sleep "$copy_timeout"; kill_tree "$job" ) &
    local watchdog=$!
    wait "$job" || status=$?
    kill_tree "$watchdog"; wait "$watchdog" 2>/dev/null || true
    t1=$(date +%s.%N)
    local cpu fcpu
    cpu=$(awk -v a="$c0" -v z="$(cpu_busy)" 'BEGIN { printf "%.2f", z - a }')
    fcpu=$(awk -v a="$d0" -v z="$(cpu_of "$ferryd_pid")" 'BEGIN { printf "%.2f", z - a }')
    # The nc pipeline's 0.2 s for the listener to start is not counted.
    [ "$m" = nc-lz4 ] && t1=$(echo "$t1 - 0.2" | bc)
    case "$m" in cp|cp2|cppar|cpcache|cpmirror|rsync|tar|find|lsR)
        local pid; pid=$(pgrep -f -- "ferry mount 127.0.0.1:$P_FERRY $mnt" | head -1)
        [ -n "$pid" ] && rss=$(awk '/VmHWM/ {printf "%.0f", $2 / 1024}' "/proc/$pid/status" 2>/dev/null)
        ferry_unmount "$mnt" || true ;;
    esac
    if [ $status -ne 0 ]; then
        if awk -v a="$t0" -v z="$t1" -v l="$copy_timeout" 'BEGIN { exit !(z - a >= l - 1) }'; then
            echo "timed out (> $copy_timeout s)"
        else
            echo "failed ($status: $(grep -v '^$' "$WORK/logs/run.log" | head -1 | cut -c1-80 | tr '|' '/'))"
        fi
        return 0
    fi
    case "$m" in find|lsR) ;; *)
        diff -r --no-dereference "$DATA/$t" "$WORK/dst/$t" >/dev/null \
            || die "$m: the copy of $t differs from the source" ;;
    esac
    echo "$(awk -v a="$t0" -v z="$t1" 'BEGIN { printf "%.2f", z - a }')|$rss|$cpu|$fcpu"
}

# report_row LINK TREE METHOD BYTES PAIRED RUN...: the method's row (median run) into $ROWS
# and its runs into the log. PAIRED: the median of the rounds' own ratios to nc-lz4, or "".
report_row() {
    local link=$1 t=$2 m=$3 bytes=$4 paired=$5 row med
    shift 5
    local runs=("$@")
    case "${runs[0]}" in
        failed*|timed*) row="${runs[0]}||||" ;;
        *) med=$(printf '%s\n' "${runs[@]}" | sort -t'|' -k1,1g | awk '{ a[NR] = $0 } END { print a[int((NR + 1) / 2)] }')
           row=$(awk -v b="$bytes" -v m="$med" 'BEGIN { split(m, x, "|"); printf "%.2f|%.1f|%s|%s|%s", x[1], b / x[1] / 1e6, x[2], x[3], x[4] }') ;;
    esac
    echo "$link|$t|$m|$row|$paired" >> "$ROWS"
    # Each run's seconds, and its CPU seconds (machine/ferryd): an A/B alternated with
    # bench/alternate.sh reads both builds' runs from here.
    log "  $(printf '%-7s %-7s' "$t" "$m") ${row//|/  }${paired:+  (× nc-lz4 per round: $paired)}  (s, MB/s, peak RSS MiB, CPU s, ferryd CPU s; runs: $(printf '%s ' "${runs[@]%%|*}"); CPU s per run, machine/ferryd: $(printf '%s\n' "${runs[@]}" | awk -F'|' '{ printf "%s/%s ", $3, $4 }'))"
}

for link in ${links//,/ }; do
    log "link $link"
    set_link "$link"
    for t in ${trees//,/ }; do
        bytes=$(du -sb "$DATA/$t" | cut -f1)
        declare -A got=()
        if [ "$interleave" = 1 ]; then
            for ((i = 1; i <= repeat; i++)); do
                for m in ${methods//,/ }; do
                    case "${got[$m]:-}" in failed*|timed*) continue ;; esac
                    r=$(run_once "$t" "$m" "$WORK/mnt/m")
                    case "$r" in failed*|timed*) got[$m]=$r; continue ;; esac
                    got[$m]="${got[$m]:-}${got[$m]:+ }$r"
                done
            done
        else
            for m in ${methods//,/ }; do
                for ((i = 1; i <= repeat; i++)); do
                    r=$(run_once "$t" "$m" "$WORK/mnt/m")
                    case "$r" in failed*|timed*) got[$m]=$r; break ;; esac
                    got[$m]="${got[$m]:-}${got[$m]:+ }$r"
                done
            done
        fi
        for m in ${methods//,/ }; do
            paired=""
            case "$m" in nc-lz4|find|lsR) ;; *)
                if [ "$interleave" = 1 ] && [[ "${got[nc-lz4]:-}" != "" && "${got[nc-lz4]}" != failed* && "${got[nc-lz4]}" != timed* && "${got[$m]}" != failed* && "${got[$m]}" != timed* ]]; then
                    paired=$(paste -d' ' <(tr ' ' '\n' <<< "${got[nc-lz4]}" | cut -d'|' -f1) <(tr ' ' '\n' <<< "${got[$m]}" | cut -d'|' -f1) \
                        | awk '$1 > 0 && $2 > 0 { print $1 / $2 }' | median_of_lines)
                fi ;;
            esac
            # shellcheck disable=SC2086 # the runs are words on purpose
            if [[ "${got[$m]}" == failed* || "${got[$m]}" == timed* ]]; then
                report_row "$link" "$t" "$m" "$bytes" "$paired" "${got[$m]}"
            else
                report_row "$link" "$t" "$m" "$bytes" "$paired" ${got[$m]}
            fi
        done
        unset got
    done
done

mkdir -p "$(dirname "$out")"
{
    echo "# Trees of real shapes (bench/trees.sh)"
    echo
    echo "ferry $commit, $(date -u '+%Y-%m-%d %H:%M') UTC; $(nproc) cores; median of $repeat run(s); page cache dropped before each; copies written to $DST_FS."
    for t in ${trees//,/ }; do
        echo "- $t: $(find "$DATA/$t" -type f | wc -l) files, $(find "$DATA/$t" -type d | wc -l) directories, $(du -sm "$DATA/$t" | cut -f1) MiB"
    done
    for link in ${links//,/ }; do
        echo
        echo "## $link"
        echo
        echo "| tree | method | seconds | MB/s | × nc-lz4 | × nc-lz4 per round | mount peak RSS (MiB) | CPU s (machine) | CPU s (ferryd) |"
        echo "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
        awk -F'|' -v l="$link" '
            $1 == l && $3 == "nc-lz4" { base[$2] = $4 }
            $1 == l { rows[++n] = $0 }
            END {
                for (i = 1; i <= n; i++) {
                    split(rows[i], x, "|")
                    r = (x[4] + 0 > 0 && base[x[2]] + 0 > 0 && x[3] != "find" && x[3] != "lsR") ? sprintf("%.2f", base[x[2]] / x[4]) : ""
                    mbs = (x[3] == "find" || x[3] == "lsR") ? "" : x[5]
                    printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", x[2], x[3], x[4], mbs, r, x[9], x[6], x[7], x[8]
                }
            }' "$ROWS"
    done
} > "$out"
log "report: $out"
cat "$out"
