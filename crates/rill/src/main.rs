//! `rill`: the one binary — server, command line and benchmark.
//!
//! `rill server` with no arguments starts a single-node cluster (controller and broker in
//! one process) on 127.0.0.1:9092 with its data in `./rill-data`; `process.roles` makes a
//! node a controller only or a broker only. The other subcommands
//! (`topic`, `produce`, `consume`, `group`, `cluster`, `bench`) are clients of a running cluster,
//! built on `rill-client` (see `cli/`).

mod cli;
mod console;

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use rill_broker::{BrokerConfig, Node};

// mimalloc rather than glibc's malloc: a request's many small, short-lived allocations
// (frames, decoded bodies, futures) cost a leader about 9% of its CPU in glibc.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(name = "rill", version, about = "Kafka-compatible event streaming")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a node until SIGINT or SIGTERM: broker and controller (the default), or one
    /// of them (`--override process.roles=broker` or `=controller`).
    Server(ServerArgs),
    /// Prepare a data directory before its first start: SCRAM users for the bootstrap
    /// metadata, as `kafka-storage format --add-scram`.
    Format(FormatArgs),
    /// Create, list, describe, delete and alter topics.
    Topic {
        #[command(flatten)]
        common: cli::Common,
        #[command(subcommand)]
        command: cli::topic::TopicCommand,
    },
    /// Write stdin, one record per line, to a topic.
    Produce {
        #[command(flatten)]
        common: cli::Common,
        #[command(flatten)]
        args: cli::produce::ProduceArgs,
    },
    /// Print a topic's records, in a consumer group or from chosen partitions.
    Consume {
        #[command(flatten)]
        common: cli::Common,
        #[command(flatten)]
        args: cli::consume::ConsumeArgs,
    },
    /// List, describe (with lag), delete consumer groups and reset their offsets.
    Group {
        #[command(flatten)]
        common: cli::Common,
        #[command(subcommand)]
        command: cli::group::GroupCommand,
    },
    /// List and describe transactional ids (KIP-664).
    Transaction {
        #[command(flatten)]
        common: cli::Common,
        #[command(subcommand)]
        command: cli::transaction::TransactionCommand,
    },
    /// Describe the cluster: id, controller, brokers.
    Cluster {
        #[command(flatten)]
        common: cli::Common,
        #[command(subcommand)]
        command: cli::cluster::ClusterCommand,
    },
    /// Create, delete and list SCRAM users (SASL/SCRAM-SHA-256 and -512).
    User {
        #[command(flatten)]
        common: cli::Common,
        #[command(subcommand)]
        command: cli::user::UserCommand,
    },
    /// Create, renew, expire and describe delegation tokens (kafka-delegation-tokens.sh).
    Token {
        #[command(flatten)]
        common: cli::Common,
        #[command(subcommand)]
        command: cli::token::TokenCommand,
    },
    /// Set, remove and list client quotas (users, client ids, addresses).
    Quota {
        #[command(flatten)]
        common: cli::Common,
        #[command(subcommand)]
        command: cli::quota::QuotaCommand,
    },
    /// Add, list and remove ACLs (kafka-acls.sh's options).
    Acl {
        #[command(flatten)]
        common: cli::Common,
        #[command(subcommand)]
        command: cli::acl::AclCommand,
    },
    /// Measure produce (throughput, delivery latency) and consume throughput.
    Bench {
        #[command(flatten)]
        common: cli::Common,
        #[command(subcommand)]
        command: cli::bench::BenchCommand,
    },
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
    /// Address of this node's controller listener, where the controller quorum talks;
    /// on a broker-only node, where it receives the metadata log (adds
    /// `CONTROLLER://HOST:PORT` to `listeners`).
    #[arg(long, value_name = "HOST:PORT")]
    controller_listen: Option<String>,
    /// The controller quorum's voters: `1@HOST:PORT,2@HOST:PORT,3@HOST:PORT`, the same on
    /// every node; a broker-only node finds the controllers here and is not listed
    /// (sets `controller.quorum.voters`).
    #[arg(long, value_name = "ID@HOST:PORT,...")]
    controller_quorum: Option<String>,
    /// The address clients are told to use when it differs from `--listen`
    /// (sets `advertised.listeners`).
    #[arg(long, value_name = "HOST:PORT")]
    advertised_listener: Option<String>,
    /// Any broker config as key=value; repeatable; applied last.
    #[arg(long = "override", value_name = "KEY=VALUE")]
    overrides: Vec<String>,
    /// Refuse to start when the config file or an override sets a key Rill does not
    /// know, instead of warning (sets `config.strict`).
    #[arg(long)]
    strict_config: bool,
    /// `text` (the default) or `json`: one JSON object per log line, with the span's
    /// fields (sets `log.format`).
    #[arg(long, value_name = "text|json")]
    log_format: Option<String>,
}

fn main() -> anyhow::Result<()> {
    ignore_sigxfsz();
    purge_freed_memory_at_once();
    let cli = Cli::parse();
    // The server logs its life at info; client commands only say what went wrong, so
    // that their stdout and stderr stay scriptable.
    let default_level = if matches!(cli.command, Command::Server(_)) {
        "info,openraft=off"
    } else {
        "warn"
    };
    let filter = || {
        tracing_subscriber::EnvFilter::try_from_env("RILL_LOG")
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level))
    };
    let client_command = match cli.command {
        Command::Server(args) => {
            // The config first: `log.format` decides how everything after it is logged.
            let started = server_config(&args).and_then(|config| {
                match LogFormat::of(&config)? {
                    LogFormat::Json => tracing_subscriber::fmt()
                        .json()
                        .with_current_span(true)
                        .with_env_filter(filter())
                        .with_writer(std::io::stderr)
                        .init(),
                    LogFormat::Text => tracing_subscriber::fmt()
                        .with_env_filter(filter())
                        .with_writer(std::io::stderr)
                        .init(),
                }
                server(config)
            });
            if let Err(e) = started {
                // A start-up failure (bad config, a locked or foreign data directory, a
                // port taken) is exit status 1, in one line like the client commands'.
                eprintln!("error: {}", one_line(&e));
                std::process::exit(1);
            }
            return Ok(());
        }
        Command::Format(args) => {
            if let Err(e) = format(&args) {
                eprintln!("error: {}", one_line(&e));
                std::process::exit(1);
            }
            return Ok(());
        }
        other => other,
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter())
        .with_writer(std::io::stderr)
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let result = runtime.block_on(async move {
        match client_command {
            Command::Server(_) | Command::Format(_) => Ok(()),
            Command::Topic { common, command } => cli::topic::run(&common, command).await,
            Command::Produce { common, args } => cli::produce::run(&common, args).await,
            Command::Consume { common, args } => cli::consume::run(&common, args).await,
            Command::Group { common, command } => cli::group::run(&common, command).await,
            Command::Transaction { common, command } => {
                cli::transaction::run(&common, command).await
            }
            Command::Cluster { common, command } => cli::cluster::run(&common, command).await,
            Command::User { common, command } => cli::user::run(&common, command).await,
            Command::Token { common, command } => cli::token::run(&common, command).await,
            Command::Quota { common, command } => cli::quota::run(&common, command).await,
            Command::Acl { common, command } => cli::acl::run(&common, command).await,
            Command::Bench { common, command } => cli::bench::run(&common, command).await,
        }
    });
    // Background tasks (heartbeats, the producer's sender) must not keep the process
    // alive once the command is done.
    runtime.shutdown_timeout(std::time::Duration::from_millis(100));
    if let Err(e) = result {
        eprintln!("error: {}", one_line(&e));
        std::process::exit(1);
    }
    Ok(())
}

/// An error and its causes in one line, the Kafka tools' way. A cause whose text the
/// line already holds is left out: errors such as `i/o on PATH: SOURCE` print their
/// source themselves, and naming it twice says nothing more.
fn one_line(e: &anyhow::Error) -> String {
    let mut line = e.to_string();
    for cause in e.chain().skip(1) {
        let cause = cause.to_string();
        if !line.contains(&cause) {
            line.push_str(": ");
            line.push_str(&cause);
        }
    }
    line
}

/// The exit code of a server that stopped because its log directory failed (a write or
/// fsync refused by the disk), apart from 1 (bad configuration, start-up errors) so that
/// a supervisor can tell "fix the disk" from "fix the config".
const EXIT_LOG_DIR_FAILED: i32 = 3;
/// Exit status after a write or fsync of the metadata log (or the vote) failed, which
/// stops Raft on this node for good.
const EXIT_METADATA_LOG_FAILED: i32 = 4;

/// Makes a write past `RLIMIT_FSIZE` fail with EFBIG instead of killing the process.
///
/// The kernel sends SIGXFSZ to a process that writes beyond its file-size limit, and the
/// default action terminates it on the spot: no error is logged, and no produce gets its
/// KAFKA_STORAGE_ERROR. With the signal ignored the write returns EFBIG, which the log
/// handles like any other full disk (see `rill_broker::log_dir_failure`).
#[allow(
    unsafe_code,
    reason = "setting a signal disposition has no safe std API"
)]
fn ignore_sigxfsz() {
    // SAFETY: SIG_IGN installs no handler, so no code runs in signal context; this is
    // called at the start of `main`, before any other thread exists.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
    }
}

/// `mi_option_purge_delay` in mimalloc v3's `mi_option_t` (include/mimalloc.h);
/// libmimalloc-sys names the options around it but not this one (a test checks it).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Makes mimalloc give freed pages back to the kernel as soon as they are free.
///
/// By default (v3) it waits a second, and it only purges when the allocator is called again: after
/// a burst (a pre-authentication flood of large frames, a big fetch) a quiet node kept
/// its peak, 111 MiB where glibc returned to 33 (the flood test in `test_security.py`).
/// With no delay it returned to 41 MiB, at no cost measurable on the saturation bench
/// (BENCHMARKS.md, the replicated write path).
#[allow(
    unsafe_code,
    reason = "mimalloc's options have no safe API; mi_option_set only stores a value"
)]
fn purge_freed_memory_at_once() {
    // SAFETY: setting an option writes one atomic in mimalloc's option table; it may be
    // called at any time, from any thread.
    unsafe {
        libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0);
    }
}

/// How the server's log lines look (`log.format`, `--log-format`).
enum LogFormat {
    Text,
    Json,
}

impl LogFormat {
    fn of(config: &BrokerConfig) -> anyhow::Result<Self> {
        match config.get("log.format").unwrap_or("text").trim() {
            "" | "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => anyhow::bail!("log.format: invalid value {other:?}: must be text or json"),
        }
    }
}

/// The server's config: the file, then the flags, then the overrides.
fn server_config(args: &ServerArgs) -> anyhow::Result<BrokerConfig> {
    let mut config = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            BrokerConfig::from_toml(&text)?
        }
        None => BrokerConfig::default(),
    };
    if let Some(listen) = &args.listen {
        config.set("listeners", &format!("PLAINTEXT://{listen}"));
    }
    if let Some(controller) = &args.controller_listen {
        let client = config.get("listeners").unwrap_or_default().to_string();
        let client: Vec<&str> = client
            .split(',')
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with("CONTROLLER://"))
            .collect();
        config.set(
            "listeners",
            &format!("{},CONTROLLER://{controller}", client.join(",")),
        );
    }
    if let Some(voters) = &args.controller_quorum {
        config.set("controller.quorum.voters", voters);
    }
    if let Some(advertised) = &args.advertised_listener {
        // The first client listener's, whatever its name.
        config.set("advertised.listeners", advertised);
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
    if args.strict_config {
        config.set("config.strict", "true");
    }
    if let Some(format) = &args.log_format {
        config.set("log.format", format);
    }
    if args.listen.is_some() && !config.process_roles()?.broker {
        anyhow::bail!(
            "--listen: a controller-only node (process.roles=controller) has no client \
             listener; use --controller-listen"
        );
    }
    Ok(config)
}

fn server(config: BrokerConfig) -> anyhow::Result<()> {
    // Many clients mean many sockets: lift the soft fd limit to the hard one first.
    rill_broker::network::raise_fd_limit();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    // Locked before anything in the directory is read, and held past the runtime's end:
    // background tasks may write to the metadata log until the runtime stops them.
    let data_dir = config.data_dir();
    let lock = std::sync::Arc::new(rill_broker::DataDirLock::acquire_all(&config.all_dirs())?);
    let node_lock = lock.clone();
    // The console is a client of this node: its listeners' protocols, the listener it
    // is told to use, and its client settings (`console.client.*`).
    let protocols: Vec<(String, &'static str)> = config
        .client_listeners()
        .map(|ls| {
            ls.into_iter()
                .map(|l| (l.name, l.protocol.name()))
                .collect()
        })
        .unwrap_or_default();
    let console_listener = config
        .get("console.listener.name")
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty());
    let mut console_settings: Vec<(String, String)> = config
        .explicit()
        .filter_map(|(k, v)| {
            k.strip_prefix("console.client.")
                .map(|k| (k.to_string(), v.to_string()))
        })
        .collect();
    // A TLS listener's CA: the broker's own truststore unless the console is told.
    if let Some(truststore) = config.get("ssl.truststore.location") {
        if !console_settings.iter().any(|(k, _)| k == "ssl.ca.location") {
            console_settings.insert(0, ("ssl.ca.location".into(), truststore.to_string()));
        }
    }
    let result = runtime.block_on(async move {
        let node = Node::start_with_lock(config, node_lock).await?;
        if let Node::Broker(server) = &node {
            if server.http_addr.is_some() {
                let listeners: Vec<_> = server
                    .listeners
                    .iter()
                    .filter_map(|(name, addr)| {
                        let (_, protocol) = protocols.iter().find(|(n, _)| n == name)?;
                        Some(console::ConsoleListener {
                            name: name.clone(),
                            addr: *addr,
                            protocol,
                        })
                    })
                    .collect();
                let target =
                    console::target_for(&listeners, console_listener.as_deref(), &console_settings);
                let routes = console::router(target);
                server.http_routes.install(routes);
            }
        }
        match &node {
            Node::Broker(server) if server.broker.quorum.is_voter() => println!(
                "rill listening on {} (controller on {}, data in {})",
                server.local_addr,
                server.controller_addr,
                data_dir.display()
            ),
            Node::Broker(server) => println!(
                "rill listening on {} (broker only, metadata log on {}, data in {})",
                server.local_addr,
                server.controller_addr,
                data_dir.display()
            ),
            Node::Controller(controller) => println!(
                "rill controller listening on {} (controller only, data in {})",
                controller.controller_addr,
                data_dir.display()
            ),
        }
        if let Node::Broker(server) = &node {
            for (name, addr) in &server.listeners {
                println!("rill listener {name} on {addr}");
            }
            if let Some(addr) = server.http_addr {
                println!("rill http listening on {addr}");
            }
        }
        if let Node::Controller(controller) = &node {
            if let Some(addr) = controller.http_addr {
                println!("rill http listening on {addr}");
            }
        }
        let failures = match &node {
            Node::Broker(server) => Some(server.broker.replicas.log_dir_failure().clone()),
            Node::Controller(_) => None,
        };
        let failed = async {
            match &failures {
                Some(f) => f.failed().await,
                None => std::future::pending().await,
            }
        };
        let quorum = match &node {
            Node::Broker(server) => server.broker.quorum.clone(),
            Node::Controller(controller) => controller.quorum.clone(),
        };
        tokio::select! {
            r = wait_for_signal() => r?,
            fatal = quorum.fatal() => {
                // Kafka halts on a metadata-log fault too: this node can no longer vote
                // or learn new metadata, and serving clients from its frozen image would
                // hand out leaders and configs that are no longer true. No controlled
                // shutdown: it would need the quorum.
                tracing::error!(error = %fatal, "the metadata log failed; stopping");
                eprintln!("error: the metadata log failed: {fatal}");
                std::process::exit(EXIT_METADATA_LOG_FAILED);
            }
            failure = failed => {
                // Kafka halts here too: no controlled shutdown (it would write to the
                // failed directory), no clean-shutdown markers, so that the next start
                // recovers the logs from what really is on disk.
                tracing::error!("{failure}");
                eprintln!("error: {failure}");
                // A moment for the requests that failed to get their KAFKA_STORAGE_ERROR
                // back instead of a closed connection; every write is refused meanwhile.
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                std::process::exit(EXIT_LOG_DIR_FAILED);
            }
        }
        tracing::info!("shutting down");
        node.shutdown().await;
        Ok(())
    });
    // Waits for the blocking tasks still running (a clean, an fsync); logged after, so
    // that a shutdown that hangs here says so.
    drop(runtime);
    tracing::info!("stopped");
    drop(lock);
    result
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

#[cfg(test)]
mod tests {
    use super::one_line;

    /// The option index is mimalloc's purge delay: its default in v3, 1000 ms, is what
    /// the neighbouring options (a deprecated one at 14, 1; NUMA nodes at 16, 0) do not
    /// have.
    #[test]
    #[allow(unsafe_code, reason = "reading a mimalloc option")]
    fn the_purge_delay_option_is_the_one_set() {
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
            return;
        }
        // SAFETY: reads one value of mimalloc's option table.
        let value = unsafe { libmimalloc_sys::mi_option_get(super::MI_OPTION_PURGE_DELAY) };
        assert_eq!(value, 1000);
    }

    #[test]
    fn a_cause_the_message_already_holds_is_not_repeated() {
        let taken = std::io::Error::new(std::io::ErrorKind::AddrInUse, "Address already in use");
        let e = anyhow::Error::from(rill_broker::BrokerError::io("127.0.0.1:1", taken));
        assert_eq!(one_line(&e), "i/o on 127.0.0.1:1: Address already in use");
        let missing = std::io::Error::new(std::io::ErrorKind::NotFound, "No such file");
        let e = anyhow::Error::from(missing).context("reading rill.toml");
        assert_eq!(one_line(&e), "reading rill.toml: No such file");
    }
}

/// `rill format`'s arguments.
#[derive(clap::Args)]
struct FormatArgs {
    /// The node's data directory (`log.dirs`).
    #[arg(long, value_name = "DIR")]
    data_dir: std::path::PathBuf,
    /// A SCRAM user the metadata log starts with, as Kafka writes it:
    /// `SCRAM-SHA-256=[name=alice,password=alice-secret]`, or with
    /// `iterations=N,salt=BASE64,saltedpassword=BASE64` instead of the password.
    /// Repeat for more users.
    #[arg(long = "add-scram", value_name = "MECHANISM=[...]", required = true)]
    add_scram: Vec<String>,
}

/// Writes `bootstrap.scram` in the data directory (see `rill_broker::bootstrap_scram`).
fn format(args: &FormatArgs) -> anyhow::Result<()> {
    let users = args
        .add_scram
        .iter()
        .map(|spec| rill_broker::network::bootstrap_scram::parse_add_scram(spec))
        .collect::<Result<Vec<_>, _>>()
        .map_err(anyhow::Error::msg)?;
    rill_broker::network::bootstrap_scram::write(&args.data_dir, &users)?;
    println!(
        "wrote {} SCRAM credential(s) to {}",
        users.len(),
        args.data_dir
            .join(rill_broker::network::bootstrap_scram::FILE)
            .display()
    );
    Ok(())
}
