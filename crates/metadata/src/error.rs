//! `rill-metadata`'s one error type.
//!
//! Controller decisions that a client caused (a topic that already exists, a stale
//! epoch) are not errors here: they are Kafka error codes inside the controller's
//! response, because the broker copies them onto the wire. [`MetadataError`] is for what
//! the caller of this crate must handle: bytes that do not decode, a record that does not
//! fit the image, a quorum that cannot be reached or a disk that failed.

use rill_protocol::ErrorCode;

/// Errors of the metadata image, its record codec and the Raft quorum.
#[derive(Debug, thiserror::Error)]
pub enum MetadataError {
    /// A record frame or batch did not decode.
    #[error("malformed metadata record: {0}")]
    Decode(#[from] rill_protocol::DecodeError),
    /// A record could not be encoded (a bug: every record we build is encodable).
    #[error("cannot encode metadata record: {0}")]
    Encode(#[from] rill_protocol::EncodeError),
    /// A frame names a record type or version this code does not know.
    #[error("unknown metadata record api key {api_key} version {version}")]
    UnknownRecord { api_key: u32, version: u32 },
    /// A frame or batch is shorter or longer than its header says, or has a bad checksum.
    #[error("corrupt metadata frame: {reason}")]
    Corrupt { reason: &'static str },
    /// A committed record refers to something the image does not hold (a partition of an
    /// unknown topic, a broker that never registered). The record is skipped; replicas
    /// that apply the same log skip it alike, so their images stay equal.
    #[error("record does not apply to the image: {reason}")]
    Inconsistent { reason: String },
    /// This node is not the quorum's leader; `leader_id` is the leader it knows of.
    #[error("not the controller (leader is {leader_id:?})")]
    NotController { leader_id: Option<u64> },
    /// A quorum peer could not be reached or did not answer (a submission being
    /// forwarded to the controller; [`crate::MetadataQuorum::submit`] retries it).
    #[error("quorum node {node_id} unreachable: {reason}")]
    Unreachable { node_id: u64, reason: String },
    /// No answer within the caller's timeout; the request may still take effect.
    #[error("no answer from the controller within {timeout:?}")]
    Timeout { timeout: std::time::Duration },
    /// A file of the Raft log, vote or snapshot could not be read or written.
    #[error("metadata quorum storage at {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The Raft library failed for a reason other than leadership (shut down, fatal).
    #[error("metadata quorum: {0}")]
    Quorum(String),
}

impl MetadataError {
    /// The Kafka error code the broker answers with when this error ends a request.
    pub fn error_code(&self) -> ErrorCode {
        match self {
            MetadataError::NotController { .. } => ErrorCode::NOT_CONTROLLER,
            MetadataError::Timeout { .. } => ErrorCode::REQUEST_TIMED_OUT,
            _ => ErrorCode::UNKNOWN_SERVER_ERROR,
        }
    }
}
