#!/usr/bin/env bash
# Starts and stops a throw-away Garage (S3-compatible object store) cluster on 127.0.0.1, for
# the tests and benchmarks of `ferry mount s3://` and `ferry mirror s3://`, which need a real
# S3 server. Garage is installed by scripts/prereqs-garage.sh; it runs as separate processes.
#
#   garage-cluster.sh start DIR [NODES]    NODES garage servers (default 3; 1 allowed), each in
#                                          DIR/nodeK (garage.toml, meta/, data/, log, pid);
#                                          replication factor = NODES; one zone per node; a key
#                                          and the bucket "ferry-test" (read+write+owner).
#                                          Writes DIR/env (sourceable) and prints it:
#                                            FERRY_S3_ENDPOINTS=http://127.0.0.1:P1,...
#                                            AWS_ACCESS_KEY_ID=GK...
#                                            AWS_SECRET_ACCESS_KEY=...
#                                            AWS_REGION=garage
#                                            FERRY_S3_BUCKET=ferry-test
#                                            GARAGE_PIDS="pid1 pid2 pid3"
#                                            GARAGE_ADMIN_ENDPOINTS=... GARAGE_ADMIN_TOKEN=...
#   garage-cluster.sh stop DIR             stops every node of DIR (SIGTERM, then SIGKILL after
#                                          the timeout) and waits for them; removes nothing.
#   garage-cluster.sh kill-node DIR K      SIGKILLs node K only (fault tests) and waits for it.
#   garage-cluster.sh restart-node DIR K   starts node K again with its config (after kill-node)
#                                          and waits until the cluster is healthy again.
#
# DIR must not already hold a cluster (start refuses a DIR with node1/ in it).
# Environment:
#   GARAGE_BIN        garage binary (else /opt/ferry/garage/bin/garage, else `garage` on PATH)
#   GARAGE_WAIT_SECS  bound of every wait (default 30)
#   GARAGE_LOG        RUST_LOG of the servers (default netapp=warn,garage=info)
# Needs python3 (free ports, JSON, one signed S3 request per node as the readiness check).
# Every wait is bounded; on failure it prints one line plus the tail of the node logs, and
# stops every node it started.
set -euo pipefail

EXPECT_UP=()
PROG=garage-cluster.sh
WAIT_SECS=${GARAGE_WAIT_SECS:-30}
BUCKET=ferry-test
REGION=garage

die() {
    echo "$PROG: $*" >&2
    exit 1
}

usage() {
    die "usage: $PROG start DIR [NODES] | stop DIR | kill-node DIR K | restart-node DIR K"
}

find_garage() {
    if [ -n "${GARAGE_BIN:-}" ]; then
        [ -x "$GARAGE_BIN" ] || die "GARAGE_BIN=$GARAGE_BIN is not an executable"
        GARAGE=$GARAGE_BIN
    elif [ -x /opt/ferry/garage/bin/garage ]; then
        GARAGE=/opt/ferry/garage/bin/garage
    elif command -v garage >/dev/null 2>&1; then
        GARAGE=$(command -v garage)
    else
        die "garage not found (set GARAGE_BIN, or run scripts/prereqs-garage.sh)"
    fi
}

# Absolute path of DIR (which must exist).
abs_dir() { (cd "$1" && pwd -P); }

node_dir() { echo "$DIR/node$1"; }
node_cfg() { echo "$DIR/node$1/garage.toml"; }

# The node count of an existing DIR: the highest K with DIR/nodeK/garage.toml.
count_nodes() {
    local k=1
    while [ -f "$(node_cfg "$k")" ]; do k=$((k + 1)); done
    echo $((k - 1))
}

# Pid of node K if that process is alive and is the garage server of this DIR/nodeK.
node_pid() {
    local pidfile pid
    pidfile="$(node_dir "$1")/pid"
    [ -f "$pidfile" ] || return 1
    pid=$(cat "$pidfile" 2>/dev/null) || return 1
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    is_our_server "$pid" "$1" && echo "$pid"
}

is_our_server() { # PID K
    local state
    [ -r "/proc/$1/cmdline" ] || return 1
    state=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
    [ "$state" != Z ] || return 1
    tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | grep -qF -- "$(node_cfg "$2") server"
}

# Runs the garage CLI against node K (over RPC, with that node's config).
gcli() {
    local k=$1
    shift
    env -u RUST_LOG "$GARAGE" -c "$(node_cfg "$k")" "$@"
}

log_tails() {
    local k log
    for ((k = 1; k <= ${NODES:-0}; k++)); do
        log="$(node_dir "$k")/log"
        [ -f "$log" ] || continue
        echo "---- tail of $log" >&2
        tail -n 15 "$log" >&2
    done
}

# fail MESSAGE: one line, the node logs, then exit (the EXIT trap stops started nodes).
fail() {
    echo "$PROG: $*" >&2
    log_tails
    exit 1
}

# wait_until DESCRIPTION COMMAND...: polls COMMAND every 0.2 s for at most WAIT_SECS seconds;
# fails early when a node that should run has died.
wait_until() {
    local what=$1 k
    shift
    local deadline=$((SECONDS + WAIT_SECS))
    while ! "$@" >/dev/null 2>&1; do
        for k in "${EXPECT_UP[@]}"; do
            node_pid "$k" >/dev/null || fail "node $k exited while waiting for $what"
        done
        ((SECONDS < deadline)) || fail "timed out after ${WAIT_SECS}s waiting for $what"
        sleep 0.2
    done
}

# Prints N distinct free TCP ports on 127.0.0.1, chosen at random below the ephemeral range
# (20000-31999) so outgoing connections cannot take them; all are held while choosing.
free_ports() {
    python3 - "$1" <<'EOF'
import random, socket, sys
n = int(sys.argv[1])
held = []
tries = 0
while len(held) < n:
    tries += 1
    if tries > 10000:
        sys.exit("no free ports found")
    port = random.randrange(20000, 32000)
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        s.close()
        continue
    held.append(s)
print(" ".join(str(s.getsockname()[1]) for s in held))
EOF
}

join() { # SEP WORDS...
    local IFS=$1
    shift
    echo "$*"
}

random_hex() { head -c "$1" /dev/urandom | od -An -tx1 | tr -d ' \n'; }

# json_field FIELD: prints FIELD of the JSON object on stdin.
json_field() {
    python3 -c 'import json, sys; print(json.load(sys.stdin)[sys.argv[1]])' "$1"
}

start_node() { # K
    local k=$1 d
    d=$(node_dir "$k")
    echo "=== $(date '+%F %T') start" >>"$d/log"
    NO_COLOR=1 RUST_LOG=${GARAGE_LOG:-netapp=warn,garage=info} \
        nohup "$GARAGE" -c "$(node_cfg "$k")" server </dev/null >>"$d/log" 2>&1 &
    echo $! >"$d/pid"
    disown $! # no job notices from this shell; stop/kill-node track it through DIR/nodeK/pid
}

rpc_up() { # K: node K answers over RPC
    [ -f "$(node_dir "$1")/meta/node_key" ] && gcli "$1" status
}

all_nodes_up() { # K: node K sees every node of the cluster up
    gcli "$1" json-api GetClusterStatus | python3 -c '
import json, sys
d = json.load(sys.stdin)
n = int(sys.argv[1])
sys.exit(0 if sum(1 for x in d["nodes"] if x.get("isUp")) >= n else 1)' "$NODES"
}

healthy() { # K: node K reports the cluster healthy with every storage node up
    gcli "$1" json-api GetClusterHealth | python3 -c '
import json, sys
d = json.load(sys.stdin)
n = int(sys.argv[1])
ok = (d["status"] == "healthy" and d["storageNodes"] == n and d["storageNodesUp"] == n
      and d["partitionsAllOk"] == d["partitions"])
sys.exit(0 if ok else 1)' "$NODES"
}

# s3_ready ENDPOINT: a SigV4-signed ListObjectsV2 of the bucket answers 200.
s3_ready() {
    python3 - "$1" "$ACCESS_KEY" "$SECRET_KEY" "$BUCKET" "$REGION" <<'EOF'
import datetime, hashlib, hmac, sys, urllib.request
ep, ak, sk, bucket, region = sys.argv[1:6]
host = ep.split("://", 1)[1]
amzdate = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
date = amzdate[:8]
query = "list-type=2&max-keys=1"
payload = hashlib.sha256(b"").hexdigest()
signed = "host;x-amz-content-sha256;x-amz-date"
creq = "\n".join(["GET", "/" + bucket, query,
                  f"host:{host}\nx-amz-content-sha256:{payload}\nx-amz-date:{amzdate}\n",
                  signed, payload])
scope = f"{date}/{region}/s3/aws4_request"
sts = "\n".join(["AWS4-HMAC-SHA256", amzdate, scope, hashlib.sha256(creq.encode()).hexdigest()])
key = ("AWS4" + sk).encode()
for part in (date, region, "s3", "aws4_request"):
    key = hmac.new(key, part.encode(), hashlib.sha256).digest()
sig = hmac.new(key, sts.encode(), hashlib.sha256).hexdigest()
req = urllib.request.Request(f"{ep}/{bucket}?{query}", headers={
    "x-amz-date": amzdate, "x-amz-content-sha256": payload,
    "Authorization": f"AWS4-HMAC-SHA256 Credential={ak}/{scope}, "
                     f"SignedHeaders={signed}, Signature={sig}"})
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
with opener.open(req, timeout=5) as r:
    sys.exit(0 if r.status == 200 else 1)
EOF
}

# stop_nodes SIGNAL K...: signals the given nodes, waits (bounded) for them to exit, SIGKILLs
# the ones still running after WAIT_SECS. Returns non-zero if one survived even SIGKILL.
stop_nodes() {
    local sig=$1 k pid
    shift
    local -a pids=()
    for k in "$@"; do
        if pid=$(node_pid "$k"); then
            kill "-$sig" "$pid" 2>/dev/null || true
            pids+=("$k:$pid")
        fi
    done
    local deadline=$((SECONDS + WAIT_SECS)) killed=0 left entry
    while :; do
        left=()
        for entry in "${pids[@]}"; do
            if is_our_server "${entry#*:}" "${entry%%:*}"; then left+=("$entry"); fi
        done
        [ "${#left[@]}" -gt 0 ] || return 0
        if ((SECONDS >= deadline)); then
            ((killed == 0)) || {
                echo "$PROG: node(s) ${left[*]%%:*} did not exit after SIGKILL" >&2
                return 1
            }
            echo "$PROG: node(s) ${left[*]%%:*} still running after ${WAIT_SECS}s; sending SIGKILL" >&2
            for entry in "${left[@]}"; do kill -KILL "${entry#*:}" 2>/dev/null || true; done
            killed=1
            deadline=$((SECONDS + 10))
        fi
        sleep 0.1
    done
}

cleanup_on_failure() {
    local rc=$?
    if ((rc != 0)) && [ "${STARTED:-0}" -gt 0 ]; then
        echo "$PROG: stopping the nodes started so far" >&2
        local -a ks=()
        for ((k = 1; k <= STARTED; k++)); do ks+=("$k"); done
        WAIT_SECS=5 stop_nodes KILL "${ks[@]}" || true
    fi
    exit "$rc"
}

cmd_start() {
    local k
    [ "$NODES" -ge 1 ] 2>/dev/null || die "NODES must be a positive integer, got '$NODES'"
    command -v python3 >/dev/null 2>&1 || die "python3 is needed (ports, JSON, readiness check)"
    mkdir -p "$DIR" || die "cannot create $DIR"
    DIR=$(abs_dir "$DIR")
    [ ! -e "$DIR/node1" ] || die "$DIR already holds a cluster (node1/); stop it and use a fresh DIR"

    local t0
    t0=$(date +%s%N)
    local -a ports
    read -r -a ports <<<"$(free_ports $((3 * NODES)))" || die "could not choose free ports"
    [ "${#ports[@]}" -eq $((3 * NODES)) ] || die "could not choose free ports"
    local secret admin_token
    secret=$(random_hex 32)
    admin_token=$(random_hex 24)

    local -a rpc s3 adm
    for ((k = 1; k <= NODES; k++)); do
        rpc[k]=${ports[3 * (k - 1)]}
        s3[k]=${ports[3 * (k - 1) + 1]}
        adm[k]=${ports[3 * (k - 1) + 2]}
        local d
        d=$(node_dir "$k")
        mkdir -p "$d/meta" "$d/data"
        (
            umask 077
            cat >"$(node_cfg "$k")" <<EOF
# Garage node $k of a test cluster made by scripts/garage-cluster.sh
metadata_dir = "$d/meta"
data_dir = "$d/data"
db_engine = "lmdb"
replication_factor = $NODES
consistency_mode = "consistent"

# test cluster: no fsync, no background scrub, no compression (CPU is scarce)
metadata_fsync = false
data_fsync = false
disable_scrub = true
compression_level = "none"

rpc_bind_addr = "127.0.0.1:${rpc[k]}"
rpc_public_addr = "127.0.0.1:${rpc[k]}"
rpc_secret = "$secret"

[s3_api]
s3_region = "$REGION"
api_bind_addr = "127.0.0.1:${s3[k]}"
root_domain = ".s3.garage.localhost"

[admin]
api_bind_addr = "127.0.0.1:${adm[k]}"
admin_token = "$admin_token"
EOF
        )
    done

    STARTED=0
    trap cleanup_on_failure EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    EXPECT_UP=()
    for ((k = 1; k <= NODES; k++)); do
        start_node "$k"
        STARTED=$k
        EXPECT_UP+=("$k")
    done
    for ((k = 1; k <= NODES; k++)); do
        wait_until "node $k to answer over RPC" rpc_up "$k"
    done

    # Connect the nodes: node 1 connects to every other node; membership then spreads.
    local id
    for ((k = 2; k <= NODES; k++)); do
        id=$(gcli "$k" node id -q) || fail "garage node id failed on node $k"
        gcli 1 node connect "$id" >/dev/null || fail "node 1 could not connect to node $k ($id)"
    done
    for ((k = 1; k <= NODES; k++)); do
        wait_until "node $k to see all $NODES nodes up" all_nodes_up "$k"
    done

    # Layout: every node a storage node in its own zone, 1G each; version 1.
    for ((k = 1; k <= NODES; k++)); do
        id=$(gcli "$k" node id -q) || fail "garage node id failed on node $k"
        gcli 1 layout assign -z "z$k" -c 1G "${id%%@*}" >/dev/null \
            || fail "garage layout assign failed for node $k"
    done
    gcli 1 layout apply --version 1 >/dev/null || fail "garage layout apply --version 1 failed"
    for ((k = 1; k <= NODES; k++)); do
        wait_until "node $k to report the cluster healthy" healthy "$k"
    done

    # Key, bucket, permissions.
    local key_json bucket_id
    key_json=$(gcli 1 json-api CreateKey "{\"name\":\"$BUCKET\"}") || fail "CreateKey failed"
    ACCESS_KEY=$(json_field accessKeyId <<<"$key_json")
    SECRET_KEY=$(json_field secretAccessKey <<<"$key_json")
    bucket_id=$(gcli 1 json-api CreateBucket "{\"globalAlias\":\"$BUCKET\"}" | json_field id) \
        || fail "CreateBucket $BUCKET failed"
    gcli 1 json-api AllowBucketKey "{\"bucketId\":\"$bucket_id\",\"accessKeyId\":\"$ACCESS_KEY\",\
\"permissions\":{\"read\":true,\"write\":true,\"owner\":true}}" >/dev/null \
        || fail "AllowBucketKey failed"

    local -a endpoints=() admins=() pids=()
    for ((k = 1; k <= NODES; k++)); do
        endpoints+=("http://127.0.0.1:${s3[k]}")
        admins+=("http://127.0.0.1:${adm[k]}")
        pids+=("$(cat "$(node_dir "$k")/pid")")
    done
    for ((k = 1; k <= NODES; k++)); do
        wait_until "a signed S3 ListObjectsV2 of $BUCKET through node $k" \
            s3_ready "${endpoints[k - 1]}"
    done

    local env_text
    env_text="FERRY_S3_ENDPOINTS=$(join , "${endpoints[@]}")
AWS_ACCESS_KEY_ID=$ACCESS_KEY
AWS_SECRET_ACCESS_KEY=$SECRET_KEY
AWS_REGION=$REGION
FERRY_S3_BUCKET=$BUCKET
GARAGE_ADMIN_ENDPOINTS=$(join , "${admins[@]}")
GARAGE_ADMIN_TOKEN=$admin_token
GARAGE_PIDS=\"${pids[*]}\""
    (umask 077 && printf '%s\n' "$env_text" >"$DIR/env")
    printf '%s\n' "$env_text"
    local ms=$((($(date +%s%N) - t0) / 1000000))
    echo "$PROG: $NODES-node cluster up in $((ms / 1000)).$(printf %03d $((ms % 1000)))s; env in $DIR/env" >&2
    STARTED=0
    trap - EXIT INT TERM
}

cmd_stop() {
    NODES=$(count_nodes)
    [ "$NODES" -ge 1 ] || die "no cluster in $DIR (no node1/garage.toml)"
    local -a ks=()
    for ((k = 1; k <= NODES; k++)); do ks+=("$k"); done
    stop_nodes TERM "${ks[@]}" || die "could not stop every node of $DIR"
}

check_k() {
    NODES=$(count_nodes)
    [ "$NODES" -ge 1 ] || die "no cluster in $DIR (no node1/garage.toml)"
    if ! [[ "$K" =~ ^[0-9]+$ ]] || [ "$K" -lt 1 ] || [ "$K" -gt "$NODES" ]; then
        die "node number must be 1..$NODES, got '$K'"
    fi
}

cmd_kill_node() {
    check_k
    node_pid "$K" >/dev/null || die "node $K of $DIR is not running"
    stop_nodes KILL "$K" || die "could not kill node $K"
}

cmd_restart_node() {
    check_k
    ! node_pid "$K" >/dev/null || die "node $K of $DIR is already running"
    find_garage
    EXPECT_UP=("$K")
    start_node "$K"
    STARTED_ONE=$K
    trap 'rc=$?; if ((rc != 0)); then WAIT_SECS=5 stop_nodes KILL "$STARTED_ONE" || true; fi' EXIT
    wait_until "node $K to answer over RPC" rpc_up "$K"
    # Reconnect at once both ways (the other nodes would otherwise retry only after ~20 s).
    local k all_up=1 id_k id
    id_k=$(gcli "$K" node id -q) || fail "garage node id failed on node $K"
    for ((k = 1; k <= NODES; k++)); do
        [ "$k" -ne "$K" ] || continue
        if node_pid "$k" >/dev/null; then
            id=$(gcli "$k" node id -q) || fail "garage node id failed on node $k"
            gcli "$K" node connect "$id" >/dev/null || fail "node $K could not connect to node $k"
            gcli "$k" node connect "$id_k" >/dev/null || fail "node $k could not connect to node $K"
        else
            all_up=0
        fi
    done
    if ((all_up)); then
        EXPECT_UP=()
        for ((k = 1; k <= NODES; k++)); do EXPECT_UP+=("$k"); done
        for ((k = 1; k <= NODES; k++)); do
            wait_until "node $k to report the cluster healthy" healthy "$k"
        done
    fi
    trap - EXIT
    echo "$PROG: node $K restarted (pid $(cat "$(node_dir "$K")/pid"))" >&2
}

[ $# -ge 2 ] || usage
CMD=$1
DIR=$2
case "$CMD" in
start)
    [ $# -le 3 ] || usage
    NODES=${3:-3}
    find_garage
    cmd_start
    ;;
stop)
    [ $# -eq 2 ] || usage
    [ -d "$DIR" ] || die "no such directory: $DIR"
    DIR=$(abs_dir "$DIR")
    cmd_stop
    ;;
kill-node | restart-node)
    [ $# -eq 3 ] || usage
    K=$3
    [ -d "$DIR" ] || die "no such directory: $DIR"
    DIR=$(abs_dir "$DIR")
    if [ "$CMD" = kill-node ]; then cmd_kill_node; else cmd_restart_node; fi
    ;;
*)
    usage
    ;;
esac
