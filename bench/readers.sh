#!/usr/bin/env bash
# Readers during the background mirror (issue 13): what tools reading the mount lose while the
# mount's mirror (`ferry mount --cache-dir DIR --mirror`) fills the local copy, on the emulated
# links of bench/run.sh (a network namespace; shared code in bench/lib.sh).
#
#   bench/readers.sh [--smoke] [--links 1gbit,wan,loopback] [--only LIST] [--repeat N]
#                    [--seconds S] [--fio-seconds S] [--warmup S] [--read-mib N] [--cp-mib N]
#                    [--bulk-files N] [--bulk-mib N] [--bulk random|pgdata] [--bulk-pg-scale N]
#                    [--reads random|pg] [--cache-fs disk|ram]
#                    [--pg-scale N] [--timeout SECS]
#                    [--data DIR] [--out FILE] [--baseline FILE] [--fresh-ferryd]
#   FERRY_ARGS=...               extra options for every ferry mount
#   FERRY_MIRROR_MOUNT_ARGS=...  extra options for the mount with --mirror only
#   FERRYD_ARGS=...              extra options for ferryd
#
# Links (default 1gbit,wan): loopback (unshaped: CPU and disk are the limit), 1gbit (tbf),
#   wan (1 Gbit/s, toxiproxy: 20 ms each way, 25 MB/s per TCP connection); as bench/run.sh.
# Measurements (--only; default all, cp1g and restore on loopback only), each run --repeat
# times (default 3) alone (a plain mount) and during the mirror (a mount with --cache-dir on
# a fresh directory and --mirror, started --warmup s before), alone and during alternating
# which goes first; the page cache is dropped before every run:
#   pread    4 KiB random preads of read/random.bin (bench/pread_lat.py: posix_fadvise RANDOM,
#            each block once, --seconds s): p50, p99, reads per second
#   fio      fio 16 KiB random reads, 4 jobs, --fio-seconds s, of read/random.bin: IOPS
#   cp       cp of cp/random.bin (--cp-mib) out of the mount to local disk, verified with cmp
#   cp1g     the same with read/random.bin (--read-mib)
#   restore  pg_restore into a throwaway PostgreSQL 15 cluster of a custom-format dump
#            (pgbench -i -s --pg-scale, pg_dump -Fc -Z0, made once) read from the mount
#   idle     the mirror alone, no readers: MB/s over --seconds s (or until it completes)
# Alone and during alike wait --warmup s between dropping the page cache (and mounting)
# and the measurement: on a virtual machine that hands freed memory back to its host (free
# page reporting, virtio-balloon), pages freed by the drop are slow to use again a few
# seconds later (measured on the 2-core VM: a plain cp of 1 GiB ~0.6x when started 6 s
# after the drop rather than at once), so an unequal wait would be counted against the mirror.
# During the mirror, `ferry status --json` before and after each measurement gives the
# mirror's MB/s over it (bytes_fetched), whether it was running throughout, and the chunks
# readers found in the local copy. The export (--data, made once by scripts/gen-data.py) is
# the same for every link: read/random.bin, cp/random.bin (--reads pg: read/pg.bin,
# cp/pg.bin), --bulk-files × --bulk-mib MiB of
# bulk/, pg/*.dump; all incompressible but the dump, so the mirror's MB/s is on the wire too.
# --bulk pgdata: bulk/ is instead a real PostgreSQL 15 data directory (bulk/pgdata, made once
# by bench/lib.sh's real_trees: initdb, then `pgbench -i -s --bulk-pg-scale`, default 400,
# about 7 GiB, cleanly shut down), what a DBA's mirror moves: the mirror's MB/s is then of decoded bytes, the wire
# carrying less (its chunks pack 2-4.5:1 under the codecs `auto` picks).
# It must be big enough that the mirror does not finish during a measurement: the report
# flags runs where it was not running throughout.
# --reads pg: what the readers read is a real PostgreSQL datafile instead of random bytes:
# read/pg.bin is the first --read-mib MiB of pgbench_accounts after `pgbench -i -s 110`
# (its segments end to end; made once, the cluster then removed), cp/pg.bin the --cp-mib MiB
# after them. Database pages compress (zstd 1 about 40:1), so their reads move fewer wire
# bytes than random ones: what a database opening its datafiles on the mount reads.
# --cache-fs ram: the mirror's local copy (--cache-dir) on a fresh ext4 of its own, on a loop
# device over a file in RAM (tmpfs), instead of on the disk the export is on. On this one
# machine ferryd reads the export and the mirror writes its copy through one virtual disk;
# a real client writes its copy to its own disk, and the readers' reads from ferryd's disk
# do not queue behind it. Default disk (both on the one disk, as before).
# --smoke: a check that every step works (small files, --repeat 1, short windows).
# --fresh-ferryd: ferryd is started afresh before every run (alone and during alike), so its
# cache of whole-file hashes is cold, as at a first mirror of the data: otherwise from the
# second run on ferryd answers the mirror's hashes without reading the files again.
#
# Output: a markdown report (default bench/out/readers.md; --smoke: bench/out/readers-smoke.md)
# with the date and commit, a table per link, every run, and the issue's targets checked; the
# runs as tab-separated values beside it (FILE with .tsv). --baseline OLD.tsv (an earlier
# run's) adds "mirror alone ≥ 0.95× OLD". No namespace, mount, cluster or process is left
# behind, even on Ctrl-C.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
args_given="$*"

smoke=0 links="" only="" only_given=0 repeat="" seconds="" fio_secs="" warmup="" read_mib="" cp_mib=""
bulk_files="" bulk_mib="" bulk=random bulk_pg_scale=400 reads=random cache_fs=disk pg_scale="" timeout_secs=1800 data="" out="" baseline="" fresh_ferryd=0
while [ $# -gt 0 ]; do
    case "$1" in
        --smoke) smoke=1; shift ;;
        --fresh-ferryd) fresh_ferryd=1; shift ;;
        --links) links=$2; shift 2 ;;
        --only) only=$2; only_given=1; shift 2 ;;
        --repeat) repeat=$2; shift 2 ;;
        --seconds) seconds=$2; shift 2 ;;
        --fio-seconds) fio_secs=$2; shift 2 ;;
        --warmup) warmup=$2; shift 2 ;;
        --read-mib) read_mib=$2; shift 2 ;;
        --cp-mib) cp_mib=$2; shift 2 ;;
        --bulk-files) bulk_files=$2; shift 2 ;;
        --bulk-mib) bulk_mib=$2; shift 2 ;;
        --bulk) bulk=$2; shift 2 ;;
        --bulk-pg-scale) bulk_pg_scale=$2; shift 2 ;;
        --reads) reads=$2; shift 2 ;;
        --cache-fs) cache_fs=$2; shift 2 ;;
        --pg-scale) pg_scale=$2; shift 2 ;;
        --timeout) timeout_secs=$2; shift 2 ;;
        --data) data=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        --baseline) baseline=$2; shift 2 ;;
        -h|--help) sed -n '2,61p' "$0"; exit 0 ;;
        *) echo "bench/readers.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
    esac
done
if [ "$smoke" = 1 ]; then
    repeat=${repeat:-1} seconds=${seconds:-3} fio_secs=${fio_secs:-3} warmup=${warmup:-1}
    read_mib=${read_mib:-128} cp_mib=${cp_mib:-32} bulk_files=${bulk_files:-4} bulk_mib=${bulk_mib:-64}
    pg_scale=${pg_scale:-2} data=${data:-bench/out/readers-smoke-data} out=${out:-bench/out/readers-smoke.md}
fi
links=${links:-1gbit,wan}
repeat=${repeat:-3} seconds=${seconds:-20} fio_secs=${fio_secs:-15} warmup=${warmup:-3}
read_mib=${read_mib:-1024} cp_mib=${cp_mib:-256} bulk_files=${bulk_files:-24} bulk_mib=${bulk_mib:-256}
pg_scale=${pg_scale:-30} data=${data:-bench/out/readers-data} out=${out:-bench/out/readers.md}
case "$data" in /*) ;; *) data=$ROOT/$data ;; esac
DATA=$data
RAW=${out%.md}.tsv

die() { echo "bench/readers.sh: $*" >&2; exit 1; }
log() { printf '[%s] %s\n' "$(date +%T)" "$*" >&2; }
# The code measured is the code at the start (the tree may change during a long run).
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
[ -z "$(git status --porcelain 2>/dev/null)" ] || commit="$commit (+ uncommitted changes)"
started=$(date -u '+%Y-%m-%d %H:%M')
# shellcheck source=bench/lib.sh
. bench/lib.sh

IFS=, read -ra LINKS <<<"$links"
for l in "${LINKS[@]}"; do case "$l" in loopback|1gbit|wan) ;; *) die "unknown link '$l' (loopback, 1gbit, wan)" ;; esac; done
for m in ${only//,/ }; do case "$m" in pread|fio|cp|cp1g|restore|idle) ;; *) die "unknown measurement '$m'" ;; esac; done
# measures_for LINK: --only as given, else all (cp1g and restore, the CPU- and disk-bound
# targets, on loopback only).
measures_for() {
    if [ "$only_given" = 1 ]; then
        local m list=()
        for m in pread fio cp cp1g restore idle; do [[ ",$only," == *",$m,"* ]] && list+=("$m"); done
        echo "${list[*]}"
    elif [ "$1" = loopback ]; then echo "pread fio cp cp1g restore idle"
    else echo "pread fio cp idle"
    fi
}
case "$bulk" in random|pgdata) ;; *) die "unknown --bulk '$bulk' (random or pgdata)" ;; esac
case "$reads" in random|pg) ;; *) die "unknown --reads '$reads' (random or pg)" ;; esac
case "$cache_fs" in disk|ram) ;; *) die "unknown --cache-fs '$cache_fs' (disk or ram)" ;; esac
# What the readers read (paths in the export).
RF=read/$reads.bin CF=cp/$reads.bin
need_pg=0
for l in "${LINKS[@]}"; do [[ " $(measures_for "$l") " == *" restore "* ]] && need_pg=1; done

# ---------------------------------------------------------------- prerequisites
[ "$(id -u)" -eq 0 ] || die "run as root: it creates a network namespace, shapes it with tc, mounts FUSE and drops caches"
[ -e /dev/fuse ] || die "/dev/fuse is missing: FUSE is needed for the mounts"
bash scripts/prereqs.sh
ns_install fio:fio jq:jq ip:iproute2 tc:iproute2 nsenter:util-linux curl:curl timeout:coreutils
ns_toxiproxy "$links"
PGBIN=${PGBIN:-/usr/lib/postgresql/15/bin}
if [ "$need_pg" = 1 ]; then
    for t in initdb pg_ctl pgbench pg_dump pg_restore createdb dropdb; do
        [ -x "$PGBIN/$t" ] || die "restore needs PostgreSQL ($PGBIN/$t is missing; set PGBIN or leave restore out with --only)"
    done
    id postgres >/dev/null 2>&1 || die "restore needs a postgres user to run the throwaway cluster"
fi
log "building ferry (release)"
cargo build --release --bins -q

# ---------------------------------------------------------------- data
mkdir -p "$DATA" "$(dirname "$out")"
if [ "$bulk" = random ]; then
    log "export $DATA: read/ ${read_mib} MiB, cp/ ${cp_mib} MiB, bulk/ ${bulk_files} × ${bulk_mib} MiB"
    [ -e "$DATA/bulk/pgdata" ] && die "$DATA/bulk holds a PostgreSQL data directory (--bulk pgdata): give --bulk pgdata or another --data"
else
    log "export $DATA: read/ ${read_mib} MiB, cp/ ${cp_mib} MiB, bulk/pgdata (pgbench -i -s $bulk_pg_scale)"
fi
gen() { python3 scripts/gen-data.py "$DATA/$1" --size-mib "$2" --only random --seed "$3" >/dev/null; }
if [ "$reads" = random ]; then
    rm -f "$DATA/read/pg.bin" "$DATA/cp/pg.bin"
    gen read "$read_mib" 1
    gen cp "$cp_mib" 2
else
    rm -f "$DATA/read/random.bin" "$DATA/cp/random.bin"
    want=$(((read_mib + cp_mib) << 20))
    if [ "$(stat -c %s "$DATA/$RF" 2>/dev/null || echo 0)" != $((read_mib << 20)) ] \
        || [ "$(stat -c %s "$DATA/$CF" 2>/dev/null || echo 0)" != $((cp_mib << 20)) ]; then
        log "making $RF and $CF from a real PostgreSQL datafile: pgbench -i -s 110 (a minute or two)"
        rm -rf "$DATA.pgsrc"
        PG_SCALE=110 real_trees "$DATA.pgsrc" pgdata
        rel=$(find "$DATA.pgsrc/pgdata/base" -type f -size +500M -printf '%p\n' | sort | head -1)
        [ -n "$rel" ] || die "no 1 GiB relation segment in the PostgreSQL data directory $DATA.pgsrc"
        mkdir -p "$DATA/read" "$DATA/cp"
        { cat "$rel" "$rel".[0-9]* 2>/dev/null || true; } | head -c "$want" > "$DATA.pages"
        [ "$(stat -c %s "$DATA.pages")" = "$want" ] || die "pgbench_accounts holds under $((want >> 20)) MiB: lower --read-mib or --cp-mib"
        head -c $((read_mib << 20)) "$DATA.pages" > "$DATA/$RF"
        tail -c $((cp_mib << 20)) "$DATA.pages" > "$DATA/$CF"
        rm -rf "$DATA.pages" "$DATA.pgsrc"
    fi
fi
if [ "$bulk" = random ]; then
    for ((i = 1; i <= bulk_files; i++)); do gen "bulk/$(printf %02d "$i")" "$bulk_mib" $((100 + i)); done
else
    PG_SCALE=$bulk_pg_scale real_trees "$DATA/bulk" pgdata
fi
# Bulk directories beyond --bulk-files (from an earlier, larger run), or any with --bulk
# pgdata, would be mirrored too.
for d in "$DATA"/bulk/*; do
    [ -d "$d" ] || continue
    n=$(basename "$d")
    [ "$n" = pgdata ] && continue
    if [ "$bulk" = pgdata ] || [[ ! "$n" =~ ^[0-9]+$ ]] || ((10#$n > bulk_files)); then rm -rf "$d"; fi
done

# ---------------------------------------------------------------- sandbox and cleanup
PGWORK=""
PGPORT=5499
bench_extra_cleanup() {
    # --cache-fs ram: the copy's ext4 (its loop device goes with it), then the tmpfs under it;
    # lazily, as the mount using the copy may not have exited yet.
    mountpoint -q "$WORK/cache" 2>/dev/null && umount -l "$WORK/cache"
    mountpoint -q "$WORK/cache-ram" 2>/dev/null && umount -l "$WORK/cache-ram"
    [ -n "$PGWORK" ] || return 0
    if [ -f "$PGWORK/data/postmaster.pid" ]; then
        runuser -u postgres -- "$PGBIN/pg_ctl" -D "$PGWORK/data" stop -m immediate -w -t 20 >/dev/null 2>&1
        local pid; pid=$(head -1 "$PGWORK/data/postmaster.pid" 2>/dev/null)
        [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null
    fi
    rm -rf "$PGWORK"
}
ns_start
mkdir -p "$WORK/dst"

# A throwaway PostgreSQL cluster (Unix socket in its own directory only), for the dump and
# the restores.
pg() { "$PGBIN/$1" -h "$PGWORK" -p "$PGPORT" -U postgres "${@:2}"; }
pg_start() {
    PGWORK=$(mktemp -d /tmp/ferry-bench-pg.XXXXXX)
    chown postgres: "$PGWORK"
    runuser -u postgres -- "$PGBIN/initdb" -D "$PGWORK/data" -U postgres -A trust --no-sync >"$WORK/logs/initdb.log" 2>&1 \
        || die "initdb failed: $(tail -3 "$WORK/logs/initdb.log")"
    runuser -u postgres -- "$PGBIN/pg_ctl" -D "$PGWORK/data" -l "$PGWORK/postgres.log" -w \
        -o "-k $PGWORK -p $PGPORT -c listen_addresses=''" start >/dev/null \
        || die "the PostgreSQL cluster did not start: $(tail -3 "$PGWORK/postgres.log")"
}
DUMP=""
if [ "$need_pg" = 1 ]; then
    pg_start
    DUMP=pg/pgbench-s$pg_scale.dump
    if [ ! -s "$DATA/$DUMP" ]; then
        log "making $DUMP (pgbench -i -s $pg_scale, pg_dump -Fc -Z0)"
        mkdir -p "$DATA/pg"
        rm -f "$DATA"/pg/*
        pg createdb src
        pg pgbench -i -q -s "$pg_scale" src >"$WORK/logs/pgbench.log" 2>&1 || die "pgbench -i failed: $(tail -3 "$WORK/logs/pgbench.log")"
        pg pg_dump -Fc -Z0 -f "$DATA/$DUMP.tmp" src
        mv "$DATA/$DUMP.tmp" "$DATA/$DUMP"
        pg dropdb src
    fi
fi
total_bytes=$(du -sb "$DATA" | cut -f1)
log "export: $(du -sh "$DATA" | cut -f1) in all"
ns_ferryd "$DATA"

# ---------------------------------------------------------------- measurements
# Each prints its figures on one line (fields separated by spaces) or fails.
measure_pread() {
    python3 "$ROOT/bench/pread_lat.py" "$1/$RF" --seconds "$seconds" >"$WORK/logs/pread.json" || return 1
    jq -r '"\(.p50_ms) \(.p99_ms) \(.reads_per_sec) \(.count)"' "$WORK/logs/pread.json"
}
measure_fio() {
    fio_randread "$1/$RF" "$fio_secs" "$WORK/logs/fio.json" || return 1
    jq -r '.jobs[0].read | "\(.iops) \(.total_ios) - -"' "$WORK/logs/fio.json"
}
# measure_copy MOUNT REL: prints MB/s and seconds; verified after the mount is gone.
measure_copy() {
    local t0 t1 bytes
    bytes=$(stat -c %s "$DATA/$2")
    t0=$(date +%s.%N)
    timeout --foreground "$timeout_secs" cp "$1/$2" "$WORK/dst/copy" || return 1
    t1=$(date +%s.%N)
    awk -v b="$bytes" -v a="$t0" -v z="$t1" 'BEGIN { printf "%.1f %.2f - -\n", b / (z - a) / 1e6, z - a }'
}
measure_cp() { measure_copy "$1" "$CF"; }
measure_cp1g() { measure_copy "$1" "$RF"; }
measure_restore() {
    local t0 t1
    t0=$(date +%s.%N)
    timeout --foreground "$timeout_secs" "$PGBIN/pg_restore" -h "$PGWORK" -p "$PGPORT" -U postgres -d bench --no-owner \
        "$1/$DUMP" >"$WORK/logs/restore.log" 2>&1 || { log "  pg_restore: $(tail -2 "$WORK/logs/restore.log")"; return 1; }
    t1=$(date +%s.%N)
    awk -v a="$t0" -v z="$t1" 'BEGIN { printf "%.2f - - -\n", z - a }'
}
# The mirror alone: until it is no longer running or --seconds have passed, whichever is
# first (on loopback it may finish sooner); run_one's MB/s is over that time.
measure_idle() {
    local end; end=$(awk -v n="$(date +%s.%N)" -v s="$seconds" 'BEGIN { printf "%.3f", n + s }')
    while awk -v n="$(date +%s.%N)" -v e="$end" 'BEGIN { exit !(n < e) }'; do
        [ "$(status_json "$1" | jq -r '.state // "?"')" = running ] || break
        sleep 0.2
    done
    echo "- - - -"
}

prepare() {  # before the page cache is dropped
    case "$1" in
        cp|cp1g) rm -f "$WORK/dst/copy" ;;
        restore) pg dropdb --if-exists bench 2>/dev/null; pg createdb bench ;;
    esac
}
verify() {  # after the mount is gone
    case "$1" in
        cp) cmp -s "$DATA/$CF" "$WORK/dst/copy" || die "cp: the copy of $CF differs from the source" ;;
        cp1g) cmp -s "$DATA/$RF" "$WORK/dst/copy" || die "cp1g: the copy of $RF differs from the source" ;;
        restore)
            local n want=$((pg_scale * 100000))
            n=$(pg psql -tA -d bench -c 'select count(*) from pgbench_accounts')
            [ "$n" = "$want" ] || die "restore: pgbench_accounts has $n rows, not $want"
            # Nothing of this restore (a checkpoint, dirty pages) is left to disturb the next run.
            pg dropdb bench && pg psql -q -d postgres -c CHECKPOINT ;;
    esac
    rm -f "$WORK/dst/copy"
}

status_json() { "$ROOT/target/release/ferry" status "$1" --json 2>/dev/null || echo '{}'; }
RES=$WORK/results
# v1..v4: pread p50 ms, p99 ms, reads/s, reads; fio IOPS, reads; cp MB/s, s; restore s.
# net: pread reads/s and fio IOPS counting only the reads that went to the network (the
# reads that found their chunk in the local copy taken as free).
printf 'link\tmeasure\tmode\trun\tv1\tv2\tv3\tv4\tmirror_MBps\tstate_before\tstate_after\tlocal_chunks\tnet\n' > "$RES"

# The mirror's local copy: $WORK/cache, emptied (with --cache-fs ram, a fresh ext4 on a loop
# device over a file in a tmpfs, made at the first run; the cleanup unmounts both).
fresh_cache() {
    if [ "$cache_fs" = disk ]; then
        rm -rf "$WORK/cache"; mkdir -p "$WORK/cache"
        return
    fi
    if ! mountpoint -q "$WORK/cache"; then
        mkdir -p "$WORK/cache-ram" "$WORK/cache"
        mount -t tmpfs -o size=12g tmpfs "$WORK/cache-ram"
        truncate -s 11G "$WORK/cache-ram/fs.img"
        mkfs.ext4 -q -F "$WORK/cache-ram/fs.img" >/dev/null
        mount -o loop,discard "$WORK/cache-ram/fs.img" "$WORK/cache"
    fi
    empty_cache
}
empty_cache() {
    if [ "$cache_fs" = disk ]; then rm -rf "$WORK/cache"; return; fi
    find "$WORK/cache" -mindepth 1 -delete 2>/dev/null || true
    fstrim "$WORK/cache" 2>/dev/null || true
}

# run_one LINK MEASURE alone|during RUN: one measurement, one row of $RES.
run_one() {
    local link=$1 m=$2 mode=$3 run=$4 mnt s0="{}" s1="{}" t0=0 t1=0 r
    prepare "$m"
    if [ "$fresh_ferryd" = 1 ]; then
        kill "$ferryd_pid" 2>/dev/null || true
        for _ in $(seq 100); do kill -0 "$ferryd_pid" 2>/dev/null || break; sleep 0.1; done
        ns_ferryd "$DATA"
    fi
    drop_caches
    if [ "$mode" = alone ]; then
        mnt=$WORK/mnt/plain
        ferry_mount_at "$mnt" || die "ferry mount failed: $(tail -3 "$WORK/logs/ferry-plain-$link.log" 2>/dev/null)"
        # The same wait as the mirror's warm-up: both modes start as long after the page
        # cache was dropped (see the header).
        sleep "$warmup"
    else
        mnt=$WORK/mnt/mirror
        fresh_cache
        # shellcheck disable=SC2086 # FERRY_MIRROR_MOUNT_ARGS: extra options, split on purpose
        ferry_mount_at "$mnt" --cache-dir "$WORK/cache" --mirror ${FERRY_MIRROR_MOUNT_ARGS:-} \
            || die "ferry mount --mirror failed: $(tail -3 "$WORK/logs/ferry-mirror-$link.log" 2>/dev/null)"
        sleep "$warmup"
        s0=$(status_json "$mnt"); t0=$(date +%s.%N)
    fi
    if ! r=$("measure_$m" "$mnt"); then
        r="failed"
        # A Ctrl-C that the tool caught (pg_restore does) leaves bash running: ferryd, in the
        # same process group, tells.
        kill -0 "$ferryd_pid" 2>/dev/null || die "ferryd is gone (interrupted?)"
    fi
    if [ "$mode" = during ]; then
        t1=$(date +%s.%N); s1=$(status_json "$mnt")
    fi
    ferry_unmount "$mnt" || log "  the mount at $mnt did not exit within 30 s"
    empty_cache
    [ "$r" = failed ] && { log "  $m $mode run $run failed"; printf '%s\t%s\t%s\t%s\tfailed\t-\t-\t-\t-\t-\t-\t-\t-\n' "$link" "$m" "$mode" "$run" >> "$RES"; return 0; }
    verify "$m"
    local mbps="-" st0="-" st1="-" loc="-"
    if [ "$mode" = during ]; then
        local f0 f1 l0 l1
        f0=$(jq -r '.bytes_fetched // empty' <<<"$s0"); f1=$(jq -r '.bytes_fetched // empty' <<<"$s1")
        st0=$(jq -r '.state // "?"' <<<"$s0"); st1=$(jq -r '.state // "?"' <<<"$s1")
        l0=$(jq -r '.mount.chunks_served_locally // empty' <<<"$s0"); l1=$(jq -r '.mount.chunks_served_locally // empty' <<<"$s1")
        [ -n "$f0" ] && [ -n "$f1" ] && mbps=$(awk -v a="$f0" -v b="$f1" -v s="$t0" -v e="$t1" 'BEGIN { printf "%.1f", (b - a) / (e - s) / 1e6 }')
        [ -n "$l0" ] && [ -n "$l1" ] && loc=$((l1 - l0))
        # Nothing fetched and finished: the mirror was done before the window (tiny data).
        [ "$m" = idle ] && [ "$st1" != running ] && [ "${f0:-x}" = "${f1:-y}" ] && mbps="-"
    fi
    read -r v1 v2 v3 v4 <<<"$r"
    local net="-" l=${loc/-/0}
    case "$m" in
        pread) net=$(awk -v r="$v3" -v n="$v4" -v l="$l" 'BEGIN { printf "%.1f", r * (n - l) / n }') ;;
        fio) net=$(awk -v r="$v1" -v n="$v2" -v l="$l" 'BEGIN { printf "%.1f", (n > 0 ? r * (n - l) / n : r) }') ;;
    esac
    local also=""
    [ "$mode" = during ] && also="; mirror $mbps MB/s, $st0 → $st1, $loc from the local copy"
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$link" "$m" "$mode" "$run" "$v1" "$v2" "$v3" "$v4" "$mbps" "$st0" "$st1" "$loc" "$net" >> "$RES"
    case "$m" in
        pread) log "  $(printf '%-7s %-6s' "$m" "$mode") p50 $v1 ms, p99 $v2 ms, $v3 reads/s ($v4 reads)$also" ;;
        fio) log "  $(printf '%-7s %-6s %.1f' "$m" "$mode" "$v1") IOPS$also" ;;
        cp|cp1g) log "  $(printf '%-7s %-6s' "$m" "$mode") $v1 MB/s ($v2 s, verified)$also" ;;
        restore) log "  $(printf '%-7s %-6s' "$m" "$mode") $v1 s (verified)$also" ;;
        idle) log "  mirror alone: $mbps MB/s, $st0 → $st1" ;;
    esac
}

for link in "${LINKS[@]}"; do
    log "link: $link"
    set_link "$link"
    read -ra MEASURES <<<"$(measures_for "$link")"
    for ((run = 1; run <= repeat; run++)); do
        for m in "${MEASURES[@]}"; do
            if [ "$m" = idle ]; then
                run_one "$link" idle during "$run"
            elif [ $((run % 2)) = 1 ]; then
                run_one "$link" "$m" alone "$run"; run_one "$link" "$m" during "$run"
            else
                run_one "$link" "$m" during "$run"; run_one "$link" "$m" alone "$run"
            fi
        done
    done
done
cp "$RES" "$RAW"

# ---------------------------------------------------------------- report
# med LINK MEASURE MODE COLUMN: the median over the runs, or n/a.
med() {
    awk -F'\t' -v l="$1" -v m="$2" -v o="$3" -v c="$4" \
        'NR > 1 && $1 == l && $2 == m && $3 == o && $c != "failed" && $c != "-" && $c != "" { print $c }' "$RES" \
        | sort -g | awk '{ a[NR] = $1 } END { if (NR == 0) print "n/a"; else if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'
}
div() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "n/a" || b == "n/a" || b + 0 == 0) print "n/a"; else printf "%.2f", a / b }'; }
# mirror_ok LINK MEASURE: "yes" when the mirror was running before and after every run of it.
mirror_ok() {
    awk -F'\t' -v l="$1" -v m="$2" 'NR > 1 && $1 == l && $2 == m && $3 == "during" && !($10 == "running" && $11 == "running") { bad = 1 }
        END { print bad ? "no" : "yes" }' "$RES"
}
# idle_end LINK: how the mirror-alone runs ended (running at the end of the window, or
# complete within it: both valid, the MB/s is over the time it ran).
idle_end() {
    awk -F'\t' -v l="$1" 'NR > 1 && $1 == l && $2 == "idle" { n[$11]++ }
        END { for (s in n) { printf "%s%s", sep, (n[s] > 1 ? n[s] "× " : "") s; sep = ", " } }' "$RES"
}
LINK_MBPS=125  # 1 Gbit/s end to end on both shaped links
fmt() {
    awk -v v="$1" 'BEGIN { if (v == "n/a" || v + 0 == 0) print v; else if (v + 0 >= 100) printf "%.0f", v;
        else if (v + 0 >= 10) printf "%.1f", v; else if (v + 0 >= 1) printf "%.2f", v; else printf "%.3f", v }'
}
base_mirror() {  # the mirror-alone median of LINK in the --baseline TSV
    [ -n "$baseline" ] || { echo n/a; return; }
    [ -f "$baseline" ] || die "--baseline $baseline: no such file"
    awk -F'\t' -v l="$1" 'NR > 1 && $1 == l && $2 == "idle" && $9 != "-" { print $9 }' "$baseline" \
        | sort -g | awk '{ a[NR] = $1 } END { if (NR == 0) print "n/a"; else if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'
}
{
    echo "# Readers during the background mirror (issue 13)"
    echo
    echo "Produced by \`bench/readers.sh${args_given:+ $args_given}\` from $started to $(date -u '+%H:%M UTC'), binaries built at"
    echo "commit $commit; $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB, kernel $(uname -r)."
    echo "FERRY_ARGS='${FERRY_ARGS:-}' FERRY_MIRROR_MOUNT_ARGS='${FERRY_MIRROR_MOUNT_ARGS:-}' FERRYD_ARGS='${FERRYD_ARGS:-}'."
    # A VM that reports free memory to its host makes memory freed during a run slow to use
    # again, and the loopback copies beside the mirror with it (docs/MIRROR.md).
    if [ -r /sys/module/page_reporting/parameters/page_reporting_order ]; then
        echo "Free page reporting to the host: possible, order $(cat /sys/module/page_reporting/parameters/page_reporting_order) (above 10: off)."
    else
        echo "Free page reporting to the host: not built in."
    fi
    echo
    gib=$(awk -v b="$total_bytes" 'BEGIN { printf "%.1f", b / 1073741824 }')
    dump=""
    [ -n "$DUMP" ] && dump=", $DUMP ($(du -m "$DATA/$DUMP" | cut -f1) MiB: \`pgbench -i -s $pg_scale\`, \`pg_dump -Fc -Z0\`)"
    cache_is=" (\`--cache-dir\` on the disk the export is on)"
    [ "$cache_fs" = ram ] && cache_is=" (\`--cache-dir\` on a fresh ext4 of its own, a loop device over a file in RAM: the copy written apart from the disk ferryd reads, as on a client of its own)"
    reads_are=" (random bytes)"
    [ "$reads" = pg ] && reads_are=" (a real PostgreSQL datafile, pgbench_accounts after \`pgbench -i -s 110\`)"
    if [ "$bulk" = random ]; then
        bulk_is="bulk/ ($bulk_files × $bulk_mib MiB of random data)"
    else
        bulk_is="bulk/pgdata ($(du -sm "$DATA/bulk/pgdata" | cut -f1) MiB: a PostgreSQL 15 data directory, \`pgbench -i -s $bulk_pg_scale\`; the mirror's MB/s are decoded bytes)"
    fi
    cat <<EOF
- The export, the same for every link ($gib GiB): $RF ($read_mib MiB), $CF
  ($cp_mib MiB)$reads_are, $bulk_is$dump.
- **Alone**: through a plain mount. **During**: through a mount with \`--cache-dir DIR --mirror\`
  (a fresh DIR every run$cache_is) whose mirror started $warmup s before. The page cache is dropped before
  every run; the pairs alternate which goes first. Figures are medians of $repeat runs; ratios are
  of the medians.
- pread: 4 KiB random \`pread\`s of $RF, posix_fadvise RANDOM, each block once, for
  $seconds s (bench/pread_lat.py). fio: 16 KiB random reads of it, 4 jobs, $fio_secs s. cp: \`cp\` of
  $CF out of the mount to local disk (cp1g: of $RF), verified with cmp.
  pg_restore: \`pg_restore -d\` of the dump on the mount into a throwaway PostgreSQL 15 cluster
  (database dropped and created before every run, row count checked).
- Mirror MB/s meanwhile: \`bytes_fetched\` of \`ferry status --json\` over the measurement. From the
  local copy: chunks readers found already mirrored (one per 4 KiB pread or 16 KiB fio read).
  "Network reads only" counts the other reads (local ones taken as free), so it is not flattered
  by them; p50 and p99 include them. Mirror running throughout: its state before and after every
  run was \`running\`; where not, the contention is understated. Mirror alone: MB/s over $seconds s,
  or until the mirror completed if sooner (the last column says which).
EOF
    for link in "${LINKS[@]}"; do
        read -ra MEASURES <<<"$(measures_for "$link")"
        echo
        case "$link" in
            loopback) echo "## loopback (unshaped)" ;;
            1gbit) echo "## 1gbit (tbf 1 Gbit/s)" ;;
            wan) echo "## wan (1 Gbit/s, 20 ms each way, 25 MB/s per TCP connection via toxiproxy)" ;;
        esac
        echo
        echo "| measurement | alone | during the mirror | during ÷ alone | mirror MB/s meanwhile | from the local copy | mirror running throughout |"
        echo "| --- | ---: | ---: | ---: | ---: | ---: | --- |"
        row() {  # row LABEL MEASURE COLUMN [inverse]: inverse for times (the ratio of speeds)
            local a d r
            a=$(med "$link" "$2" alone "$3"); d=$(med "$link" "$2" during "$3")
            if [ "${4:-}" = inverse ]; then r=$(div "$a" "$d"); else r=$(div "$d" "$a"); fi
            echo "| $1 | $(fmt "$a") | $(fmt "$d") | $r | $(fmt "$(med "$link" "$2" during 9)") | $(med "$link" "$2" during 12 | awk '{ if ($1 == "n/a") print; else printf "%.0f", $1 }') | $(mirror_ok "$link" "$2") |"
        }
        for m in "${MEASURES[@]}"; do
            case "$m" in
                pread) row "4 KiB pread p50 (ms)" pread 5; row "4 KiB pread p99 (ms)" pread 6; row "4 KiB preads per second" pread 7
                       row "4 KiB preads per second, network reads only" pread 13 ;;
                fio) row "fio 16 KiB × 4 jobs (IOPS)" fio 5; row "fio IOPS, network reads only" fio 13 ;;
                cp) row "cp $cp_mib MiB (MB/s)" cp 5 ;;
                cp1g) row "cp $read_mib MiB (MB/s)" cp1g 5 ;;
                restore) row "pg_restore (seconds; ratio: alone ÷ during)" restore 5 inverse ;;
                idle) echo "| mirror alone, no readers | | | | $(fmt "$(med "$link" idle during 9)") | | $(idle_end "$link") |" ;;
            esac
        done
    done
    echo
    echo "## Every run"
    echo
    echo "| link | measurement | run | mode | figures | mirror MB/s | local copy | mirror state |"
    echo "| --- | --- | ---: | --- | --- | ---: | ---: | --- |"
    awk -F'\t' 'NR > 1 {
        f = $5
        if ($2 == "pread" && $5 != "failed") f = "p50 " $5 " ms, p99 " $6 " ms, " $7 " reads/s, " $8 " reads"
        else if ($2 == "fio" && $5 != "failed") f = sprintf("%.0f IOPS", $5)
        else if (($2 == "cp" || $2 == "cp1g") && $5 != "failed") f = $5 " MB/s, " $6 " s"
        else if ($2 == "restore" && $5 != "failed") f = $5 " s"
        else if ($2 == "idle") f = "no readers"
        if ($3 == "during" && $13 != "-" && $13 != "") f = f "; network reads only: " $13 "/s"
        st = ($3 == "during") ? $10 " → " $11 : ""
        printf "| %s | %s | %s | %s | %s | %s | %s | %s |\n", $1, $2, $4, $3, f, $9, $12, st }' "$RES"
    echo
    echo "## Targets (issue 13)"
    echo
    echo "| target | measured | met |"
    echo "| --- | ---: | --- |"
    # target LABEL VALUE MIN|max:MAX [LINK MEASURE]: met unless the mirror stopped during a run.
    target() {
        local met
        met=$(awk -v v="$2" -v t="$3" 'BEGIN {
            if (v == "n/a") { print "n/a"; exit }
            if (t == "report") { print "reported"; exit }
            if (t ~ /^max:/) { ok = (v + 0 <= substr(t, 5) + 0) } else { ok = (v + 0 >= t + 0) }
            print ok ? "yes" : "**no**" }')
        if [ $# -ge 5 ] && [ "$met" != n/a ] && [ "$(mirror_ok "$4" "$5")" != yes ]; then
            met="$met (invalid: the mirror was not running throughout every run; enlarge --bulk-files)"
        fi
        echo "| $1 | $2 | $met |"
    }
    ratio() { div "$(med "$1" "$2" during "$3")" "$(med "$1" "$2" alone "$3")"; }
    has() { [[ " ${LINKS[*]} " == *" $1 "* ]] && [[ " $(measures_for "$1") " == *" $2 "* ]]; }
    if has 1gbit pread; then
        target "1gbit: 4 KiB pread p50, during ÷ alone (≤ 2)" "$(ratio 1gbit pread 5)" max:2 1gbit pread
        target "1gbit: 4 KiB pread p99, during ÷ alone (≤ 4)" "$(ratio 1gbit pread 6)" max:4 1gbit pread
        target "1gbit: mirror MB/s during the preads (≥ 60)" "$(fmt "$(med 1gbit pread during 9)")" 60 1gbit pread
    fi
    has 1gbit fio && target "1gbit: fio IOPS, network reads only, during ÷ alone (≥ 0.8)" "$(ratio 1gbit fio 13)" 0.8 1gbit fio
    has 1gbit cp && target "1gbit: cp $cp_mib MiB MB/s, during ÷ alone (≥ 0.8)" "$(ratio 1gbit cp 5)" 0.8 1gbit cp
    if has wan pread; then
        target "wan: 4 KiB preads per second, network reads only, during ÷ alone (≥ 0.9)" "$(ratio wan pread 13)" 0.9 wan pread
        target "wan: mirror MB/s during the preads ÷ the link's $LINK_MBPS MB/s (≥ 0.5)" \
            "$(div "$(med wan pread during 9)" "$LINK_MBPS")" 0.5 wan pread
    fi
    has wan fio && target "wan: fio IOPS, network reads only, during ÷ alone (≥ 0.9)" "$(ratio wan fio 13)" 0.9 wan fio
    has loopback cp1g && target "loopback: cp $read_mib MiB MB/s, during ÷ alone (≥ 0.8)" "$(ratio loopback cp1g 5)" 0.8 loopback cp1g
    # A restore's figure is seconds: the speed ratio is alone ÷ during.
    has loopback restore && target "loopback: pg_restore speed, during ÷ alone (≥ 0.8)" \
        "$(div "$(med loopback restore alone 5)" "$(med loopback restore during 5)")" 0.8 loopback restore
    for link in "${LINKS[@]}"; do
        has "$link" idle || continue
        b=$(base_mirror "$link")
        if [ "$b" = n/a ]; then
            target "$link: mirror alone, MB/s ($([ -n "$baseline" ] && echo "none for $link in the baseline" || echo "no --baseline given"))" \
                "$(fmt "$(med "$link" idle during 9)")" report
        else
            target "$link: mirror alone ($(fmt "$(med "$link" idle during 9)") MB/s) ÷ the baseline's $(fmt "$b") MB/s (≥ 0.95)" \
                "$(div "$(med "$link" idle during 9)" "$b")" 0.95
        fi
    done
    echo
    echo "Runs, tab-separated: $RAW."
} > "$out"
log "report written to $out (runs: $RAW)"
cat "$out"
