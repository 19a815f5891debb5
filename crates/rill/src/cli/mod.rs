//! The client-side subcommands of `rill` (`topic`, `produce`, `consume`, `group`,
//! `transaction`, `cluster`, `user`, `acl`, `quota`, `bench`), built on `rill-client`, with the Kafka tools' conventions: the cluster is
//! `--bootstrap-server`/`-b` (or `RILL_BOOTSTRAP_SERVER`, default `127.0.0.1:9092`),
//! tables for people by default and `--output json` for scripts, and one line on stderr
//! with a non-zero exit on failure.

pub mod acl;
pub mod bench;
pub mod cluster;
pub mod consume;
pub mod group;
pub mod produce;
pub mod quota;
pub mod table;
pub mod topic;
pub mod transaction;
pub mod user;

use std::time::Duration;

use clap::{Args, ValueEnum};
use rill_client::ClientConfig;

/// Options every client subcommand takes.
#[derive(Args, Debug, Clone)]
pub struct Common {
    /// Broker(s) to bootstrap from, comma-separated host:port.
    #[arg(
        long = "bootstrap-server",
        short = 'b',
        env = "RILL_BOOTSTRAP_SERVER",
        default_value = "127.0.0.1:9092",
        global = true
    )]
    pub bootstrap_server: String,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Output::Table, global = true)]
    pub output: Output,
    /// Per-request timeout in milliseconds.
    #[arg(long, default_value_t = 30_000, global = true)]
    pub request_timeout_ms: u64,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    Table,
    Json,
}

impl Common {
    pub fn client(&self) -> ClientConfig {
        ClientConfig::new(&self.bootstrap_server)
            .client_id("rill-cli")
            .request_timeout(Duration::from_millis(self.request_timeout_ms))
    }

    pub fn json(&self) -> bool {
        self.output == Output::Json
    }
}

/// Splits `key=value`.
pub fn parse_kv(s: &str) -> anyhow::Result<(String, String)> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| anyhow::anyhow!("expected key=value, got {s:?}"))?;
    Ok((k.to_string(), v.to_string()))
}

/// Prints a JSON value on one line.
pub fn print_json(value: &serde_json::Value) {
    println!("{value}");
}
