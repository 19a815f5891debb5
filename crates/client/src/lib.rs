//! `rill-client`: Rill's native asynchronous Kafka client (tokio).
//!
//! - [`Producer`]: batching (`batch.size`, `linger.ms`), compression, idempotence on by
//!   default, the Java client's partitioner ([`murmur2`]), a [`DeliveryFuture`] per record;
//!   with a `transactional.id`, transactions ([`Producer::init_transactions`],
//!   `begin_transaction`, `commit_transaction`, `abort_transaction`; transaction version 2
//!   when the cluster finalizes it, as the Java client 4.x decides, else version 1).
//! - [`Consumer`]: consumer groups (the classic protocol: FindCoordinator, JoinGroup,
//!   SyncGroup, heartbeats, the range/roundrobin/sticky/cooperative-sticky assignors in
//!   Kafka's embedded consumer-protocol format), auto-commit, rebalance listener, or
//!   plain `assign` without a group.
//! - [`Admin`]: topics, partitions (leader elections, reassignments), configs, groups
//!   and their offsets, offsets, cluster, transactions (list, describe, the producers of
//!   a partition, and aborting a hanging transaction).
//!
//! All three share the connection layer: a metadata cache refreshed on
//! `NOT_LEADER_OR_FOLLOWER`/`UNKNOWN_TOPIC_OR_PARTITION` and after `metadata.max.age.ms`,
//! one connection per broker with pipelined requests, api versions negotiated with
//! `ApiVersions`, and a deadline on every request so a stopped broker is a
//! [`Error::Timeout`], never a hang. Connections speak TLS (rustls, optionally with a
//! client certificate) and log in with SASL PLAIN or SCRAM when [`ClientConfig::set`]
//! names `security.protocol` and the `ssl.*`/`sasl.*` settings ([`security`]).
//!
//! ```no_run
//! use std::time::Duration;
//! use rill_client::{ClientConfig, Consumer, ConsumerConfig, Producer, ProducerConfig, ProducerRecord};
//!
//! # async fn run() -> rill_client::Result<()> {
//! let client = ClientConfig::new("127.0.0.1:9092");
//! let producer = Producer::new(ProducerConfig::new(client.clone()))?;
//! producer.send(ProducerRecord::new("events", "hello")).await?.await?;
//!
//! let mut consumer = Consumer::new(ConsumerConfig::new(client).group_id("readers"))?;
//! consumer.subscribe(&["events"])?;
//! for record in consumer.poll(Duration::from_secs(1)).await? {
//!     println!("{}@{}: {:?}", record.partition, record.offset, record.value);
//! }
//! consumer.close().await?;
//! # Ok(()) }
//! ```

mod admin;
mod admin_producers;
mod assignor;
mod config;
mod connection;
mod consumer;
mod consumer_protocol;
mod error;
mod network;
mod ops;
mod partitioner;
mod producer;
pub mod security;
mod transaction;
mod types;

pub use admin::{
    hmac_from_base64, Admin, AlterConfigOp, ConfigEntry, ConfigResource, ConfigResourceType,
    ConsumerGroupDescription, ConsumerGroupMemberDescription, DelegationToken, GroupDescription,
    GroupListing, MemberDescription, NewPartitions, NewTopic, PartitionResults, QuotaAlteration,
    QuotaEntity, QuotaMatch, QuotaValues, ScramCredentialUpsertion, ShareGroupDescription,
    ShareGroupMemberDescription, ShareGroupOffset, TransactionDescription, TransactionListing,
};
pub use admin_producers::{AbortTransactionSpec, ProducerState};
pub use assignor::{Assignor, GroupSubscription, MemberSubscription};
pub use config::ClientConfig;
pub use consumer::{
    AutoOffsetReset, Consumer, ConsumerConfig, ConsumerRecord, GroupProtocol, RebalanceEvent,
    RebalanceListener,
};
pub use error::{Error, Result};
pub use network::{BrokerMetadata, ClusterMetadata, PartitionMetadata, TopicMetadata};
pub use partitioner::{murmur2, partition_for_key, to_positive};
pub use producer::{
    Acks, DeliveryFuture, Producer, ProducerConfig, ProducerRecord, RecordMetadata,
};
pub use types::{ElectionType, OffsetSpec, PartitionReassignment, TopicPartition};

/// Kafka's ACL nouns, as [`Admin::create_acls`], [`Admin::describe_acls`] and
/// [`Admin::delete_acls`] take and give them (re-exported from `rill-protocol`).
pub use rill_protocol::acl;

/// Record-batch types re-exported from `rill-protocol` (compression codecs, headers).
pub mod records {
    pub use rill_protocol::records::{CompressionType, Header};
}
