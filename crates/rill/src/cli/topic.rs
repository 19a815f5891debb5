//! `rill topic create|list|describe|delete|alter|reassign|reassignments`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Context;
use clap::Subcommand;
use rill_client::{Admin, AlterConfigOp, ConfigResource, NewPartitions, NewTopic, TopicPartition};
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
    /// Move partitions to other brokers, or cancel such a move.
    ///
    /// Either one partition: `rill topic reassign orders --partition 0 --replicas 2,3,1`
    /// (the first replica is the preferred leader), or a plan file in the format of
    /// kafka-reassign-partitions.sh:
    /// `{"version":1,"partitions":[{"topic":"orders","partition":0,"replicas":[2,3,1]}]}`.
    /// The command returns once the controller has accepted the move; the new replicas
    /// then copy the log and the old ones leave when every new one is in sync. `rill
    /// topic reassignments` shows what is still moving. With --cancel, the partitions
    /// (of --partition or of the plan) go back to their replicas before the move.
    /// Exits non-zero when a partition was refused.
    Reassign {
        /// The topic (leave out with --plan).
        #[arg(required_unless_present = "plan", conflicts_with = "plan")]
        topic: Option<String>,
        /// The partition to move.
        #[arg(long, short = 'p', requires = "topic")]
        partition: Option<i32>,
        /// The target brokers, comma-separated, preferred leader first.
        #[arg(long, value_delimiter = ',', value_name = "ID,ID,...")]
        replicas: Vec<i32>,
        /// A JSON plan file (kafka-reassign-partitions.sh format), `-` for stdin.
        #[arg(long, value_name = "FILE")]
        plan: Option<PathBuf>,
        /// Cancel the reassignments in progress of these partitions instead.
        #[arg(long, conflicts_with = "replicas")]
        cancel: bool,
    },
    /// List the partition reassignments in progress (of one topic, or of all).
    Reassignments {
        /// Only this topic's partitions.
        topic: Option<String>,
    },
}

/// Reads a kafka-reassign-partitions.sh plan: `{"version":1,"partitions":[{"topic":
/// "t","partition":0,"replicas":[1,2]}, ...]}` (other fields, such as `log_dirs`, are
/// ignored).
fn parse_plan(text: &str) -> anyhow::Result<Vec<(TopicPartition, Vec<i32>)>> {
    let plan: serde_json::Value = serde_json::from_str(text).context("plan is not JSON")?;
    if let Some(v) = plan.get("version") {
        anyhow::ensure!(v.as_i64() == Some(1), "unsupported plan version {v}");
    }
    let entries = plan
        .get("partitions")
        .and_then(|p| p.as_array())
        .context("plan has no \"partitions\" array")?;
    let mut out = Vec::with_capacity(entries.len());
    for (i, e) in entries.iter().enumerate() {
        let topic = e
            .get("topic")
            .and_then(|t| t.as_str())
            .with_context(|| format!("partitions[{i}] has no \"topic\" string"))?;
        let partition = e
            .get("partition")
            .and_then(serde_json::Value::as_i64)
            .and_then(|p| i32::try_from(p).ok())
            .with_context(|| format!("partitions[{i}] has no \"partition\" number"))?;
        let replicas = match e.get("replicas") {
            None | Some(serde_json::Value::Null) => Vec::new(),
            Some(r) => r
                .as_array()
                .with_context(|| format!("partitions[{i}].replicas is not an array"))?
                .iter()
                .map(|b| b.as_i64().and_then(|b| i32::try_from(b).ok()))
                .collect::<Option<Vec<i32>>>()
                .with_context(|| format!("partitions[{i}].replicas holds a non-id"))?,
        };
        out.push((TopicPartition::new(topic, partition), replicas));
    }
    Ok(out)
}

fn read_plan(path: &PathBuf) -> anyhow::Result<String> {
    if path.as_os_str() == "-" {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
            .context("reading the plan from stdin")?;
        Ok(text)
    } else {
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
    }
}

async fn reassign(
    common: &Common,
    admin: &Admin,
    topic: Option<String>,
    partition: Option<i32>,
    replicas: Vec<i32>,
    plan: Option<PathBuf>,
    cancel: bool,
) -> anyhow::Result<()> {
    let moves: Vec<(TopicPartition, Vec<i32>)> = match (plan, topic) {
        (Some(path), _) => parse_plan(&read_plan(&path)?)?,
        (None, Some(topic)) => {
            let partition = partition.context("give --partition (or a --plan file)")?;
            vec![(TopicPartition::new(topic, partition), replicas)]
        }
        (None, None) => anyhow::bail!("give a topic with --partition, or --plan"),
    };
    anyhow::ensure!(!moves.is_empty(), "the plan names no partition");
    let mut request: BTreeMap<TopicPartition, Option<Vec<i32>>> = BTreeMap::new();
    for (tp, replicas) in moves {
        if !cancel && replicas.is_empty() {
            anyhow::bail!("no target replicas for {tp}: give --replicas (or --cancel)");
        }
        let target = (!cancel).then_some(replicas);
        if request.insert(tp.clone(), target).is_some() {
            anyhow::bail!("{tp} appears twice");
        }
    }
    let results = admin.alter_partition_reassignments(&request).await?;
    let failed = results.values().any(Result::is_err);
    if common.json() {
        print_json(&json!({
            "partitions": results.iter().map(|(tp, r)| json!({
                "topic": tp.topic,
                "partition": tp.partition,
                "replicas": request.get(tp).cloned().flatten(),
                "error": match r { Ok(()) => "NONE", Err(e) => e.code().map_or("ERROR", |c| c.name()) },
                "message": r.as_ref().err().map(ToString::to_string),
            })).collect::<Vec<_>>(),
        }));
    } else {
        for (tp, r) in &results {
            match (r, request.get(tp).cloned().flatten()) {
                (Ok(()), Some(replicas)) => {
                    println!("Reassigning {tp} to replicas {}.", join(&replicas))
                }
                (Ok(()), None) => println!("Cancelled the reassignment of {tp}."),
                (Err(e), _) => println!("{e}"),
            }
        }
    }
    if failed {
        anyhow::bail!("the controller refused some of the partitions");
    }
    Ok(())
}

async fn list_reassignments(
    common: &Common,
    admin: &Admin,
    topic: Option<String>,
) -> anyhow::Result<()> {
    let partitions = match &topic {
        Some(t) => Some(admin.partitions_of(t).await?),
        None => None,
    };
    let listed = admin
        .list_partition_reassignments(partitions.as_deref())
        .await?;
    if common.json() {
        print_json(&json!(listed
            .iter()
            .map(|(tp, r)| json!({
                "topic": tp.topic, "partition": tp.partition, "replicas": r.replicas,
                "adding_replicas": r.adding_replicas, "removing_replicas": r.removing_replicas,
                "target_replicas": r.target_replicas(),
            }))
            .collect::<Vec<_>>()));
    } else if listed.is_empty() {
        println!("No partition reassignments in progress.");
    } else {
        let rows: Vec<Vec<String>> = listed
            .iter()
            .map(|(tp, r)| {
                vec![
                    tp.topic.clone(),
                    tp.partition.to_string(),
                    join(&r.replicas),
                    join(&r.adding_replicas),
                    join(&r.removing_replicas),
                ]
            })
            .collect();
        table::print(
            &["TOPIC", "PARTITION", "REPLICAS", "ADDING", "REMOVING"],
            &rows,
        );
    }
    Ok(())
}

pub async fn run(common: &Common, command: TopicCommand) -> anyhow::Result<()> {
    let admin = Admin::new(common.client()?)?;
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
        TopicCommand::Reassign {
            topic,
            partition,
            replicas,
            plan,
            cancel,
        } => reassign(common, &admin, topic, partition, replicas, plan, cancel).await?,
        TopicCommand::Reassignments { topic } => list_reassignments(common, &admin, topic).await?,
    }
    Ok(())
}

fn join(ids: &[i32]) -> String {
    ids.iter().map(i32::to_string).collect::<Vec<_>>().join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_in_kafka_reassign_partitions_format_parse() {
        let plan = parse_plan(
            r#"{"version":1,"partitions":[
                {"topic":"a","partition":0,"replicas":[2,3],"log_dirs":["any","any"]},
                {"topic":"b","partition":4,"replicas":[1]}]}"#,
        )
        .unwrap();
        assert_eq!(
            plan,
            [
                (TopicPartition::new("a", 0), vec![2, 3]),
                (TopicPartition::new("b", 4), vec![1]),
            ]
        );
    }

    #[test]
    fn bad_plans_say_what_is_wrong() {
        let err = parse_plan(r#"{"version":1,"partitions":[{"topic":"a"}]}"#).unwrap_err();
        assert!(err.to_string().contains("partitions[0]"), "{err}");
        assert!(parse_plan(r#"{"version":2,"partitions":[]}"#).is_err());
        assert!(parse_plan("not json").is_err());
        let err = parse_plan(r#"{"partitions":[{"topic":"a","partition":0,"replicas":["x"]}]}"#)
            .unwrap_err();
        assert!(err.to_string().contains("non-id"), "{err}");
    }
}
