//! `rill cluster describe|elect-leaders|unregister`: cluster id, controller, brokers and
//! the partitions in trouble; preferred and unclean leader elections; removing a broker
//! that is gone for good.

use clap::Subcommand;
use rill_client::{Admin, ElectionType, TopicMetadata, TopicPartition};
use rill_protocol::ErrorCode;
use serde_json::json;

use super::{print_json, table, Common};

#[derive(Subcommand, Debug)]
pub enum ClusterCommand {
    /// Cluster id, controller and brokers, then the under-replicated partitions (ISR
    /// smaller than the replicas) and the offline ones (no leader).
    Describe,
    /// Elect partition leaders (like kafka-leader-election.sh).
    ///
    /// `preferred` moves leadership back to each partition's first replica when it is
    /// alive and in sync; `unclean` gives a partition that has no leader one chosen among
    /// its live replicas outside the ISR, which may lose acknowledged records. Without
    /// --topic, every partition of the cluster; with --topic and no --partition, every
    /// partition of that topic. Exits non-zero when an election failed (a partition that
    /// needed none is not a failure).
    #[command(name = "elect-leaders")]
    ElectLeaders {
        /// Which leader to elect.
        #[arg(
            long = "type",
            value_name = "preferred|unclean",
            default_value = "preferred"
        )]
        election_type: ElectionType,
        /// Only the partitions of this topic.
        #[arg(long)]
        topic: Option<String>,
        /// Only these partitions of --topic; repeatable.
        #[arg(long, requires = "topic")]
        partition: Vec<i32>,
    },
    /// Remove a broker that is gone for good from the cluster (like `kafka-cluster.sh
    /// unregister`): it leaves every ISR and the controller forgets it. Its replicas stay
    /// in the partitions' replica lists until reassigned. A broker still running
    /// registers again.
    Unregister {
        /// The broker's node id.
        #[arg(long = "broker-id")]
        broker_id: i32,
    },
}

/// A partition that is not fully healthy, as `cluster describe` lists it.
struct Troubled<'a> {
    topic: &'a str,
    partition: &'a rill_client::PartitionMetadata,
}

impl Troubled<'_> {
    fn json(&self) -> serde_json::Value {
        json!({
            "topic": self.topic, "partition": self.partition.partition,
            "leader": self.partition.leader, "replicas": self.partition.replicas,
            "isr": self.partition.isr,
        })
    }

    fn row(&self) -> Vec<String> {
        vec![
            self.topic.to_string(),
            self.partition.partition.to_string(),
            self.partition.leader.to_string(),
            join(&self.partition.replicas),
            join(&self.partition.isr),
        ]
    }
}

/// The under-replicated partitions (ISR smaller than the replica set) and the offline
/// ones (no leader) among `topics`; an offline partition is listed only as offline.
fn troubled(topics: &[TopicMetadata]) -> (Vec<Troubled<'_>>, Vec<Troubled<'_>>) {
    let mut under = Vec::new();
    let mut offline = Vec::new();
    for t in topics {
        for p in &t.partitions {
            let entry = Troubled {
                topic: &t.name,
                partition: p,
            };
            if p.leader < 0 {
                offline.push(entry);
            } else if p.isr.len() < p.replicas.len() {
                under.push(entry);
            }
        }
    }
    (under, offline)
}

pub async fn run(common: &Common, command: ClusterCommand) -> anyhow::Result<()> {
    let admin = Admin::new(common.client()?)?;
    match command {
        ClusterCommand::Describe => describe(common, &admin).await,
        ClusterCommand::ElectLeaders {
            election_type,
            topic,
            partition,
        } => elect_leaders(common, &admin, election_type, topic, partition).await,
        ClusterCommand::Unregister { broker_id } => {
            admin.unregister_broker(broker_id).await?;
            if common.json() {
                print_json(&json!({ "unregistered": broker_id }));
            } else {
                println!("Unregistered broker {broker_id}.");
            }
            Ok(())
        }
    }
}

async fn describe(common: &Common, admin: &Admin) -> anyhow::Result<()> {
    let cluster = admin.describe_cluster().await?;
    let topics = admin.list_topics(true).await?;
    let (under, offline) = troubled(&topics);
    if common.json() {
        print_json(&json!({
            "cluster_id": cluster.cluster_id,
            "controller_id": cluster.controller_id,
            "brokers": cluster.brokers.values().map(|b| json!({
                "id": b.node_id, "host": b.host, "port": b.port, "rack": b.rack,
            })).collect::<Vec<_>>(),
            "under_replicated_partitions": under.iter().map(Troubled::json).collect::<Vec<_>>(),
            "offline_partitions": offline.iter().map(Troubled::json).collect::<Vec<_>>(),
        }));
        return Ok(());
    }
    println!(
        "Cluster id: {}",
        cluster.cluster_id.as_deref().unwrap_or("-")
    );
    println!("Controller: {}", cluster.controller_id);
    let rows: Vec<Vec<String>> = cluster
        .brokers
        .values()
        .map(|b| {
            vec![
                b.node_id.to_string(),
                b.host.clone(),
                b.port.to_string(),
                b.rack.clone().unwrap_or_else(|| "-".into()),
                if b.node_id == cluster.controller_id {
                    "yes".into()
                } else {
                    String::new()
                },
            ]
        })
        .collect();
    table::print(&["ID", "HOST", "PORT", "RACK", "CONTROLLER"], &rows);
    let header = ["TOPIC", "PARTITION", "LEADER", "REPLICAS", "ISR"];
    for (what, list) in [
        ("Under-replicated partitions", &under),
        ("Offline partitions", &offline),
    ] {
        println!();
        println!("{what}: {}", list.len());
        if !list.is_empty() {
            let rows: Vec<Vec<String>> = list.iter().map(Troubled::row).collect();
            table::print(&header, &rows);
        }
    }
    Ok(())
}

async fn elect_leaders(
    common: &Common,
    admin: &Admin,
    election_type: ElectionType,
    topic: Option<String>,
    partitions: Vec<i32>,
) -> anyhow::Result<()> {
    let asked: Option<Vec<TopicPartition>> = match topic {
        None => None,
        Some(t) if partitions.is_empty() => Some(admin.partitions_of(&t).await?),
        Some(t) => Some(
            partitions
                .iter()
                .map(|p| TopicPartition::new(t.clone(), *p))
                .collect(),
        ),
    };
    let results = admin.elect_leaders(election_type, asked.as_deref()).await?;
    let outcome = |r: &rill_client::Result<()>| -> (&'static str, Option<String>) {
        match r {
            Ok(()) => ("NONE", None),
            Err(e) => (
                e.code().map_or("ERROR", ErrorCode::name),
                Some(e.to_string()),
            ),
        }
    };
    let failed = results.values().any(|r| {
        r.as_ref()
            .is_err_and(|e| e.code() != Some(ErrorCode::ELECTION_NOT_NEEDED))
    });
    if common.json() {
        print_json(&json!({
            "election_type": election_type.to_string(),
            "partitions": results.iter().map(|(tp, r)| {
                let (code, message) = outcome(r);
                json!({
                    "topic": tp.topic, "partition": tp.partition,
                    "error": code, "message": message,
                })
            }).collect::<Vec<_>>(),
        }));
    } else if results.is_empty() {
        println!("No partition needed a {election_type} leader election.");
    } else {
        let rows: Vec<Vec<String>> = results
            .iter()
            .map(|(tp, r)| {
                let (code, _) = outcome(r);
                let result = match code {
                    "NONE" => "elected".to_string(),
                    "ELECTION_NOT_NEEDED" => "not needed".to_string(),
                    other => other.to_string(),
                };
                vec![tp.topic.clone(), tp.partition.to_string(), result]
            })
            .collect();
        table::print(&["TOPIC", "PARTITION", "RESULT"], &rows);
    }
    if failed {
        anyhow::bail!("{election_type} leader election failed for some partitions");
    }
    Ok(())
}

fn join(ids: &[i32]) -> String {
    ids.iter().map(i32::to_string).collect::<Vec<_>>().join(",")
}

#[cfg(test)]
mod tests {
    use rill_client::PartitionMetadata;
    use rill_protocol::ErrorCode;

    use super::*;

    fn partition(partition: i32, leader: i32, replicas: &[i32], isr: &[i32]) -> PartitionMetadata {
        PartitionMetadata {
            partition,
            leader,
            leader_epoch: 0,
            replicas: replicas.to_vec(),
            isr: isr.to_vec(),
            offline_replicas: Vec::new(),
            error: ErrorCode::NONE,
        }
    }

    #[test]
    fn troubled_partitions_are_told_apart() {
        let topic = TopicMetadata {
            name: "t".into(),
            topic_id: rill_protocol::Uuid::default(),
            is_internal: false,
            error: ErrorCode::NONE,
            partitions: vec![
                partition(0, 1, &[1, 2, 3], &[1, 2, 3]),
                partition(1, 2, &[2, 3, 1], &[2, 3]),
                partition(2, -1, &[3, 1, 2], &[3]),
            ],
        };
        let topics = [topic];
        let (under, offline) = troubled(&topics);
        assert_eq!(under.len(), 1);
        assert_eq!(under[0].partition.partition, 1);
        assert_eq!(offline.len(), 1);
        assert_eq!(offline[0].partition.partition, 2);
    }
}
