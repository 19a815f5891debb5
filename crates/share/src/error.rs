//! [`ShareError`]: why a share-partition refused an acknowledgement or a persisted state,
//! with the Kafka error code the broker answers it with.

use rill_protocol::ErrorCode;

/// Why a share-partition operation failed. Nothing is changed when one is returned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShareError {
    /// The request is malformed: offsets out of order, an unknown acknowledge type, offsets
    /// past what was ever acquired (Kafka's `InvalidRequestException`).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// A record named is not acquired by the member that names it (Kafka's
    /// `InvalidRecordStateException`).
    #[error("invalid record state: {0}")]
    InvalidRecordState(String),
    /// A persisted state that cannot describe a share-partition (a batch below the start
    /// offset, overlapping batches): the share-partition cannot be initialised from it.
    #[error("bad persisted share-partition state: {0}")]
    BadPersistedState(String),
}

impl ShareError {
    /// The error code of a ShareFetch or ShareAcknowledge partition answer.
    pub fn error_code(&self) -> ErrorCode {
        match self {
            ShareError::InvalidRequest(_) => ErrorCode::INVALID_REQUEST,
            ShareError::InvalidRecordState(_) => ErrorCode::INVALID_RECORD_STATE,
            ShareError::BadPersistedState(_) => ErrorCode::UNKNOWN_SERVER_ERROR,
        }
    }
}
