//! `rill transaction list|describe|describe-producers|find-hanging|abort` (KIP-664, as
//! `kafka-transactions.sh`): the transactional ids every broker coordinates, one id's state,
//! producer and partitions as its coordinator sees them, the producers a partition leader
//! keeps state for, the open transactions no coordinator will end (hanging), and aborting
//! one with an ABORT marker written straight to the partition's leader.
//!
//! A transaction is hanging, as `kafka-transactions.sh find-hanging` decides it, when a
//! partition leader has it open for longer than any transaction may run
//! (`--max-transaction-timeout`, the brokers' `transaction.max.timeout.ms`, 15 minutes by
//! default) and its coordinator does not list that partition in a transaction of the same
//! producer id: the coordinator would have aborted it by then, so no marker is coming.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use clap::Subcommand;
use rill_client::{AbortTransactionSpec, Admin, ProducerState, TopicPartition};
use serde_json::json;

use super::{print_json, table, Common};

#[derive(Subcommand, Debug)]
pub enum TransactionCommand {
    /// List transactional ids and their state.
    List {
        /// Only ids in this state (Empty, Ongoing, PrepareCommit, PrepareAbort,
        /// CompleteCommit, CompleteAbort, ...); repeatable.
        #[arg(long = "state")]
        states: Vec<String>,
    },
    /// State, producer, timeout and partitions of transactional ids.
    Describe {
        #[arg(required = true)]
        transactional_ids: Vec<String>,
    },
    /// The producers a partition's leader keeps state for, with their open transactions.
    #[command(name = "describe-producers")]
    DescribeProducers {
        #[arg(long)]
        topic: String,
        #[arg(long)]
        partition: i32,
    },
    /// Open transactions older than the longest a transaction may run, that no
    /// coordinator will end; needs --topic or --broker-id.
    #[command(name = "find-hanging")]
    FindHanging {
        /// Only this topic's partitions.
        #[arg(long)]
        topic: Option<String>,
        /// Only this partition of --topic.
        #[arg(long, requires = "topic")]
        partition: Option<i32>,
        /// Only partitions with a replica on this broker.
        #[arg(long)]
        broker_id: Option<i32>,
        /// The brokers' transaction.max.timeout.ms, in minutes.
        #[arg(long, default_value_t = 15)]
        max_transaction_timeout: u64,
    },
    /// Abort an open transaction in one partition (a hanging one) by writing an ABORT
    /// marker there: identified by its first offset, or by producer id, epoch and
    /// coordinator epoch.
    Abort {
        #[arg(long)]
        topic: String,
        #[arg(long)]
        partition: i32,
        /// The first offset of the transaction (DescribeProducers' start offset).
        #[arg(long, conflicts_with = "producer_id")]
        start_offset: Option<i64>,
        #[arg(long, requires_all = ["producer_epoch", "coordinator_epoch"])]
        producer_id: Option<i64>,
        #[arg(long)]
        producer_epoch: Option<i16>,
        #[arg(long)]
        coordinator_epoch: Option<i32>,
    },
}

pub async fn run(common: &Common, command: TransactionCommand) -> anyhow::Result<()> {
    let admin = Admin::new(common.client()?)?;
    match command {
        TransactionCommand::List { states } => {
            let listed = admin.list_transactions(&states).await?;
            if common.json() {
                print_json(&json!(listed
                    .iter()
                    .map(|t| json!({
                        "transactional_id": t.transactional_id, "producer_id": t.producer_id,
                        "state": t.state, "coordinator": t.coordinator,
                    }))
                    .collect::<Vec<_>>()));
            } else {
                let rows: Vec<Vec<String>> = listed
                    .iter()
                    .map(|t| {
                        vec![
                            t.transactional_id.clone(),
                            t.coordinator.to_string(),
                            t.producer_id.to_string(),
                            t.state.clone(),
                        ]
                    })
                    .collect();
                table::print(
                    &["TRANSACTIONAL-ID", "COORDINATOR", "PRODUCER-ID", "STATE"],
                    &rows,
                );
            }
        }
        TransactionCommand::Describe { transactional_ids } => {
            let described = admin.describe_transactions(&transactional_ids).await?;
            let partitions = |t: &rill_client::TransactionDescription| {
                t.partitions
                    .iter()
                    .map(|tp| format!("{}-{}", tp.topic, tp.partition))
                    .collect::<Vec<_>>()
            };
            if common.json() {
                print_json(&json!(described
                    .iter()
                    .map(|t| json!({
                        "transactional_id": t.transactional_id, "coordinator": t.coordinator,
                        "state": t.state, "producer_id": t.producer_id,
                        "producer_epoch": t.producer_epoch,
                        "transaction_timeout_ms": t.transaction_timeout_ms,
                        "transaction_start_time_ms": t.transaction_start_time_ms,
                        "partitions": partitions(t),
                    }))
                    .collect::<Vec<_>>()));
            } else {
                let rows: Vec<Vec<String>> = described
                    .iter()
                    .map(|t| {
                        vec![
                            t.transactional_id.clone(),
                            t.coordinator.to_string(),
                            t.producer_id.to_string(),
                            t.producer_epoch.to_string(),
                            t.state.clone(),
                            t.transaction_timeout_ms.to_string(),
                            t.transaction_start_time_ms.to_string(),
                            partitions(t).join(","),
                        ]
                    })
                    .collect();
                table::print(
                    &[
                        "TRANSACTIONAL-ID",
                        "COORDINATOR",
                        "PRODUCER-ID",
                        "EPOCH",
                        "STATE",
                        "TIMEOUT-MS",
                        "START-MS",
                        "PARTITIONS",
                    ],
                    &rows,
                );
            }
        }
        TransactionCommand::DescribeProducers { topic, partition } => {
            let tp = TopicPartition::new(topic, partition);
            let producers = admin
                .describe_producers(std::slice::from_ref(&tp))
                .await?
                .remove(&tp)
                .unwrap_or_default();
            let open: Vec<(TopicPartition, ProducerState)> =
                producers.into_iter().map(|p| (tp.clone(), p)).collect();
            print_producers(common, &open);
        }
        TransactionCommand::FindHanging {
            topic,
            partition,
            broker_id,
            max_transaction_timeout,
        } => {
            let partitions = partitions_to_search(&admin, topic, partition, broker_id).await?;
            let max = Duration::from_secs(max_transaction_timeout.saturating_mul(60));
            let hanging = find_hanging(&admin, &partitions, max).await?;
            print_producers(common, &hanging);
        }
        TransactionCommand::Abort {
            topic,
            partition,
            start_offset,
            producer_id,
            producer_epoch,
            coordinator_epoch,
        } => {
            let tp = TopicPartition::new(topic, partition);
            let spec = match (start_offset, producer_id, producer_epoch, coordinator_epoch) {
                (Some(start), _, _, _) => spec_at(&admin, &tp, start).await?,
                (None, Some(producer_id), Some(producer_epoch), Some(coordinator_epoch)) => {
                    AbortTransactionSpec {
                        partition: tp.clone(),
                        producer_id,
                        producer_epoch,
                        // A producer whose transaction hung before its first marker shows
                        // -1; 0 is at most any coordinator epoch (as Kafka's tool does).
                        coordinator_epoch: coordinator_epoch.max(0),
                    }
                }
                _ => anyhow::bail!(
                    "name the transaction with --start-offset, or with --producer-id, \
                     --producer-epoch and --coordinator-epoch"
                ),
            };
            admin
                .abort_transaction(&spec)
                .await
                .with_context(|| format!("aborting {spec:?}"))?;
            if common.json() {
                print_json(&json!({
                    "aborted": {
                        "topic": tp.topic, "partition": tp.partition,
                        "producer_id": spec.producer_id, "producer_epoch": spec.producer_epoch,
                        "coordinator_epoch": spec.coordinator_epoch,
                    }
                }));
            } else {
                println!(
                    "aborted the transaction of producer {} (epoch {}) in {}-{}",
                    spec.producer_id, spec.producer_epoch, tp.topic, tp.partition
                );
            }
        }
    }
    Ok(())
}

/// The abort of the transaction open in `tp` from offset `start`, with the producer and
/// epochs its leader has for it.
async fn spec_at(
    admin: &Admin,
    tp: &TopicPartition,
    start: i64,
) -> anyhow::Result<AbortTransactionSpec> {
    let producers = admin
        .describe_producers(std::slice::from_ref(tp))
        .await?
        .remove(tp)
        .unwrap_or_default();
    let Some(p) = producers
        .iter()
        .find(|p| p.current_txn_start_offset == start)
    else {
        anyhow::bail!(
            "no open transaction starts at offset {start} in {}-{}",
            tp.topic,
            tp.partition
        );
    };
    Ok(AbortTransactionSpec {
        partition: tp.clone(),
        producer_id: p.producer_id,
        producer_epoch: i16::try_from(p.producer_epoch)
            .with_context(|| format!("producer epoch {}", p.producer_epoch))?,
        coordinator_epoch: p.coordinator_epoch.max(0),
    })
}

/// The partitions `find-hanging` looks at: one, a topic's, or those with a replica on a
/// broker.
async fn partitions_to_search(
    admin: &Admin,
    topic: Option<String>,
    partition: Option<i32>,
    broker_id: Option<i32>,
) -> anyhow::Result<Vec<TopicPartition>> {
    if let (Some(topic), Some(partition)) = (&topic, partition) {
        return Ok(vec![TopicPartition::new(topic.clone(), partition)]);
    }
    let topics = match (&topic, broker_id) {
        (Some(topic), _) => admin.describe_topics(std::slice::from_ref(topic)).await?,
        (None, Some(_)) => admin.list_topics(true).await?,
        (None, None) => anyhow::bail!("find-hanging needs --topic or --broker-id"),
    };
    Ok(topics
        .iter()
        .flat_map(|t| {
            t.partitions
                .iter()
                .filter(|p| broker_id.is_none_or(|b| p.replicas.contains(&b)))
                .map(|p| TopicPartition::new(t.name.clone(), p.partition))
        })
        .collect())
}

/// The open transactions of `partitions` older than `max` (from their producer's last
/// batch) that their coordinator does not count on ending (see the module doc).
async fn find_hanging(
    admin: &Admin,
    partitions: &[TopicPartition],
    max: Duration,
) -> anyhow::Result<Vec<(TopicPartition, ProducerState)>> {
    let now_ms = now_ms();
    let max_ms = i64::try_from(max.as_millis()).unwrap_or(i64::MAX);
    let mut candidates = Vec::new();
    // Bounded requests, as Kafka's tool sends them.
    for chunk in partitions.chunks(500) {
        for (tp, producers) in admin.describe_producers(chunk).await? {
            for p in producers {
                if p.current_txn_start_offset >= 0 && now_ms - p.last_timestamp > max_ms {
                    candidates.push((tp.clone(), p));
                }
            }
        }
    }
    if candidates.is_empty() {
        return Ok(candidates);
    }
    let producer_ids: BTreeSet<i64> = candidates.iter().map(|(_, p)| p.producer_id).collect();
    let producer_ids: Vec<i64> = producer_ids.into_iter().collect();
    let listed = admin.list_transactions_filtered(&[], &producer_ids).await?;
    let transactional_ids: BTreeMap<i64, String> = listed
        .into_iter()
        .map(|t| (t.producer_id, t.transactional_id))
        .collect();
    let mut expected: BTreeMap<i64, Vec<TopicPartition>> = BTreeMap::new();
    for (producer_id, transactional_id) in &transactional_ids {
        match admin
            .describe_transactions(std::slice::from_ref(transactional_id))
            .await
        {
            Ok(described) => {
                for d in described
                    .into_iter()
                    .filter(|d| d.producer_id == *producer_id)
                {
                    expected
                        .entry(*producer_id)
                        .or_default()
                        .extend(d.partitions);
                }
            }
            // Gone since it was listed: nothing will end its transactions.
            Err(e) if e.code() == Some(rill_protocol::ErrorCode::TRANSACTIONAL_ID_NOT_FOUND) => {}
            Err(e) => return Err(e).context("describing the open transactions' ids"),
        }
    }
    Ok(candidates
        .into_iter()
        .filter(|(tp, p)| {
            !expected
                .get(&p.producer_id)
                .is_some_and(|partitions| partitions.contains(tp))
        })
        .collect())
}

fn print_producers(common: &Common, producers: &[(TopicPartition, ProducerState)]) {
    let now_ms = now_ms();
    if common.json() {
        print_json(&json!(producers
            .iter()
            .map(|(tp, p)| json!({
                "topic": tp.topic, "partition": tp.partition,
                "producer_id": p.producer_id, "producer_epoch": p.producer_epoch,
                "coordinator_epoch": p.coordinator_epoch, "last_sequence": p.last_sequence,
                "last_timestamp": p.last_timestamp,
                "current_txn_start_offset": p.current_txn_start_offset,
            }))
            .collect::<Vec<_>>()));
        return;
    }
    let rows: Vec<Vec<String>> = producers
        .iter()
        .map(|(tp, p)| {
            vec![
                tp.topic.clone(),
                tp.partition.to_string(),
                p.producer_id.to_string(),
                p.producer_epoch.to_string(),
                p.coordinator_epoch.to_string(),
                p.current_txn_start_offset.to_string(),
                p.last_timestamp.to_string(),
                ((now_ms - p.last_timestamp) / 60_000).to_string(),
            ]
        })
        .collect();
    table::print(
        &[
            "TOPIC",
            "PARTITION",
            "PRODUCER-ID",
            "EPOCH",
            "COORDINATOR-EPOCH",
            "START-OFFSET",
            "LAST-TIMESTAMP",
            "DURATION-MIN",
        ],
        &rows,
    );
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
