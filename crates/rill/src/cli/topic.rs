//! `rill topic create|list|describe|delete|alter`.

use clap::Subcommand;
use rill_client::{Admin, AlterConfigOp, ConfigResource, NewPartitions, NewTopic};
use serde_json::json;

use super::{parse_kv, print_json, table, Common};

#[derive(Subcommand, Debug)]
pub enum TopicCommand {
    /// Create a topic.
    Create {
        topic: String,
        /// Partition count (the broker's num.partitions when left out).
        #[arg(long, short = 'p')]
        partitions: Option<i32>,
        /// Replication factor (the broker's default when left out).
        #[arg(long, short = 'r')]
        replication_factor: Option<i16>,
        /// Topic config as key=value; repeatable.
        #[arg(long = "config", short = 'c', value_name = "KEY=VALUE")]
        configs: Vec<String>,
        /// Succeed when the topic exists already.
        #[arg(long)]
        if_not_exists: bool,
    },
    /// List topics.
    List {
        /// Include internal topics (__consumer_offsets).
        #[arg(long)]
        internal: bool,
    },
    /// Partitions, leaders, replicas and configs of topics.
    Describe {
        #[arg(required = true)]
        topics: Vec<String>,
    },
    /// Delete topics.
    Delete {
        #[arg(required = true)]
        topics: Vec<String>,
    },
    /// Add partitions or change configs.
    Alter {
        topic: String,
        /// New (larger) partition count.
        #[arg(long, short = 'p')]
        partitions: Option<i32>,
        /// Config to set as key=value; repeatable.
        #[arg(long = "config", short = 'c', value_name = "KEY=VALUE")]
        configs: Vec<String>,
        /// Config to reset to its default; repeatable.
        #[arg(long = "delete-config", value_name = "KEY")]
        delete_configs: Vec<String>,
    },
}

pub async fn run(common: &Common, command: TopicCommand) -> anyhow::Result<()> {
    let admin = Admin::new(common.client())?;
    match command {
        TopicCommand::Create {
            topic,
            partitions,
            replication_factor,
            configs,
            if_not_exists,
        } => {
            let mut new = NewTopic::new(&topic, partitions.unwrap_or(-1))
                .replication_factor(replication_factor.unwrap_or(-1));
            for c in &configs {
                let (k, v) = parse_kv(c)?;
                new = new.config(k, v);
            }
            match admin.create_topics(&[new]).await {
                Ok(()) => {}
                Err(e)
                    if if_not_exists
                        && e.code() == Some(rill_protocol::ErrorCode::TOPIC_ALREADY_EXISTS) => {}
                Err(e) => return Err(e.into()),
            }
            if common.json() {
                print_json(&json!({ "created": topic }));
            } else {
                println!("Created topic {topic}.");
            }
        }
        TopicCommand::List { internal } => {
            let topics = admin.list_topics(internal).await?;
            if common.json() {
                print_json(&json!(topics
                    .iter()
                    .map(|t| json!({ "name": t.name, "partitions": t.partitions.len(), "internal": t.is_internal }))
                    .collect::<Vec<_>>()));
            } else {
                for t in topics {
                    println!("{}", t.name);
                }
            }
        }
        TopicCommand::Describe { topics } => {
            let described = admin.describe_topics(&topics).await?;
            let mut out = Vec::new();
            for t in &described {
                let configs = admin
                    .describe_configs(&ConfigResource::topic(&t.name))
                    .await
                    .unwrap_or_default();
                let overrides: Vec<_> = configs.iter().filter(|c| !c.is_default).collect();
                if common.json() {
                    out.push(json!({
                        "name": t.name,
                        "topic_id": t.topic_id.to_string(),
                        "internal": t.is_internal,
                        "partitions": t.partitions.iter().map(|p| json!({
                            "partition": p.partition, "leader": p.leader, "leader_epoch": p.leader_epoch,
                            "replicas": p.replicas, "isr": p.isr,
                        })).collect::<Vec<_>>(),
                        "configs": overrides.iter().map(|c| (c.name.clone(), json!(c.value))).collect::<serde_json::Map<_, _>>(),
                    }));
                } else {
                    let rf = t.partitions.first().map_or(0, |p| p.replicas.len());
                    println!(
                        "Topic: {}  TopicId: {}  PartitionCount: {}  ReplicationFactor: {}",
                        t.name,
                        t.topic_id,
                        t.partitions.len(),
                        rf
                    );
                    if !overrides.is_empty() {
                        let list: Vec<String> = overrides
                            .iter()
                            .map(|c| format!("{}={}", c.name, c.value.as_deref().unwrap_or("")))
                            .collect();
                        println!("Configs: {}", list.join(","));
                    }
                    let rows: Vec<Vec<String>> = t
                        .partitions
                        .iter()
                        .map(|p| {
                            vec![
                                p.partition.to_string(),
                                p.leader.to_string(),
                                join(&p.replicas),
                                join(&p.isr),
                            ]
                        })
                        .collect();
                    table::print(&["PARTITION", "LEADER", "REPLICAS", "ISR"], &rows);
                }
            }
            if common.json() {
                print_json(&json!(out));
            }
        }
        TopicCommand::Delete { topics } => {
            admin.delete_topics(&topics).await?;
            if common.json() {
                print_json(&json!({ "deleted": topics }));
            } else {
                for t in topics {
                    println!("Deleted topic {t}.");
                }
            }
        }
        TopicCommand::Alter {
            topic,
            partitions,
            configs,
            delete_configs,
        } => {
            if partitions.is_none() && configs.is_empty() && delete_configs.is_empty() {
                anyhow::bail!("nothing to alter: give --partitions, --config or --delete-config");
            }
            if let Some(n) = partitions {
                admin
                    .create_partitions(&[NewPartitions {
                        topic: topic.clone(),
                        total_count: n,
                    }])
                    .await?;
            }
            let mut ops = Vec::new();
            for c in &configs {
                let (k, v) = parse_kv(c)?;
                ops.push(AlterConfigOp::Set(k, v));
            }
            for k in delete_configs {
                ops.push(AlterConfigOp::Delete(k));
            }
            if !ops.is_empty() {
                admin
                    .alter_configs(&ConfigResource::topic(&topic), &ops)
                    .await?;
            }
            if common.json() {
                print_json(&json!({ "altered": topic }));
            } else {
                println!("Altered topic {topic}.");
            }
        }
    }
    Ok(())
}

fn join(ids: &[i32]) -> String {
    ids.iter().map(i32::to_string).collect::<Vec<_>>().join(",")
}
