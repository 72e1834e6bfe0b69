#!/bin/bash
# Alternates two builds invocation by invocation, for an A/B inside one benchmark run. This
# VM's speed swings up to 2x between spells, so two builds measured in separate runs are
# compared across spells; alternated within one run, each pair of runs shares its spell.
#
#   ALT_A=/tmp/old/ferry ALT_B=target/release/ferry FERRY_BIN=bench/alternate.sh \
#       bench/s3.sh --links 1gbit --methods ferry-get --repeat 6
#
# Runs ALT_A, then ALT_B, then ALT_A... (a counter in $ALT_STATE, default
# /tmp/ferry-alternate, started afresh when absent), and appends "A" or "B" to
# $ALT_STATE.order, so the report's runs can be told apart: run 1 is A, run 2 B, and so on.
#
# Only `mount` and `mirror` (the runs) alternate; any other subcommand (`status`, which
# bench/compression.sh calls after each run) goes to ALT_B and is not counted, so it does not
# shift the order: with every call counted, a script calling `ferry status` after each mount
# would have mounted ALT_A every time.
set -euo pipefail
: "${ALT_A:?set ALT_A and ALT_B to the two binaries to alternate}" "${ALT_B:?set ALT_B}"
case "${1:-}" in
    mount | mirror) ;;
    *) exec "$ALT_B" "$@" ;;
esac
state=${ALT_STATE:-/tmp/ferry-alternate}
n=$(cat "$state" 2>/dev/null || echo 0)
echo $((n + 1)) > "$state"
if [ $((n % 2)) -eq 0 ]; then which=A bin=$ALT_A; else which=B bin=$ALT_B; fi
echo "$which" >> "$state.order"
exec "$bin" "$@"
