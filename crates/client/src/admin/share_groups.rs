//! KIP-932's share groups on the admin client: ShareGroupDescribe v1 and
//! DescribeShareGroupOffsets v0-1, sent to the group's coordinator (Kafka's
//! `Admin.describeShareGroups` and `listShareGroupOffsets`).

use rill_protocol::generated::describe_share_group_offsets_request::DescribeShareGroupOffsetsRequestGroup;
use rill_protocol::generated::{
    ApiKey, DescribeShareGroupOffsetsRequest, ShareGroupDescribeRequest,
};
use rill_protocol::ErrorCode;

use super::{Admin, GroupDescription, MemberDescription};
use crate::error::{check, Error, Result};
use crate::network::BrokerMetadata;
use crate::ops;
use crate::types::TopicPartition;

const SHARE_GROUP_DESCRIBE_VERSION: i16 = 1;
/// v1 adds the lag (KIP-1226, Kafka 4.2).
const DESCRIBE_SHARE_GROUP_OFFSETS_VERSION: i16 = 1;

/// Where a share group stands in one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareGroupOffset {
    pub partition: TopicPartition,
    /// The share-partition start offset: every record below it is acknowledged or
    /// archived; -1 when the group has no state for the partition.
    pub start_offset: i64,
    /// Records not yet delivered for good; -1 when the broker does not know (v0, or no
    /// state).
    pub lag: i64,
}

/// A member of a share group as its coordinator sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareGroupMemberDescription {
    pub member_id: String,
    pub rack_id: Option<String>,
    pub member_epoch: i32,
    pub client_id: String,
    pub client_host: String,
    pub subscribed_topic_names: Vec<String>,
    /// The partitions it was given; a share group may give one partition to several
    /// members.
    pub assignment: Vec<TopicPartition>,
}

/// A share group (KIP-932) as ShareGroupDescribe shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareGroupDescription {
    pub group_id: String,
    /// `Empty`, `Stable` or `Dead`.
    pub state: String,
    pub group_epoch: i32,
    pub assignment_epoch: i32,
    /// The server-side assignor (`simple`).
    pub assignor: String,
    pub members: Vec<ShareGroupMemberDescription>,
    pub coordinator: BrokerMetadata,
}

impl From<ShareGroupDescription> for GroupDescription {
    /// A share group in DescribeGroups' shape: protocol type `share`, the assignor as the
    /// protocol, each member's partitions.
    fn from(sg: ShareGroupDescription) -> Self {
        GroupDescription {
            group_id: sg.group_id,
            state: sg.state,
            protocol_type: "share".into(),
            protocol: sg.assignor,
            members: sg
                .members
                .into_iter()
                .map(|m| MemberDescription {
                    member_id: m.member_id,
                    group_instance_id: None,
                    client_id: m.client_id,
                    client_host: m.client_host,
                    subscribed_topics: m.subscribed_topic_names,
                    assignment: m.assignment,
                })
                .collect(),
            coordinator: sg.coordinator,
        }
    }
}

impl Admin {
    /// Describes a share group; `None` when the group is not one (another type, no
    /// group, or a broker without share groups).
    ///
    /// ```no_run
    /// # async fn run(admin: rill_client::Admin) -> rill_client::Result<()> {
    /// if let Some(g) = admin.describe_share_group("workers").await? {
    ///     println!("{} at epoch {}, {} members", g.state, g.group_epoch, g.members.len());
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn describe_share_group(&self, group: &str) -> Result<Option<ShareGroupDescription>> {
        let coordinator = ops::find_coordinator(self.net(), group).await?;
        let conn = self.net().connection(&coordinator.addr()).await?;
        match conn.version(ApiKey::ShareGroupDescribe, SHARE_GROUP_DESCRIBE_VERSION) {
            Ok(_) => {}
            Err(Error::UnsupportedVersion { .. }) => return Ok(None),
            Err(e) => return Err(e),
        }
        let request = ShareGroupDescribeRequest {
            group_ids: vec![group.to_owned()],
            ..Default::default()
        };
        let response = conn.send(&request, SHARE_GROUP_DESCRIBE_VERSION).await?;
        let Some(g) = response.groups.into_iter().next() else {
            return Ok(None);
        };
        if g.error_code == ErrorCode::GROUP_ID_NOT_FOUND.code() {
            return Ok(None);
        }
        check(g.error_code, || format!("describing share group {group}"))?;
        Ok(Some(ShareGroupDescription {
            group_id: g.group_id,
            state: g.group_state,
            group_epoch: g.group_epoch,
            assignment_epoch: g.assignment_epoch,
            assignor: g.assignor_name,
            members: g
                .members
                .into_iter()
                .map(|m| {
                    let mut assignment: Vec<TopicPartition> = m
                        .assignment
                        .topic_partitions
                        .into_iter()
                        .flat_map(|t| {
                            let topic = t.topic_name;
                            t.partitions
                                .into_iter()
                                .map(move |partition| TopicPartition::new(topic.clone(), partition))
                        })
                        .collect();
                    assignment
                        .sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
                    ShareGroupMemberDescription {
                        member_id: m.member_id,
                        rack_id: m.rack_id,
                        member_epoch: m.member_epoch,
                        client_id: m.client_id,
                        client_host: m.client_host,
                        subscribed_topic_names: m.subscribed_topic_names,
                        assignment,
                    }
                })
                .collect(),
            coordinator,
        }))
    }

    /// The start offset and lag of every partition `group` has share-partition state for
    /// (Kafka's `Admin.listShareGroupOffsets`); empty for a broker without the API.
    ///
    /// ```no_run
    /// # async fn run(admin: rill_client::Admin) -> rill_client::Result<()> {
    /// for o in admin.describe_share_group_offsets("workers").await? {
    ///     println!("{}-{}: start {} lag {}", o.partition.topic, o.partition.partition, o.start_offset, o.lag);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn describe_share_group_offsets(&self, group: &str) -> Result<Vec<ShareGroupOffset>> {
        let coordinator = ops::find_coordinator(self.net(), group).await?;
        let conn = self.net().connection(&coordinator.addr()).await?;
        match conn.version(
            ApiKey::DescribeShareGroupOffsets,
            DESCRIBE_SHARE_GROUP_OFFSETS_VERSION,
        ) {
            Ok(_) => {}
            Err(Error::UnsupportedVersion { .. }) => return Ok(Vec::new()),
            Err(e) => return Err(e),
        }
        let request = DescribeShareGroupOffsetsRequest {
            groups: vec![DescribeShareGroupOffsetsRequestGroup {
                group_id: group.to_owned(),
                // Every partition the group has state for.
                topics: None,
                ..Default::default()
            }],
            ..Default::default()
        };
        let response = conn
            .send(&request, DESCRIBE_SHARE_GROUP_OFFSETS_VERSION)
            .await?;
        let mut out = Vec::new();
        for g in response.groups {
            check(g.error_code, || {
                format!("describing share group {group}'s offsets")
            })?;
            for t in g.topics {
                for p in t.partitions {
                    check(p.error_code, || {
                        format!(
                            "share group {group}'s offset of {}-{}",
                            t.topic_name, p.partition_index
                        )
                    })?;
                    out.push(ShareGroupOffset {
                        partition: TopicPartition::new(t.topic_name.clone(), p.partition_index),
                        start_offset: p.start_offset,
                        lag: p.lag,
                    });
                }
            }
        }
        out.sort_by(|a, b| {
            (&a.partition.topic, a.partition.partition)
                .cmp(&(&b.partition.topic, b.partition.partition))
        });
        Ok(out)
    }
}
