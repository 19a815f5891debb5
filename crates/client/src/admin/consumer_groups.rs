//! KIP-848's consumer groups on the admin client: ConsumerGroupDescribe, sent to the
//! group's coordinator (Kafka's `Admin.describeConsumerGroups` sends it first and falls
//! back to DescribeGroups for a classic group).

use rill_protocol::generated::consumer_group_describe_response::Assignment;
use rill_protocol::generated::ConsumerGroupDescribeRequest;
use rill_protocol::ErrorCode;

use super::Admin;
use crate::error::{check, Result};
use crate::network::BrokerMetadata;
use crate::ops;
use crate::types::TopicPartition;

const CONSUMER_GROUP_DESCRIBE_VERSION: i16 = 0;

/// A member of a consumer group (`group.protocol=consumer`) as its coordinator sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerGroupMemberDescription {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    /// The member's epoch: the target epoch once it is reconciled.
    pub member_epoch: i32,
    pub client_id: String,
    pub client_host: String,
    pub subscribed_topic_names: Vec<String>,
    pub subscribed_topic_regex: Option<String>,
    /// What the member owns now.
    pub assignment: Vec<TopicPartition>,
    /// What the coordinator's assignor gave it.
    pub target_assignment: Vec<TopicPartition>,
}

/// A consumer group (KIP-848) as ConsumerGroupDescribe shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerGroupDescription {
    pub group_id: String,
    /// `Empty`, `Assigning`, `Reconciling` or `Stable`.
    pub state: String,
    pub group_epoch: i32,
    pub assignment_epoch: i32,
    /// The server-side assignor (`uniform`, `range`).
    pub assignor: String,
    pub members: Vec<ConsumerGroupMemberDescription>,
    pub coordinator: BrokerMetadata,
}

fn partitions(a: Assignment) -> Vec<TopicPartition> {
    let mut out: Vec<TopicPartition> = a
        .topic_partitions
        .into_iter()
        .flat_map(|t| {
            let topic = t.topic_name;
            t.partitions
                .into_iter()
                .map(move |partition| TopicPartition {
                    topic: topic.clone(),
                    partition,
                })
        })
        .collect();
    out.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
    out
}

impl Admin {
    /// Describes a consumer group of KIP-848's protocol; `None` when the group is not one
    /// (a classic group, or no group: [`Admin::describe_groups`] tells which).
    ///
    /// ```no_run
    /// # async fn run(admin: rill_client::Admin) -> rill_client::Result<()> {
    /// if let Some(g) = admin.describe_consumer_group("billing").await? {
    ///     println!("{} at epoch {}, {} members", g.state, g.group_epoch, g.members.len());
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn describe_consumer_group(
        &self,
        group: &str,
    ) -> Result<Option<ConsumerGroupDescription>> {
        let coordinator = ops::find_coordinator(self.net(), group).await?;
        let conn = self.net().connection(&coordinator.addr()).await?;
        let request = ConsumerGroupDescribeRequest {
            group_ids: vec![group.to_owned()],
            ..Default::default()
        };
        let response = conn.send(&request, CONSUMER_GROUP_DESCRIBE_VERSION).await?;
        let Some(g) = response.groups.into_iter().next() else {
            return Ok(None);
        };
        if g.error_code == ErrorCode::GROUP_ID_NOT_FOUND.code() {
            return Ok(None);
        }
        check(g.error_code, || {
            format!("describing consumer group {group}")
        })?;
        Ok(Some(ConsumerGroupDescription {
            group_id: g.group_id,
            state: g.group_state,
            group_epoch: g.group_epoch,
            assignment_epoch: g.assignment_epoch,
            assignor: g.assignor_name,
            members: g
                .members
                .into_iter()
                .map(|m| ConsumerGroupMemberDescription {
                    member_id: m.member_id,
                    instance_id: m.instance_id,
                    rack_id: m.rack_id,
                    member_epoch: m.member_epoch,
                    client_id: m.client_id,
                    client_host: m.client_host,
                    subscribed_topic_names: m.subscribed_topic_names,
                    subscribed_topic_regex: m.subscribed_topic_regex,
                    assignment: partitions(m.assignment),
                    target_assignment: partitions(m.target_assignment),
                })
                .collect(),
            coordinator,
        }))
    }
}
