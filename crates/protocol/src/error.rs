//! Codec errors and Kafka's error codes.

/// Why bytes could not be decoded. Every variant is an operating error: the input came
/// from a peer and the caller answers it, it never panics.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("buffer underflow: needed {needed} bytes, {available} remain")]
    Underflow { needed: usize, available: usize },
}

/// Why a message could not be encoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    #[error("unsupported version {version} for {message}")]
    UnsupportedVersion { message: &'static str, version: i16 },
}

/// Kafka's error codes (placeholder until the full table lands).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorCode(pub i16);
