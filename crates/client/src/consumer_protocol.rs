//! The consumer group protocol of KIP-848 (`group.protocol=consumer`) on the client side:
//! the heartbeat task that speaks ConsumerGroupHeartbeat, and what `poll` does with the
//! assignments it brings (Kafka's `ConsumerMembershipManager`, much reduced).
//!
//! # Protocol
//!
//! 1. The member joins with a heartbeat at epoch 0 that carries its subscription (topic
//!    names, or a regular expression the broker evaluates), its rebalance timeout
//!    (`max.poll.interval.ms`), `group.instance.id` and `group.remote.assignor`. The
//!    coordinator answers with the member id, the member's epoch, the heartbeat interval
//!    and, when it changed, the assignment the member should own now (by topic id).
//! 2. The task heartbeats every interval the broker decided, and at once when `poll` has
//!    reconciled an assignment. Every heartbeat reports the partitions the member owns,
//!    which is how the coordinator learns that a revocation is done.
//! 3. `poll` reconciles towards the latest assignment: partitions no longer in it are
//!    committed (with auto-commit), handed to the listener's `on_partitions_revoked` and
//!    dropped; new ones are handed to `on_partitions_assigned` and fetched. The
//!    coordinator assigns a partition only once its previous owner has reported it
//!    revoked, so no two members read one partition in the same epoch.
//! 4. FENCED_MEMBER_EPOCH and UNKNOWN_MEMBER_ID: the member lost its partitions (the
//!    listener's `on_partitions_lost`, no commit) and joins again at epoch 0. Coordinator
//!    errors send `poll` to find it again. FENCED_INSTANCE_ID, UNRELEASED_INSTANCE_ID and
//!    the request errors (GROUP_AUTHORIZATION_FAILED, UNSUPPORTED_ASSIGNOR, ...) end the
//!    membership: `poll` returns them.
//! 5. Leaving: a heartbeat at epoch -1 (-2 for a static member, which keeps its
//!    partitions until its session ends or it comes back), also when `poll` has not been
//!    called within `max.poll.interval.ms`.
//!
//! Commits carry the member epoch (OffsetCommit v9); one the coordinator finds stale
//! (STALE_MEMBER_EPOCH, the epoch moved on while the commit was out) is sent again with the
//! newer epoch.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use rill_protocol::generated::consumer_group_heartbeat_request::TopicPartitions;
use rill_protocol::generated::ConsumerGroupHeartbeatRequest;
use rill_protocol::{ErrorCode, Uuid};
use tokio::sync::Notify;

use crate::consumer::{ConsumerConfig, Shared};
use crate::network::NetworkClient;

/// Kafka 4.x offers versions 0 and 1; 1 adds the broker-side regular expression.
const CONSUMER_GROUP_HEARTBEAT_VERSION: i16 = 1;
/// The epoch of a member leaving for good, and of a static member leaving for now.
pub(crate) const LEAVE_GROUP_MEMBER_EPOCH: i32 = -1;
pub(crate) const LEAVE_GROUP_STATIC_MEMBER_EPOCH: i32 = -2;
/// How long the task waits before heartbeating again after a failure, and before the
/// broker has said how often to heartbeat.
const RETRY_INTERVAL: Duration = Duration::from_millis(500);

/// What a member is subscribed to, as its heartbeats say it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Subscribed {
    Topics(Vec<String>),
    /// A regular expression the broker matches topic names against (RE2J's syntax).
    Regex(String),
}

/// The member's state in the consumer protocol, inside the consumer's shared group state.
#[derive(Debug, Default)]
pub(crate) struct MemberState {
    pub(crate) subscribed: Option<Subscribed>,
    /// The latest assignment the coordinator sent, not yet reconciled by `poll`.
    pub(crate) target: Option<BTreeMap<Uuid, Vec<i32>>>,
    /// What `poll` owns, as the heartbeats report it.
    pub(crate) owned: BTreeMap<Uuid, Vec<i32>>,
    /// The interval the broker decided.
    pub(crate) heartbeat_interval: Option<Duration>,
    /// An error that ended the membership, for `poll` to return.
    pub(crate) fatal: Option<(ErrorCode, String)>,
}

/// The heartbeat request for the member's current state at `epoch`.
fn heartbeat_request(
    group: &str,
    member_id: &str,
    epoch: i32,
    member: &MemberState,
    config: &ConsumerConfig,
) -> ConsumerGroupHeartbeatRequest {
    let (names, regex) = match &member.subscribed {
        Some(Subscribed::Topics(t)) => (Some(t.clone()), None),
        Some(Subscribed::Regex(r)) => (None, Some(r.clone())),
        None => (Some(Vec::new()), None),
    };
    let leaving = epoch < 0;
    ConsumerGroupHeartbeatRequest {
        group_id: group.to_string(),
        member_id: member_id.to_string(),
        member_epoch: epoch,
        instance_id: config.group_instance_id.clone(),
        rack_id: None,
        rebalance_timeout_ms: if leaving {
            -1
        } else {
            i32::try_from(config.max_poll_interval.as_millis()).unwrap_or(i32::MAX)
        },
        subscribed_topic_names: if leaving { None } else { names },
        subscribed_topic_regex: if leaving { None } else { regex },
        server_assignor: if leaving {
            None
        } else {
            config.group_remote_assignor.clone()
        },
        topic_partitions: (!leaving).then(|| {
            member
                .owned
                .iter()
                .map(|(id, partitions)| TopicPartitions {
                    topic_id: *id,
                    partitions: partitions.clone(),
                    ..Default::default()
                })
                .collect()
        }),
        ..Default::default()
    }
}

/// Sends the leave heartbeat (epoch -1, or -2 for a static member) to the coordinator.
pub(crate) async fn leave(
    net: &NetworkClient,
    shared: &Shared,
    group: &str,
    config: &ConsumerConfig,
) {
    let (member_id, coordinator, request) = {
        let Ok(mut g) = shared.lock() else { return };
        let epoch = if config.group_instance_id.is_some() {
            LEAVE_GROUP_STATIC_MEMBER_EPOCH
        } else {
            LEAVE_GROUP_MEMBER_EPOCH
        };
        let request = heartbeat_request(group, &g.member_id, epoch, &g.member, config);
        let member_id = g.member_id.clone();
        g.generation = -1;
        g.member.owned.clear();
        g.member.target = None;
        (member_id, g.coordinator.clone(), request)
    };
    if member_id.is_empty() {
        return;
    }
    let Some(coordinator) = coordinator else {
        return;
    };
    if let Ok(conn) = net.connection(&coordinator.addr()).await {
        if let Err(e) = conn.send(&request, CONSUMER_GROUP_HEARTBEAT_VERSION).await {
            tracing::debug!(group, error = %e, "leave heartbeat failed");
        }
    }
}

/// The heartbeat task of a consumer-protocol member (step 2 of the module's protocol):
/// it runs while the consumer is open, heartbeating whenever the member should be in the
/// group, and wakes `poll` (`changed`) after every answer.
pub(crate) async fn heartbeat_loop(
    net: Arc<NetworkClient>,
    shared: Shared,
    group: String,
    config: ConsumerConfig,
    wake: Arc<Notify>,
    changed: Arc<Notify>,
) {
    let mut next = Duration::ZERO;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(next) => {}
            _ = wake.notified() => {}
        }
        let state = {
            let Ok(g) = shared.lock() else { return };
            if g.closed {
                return;
            }
            if g.fenced || g.member.fatal.is_some() || g.member.subscribed.is_none() {
                None
            } else {
                g.coordinator.clone().map(|c| {
                    (
                        c,
                        g.last_poll.elapsed() > config.max_poll_interval,
                        heartbeat_request(
                            &group,
                            &g.member_id,
                            g.generation.max(0),
                            &g.member,
                            &config,
                        ),
                    )
                })
            }
        };
        let Some((coordinator, stale_poll, request)) = state else {
            next = RETRY_INTERVAL;
            continue;
        };
        if stale_poll {
            tracing::warn!(
                group,
                "poll not called within max.poll.interval.ms; leaving the group"
            );
            leave(&net, &shared, &group, &config).await;
            if let Ok(mut g) = shared.lock() {
                g.lost = true;
            }
            changed.notify_waiters();
            next = RETRY_INTERVAL;
            continue;
        }
        let epoch_sent = request.member_epoch;
        let result = async {
            let conn = net.connection(&coordinator.addr()).await?;
            conn.send(&request, CONSUMER_GROUP_HEARTBEAT_VERSION).await
        }
        .await;
        next = {
            let Ok(mut g) = shared.lock() else { return };
            // A leave (close, or an expired poll interval) went out meanwhile: this answer
            // is about a membership that ended.
            if g.closed || (g.generation < 0 && epoch_sent > 0) {
                continue;
            }
            let interval = g.member.heartbeat_interval.unwrap_or(RETRY_INTERVAL);
            match result {
                Ok(r) => match ErrorCode::from_code(r.error_code) {
                    c if c.is_ok() => {
                        if let Some(id) = r.member_id.filter(|id| !id.is_empty()) {
                            g.member_id = id;
                        }
                        g.generation = r.member_epoch;
                        let interval = u64::try_from(r.heartbeat_interval_ms)
                            .ok()
                            .filter(|ms| *ms > 0)
                            .map(Duration::from_millis);
                        g.member.heartbeat_interval = interval.or(g.member.heartbeat_interval);
                        if let Some(a) = r.assignment {
                            g.member.target = Some(
                                a.topic_partitions
                                    .into_iter()
                                    .map(|tp| (tp.topic_id, tp.partitions))
                                    .collect(),
                            );
                        }
                        g.member.heartbeat_interval.unwrap_or(RETRY_INTERVAL)
                    }
                    ErrorCode::FENCED_MEMBER_EPOCH | ErrorCode::UNKNOWN_MEMBER_ID => {
                        tracing::info!(group, code = %ErrorCode::from_code(r.error_code),
                            "fenced by the coordinator; joining again");
                        if ErrorCode::from_code(r.error_code) == ErrorCode::UNKNOWN_MEMBER_ID {
                            g.member_id.clear();
                        }
                        g.generation = 0;
                        g.lost = true;
                        g.member.target = None;
                        g.member.owned.clear();
                        Duration::ZERO
                    }
                    ErrorCode::NOT_COORDINATOR
                    | ErrorCode::COORDINATOR_NOT_AVAILABLE
                    | ErrorCode::COORDINATOR_LOAD_IN_PROGRESS => {
                        g.coordinator = None;
                        RETRY_INTERVAL
                    }
                    ErrorCode::FENCED_INSTANCE_ID => {
                        g.fenced = true;
                        g.member_id.clear();
                        g.generation = -1;
                        RETRY_INTERVAL
                    }
                    c => {
                        let message = r
                            .error_message
                            .unwrap_or_else(|| format!("ConsumerGroupHeartbeat of {group}"));
                        tracing::warn!(group, code = %c, message, "heartbeat refused");
                        g.member.fatal = Some((c, message));
                        RETRY_INTERVAL
                    }
                },
                Err(e) => {
                    tracing::debug!(group, error = %e, "heartbeat failed; rediscovering the coordinator");
                    g.coordinator = None;
                    interval.min(RETRY_INTERVAL)
                }
            }
        };
        changed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ClientConfig;

    fn config() -> ConsumerConfig {
        ConsumerConfig::new(ClientConfig::new("127.0.0.1:9092"))
            .group_id("g")
            .group_remote_assignor("range")
    }

    #[test]
    fn a_heartbeat_carries_the_subscription_and_what_the_member_owns() {
        let id = Uuid::from_u64_pair(1, 2);
        let member = MemberState {
            subscribed: Some(Subscribed::Topics(vec!["a".into(), "b".into()])),
            owned: BTreeMap::from([(id, vec![0, 3])]),
            ..Default::default()
        };
        let r = heartbeat_request("g", "m1", 7, &member, &config());
        assert_eq!((r.member_id.as_str(), r.member_epoch), ("m1", 7));
        assert_eq!(r.subscribed_topic_names, Some(vec!["a".into(), "b".into()]));
        assert_eq!(r.subscribed_topic_regex, None);
        assert_eq!(r.server_assignor.as_deref(), Some("range"));
        assert_eq!(r.rebalance_timeout_ms, 300_000);
        let owned = r.topic_partitions.unwrap();
        assert_eq!(
            (owned[0].topic_id, owned[0].partitions.clone()),
            (id, vec![0, 3])
        );
        // A regular expression goes to the broker as such.
        let member = MemberState {
            subscribed: Some(Subscribed::Regex("orders-.*".into())),
            ..Default::default()
        };
        let r = heartbeat_request("g", "", 0, &member, &config());
        assert_eq!(r.subscribed_topic_names, None);
        assert_eq!(r.subscribed_topic_regex.as_deref(), Some("orders-.*"));
        assert_eq!(r.topic_partitions, Some(Vec::new()), "a join owns nothing");
    }

    #[test]
    fn a_leave_heartbeat_carries_only_the_member_and_its_epoch() {
        let member = MemberState {
            subscribed: Some(Subscribed::Topics(vec!["a".into()])),
            owned: BTreeMap::from([(Uuid::from_u64_pair(1, 2), vec![0])]),
            ..Default::default()
        };
        let r = heartbeat_request("g", "m1", LEAVE_GROUP_MEMBER_EPOCH, &member, &config());
        assert_eq!(r.member_epoch, -1);
        assert_eq!(
            (
                r.subscribed_topic_names,
                r.server_assignor,
                r.topic_partitions
            ),
            (None, None, None)
        );
        assert_eq!(r.rebalance_timeout_ms, -1);
    }

    #[test]
    fn group_protocol_parses_kafkas_names() {
        use crate::consumer::GroupProtocol;
        assert_eq!(
            "consumer".parse::<GroupProtocol>().unwrap(),
            GroupProtocol::Consumer
        );
        assert_eq!(
            "Classic".parse::<GroupProtocol>().unwrap(),
            GroupProtocol::Classic
        );
        assert!("eager".parse::<GroupProtocol>().is_err());
    }
}
