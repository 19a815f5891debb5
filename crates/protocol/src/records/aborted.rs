//! What a read_committed consumer skips in one partition's fetch answer (Kafka's
//! `CompletedFetch` with its `abortedProducerIds`): the broker reads only up to the last
//! stable offset and lists the aborted transactions that overlap the answer, each as its
//! producer id and first offset; the consumer drops that producer's transactional batches
//! from the first offset on, until the producer's ABORT marker. Here because both
//! `rill-client`'s consumer and the broker's replication simulation read that way.
//!
//! Why a producer id and a first offset are enough: a producer has at most one open
//! transaction per partition, so its batches between that first offset and the next ABORT
//! marker of the same producer are exactly that transaction's.

use std::collections::HashSet;

use crate::generated::fetch_response::AbortedTransaction;
use crate::records::{ControlRecordType, RecordBatch};

/// The aborted transactions of one partition's fetch answer, consumed batch by batch in
/// offset order.
///
/// ```
/// use rill_protocol::generated::fetch_response::AbortedTransaction;
/// use rill_protocol::records::{AbortedTransactions, RecordBatch, RecordBatchBuilder, CompressionType};
///
/// // Producer 7's transaction from offset 0 was aborted.
/// let listed = [AbortedTransaction { producer_id: 7, first_offset: 0, ..Default::default() }];
/// let mut builder = RecordBatchBuilder::new(CompressionType::None, 0).producer(7, 0, 0).transactional(true);
/// builder.append(0, None, Some(b"never seen"), &[]).unwrap();
/// let batch = RecordBatch::new(builder.build().unwrap()).unwrap();
/// let mut aborted = AbortedTransactions::new(Some(&listed));
/// assert!(!aborted.deliver(&batch));
/// ```
pub struct AbortedTransactions {
    /// (first offset, producer id), the ones not reached yet last.
    ahead: Vec<(i64, i64)>,
    /// Producers whose aborted transaction has begun and whose ABORT marker is not
    /// reached yet.
    aborting: HashSet<i64>,
}

impl AbortedTransactions {
    /// The transactions a fetch answer lists (`aborted_transactions`; none for
    /// read_uncommitted).
    pub fn new(listed: Option<&[AbortedTransaction]>) -> Self {
        let mut ahead: Vec<(i64, i64)> = listed
            .unwrap_or_default()
            .iter()
            .map(|a| (a.first_offset, a.producer_id))
            .collect();
        // Popped from the end, lowest first offset first.
        ahead.sort_unstable_by(|a, b| b.cmp(a));
        Self {
            ahead,
            aborting: HashSet::new(),
        }
    }

    /// Whether `batch`'s records are delivered: false for a batch of an aborted
    /// transaction, and for control batches, which are never delivered (an ABORT marker
    /// ends its producer's aborted transaction here).
    pub fn deliver(&mut self, batch: &RecordBatch) -> bool {
        while let Some(&(first_offset, producer_id)) = self.ahead.last() {
            if first_offset > batch.last_offset() {
                break;
            }
            self.aborting.insert(producer_id);
            self.ahead.pop();
        }
        if batch.is_control() {
            if batch.is_transactional() && is_abort_marker(batch) {
                self.aborting.remove(&batch.producer_id());
            }
            return false;
        }
        !(batch.is_transactional() && self.aborting.contains(&batch.producer_id()))
    }
}

/// A control batch whose (first) record is an ABORT marker; one that cannot be read is
/// taken for something else, as Kafka's consumers skip control records they do not know.
fn is_abort_marker(batch: &RecordBatch) -> bool {
    // A marker batch holds one small record; 4 KiB is far more than it decompresses to.
    let Ok(records) = batch.records(4096) else {
        return false;
    };
    records
        .first()
        .and_then(|r| r.key.as_deref())
        .is_some_and(|key| {
            matches!(
                ControlRecordType::from_key(key),
                Ok(ControlRecordType::Abort)
            )
        })
}

#[cfg(test)]
mod tests {
    use crate::records::{end_txn_marker_value, CompressionType, RecordBatchBuilder};

    use super::*;

    fn data(base_offset: i64, producer_id: i64, records: usize) -> RecordBatch {
        let mut b = RecordBatchBuilder::new(CompressionType::None, base_offset);
        if producer_id >= 0 {
            b = b.producer(producer_id, 0, 0).transactional(true);
        }
        for _ in 0..records {
            b.append(0, None, Some(b"v"), &[]).unwrap();
        }
        RecordBatch::new(b.build().unwrap()).unwrap()
    }

    fn marker(offset: i64, producer_id: i64, kind: ControlRecordType) -> RecordBatch {
        let mut b = RecordBatchBuilder::new(CompressionType::None, offset)
            .producer(producer_id, 0, -1)
            .transactional(true)
            .control(true);
        b.append(0, Some(&kind.key()), Some(&end_txn_marker_value(3)), &[])
            .unwrap();
        RecordBatch::new(b.build().unwrap()).unwrap()
    }

    fn listed(entries: &[(i64, i64)]) -> Vec<AbortedTransaction> {
        entries
            .iter()
            .map(|&(producer_id, first_offset)| AbortedTransaction {
                producer_id,
                first_offset,
                ..Default::default()
            })
            .collect()
    }

    #[test]
    fn an_aborted_transaction_is_skipped_up_to_its_marker_and_no_further() {
        // 0-1 P7 aborted, 2 plain, 3-4 P8 committed, 5 P7 ABORT, 6 P8 COMMIT,
        // 7 P7 again (a later, committed transaction), 8 P7 COMMIT.
        let log = [
            data(0, 7, 2),
            data(2, -1, 1),
            data(3, 8, 2),
            marker(5, 7, ControlRecordType::Abort),
            marker(6, 8, ControlRecordType::Commit),
            data(7, 7, 1),
            marker(8, 7, ControlRecordType::Commit),
        ];
        let list = listed(&[(7, 0)]);
        let mut aborted = AbortedTransactions::new(Some(&list));
        let delivered: Vec<i64> = log
            .iter()
            .filter(|b| aborted.deliver(b))
            .map(RecordBatch::base_offset)
            .collect();
        assert_eq!(delivered, vec![2, 3, 7]);
    }

    #[test]
    fn without_a_list_everything_but_markers_is_delivered() {
        let mut aborted = AbortedTransactions::new(None);
        assert!(aborted.deliver(&data(0, 7, 1)));
        assert!(!aborted.deliver(&marker(1, 7, ControlRecordType::Abort)));
        assert!(aborted.deliver(&data(2, -1, 1)));
    }

    #[test]
    fn a_transaction_listed_as_starting_later_is_not_skipped_before_it() {
        // P7 committed at 0-1, aborted from 3 on.
        let list = listed(&[(7, 3)]);
        let mut aborted = AbortedTransactions::new(Some(&list));
        assert!(aborted.deliver(&data(0, 7, 2)));
        assert!(!aborted.deliver(&marker(2, 7, ControlRecordType::Commit)));
        assert!(!aborted.deliver(&data(3, 7, 1)));
        assert!(!aborted.deliver(&marker(4, 7, ControlRecordType::Abort)));
        assert!(aborted.deliver(&data(5, 7, 1)));
    }
}
