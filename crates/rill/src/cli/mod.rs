//! The client-side subcommands of `rill` (`topic`, `produce`, `consume`, `group`,
//! `transaction`, `cluster`, `user`, `acl`, `quota`, `bench`), built on `rill-client`, with the Kafka tools' conventions: the cluster is
//! `--bootstrap-server`/`-b` (or `RILL_BOOTSTRAP_SERVER`, default `127.0.0.1:9092`),
//! tables for people by default and `--output json` for scripts, and one line on stderr
//! with a non-zero exit on failure. TLS and SASL take the client settings' Kafka names,
//! from a properties file (`--command-config`, as the Kafka tools) or one at a time
//! (`-X key=value`, as kcat), the latter winning.

pub mod acl;
pub mod bench;
pub mod cluster;
pub mod consume;
pub mod group;
pub mod produce;
pub mod quota;
pub mod table;
pub mod token;
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
    /// A properties file of client settings (`security.protocol`, `ssl.*`, `sasl.*`, ...).
    #[arg(long, env = "RILL_COMMAND_CONFIG", value_name = "FILE", global = true)]
    pub command_config: Option<std::path::PathBuf>,
    /// One client setting, `key=value`; repeatable; overrides `--command-config`.
    #[arg(short = 'X', value_name = "KEY=VALUE", value_parser = parse_kv, global = true)]
    pub set: Vec<(String, String)>,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    Table,
    Json,
}

impl Common {
    /// The client config these options describe: the properties file's settings, then
    /// each `-X`.
    pub fn client(&self) -> anyhow::Result<ClientConfig> {
        let mut config = ClientConfig::new(&self.bootstrap_server)
            .client_id("rill-cli")
            .request_timeout(Duration::from_millis(self.request_timeout_ms));
        if let Some(path) = &self.command_config {
            let text = std::fs::read_to_string(path)
                .map_err(|e| anyhow::anyhow!("--command-config {}: {e}", path.display()))?;
            for (key, value) in parse_properties(&text) {
                config = config
                    .set(&key, &value)
                    .map_err(|e| anyhow::anyhow!("--command-config {}: {e}", path.display()))?;
            }
        }
        for (key, value) in &self.set {
            config = config
                .set(key, value)
                .map_err(|e| anyhow::anyhow!("-X {key}: {e}"))?;
        }
        Ok(config)
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

/// The `key=value` (or `key: value`) lines of a Java properties file, skipping blank
/// lines and `#`/`!` comments. Line continuations and escapes are not read: client
/// settings do not need them.
pub fn parse_properties(text: &str) -> Vec<(String, String)> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with('!'))
        .map(|l| {
            let at = l.find(['=', ':']).unwrap_or(l.len());
            let value = l.get(at + 1..).unwrap_or("");
            (l[..at].trim().to_string(), value.trim().to_string())
        })
        .collect()
}

/// Prints a JSON value on one line.
pub fn print_json(value: &serde_json::Value) {
    println!("{value}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn properties_files_read_as_the_kafka_tools_read_them() {
        let text = "# client.properties\n\nsecurity.protocol=SASL_SSL\n! old style\n\
                    sasl.mechanism : SCRAM-SHA-256\n  sasl.password=a=b  \nflag\n";
        assert_eq!(
            parse_properties(text),
            vec![
                ("security.protocol".to_string(), "SASL_SSL".to_string()),
                ("sasl.mechanism".to_string(), "SCRAM-SHA-256".to_string()),
                ("sasl.password".to_string(), "a=b".to_string()),
                ("flag".to_string(), String::new()),
            ]
        );
    }
}
