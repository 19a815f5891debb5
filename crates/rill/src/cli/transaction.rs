//! `rill transaction list|describe` (KIP-664, as `kafka-transactions.sh`): the transactional
//! ids every broker coordinates, and one id's state, producer and partitions as its
//! coordinator sees them. Finding and aborting hanging transactions write markers to the
//! partitions directly and wait for the partition side (issue #16).

use clap::Subcommand;
use rill_client::Admin;
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
}

pub async fn run(common: &Common, command: TransactionCommand) -> anyhow::Result<()> {
    let admin = Admin::new(common.client())?;
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
    }
    Ok(())
}
