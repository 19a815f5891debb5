//! What a member says of the records it was given: the acknowledge types of ShareFetch and
//! ShareAcknowledge (ACCEPT, RELEASE, REJECT, KIP-1222's RENEW, and GAP for offsets the log
//! does not hold) and their batches, one type for a range or one per offset.

use crate::error::ShareError;

/// A ShareFetch or ShareAcknowledge acknowledge type (the `AcknowledgeTypes` bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AcknowledgeType {
    /// The offset holds no record (compaction, a control record): archive it.
    Gap,
    Accept,
    Release,
    Reject,
    /// Extend the acquisition lock (KIP-1222, Kafka 4.2).
    Renew,
}

impl TryFrom<i8> for AcknowledgeType {
    type Error = ShareError;

    fn try_from(id: i8) -> Result<Self, ShareError> {
        Ok(match id {
            0 => AcknowledgeType::Gap,
            1 => AcknowledgeType::Accept,
            2 => AcknowledgeType::Release,
            3 => AcknowledgeType::Reject,
            4 => AcknowledgeType::Renew,
            _ => {
                return Err(ShareError::InvalidRequest(format!(
                    "unknown acknowledge type {id}"
                )))
            }
        })
    }
}

/// One acknowledgement batch of ShareFetch or ShareAcknowledge: one type for the whole
/// range, or one per offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcknowledgementBatch {
    pub first_offset: i64,
    pub last_offset: i64,
    pub acknowledge_types: Vec<AcknowledgeType>,
}

impl AcknowledgementBatch {
    pub fn new(first_offset: i64, last_offset: i64, ty: AcknowledgeType) -> Self {
        AcknowledgementBatch {
            first_offset,
            last_offset,
            acknowledge_types: vec![ty],
        }
    }

    /// The type of `offset`: the batch's one type, or the offset's own; `None` for an offset
    /// the types do not cover (the share-partition refuses such a batch before it asks).
    pub(crate) fn type_of(&self, offset: i64) -> Option<AcknowledgeType> {
        match self.acknowledge_types.as_slice() {
            [one] => Some(*one),
            many => usize::try_from(offset.checked_sub(self.first_offset)?)
                .ok()
                .and_then(|i| many.get(i))
                .copied(),
        }
    }
}
