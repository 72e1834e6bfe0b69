#!/usr/bin/env bash
# Installs Garage 2.5.0 (an S3-compatible object store, crates.io crate `garage`, AGPL-3.0) at
# /opt/ferry/garage/bin/garage, built from source with cargo, once.
#
# Why: the tests and benchmarks of `ferry mount s3://` and `ferry mirror s3://` need a real S3
# server; scripts/garage-cluster.sh starts a local Garage cluster with this binary. Garage runs
# as a separate process and is never linked into ferry.
#
# Idempotent: does nothing when /opt/ferry/garage/bin/garage already reports version 2.5.0.
# The build is nice'd and keeps its target dir in /var/cache/ferry-prereqs/garage-target, so
# an interrupted or repeated install reuses what was already compiled (never /work/.../target).
# Feature set: bundled-libs + lmdb only (no sqlite, k2v or metrics): the metadata engine is
# LMDB, which garage-cluster.sh configures (db_engine = "lmdb").
# Exits non-zero with a one-line message on failure (the build log stays in the cache dir).
set -euo pipefail

VERSION=2.5.0
ROOT=/opt/ferry/garage
BIN="$ROOT/bin/garage"
CACHE=/var/cache/ferry-prereqs
TARGET_DIR="$CACHE/garage-target"
LOG="$CACHE/garage-build.log"

die() { echo "prereqs-garage.sh: $*" >&2; exit 1; }

installed_version() {
    # `garage --version` prints e.g. "garage v2.5.0 [features: ...]"
    "$BIN" --version 2>/dev/null | head -n1 | grep -Eo 'v?[0-9]+\.[0-9]+\.[0-9]+' | head -n1 | sed 's/^v//'
}

if [ -x "$BIN" ] && [ "$(installed_version || true)" = "$VERSION" ]; then
    exit 0
fi

# Debian packages the build needs: a C compiler (LMDB and libsodium are compiled from the
# bundled sources) and pkg-config.
missing=()
command -v cc >/dev/null 2>&1 || missing+=(gcc libc6-dev)
command -v make >/dev/null 2>&1 || missing+=(make)
command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
if [ "${#missing[@]}" -gt 0 ]; then
    [ "$(id -u)" -eq 0 ] || die "missing ${missing[*]}; run as root or: apt-get install ${missing[*]}"
    command -v apt-get >/dev/null 2>&1 || die "missing ${missing[*]} and apt-get is not available"
    echo "prereqs-garage.sh: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq || die "apt-get update failed"
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
        || die "apt-get install ${missing[*]} failed"
fi

command -v cargo >/dev/null 2>&1 || die "cargo not found on PATH (install Rust with rustup first)"
mkdir -p "$CACHE" "$ROOT" || die "cannot create $CACHE or $ROOT (run as root?)"

echo "prereqs-garage.sh: building Garage $VERSION once into $ROOT (~10 minutes on 2 cores; log: $LOG)"
start=$(date +%s)
if ! CARGO_TARGET_DIR="$TARGET_DIR" nice -n 19 \
    cargo install garage --version "$VERSION" --locked --root "$ROOT" \
        --no-default-features --features bundled-libs,lmdb >"$LOG" 2>&1; then
    die "cargo install garage $VERSION failed: $(grep -m1 -E '^error' "$LOG" || tail -n1 "$LOG") (full log: $LOG)"
fi
[ "$(installed_version || true)" = "$VERSION" ] \
    || die "$BIN does not report version $VERSION after the build (full log: $LOG)"
echo "prereqs-garage.sh: Garage $VERSION installed at $BIN in $(( ($(date +%s) - start) / 60 )) min"
