//! `rill group list|describe|delete|reset-offsets`.
//!
//! `describe` joins three answers the way `kafka-consumer-groups.sh --describe` does:
//! the group's members and their assignments — ConsumerGroupDescribe for a consumer group
//! of KIP-848's protocol (with its epochs, the assignor and each member's target), else
//! DescribeGroups —, OffsetFetch (committed offsets) and ListOffsets (log end offsets);
//! lag is end minus committed, and a partition without a committed offset shows `-` for
//! both. A share group (KIP-932) is described as `kafka-share-groups.sh --describe
//! --members` shows it, from ShareGroupDescribe: epochs, the assignor, and each member's
//! partitions (a partition may be in several members'); it commits no offsets.

use std::collections::{BTreeMap, BTreeSet};

use clap::Subcommand;
use rill_client::{
    Admin, ConsumerGroupDescription, GroupDescription, MemberDescription, OffsetSpec,
    ShareGroupDescription, ShareGroupOffset, TopicPartition,
};
use serde_json::json;

use super::{print_json, table, Common};

#[derive(Subcommand, Debug)]
pub enum GroupCommand {
    /// List groups.
    List,
    /// Members, assignment, committed offset, end offset and lag per partition.
    Describe {
        #[arg(required = true)]
        groups: Vec<String>,
    },
    /// Delete groups (they must have no members).
    Delete {
        #[arg(required = true)]
        groups: Vec<String>,
    },
    /// Move a group's committed offsets (the group must have no members).
    ResetOffsets {
        group: String,
        /// Topic whose partitions to reset (every partition with a committed offset
        /// when left out).
        #[arg(long, short = 't')]
        topic: Option<String>,
        /// Reset to the earliest offset.
        #[arg(long, conflicts_with_all = ["to_latest", "to_offset", "shift_by"])]
        to_earliest: bool,
        /// Reset to the log end offset.
        #[arg(long, conflicts_with_all = ["to_offset", "shift_by"])]
        to_latest: bool,
        /// Reset to this offset.
        #[arg(long, conflicts_with = "shift_by")]
        to_offset: Option<i64>,
        /// Move the committed offset by this many (negative goes back).
        #[arg(long, allow_hyphen_values = true)]
        shift_by: Option<i64>,
        /// Print what would change without committing.
        #[arg(long)]
        dry_run: bool,
    },
}

pub async fn run(common: &Common, command: GroupCommand) -> anyhow::Result<()> {
    let admin = Admin::new(common.client()?)?;
    match command {
        GroupCommand::List => {
            let groups = admin.list_groups().await?;
            if common.json() {
                print_json(&json!(groups
                    .iter()
                    .map(|g| json!({
                        "group": g.group_id, "state": g.state, "type": g.group_type,
                        "protocol_type": g.protocol_type, "coordinator": g.coordinator,
                    }))
                    .collect::<Vec<_>>()));
            } else {
                let rows: Vec<Vec<String>> = groups
                    .iter()
                    .map(|g| {
                        vec![
                            g.group_id.clone(),
                            g.state.clone(),
                            or_dash(&g.group_type).to_owned(),
                            g.protocol_type.clone(),
                            g.coordinator.to_string(),
                        ]
                    })
                    .collect();
                table::print(
                    &["GROUP", "STATE", "TYPE", "PROTOCOL-TYPE", "COORDINATOR"],
                    &rows,
                );
            }
        }
        GroupCommand::Describe { groups } => {
            let mut json_out = Vec::new();
            for (i, group) in groups.iter().enumerate() {
                if let Some(cg) = admin.describe_consumer_group(group).await? {
                    let rows = lag_rows(&admin, group, &as_classic(&cg)).await?;
                    if common.json() {
                        json_out.push(consumer_group_json(&cg, &rows));
                    } else {
                        if i > 0 {
                            println!();
                        }
                        print_consumer_group(&cg, &rows);
                    }
                    continue;
                }
                if let Some(sg) = admin.describe_share_group(group).await? {
                    let offsets = admin.describe_share_group_offsets(group).await?;
                    if common.json() {
                        json_out.push(share_group_json(&sg, &offsets));
                    } else {
                        if i > 0 {
                            println!();
                        }
                        print_share_group(&sg, &offsets);
                    }
                    continue;
                }
                let description = admin
                    .describe_groups(std::slice::from_ref(group))
                    .await?
                    .into_iter()
                    .next()
                    .ok_or_else(|| anyhow::anyhow!("group {group} was not described"))?;
                let rows = lag_rows(&admin, group, &description).await?;
                if common.json() {
                    json_out.push(json!({
                        "group": group,
                        "type": "classic",
                        "state": description.state,
                        "protocol": description.protocol,
                        "coordinator": description.coordinator.node_id,
                        "members": description.members.iter().map(|m| json!({
                            "member_id": m.member_id, "group_instance_id": m.group_instance_id,
                            "client_id": m.client_id, "host": m.client_host,
                            "assignment": m.assignment.iter().map(ToString::to_string).collect::<Vec<_>>(),
                        })).collect::<Vec<_>>(),
                        "partitions": rows.iter().map(|r| json!({
                            "topic": r.tp.topic, "partition": r.tp.partition,
                            "committed": r.committed, "end": r.end, "lag": r.lag(),
                            "member_id": r.member,
                        })).collect::<Vec<_>>(),
                    }));
                } else {
                    if i > 0 {
                        println!();
                    }
                    println!(
                        "Group: {group}  State: {}  Assignor: {}  Members: {}  Coordinator: {}",
                        or_dash(&description.state),
                        or_dash(&description.protocol),
                        description.members.len(),
                        description.coordinator.node_id
                    );
                    let table_rows: Vec<Vec<String>> = rows
                        .iter()
                        .map(|r| {
                            vec![
                                r.tp.topic.clone(),
                                r.tp.partition.to_string(),
                                r.committed.map_or_else(|| "-".into(), |o| o.to_string()),
                                r.end.map_or_else(|| "-".into(), |o| o.to_string()),
                                r.lag().map_or_else(|| "-".into(), |o| o.to_string()),
                                r.member.clone().unwrap_or_else(|| "-".into()),
                                r.client_id.clone().unwrap_or_else(|| "-".into()),
                            ]
                        })
                        .collect();
                    table::print(
                        &[
                            "TOPIC",
                            "PARTITION",
                            "CURRENT-OFFSET",
                            "LOG-END-OFFSET",
                            "LAG",
                            "MEMBER-ID",
                            "CLIENT-ID",
                        ],
                        &table_rows,
                    );
                }
            }
            if common.json() {
                print_json(&json!(json_out));
            }
        }
        GroupCommand::Delete { groups } => {
            admin.delete_groups(&groups).await?;
            if common.json() {
                print_json(&json!({ "deleted": groups }));
            } else {
                for g in groups {
                    println!("Deleted group {g}.");
                }
            }
        }
        GroupCommand::ResetOffsets {
            group,
            topic,
            to_earliest,
            to_latest,
            to_offset,
            shift_by,
            dry_run,
        } => {
            let committed = admin.list_group_offsets(&group, None).await?;
            let partitions: Vec<TopicPartition> = match &topic {
                Some(t) => admin.partitions_of(t).await?,
                None => committed.keys().cloned().collect(),
            };
            if partitions.is_empty() {
                anyhow::bail!("group {group} has no committed offsets; name a --topic");
            }
            let earliest = admin
                .list_offsets(&partitions, OffsetSpec::Earliest)
                .await?;
            let latest = admin.list_offsets(&partitions, OffsetSpec::Latest).await?;
            let mut target = BTreeMap::new();
            for tp in &partitions {
                let lo = earliest.get(tp).copied().unwrap_or(0);
                let hi = latest.get(tp).copied().unwrap_or(lo);
                let wanted = if to_earliest {
                    lo
                } else if to_latest {
                    hi
                } else if let Some(o) = to_offset {
                    o
                } else if let Some(by) = shift_by {
                    committed.get(tp).copied().unwrap_or(lo).saturating_add(by)
                } else {
                    anyhow::bail!(
                        "say where to: --to-earliest, --to-latest, --to-offset N or --shift-by N"
                    );
                };
                // Kafka's tool clamps into the log as well: an offset outside it would
                // only be reset again by the consumer's auto.offset.reset.
                target.insert(tp.clone(), wanted.clamp(lo, hi));
            }
            if !dry_run {
                admin.alter_group_offsets(&group, &target).await?;
            }
            if common.json() {
                print_json(&json!({
                    "group": group,
                    "dry_run": dry_run,
                    "offsets": target.iter().map(|(tp, o)| json!({
                        "topic": tp.topic, "partition": tp.partition, "offset": o,
                    })).collect::<Vec<_>>(),
                }));
            } else {
                let rows: Vec<Vec<String>> = target
                    .iter()
                    .map(|(tp, o)| vec![tp.topic.clone(), tp.partition.to_string(), o.to_string()])
                    .collect();
                table::print(&["TOPIC", "PARTITION", "NEW-OFFSET"], &rows);
            }
        }
    }
    Ok(())
}

/// A consumer group's members in DescribeGroups' shape, for the lag rows.
fn as_classic(cg: &ConsumerGroupDescription) -> GroupDescription {
    GroupDescription {
        group_id: cg.group_id.clone(),
        state: cg.state.clone(),
        protocol_type: "consumer".into(),
        protocol: cg.assignor.clone(),
        members: cg
            .members
            .iter()
            .map(|m| MemberDescription {
                member_id: m.member_id.clone(),
                group_instance_id: m.instance_id.clone(),
                client_id: m.client_id.clone(),
                client_host: m.client_host.clone(),
                subscribed_topics: m.subscribed_topic_names.clone(),
                assignment: m.assignment.clone(),
            })
            .collect(),
        coordinator: cg.coordinator.clone(),
    }
}

/// Partitions by topic, as `[{topic, partitions}]`.
fn by_topic(list: &[TopicPartition]) -> serde_json::Value {
    let mut topics: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
    for tp in list {
        topics.entry(&tp.topic).or_default().push(tp.partition);
    }
    json!(topics
        .into_iter()
        .map(|(topic, partitions)| json!({ "topic": topic, "partitions": partitions }))
        .collect::<Vec<_>>())
}

/// `topic:0,1,2 other:3` for a table cell.
fn compact(list: &[TopicPartition]) -> String {
    let mut topics: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for tp in list {
        topics
            .entry(&tp.topic)
            .or_default()
            .push(tp.partition.to_string());
    }
    if topics.is_empty() {
        return "-".into();
    }
    topics
        .into_iter()
        .map(|(t, ps)| format!("{t}:{}", ps.join(",")))
        .collect::<Vec<_>>()
        .join(" ")
}

fn consumer_group_json(cg: &ConsumerGroupDescription, rows: &[LagRow]) -> serde_json::Value {
    json!({
        "group": cg.group_id,
        "type": "consumer",
        "protocol_type": "consumer",
        "state": cg.state,
        "assignor": cg.assignor,
        "group_epoch": cg.group_epoch,
        "assignment_epoch": cg.assignment_epoch,
        "coordinator": cg.coordinator.node_id,
        "members": cg.members.iter().map(|m| json!({
            "member_id": m.member_id, "group_instance_id": m.instance_id,
            "member_epoch": m.member_epoch, "client_id": m.client_id, "host": m.client_host,
            "subscribed_topics": m.subscribed_topic_names,
            "subscribed_topic_regex": m.subscribed_topic_regex,
            "assignment": by_topic(&m.assignment),
            "target_assignment": by_topic(&m.target_assignment),
        })).collect::<Vec<_>>(),
        "partitions": rows.iter().map(|r| json!({
            "topic": r.tp.topic, "partition": r.tp.partition,
            "committed": r.committed, "end": r.end, "lag": r.lag(),
            "member_id": r.member,
        })).collect::<Vec<_>>(),
    })
}

fn print_consumer_group(cg: &ConsumerGroupDescription, rows: &[LagRow]) {
    println!(
        "Group: {}  Type: consumer  State: {}  Assignor: {}  Group epoch: {}  Assignment epoch: {}  Members: {}  Coordinator: {}",
        cg.group_id,
        or_dash(&cg.state),
        or_dash(&cg.assignor),
        cg.group_epoch,
        cg.assignment_epoch,
        cg.members.len(),
        cg.coordinator.node_id
    );
    let members: Vec<Vec<String>> = cg
        .members
        .iter()
        .map(|m| {
            vec![
                m.member_id.clone(),
                m.instance_id.clone().unwrap_or_else(|| "-".into()),
                m.member_epoch.to_string(),
                m.client_id.clone(),
                compact(&m.assignment),
                compact(&m.target_assignment),
            ]
        })
        .collect();
    table::print(
        &[
            "MEMBER-ID",
            "INSTANCE-ID",
            "EPOCH",
            "CLIENT-ID",
            "ASSIGNMENT",
            "TARGET-ASSIGNMENT",
        ],
        &members,
    );
    println!();
    let table_rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.tp.topic.clone(),
                r.tp.partition.to_string(),
                r.committed.map_or_else(|| "-".into(), |o| o.to_string()),
                r.end.map_or_else(|| "-".into(), |o| o.to_string()),
                r.lag().map_or_else(|| "-".into(), |o| o.to_string()),
                r.member.clone().unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    table::print(
        &[
            "TOPIC",
            "PARTITION",
            "CURRENT-OFFSET",
            "LOG-END-OFFSET",
            "LAG",
            "MEMBER-ID",
        ],
        &table_rows,
    );
}

fn share_group_json(sg: &ShareGroupDescription, offsets: &[ShareGroupOffset]) -> serde_json::Value {
    json!({
        "group": sg.group_id,
        "type": "share",
        "protocol_type": "share",
        "state": sg.state,
        "assignor": sg.assignor,
        "group_epoch": sg.group_epoch,
        "assignment_epoch": sg.assignment_epoch,
        "coordinator": sg.coordinator.node_id,
        "members": sg.members.iter().map(|m| json!({
            "member_id": m.member_id, "rack_id": m.rack_id,
            "member_epoch": m.member_epoch, "client_id": m.client_id, "host": m.client_host,
            "subscribed_topics": m.subscribed_topic_names,
            "assignment": by_topic(&m.assignment),
        })).collect::<Vec<_>>(),
        "offsets": offsets.iter().map(|o| json!({
            "topic": o.partition.topic, "partition": o.partition.partition,
            "start_offset": o.start_offset, "lag": o.lag,
        })).collect::<Vec<_>>(),
    })
}

fn print_share_group(sg: &ShareGroupDescription, offsets: &[ShareGroupOffset]) {
    println!(
        "Group: {}  Type: share  State: {}  Assignor: {}  Group epoch: {}  Assignment epoch: {}  Members: {}  Coordinator: {}",
        sg.group_id,
        or_dash(&sg.state),
        or_dash(&sg.assignor),
        sg.group_epoch,
        sg.assignment_epoch,
        sg.members.len(),
        sg.coordinator.node_id
    );
    let members: Vec<Vec<String>> = sg
        .members
        .iter()
        .map(|m| {
            vec![
                m.member_id.clone(),
                m.member_epoch.to_string(),
                m.client_id.clone(),
                m.client_host.clone(),
                m.subscribed_topic_names.join(","),
                compact(&m.assignment),
            ]
        })
        .collect();
    table::print(
        &[
            "MEMBER-ID",
            "EPOCH",
            "CLIENT-ID",
            "HOST",
            "SUBSCRIBED",
            "ASSIGNMENT",
        ],
        &members,
    );
    if offsets.is_empty() {
        return;
    }
    println!();
    let rows: Vec<Vec<String>> = offsets
        .iter()
        .map(|o| {
            let known = |v: i64| if v < 0 { "-".to_owned() } else { v.to_string() };
            vec![
                o.partition.topic.clone(),
                o.partition.partition.to_string(),
                known(o.start_offset),
                known(o.lag),
            ]
        })
        .collect();
    table::print(&["TOPIC", "PARTITION", "START-OFFSET", "LAG"], &rows);
}

fn or_dash(s: &str) -> &str {
    if s.is_empty() {
        "-"
    } else {
        s
    }
}

struct LagRow {
    tp: TopicPartition,
    committed: Option<i64>,
    end: Option<i64>,
    member: Option<String>,
    client_id: Option<String>,
}

impl LagRow {
    fn lag(&self) -> Option<i64> {
        Some((self.end? - self.committed?).max(0))
    }
}

/// One row per partition that is assigned to a member or has a committed offset.
async fn lag_rows(
    admin: &Admin,
    group: &str,
    description: &GroupDescription,
) -> anyhow::Result<Vec<LagRow>> {
    let committed = admin.list_group_offsets(group, None).await?;
    let mut owners: BTreeMap<TopicPartition, (String, String)> = BTreeMap::new();
    for m in &description.members {
        for tp in &m.assignment {
            owners.insert(tp.clone(), (m.member_id.clone(), m.client_id.clone()));
        }
    }
    let partitions: BTreeSet<TopicPartition> =
        committed.keys().chain(owners.keys()).cloned().collect();
    let partitions: Vec<TopicPartition> = partitions.into_iter().collect();
    // A deleted topic leaves committed offsets behind: show them without an end offset
    // instead of failing the whole description.
    let ends = match admin.list_offsets(&partitions, OffsetSpec::Latest).await {
        Ok(e) => e,
        Err(_) => {
            let mut ends = BTreeMap::new();
            for tp in &partitions {
                if let Ok(e) = admin
                    .list_offsets(std::slice::from_ref(tp), OffsetSpec::Latest)
                    .await
                {
                    ends.extend(e);
                }
            }
            ends
        }
    };
    Ok(partitions
        .into_iter()
        .map(|tp| {
            let owner = owners.get(&tp);
            LagRow {
                committed: committed.get(&tp).copied(),
                end: ends.get(&tp).copied(),
                member: owner.map(|o| o.0.clone()),
                client_id: owner.map(|o| o.1.clone()),
                tp,
            }
        })
        .collect())
}
