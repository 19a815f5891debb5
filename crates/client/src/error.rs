//! The one error type of `rill-client`.
//!
//! Errors are values the caller handles: a broker that does not answer is a
//! [`Error::Timeout`], a Kafka error code in a response is [`Error::Kafka`] with the code
//! and what was being done. [`Error::is_retriable`] says whether trying again may help;
//! the client's own retry loops use it, and so can callers.

use std::time::Duration;

use rill_protocol::records::BatchError;
use rill_protocol::{ApiKey, DecodeError, EncodeError, ErrorCode, FrameError};

/// Everything that can go wrong in the client.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// A request (or a connection attempt) got no answer in time; the connection it used
    /// is dropped so the next attempt starts afresh.
    #[error("{what} timed out after {after:?}")]
    Timeout { what: String, after: Duration },
    /// A TCP connection could not be opened.
    #[error("cannot connect to {addr}: {message}")]
    Connect { addr: String, message: String },
    /// A connection broke while a request was waiting for its answer.
    #[error("connection to {addr} lost: {message}")]
    Disconnected { addr: String, message: String },
    /// A broker answered with a Kafka error code.
    #[error("{context}: {code}{}", message.as_deref().map(|m| format!(" ({m})")).unwrap_or_default())]
    Kafka {
        code: ErrorCode,
        context: String,
        message: Option<String>,
    },
    /// Neither side supports a common version of an api.
    #[error("broker {addr} does not support {api} versions {min}-{max}")]
    UnsupportedVersion {
        addr: String,
        api: ApiKey,
        min: i16,
        max: i16,
    },
    /// No bootstrap server or broker could be reached.
    #[error("no broker available: {0}")]
    NoBrokerAvailable(String),
    /// The topic does not exist (after a metadata refresh).
    #[error("unknown topic {0}")]
    UnknownTopic(String),
    /// A partition that the topic does not have.
    #[error("unknown partition {topic}-{partition}")]
    UnknownPartition { topic: String, partition: i32 },
    /// `auto.offset.reset=none` and the group has no committed offset for a partition.
    #[error("no committed offset for {topic}-{partition} and auto.offset.reset is none")]
    NoOffsetForPartition { topic: String, partition: i32 },
    /// The fetch position is outside the log and `auto.offset.reset` is none.
    #[error("offset {offset} out of range for {topic}-{partition}")]
    OffsetOutOfRange {
        topic: String,
        partition: i32,
        offset: i64,
    },
    /// A configuration value or argument the client cannot use.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// The broker refused the SASL login, or a SCRAM server proved it does not know the
    /// password.
    #[error("authentication failed: {0}")]
    Authentication(String),
    /// The caller used the API in a way it does not allow (poll without subscription, ...).
    #[error("illegal state: {0}")]
    IllegalState(String),
    /// The producer, consumer or connection was closed.
    #[error("client is closed")]
    Closed,
    /// A request could not be encoded (a bug, or a value too large for the wire).
    #[error("encoding a request: {0}")]
    Encode(#[from] EncodeError),
    /// A response could not be decoded: the connection is dropped.
    #[error("decoding a response: {0}")]
    Decode(#[from] DecodeError),
    /// A frame from the broker had an impossible size.
    #[error("bad frame: {0}")]
    Frame(#[from] FrameError),
    /// A record batch could not be built or read.
    #[error("record batch: {0}")]
    Batch(#[from] BatchError),
    /// The embedded consumer protocol (subscription/assignment bytes) was malformed.
    #[error("consumer protocol: {0}")]
    ConsumerProtocol(String),
}

impl Error {
    /// Whether the same operation may succeed if tried again (after a metadata refresh
    /// or a reconnect).
    pub fn is_retriable(&self) -> bool {
        match self {
            Error::Timeout { .. }
            | Error::Connect { .. }
            | Error::Disconnected { .. }
            | Error::NoBrokerAvailable(_) => true,
            Error::Kafka { code, .. } => code.is_retriable() || *code == ErrorCode::NOT_COORDINATOR,
            _ => false,
        }
    }

    /// The Kafka error code, when the broker sent one.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            Error::Kafka { code, .. } => Some(*code),
            _ => None,
        }
    }

    pub(crate) fn kafka(code: ErrorCode, context: impl Into<String>) -> Self {
        Error::Kafka {
            code,
            context: context.into(),
            message: None,
        }
    }

    pub(crate) fn kafka_msg(
        code: ErrorCode,
        context: impl Into<String>,
        message: Option<String>,
    ) -> Self {
        Error::Kafka {
            code,
            context: context.into(),
            message: message.filter(|m| !m.is_empty()),
        }
    }
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Turns a response's error code into a `Result`.
pub(crate) fn check(code: i16, context: impl FnOnce() -> String) -> Result<()> {
    let code = ErrorCode::from_code(code);
    if code.is_ok() {
        Ok(())
    } else {
        Err(Error::kafka(code, context()))
    }
}
