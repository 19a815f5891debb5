//! Kafka's numeric error codes that the group coordinator answers with, and this crate's
//! error type.
//!
//! The codes are Kafka's own (`org.apache.kafka.common.protocol.Errors`); they are kept
//! here as plain `i16` constants so that this crate does not wait on the protocol crate's
//! full error table. The broker copies them onto the wire unchanged.

/// Kafka's error codes used by the classic group protocol and the offset APIs.
pub mod error_code {
    /// No error.
    pub const NONE: i16 = 0;
    /// An unexpected server error (used when a write to `__consumer_offsets` fails for a
    /// reason the client cannot act on).
    pub const UNKNOWN_SERVER_ERROR: i16 = -1;
    /// The committed metadata string is longer than `offset.metadata.max.bytes`.
    /// A topic or partition that does not exist (share group offsets).
    pub const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
    pub const OFFSET_METADATA_TOO_LARGE: i16 = 12;
    /// The coordinator is still loading the group's `__consumer_offsets` partition.
    pub const COORDINATOR_LOAD_IN_PROGRESS: i16 = 14;
    /// The coordinator is not available (the group is Dead or a write failed).
    pub const COORDINATOR_NOT_AVAILABLE: i16 = 15;
    /// This node is not the coordinator of the group.
    pub const NOT_COORDINATOR: i16 = 16;
    /// The generation id in the request is not the group's current generation.
    pub const ILLEGAL_GENERATION: i16 = 22;
    /// The protocol type or the protocols do not match those of the group.
    pub const INCONSISTENT_GROUP_PROTOCOL: i16 = 23;
    /// The group id is empty or otherwise invalid.
    pub const INVALID_GROUP_ID: i16 = 24;
    /// The member id is not known to the group.
    pub const UNKNOWN_MEMBER_ID: i16 = 25;
    /// The session timeout is outside the broker's allowed range.
    pub const INVALID_SESSION_TIMEOUT: i16 = 26;
    /// The group is rebalancing: the member must rejoin.
    pub const REBALANCE_IN_PROGRESS: i16 = 27;
    /// The committed offset batch is too large to be written.
    pub const INVALID_COMMIT_OFFSET_SIZE: i16 = 28;
    /// The group still has members.
    pub const NON_EMPTY_GROUP: i16 = 68;
    /// The group does not exist.
    pub const GROUP_ID_NOT_FOUND: i16 = 69;
    /// The first JoinGroup (v4+) of a dynamic member: the coordinator assigned a member id
    /// and the member must join again with it.
    pub const MEMBER_ID_REQUIRED: i16 = 79;
    /// The group already has `group.max.size` members.
    pub const GROUP_MAX_SIZE_REACHED: i16 = 81;
    /// Another member id now holds this `group.instance.id` (KIP-345).
    pub const FENCED_INSTANCE_ID: i16 = 82;
    /// The group is consuming the topic whose offsets were asked to be deleted.
    pub const GROUP_SUBSCRIBED_TO_TOPIC: i16 = 86;
    /// A transactional offset commit is pending on the partition (`require_stable`).
    pub const UNSTABLE_OFFSET_COMMIT: i16 = 88;
    /// The request's version is not allowed here (an OffsetCommit below v9 from a
    /// consumer group member).
    pub const UNSUPPORTED_VERSION: i16 = 35;
    /// The request is malformed (ConsumerGroupHeartbeat's checks).
    pub const INVALID_REQUEST: i16 = 42;
    /// A consumer group member's epoch is not the coordinator's: it must give up its
    /// partitions and join again (KIP-848).
    pub const FENCED_MEMBER_EPOCH: i16 = 110;
    /// A static member's `group.instance.id` is still used by another member.
    pub const UNRELEASED_INSTANCE_ID: i16 = 111;
    /// The member asked for a server-side assignor the broker does not have.
    pub const UNSUPPORTED_ASSIGNOR: i16 = 112;
    /// An offset commit or fetch carries a member epoch that is not the member's.
    pub const STALE_MEMBER_EPOCH: i16 = 113;
    /// A subscription's regular expression does not compile.
    pub const INVALID_REGULAR_EXPRESSION: i16 = 128;
}

/// Why the coordinator refused an input that is not a client request: a record replayed
/// from `__consumer_offsets` or bytes of the consumer protocol. Every variant is an
/// operating error; the caller decides whether to skip the record or fail the load.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GroupError {
    /// A record was replayed into a partition that is not being loaded.
    #[error("partition {partition} of __consumer_offsets is not loading")]
    PartitionNotLoading { partition: i32 },
    /// A record's group hashes to another partition than the one it was read from.
    #[error("group {group_id:?} belongs to partition {expected}, not {partition}")]
    WrongPartition {
        group_id: String,
        partition: i32,
        expected: i32,
    },
    /// The consumer protocol bytes end before a field does.
    #[error("consumer protocol subscription truncated: needed {needed} bytes, {available} remain")]
    SubscriptionUnderflow { needed: usize, available: usize },
    /// The consumer protocol bytes hold a negative length where none is allowed.
    #[error("consumer protocol subscription has invalid length {length}")]
    SubscriptionInvalidLength { length: i32 },
    /// A topic name in the consumer protocol bytes is not UTF-8.
    #[error("consumer protocol subscription has a topic name that is not utf-8")]
    SubscriptionNotUtf8,
}
