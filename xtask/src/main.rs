//! Project tooling, run as `cargo xtask <command>` (alias in `.cargo/config.toml`):
//!
//! - `cargo xtask codegen [--check]`: regenerates `crates/protocol/src/generated/` from
//!   `../shared/kafka-message-specs/` and, for the share-group family, Kafka 4.2.2's jars
//!   (fetched into the local Maven repository when missing); `--check` fails when the
//!   committed output is stale.
//! - `cargo xtask test`: every test, unit to end-to-end, installing what the end-to-end
//!   tests need (a Python venv under `target/`, kcat, librdkafka's `rdkafka_performance`)
//!   by itself.
//! - `cargo xtask compat [--family NAME]... [--quick]`: the client families of
//!   `tests/compat/` (Kafka's Java client and tools, the differential harness against Apache
//!   Kafka, Go clients) against real servers, one summary table; quick mode is in `test`.
//! - `cargo xtask chaos [--minutes N] [--seed N] [--scenario S]`: the fault-injection
//!   suite (`tests/e2e/chaos.py`) for as long as asked; its short run is in `test`.
//! - `cargo xtask rdkafka-performance`: builds (or reuses) `rdkafka_performance` under
//!   `target/` and prints its path, for the benchmarks.
//! - `cargo xtask librdkafka-suite [--quick] [NUMBER]...`: librdkafka's own integration
//!   tests against a rill cluster (the `librdkafka` compat family), all or some numbers.
//! - `cargo xtask compatibility [--check]`: writes (or checks) the API table of
//!   `COMPATIBILITY.md` from what the broker offers and what Kafka 4.1 offers.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "a dev tool, not a library"
)]

mod chaos;
mod codegen;
mod compat;
mod compatibility;
mod layering;
mod maven;
mod rdkafka_performance;
mod test;

use std::path::PathBuf;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("codegen") => codegen::run(&workspace_root(), &args[1..]),
        Some("compat") => compat::run(&workspace_root(), &args[1..]),
        Some("chaos") => chaos::run(&workspace_root(), &args[1..]),
        Some("test") => test::run(&workspace_root(), &args[1..]),
        Some("rdkafka-performance") => rdkafka_performance::run(&workspace_root(), &args[1..]),
        Some("librdkafka-suite") => compat::librdkafka_suite(&workspace_root(), &args[1..]),
        Some("compatibility") => compatibility::run(&workspace_root(), &args[1..]),
        _ => {
            eprintln!("usage: cargo xtask <codegen [--check] | test [args] | compat [args] | chaos [args] | rdkafka-performance | librdkafka-suite [--quick] [NUMBER]... | compatibility [--check]>");
            std::process::exit(2);
        }
    }
}

/// The workspace root: xtask's manifest sits one level below it.
fn workspace_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map(PathBuf::from).unwrap_or(manifest)
}
