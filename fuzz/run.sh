#!/usr/bin/env bash
# Builds every fuzz target and runs each for SECONDS (default 60); exits non-zero when a
# target finds a crash (its reproducer is then under fuzz/artifacts/<target>/).
#
#   fuzz/run.sh 300              # five minutes per target
#   FUZZ_TARGETS="frame request" fuzz/run.sh 30
#   FUZZ_PROFILE=dev fuzz/run.sh 15  # a cheaper build for a short run (the test command's)
#   FUZZ_BROKER=0 fuzz/run.sh 15     # the decoders only: not the pre-authentication targets,
#                                    # which build rill-broker (the test command's default)
#
# Needs a nightly toolchain (`cargo +nightly`); without one it says so and exits 0, so that
# a test command can call it unconditionally. cargo-fuzz is installed when missing.
# Each run starts from the committed seeds (fuzz/seeds/<target>) plus what earlier runs
# found (fuzz/corpus/<target>, not committed).
set -euo pipefail

seconds="${1:-60}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"

if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "fuzz: skipped, no nightly toolchain (rustup toolchain install nightly)"
    exit 0
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    echo "fuzz: installing cargo-fuzz"
    cargo install cargo-fuzz --locked
fi

profile=()
if [[ "${FUZZ_PROFILE:-release}" == dev ]]; then
    profile=(--dev)
fi
# The targets with `required-features = ["broker"]` in Cargo.toml.
broker_targets="sasl_server oauthbearer scram tls_accept"
if [[ "${FUZZ_BROKER:-1}" == 1 ]]; then
    profile+=(--features broker)
    all="$(cargo +nightly fuzz list)"
else
    all="$(cargo +nightly fuzz list | grep -vxF -e ${broker_targets// / -e })"
fi
cargo +nightly fuzz build "${profile[@]}"
targets="${FUZZ_TARGETS:-$all}"
failed=()
for target in $targets; do
    mkdir -p "corpus/$target"
    echo "fuzz: $target for ${seconds}s"
    # -rss_limit_mb: a decoder that allocates what a length claims shows up as a crash.
    if ! cargo +nightly fuzz run "${profile[@]}" "$target" "corpus/$target" "seeds/$target" -- \
        -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=20 -print_final_stats=1 \
        2>"corpus/$target.log"; then
        tail -n 40 "corpus/$target.log"
        failed+=("$target")
    else
        grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "corpus/$target.log" || true
    fi
done
if ((${#failed[@]})); then
    echo "fuzz: crashes in ${failed[*]} (reproducers under fuzz/artifacts/)"
    exit 1
fi
echo "fuzz: no crash in $(echo $targets | wc -w) targets, ${seconds}s each"
