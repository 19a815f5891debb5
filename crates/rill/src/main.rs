//! `rill`: the one binary — server, command line and benchmark.
//!
//! `rill server` with no arguments starts a single-node cluster (controller and broker in
//! one process) on 127.0.0.1:9092 with its data in `./rill-data`.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use rill_broker::{BrokerConfig, Server};

#[derive(Parser)]
#[command(name = "rill", version, about = "Kafka-compatible event streaming")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a broker (with its controller) until SIGINT or SIGTERM.
    Server(ServerArgs),
}

#[derive(clap::Args)]
struct ServerArgs {
    /// TOML file with broker configs under Kafka's names (`log.dirs`, `num.partitions`, …).
    #[arg(long, short = 'c')]
    config: Option<PathBuf>,
    /// Address to listen on (sets `listeners`).
    #[arg(long)]
    listen: Option<String>,
    /// Data directory (sets `log.dirs`).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// This node's id (sets `node.id`).
    #[arg(long)]
    node_id: Option<i32>,
    /// Any broker config as key=value; repeatable; applied last.
    #[arg(long = "override", value_name = "KEY=VALUE")]
    overrides: Vec<String>,
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("RILL_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::Server(args) => server(args),
    }
}

fn server(args: ServerArgs) -> anyhow::Result<()> {
    let mut config = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            BrokerConfig::from_toml(&text)?
        }
        None => BrokerConfig::default(),
    };
    if let Some(listen) = &args.listen {
        config.set("listeners", listen);
    }
    if let Some(dir) = &args.data_dir {
        config.set("log.dirs", &dir.display().to_string());
    }
    if let Some(id) = args.node_id {
        config.set("node.id", &id.to_string());
    }
    for kv in &args.overrides {
        config.set_override(kv)?;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let data_dir = config.data_dir();
        let server = Server::start(config).await?;
        println!(
            "rill listening on {} (data in {})",
            server.local_addr,
            data_dir.display()
        );
        wait_for_signal().await?;
        tracing::info!("shutting down");
        server.shutdown().await;
        Ok(())
    })
}

async fn wait_for_signal() -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r?,
        _ = term.recv() => {}
    }
    Ok(())
}
