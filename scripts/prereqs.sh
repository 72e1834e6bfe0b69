#!/usr/bin/env bash
# Installs the runtime prerequisites of ferry's demo and tests, only those that are missing:
#   fusermount3 (Debian package fuse3), rsync, lz4, pv (a slowed reader in the tests),
#   setfattr/setfacl (attr, acl: extended attributes and ACLs in the tests), and
#   PostgreSQL's server binaries (a real cluster mirrored and started in the tests),
#   python3 (scripts/garage-cluster.sh), and rclone and s3fs (trees uploaded to the S3
#   tests' bucket with the modes, owners and times those tools keep in object metadata), and
#   the Python modules of the protocol suite (tests/spec-client: blake3, xxhash, lz4,
#   zstandard, from PyPI with pip --user). Garage, the S3 server of the tests, is installed by
#   scripts/prereqs-garage.sh, which `make test` runs (not the demo: it takes ~10 minutes once).
# Idempotent: does nothing (and never runs apt-get) when everything is present.
# Needs root and apt-get to install; exits non-zero with a one-line message otherwise.
set -euo pipefail

# command -> Debian package
declare -A PKG=([fusermount3]=fuse3 [rsync]=rsync [lz4]=lz4 [pv]=pv [setfattr]=attr [setfacl]=acl [python3]=python3 [rclone]=rclone [s3fs]=s3fs)

missing=()
for cmd in fusermount3 rsync lz4 pv setfattr setfacl python3 rclone s3fs; do
    if ! command -v "$cmd" >/dev/null 2>&1; then
        missing+=("${PKG[$cmd]}")
    fi
done
if ! compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null; then
    missing+=(postgresql)
fi

if [ ! -e /dev/fuse ]; then
    echo "prereqs.sh: warning: /dev/fuse does not exist; FUSE mounts will fail (try: modprobe fuse)" >&2
fi

# The protocol suite's Python modules (pinned), once python3 is there.
spec_modules() {
    command -v python3 >/dev/null 2>&1 || return 0
    python3 -c 'import blake3, xxhash, lz4, zstandard' 2>/dev/null && return 0
    echo "prereqs.sh: installing the Python modules of tests/spec-client (pip --user)"
    local pins=(blake3==1.0.11 xxhash==4.1.0 lz4==4.4.5 zstandard==0.25.0)
    if ! python3 -m pip --version >/dev/null 2>&1 && ! python3 -m ensurepip --user >/dev/null 2>&1 \
        && [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
        { apt-get update -qq && apt-get install -y -qq --no-install-recommends python3-pip >/dev/null; } || true
    fi
    # Debian's own python3 refuses pip outside a venv unless told (PEP 668).
    python3 -m pip install --user --quiet "${pins[@]}" 2>/dev/null \
        || python3 -m pip install --user --quiet --break-system-packages "${pins[@]}" \
        || { echo "prereqs.sh: could not install ${pins[*]} with pip; install them by hand" >&2; return 1; }
}

if [ "${#missing[@]}" -eq 0 ]; then
    spec_modules
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "prereqs.sh: missing ${missing[*]}; run as root or install them: apt-get install ${missing[*]}" >&2
    exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "prereqs.sh: missing ${missing[*]} and apt-get is not available; install them by hand" >&2
    exit 1
fi

echo "prereqs.sh: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "prereqs.sh: installed ${missing[*]}"
spec_modules
