//! What an acquire takes and gives: the batches the broker read from the log for a
//! ShareFetch ([`ShareFetch`], with KIP-1206's acquire mode and the isolation hook) and the
//! `AcquiredRecords` the response carries.

use crate::error::ShareError;
use crate::persister::StateWrite;

/// ShareFetch's `ShareAcquireMode` (KIP-1206).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ShareAcquireMode {
    /// `max_records` is a soft limit: whole fetched batches are acquired.
    #[default]
    BatchOptimized,
    /// `max_records` is a hard limit: batches are split to acquire exactly that many.
    RecordLimit,
}

impl TryFrom<i8> for ShareAcquireMode {
    type Error = ShareError;

    fn try_from(id: i8) -> Result<Self, ShareError> {
        match id {
            0 => Ok(ShareAcquireMode::BatchOptimized),
            1 => Ok(ShareAcquireMode::RecordLimit),
            _ => Err(ShareError::InvalidRequest(format!(
                "unknown share acquire mode {id}"
            ))),
        }
    }
}

/// Offsets `first..=last`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OffsetRange {
    pub first: i64,
    pub last: i64,
}

impl OffsetRange {
    pub fn new(first: i64, last: i64) -> Self {
        OffsetRange { first, last }
    }
}

/// One record batch the broker read from the log: its base and last offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FetchedBatch {
    pub base_offset: i64,
    pub last_offset: i64,
}

/// What the broker read for an acquire.
#[derive(Debug, Clone, Copy)]
pub struct ShareFetch<'a> {
    /// Where the read started ([`crate::SharePartition::next_fetch_offset`] at the time).
    pub fetch_offset: i64,
    /// Every batch the log holds from the batch containing `fetch_offset` on, in order, as
    /// far as the read went. Offsets from `fetch_offset` that no batch covers are not in the
    /// log (compaction) and are archived.
    pub batches: &'a [FetchedBatch],
    /// ShareFetch's `MaxRecords`.
    pub max_records: i32,
    pub acquire_mode: ShareAcquireMode,
    /// The isolation hook: offsets the fetch's isolation level hides (records of aborted
    /// transactions under read_committed, control batches), in order. They are archived,
    /// never acquired.
    pub skip: &'a [OffsetRange],
}

/// Kafka's `AcquiredRecords`: what ShareFetch returns per run of acquired records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AcquiredRecords {
    pub first_offset: i64,
    pub last_offset: i64,
    pub delivery_count: i16,
}

/// The answer to [`crate::SharePartition::acquire`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Acquired {
    pub records: Vec<AcquiredRecords>,
    /// Offsets archived on the way (not in the log, or hidden by the isolation level).
    pub write: Option<StateWrite>,
}

impl Acquired {
    /// How many records were acquired.
    pub fn count(&self) -> i64 {
        self.records
            .iter()
            .map(|r| r.last_offset - r.first_offset + 1)
            .sum()
    }
}
