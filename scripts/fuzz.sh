#!/usr/bin/env bash
# Builds (`fuzz.sh build`) or briefly runs (`fuzz.sh smoke SECONDS`) the cargo-fuzz targets in
# fuzz/. Needs the nightly toolchain (rustup); installs cargo-fuzz from crates.io if missing.
# Exit status 1 if a target finds a crash (its input is left in fuzz/artifacts/).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"
cargo +nightly --version >/dev/null 2>&1 || rustup toolchain install nightly --profile minimal \
    || { echo "fuzz.sh: the nightly toolchain is needed (rustup toolchain install nightly)" >&2; exit 1; }
command -v cargo-fuzz >/dev/null 2>&1 || cargo install cargo-fuzz --locked \
    || { echo "fuzz.sh: cannot install cargo-fuzz (cargo install cargo-fuzz)" >&2; exit 1; }
mode=${1:-build}
cd fuzz
cargo +nightly fuzz build
[ "$mode" = build ] && exit 0
secs=${2:-60}
status=0
for t in $(cargo +nightly fuzz list); do
    mkdir -p "corpus/$t"
    log=$(mktemp)
    if cargo +nightly fuzz run "$t" -- -max_total_time="$secs" >"$log" 2>&1; then
        runs=$(grep -o 'Done [0-9]* runs in [0-9]* second(s)' "$log" | tail -1)
        echo "fuzz $t: ${runs:-finished}, no crash; corpus $(ls "corpus/$t" | wc -l) inputs"
    else
        echo "fuzz $t: FOUND A CRASH (input in fuzz/artifacts/$t/):" >&2
        grep -E 'panicked|ERROR|SUMMARY' "$log" | head -5 >&2
        status=1
    fi
    rm -f "$log"
done
exit $status
