//! The replicated cluster metadata of Rill, with no I/O in its core.
//!
//! - [`acl`] (from `rill-protocol`): Kafka's ACL nouns ([`StandardAcl`],
//!   [`AclBindingFilter`] and their enums); [`authorizer`]: [`StandardAuthorizer`], Kafka's authorizer over the image's
//!   [`AclCache`], pure like the rest.
//! - [`record`]: [`MetadataRecord`], one entry of the metadata log (Kafka's metadata
//!   record types, generated in `rill_protocol::generated::metadata`), and its bytes.
//! - [`image`]: [`MetadataImage`], what applying the records in order builds; every node
//!   holds one; [`LocalReplicaChanges`] is what a broker acts on after an update.
//! - [`controller`]: [`QuorumController`], the active controller's decisions as a pure
//!   function of an event, the image and the time ([`api`] holds its inputs and
//!   outputs), and [`check_image_invariants`].
//! - [`placement`]: rack-unaware replica placement.
//! - `directories`: KIP-858's log directories on the controller's side: replicas placed
//!   in them (AssignReplicasToDirs) and a failed one's partitions moved away.
//! - [`remote_log`]: tiered storage's remote segment metadata (KIP-405) as records of
//!   the metadata log, with the segment state machine and the controller's fencing.
//! - [`quorum`]: the Raft quorum (openraft) that replicates the records among the
//!   controller nodes, and the controller's event loop that runs on every node and acts
//!   while its node leads; [`MetadataQuorum::submit`] is how any node hands an event to
//!   the active controller. The only module that uses tokio, files and sockets.
//!
//! ```
//! use rill_metadata::*;
//!
//! let mut image = MetadataImage::new();
//! let mut controller = QuorumController::new(ControllerConfig::default());
//! let register = ControllerEvent::BrokerRegistration(BrokerRegistrationRequest {
//!     broker_id: 1,
//!     incarnation_id: rill_protocol::Uuid::from_u64_pair(1, 1),
//!     listeners: vec![],
//!     rack: None,
//!     log_dirs: vec![],
//! });
//! let result = controller.handle(register, &image, 0, 0);
//! for record in &result.records {
//!     image.apply(record).unwrap();
//! }
//! assert!(image.broker(1).unwrap().fenced); // until its first caught-up heartbeat
//! ```

pub use rill_protocol::acl;
mod acl_control;
pub mod api;
pub mod authorizer;
pub mod client_quotas;
pub mod controller;
pub mod delegation_tokens;
mod directories;
pub mod error;
pub mod features;
pub mod image;
pub mod placement;
pub mod quorum;
pub mod record;
pub mod remote_log;

#[cfg(test)]
mod tests;

pub use acl::{
    AclBindingFilter, AclOperation, AclPermissionType, PatternType, ResourceType, StandardAcl,
    CLUSTER_NAME,
};
pub use api::*;
pub use authorizer::{
    AclCache, Action, AuthorizationResult, RequestContext, StandardAuthorizer,
    STANDARD_AUTHORIZER_CLASS,
};
pub use controller::{
    check_image_invariants, validate_topic_name, ControllerConfig, QuorumController,
};
pub use error::MetadataError;
pub use image::{
    directory_id, BrokerRegistration, ConfigResource, Endpoint, LocalReplicaChanges, MetadataImage,
    PartitionRegistration, ScramCredentialImage, TopicImage, TopicPartition, NO_LEADER,
    NO_LEADER_CHANGE, RESOURCE_BROKER, RESOURCE_CLIENT_METRICS, RESOURCE_GROUP, RESOURCE_TOPIC,
};
pub use quorum::{
    parse_voters, set_controller_stats, submit_to_voters, CommittedRecords, ControllerStats,
    ImageView, MetadataQuorum, Plaintext, QuorumConfig, QuorumDescription, QuorumIo, QuorumStream,
    QuorumTransport, ReplicaProgress, TransportFuture, VoterChangeError,
};
pub use record::{decode_batch, encode_batch, MetadataRecord};
pub use remote_log::{
    RemoteLogSegmentChange, RemoteLogSegmentMetadata, RemoteLogSegmentState,
    RemoteLogSegmentUpdateRequest,
};
