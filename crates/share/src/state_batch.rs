//! The state of a range of records as it is persisted: Kafka's `RecordState` (the
//! `DeliveryState` byte of `ShareSnapshotValue`, `ShareUpdateValue` and the share-group state
//! RPCs) and `PersisterStateBatch` (a first and last offset with one state and delivery
//! count), and [`combine`], which lays newer batches over older ones the way the share
//! coordinator folds a `ShareUpdate` into its state.

use std::collections::BTreeMap;
use std::fmt;

/// Kafka's `RecordState`: where a record of a share-partition is in its delivery. The
/// numbers are the `DeliveryState` byte stored in `__share_group_state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RecordState {
    /// May be acquired by a consumer.
    Available,
    /// Acquired by one member until it acknowledges it or its acquisition lock times out.
    /// Never persisted: a failover releases every acquired record (KIP-932).
    Acquired,
    /// Accepted by a consumer: never delivered again.
    Acknowledged,
    /// Rejected, a gap, past the delivery limit, of an aborted transaction, or gone from the
    /// log: never delivered again.
    Archived,
}

impl RecordState {
    /// The `DeliveryState` byte.
    pub fn id(self) -> i8 {
        match self {
            RecordState::Available => 0,
            RecordState::Acquired => 1,
            RecordState::Acknowledged => 2,
            RecordState::Archived => 4,
        }
    }

    pub fn from_id(id: i8) -> Option<RecordState> {
        Some(match id {
            0 => RecordState::Available,
            1 => RecordState::Acquired,
            2 => RecordState::Acknowledged,
            4 => RecordState::Archived,
            _ => return None,
        })
    }

    /// Acknowledged or archived: the record's delivery is over, whatever happens next.
    pub fn is_terminal(self) -> bool {
        matches!(self, RecordState::Acknowledged | RecordState::Archived)
    }
}

impl fmt::Display for RecordState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RecordState::Available => "AVAILABLE",
            RecordState::Acquired => "ACQUIRED",
            RecordState::Acknowledged => "ACKNOWLEDGED",
            RecordState::Archived => "ARCHIVED",
        })
    }
}

/// Kafka's `PersisterStateBatch`: records `first_offset..=last_offset` share a state and a
/// delivery count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StateBatch {
    pub first_offset: i64,
    pub last_offset: i64,
    pub delivery_state: RecordState,
    pub delivery_count: i16,
}

impl StateBatch {
    pub fn new(
        first_offset: i64,
        last_offset: i64,
        delivery_state: RecordState,
        delivery_count: i16,
    ) -> Self {
        StateBatch {
            first_offset,
            last_offset,
            delivery_state,
            delivery_count,
        }
    }

    /// How many offsets it covers.
    pub fn len(&self) -> i64 {
        self.last_offset - self.first_offset + 1
    }

    pub fn is_empty(&self) -> bool {
        self.last_offset < self.first_offset
    }

    fn same_delivery(&self, other: &StateBatch) -> bool {
        self.delivery_state == other.delivery_state && self.delivery_count == other.delivery_count
    }
}

/// Lays `newer` over `current` (each offset takes the state of the last batch that covers
/// it, `newer` in order after `current`), drops what is below `start_offset` (`-1`: keep
/// everything), and returns the result sorted, without overlap, with touching batches of the
/// same state and count merged. Batches that cannot describe records (empty, a negative
/// offset, up to `i64::MAX`) are left out.
///
/// Kafka's `PersisterStateBatchCombiner` resolves an overlap by keeping the batch with the
/// higher delivery count (then state). A share-partition's leader only ever writes a record's
/// newer state, and a stale leader is fenced by its leader epoch before its write is taken,
/// so newest-wins gives the same answer on every write the coordinator accepts, and it is the
/// rule a reader can check by eye.
pub fn combine(current: &[StateBatch], newer: &[StateBatch], start_offset: i64) -> Vec<StateBatch> {
    // first offset -> batch, never overlapping.
    let mut map: BTreeMap<i64, StateBatch> = BTreeMap::new();
    for b in current.iter().chain(newer) {
        // An empty batch says nothing, and no record has a negative offset or the last one
        // (which would leave no room for the offset after it): such a batch, from a client or
        // a damaged record, is dropped rather than trusted.
        if b.is_empty() || b.first_offset < 0 || b.last_offset == i64::MAX {
            continue;
        }
        overlay(&mut map, *b);
    }
    let mut out: Vec<StateBatch> = Vec::with_capacity(map.len());
    for (_, mut b) in map {
        if start_offset >= 0 {
            if b.last_offset < start_offset {
                continue;
            }
            b.first_offset = b.first_offset.max(start_offset);
        }
        match out.last_mut() {
            Some(last) if last.last_offset + 1 == b.first_offset && last.same_delivery(&b) => {
                last.last_offset = b.last_offset;
            }
            _ => out.push(b),
        }
    }
    out
}

/// Writes `b` into `map`, cutting the batches it overlaps.
fn overlay(map: &mut BTreeMap<i64, StateBatch>, b: StateBatch) {
    // The batch that starts before `b` and reaches into it keeps its head (and its tail, if
    // it reaches past `b`).
    if let Some((_, before)) = map.range(..b.first_offset).next_back() {
        let before = *before;
        if before.last_offset >= b.first_offset {
            map.insert(
                before.first_offset,
                StateBatch {
                    last_offset: b.first_offset - 1,
                    ..before
                },
            );
            if before.last_offset > b.last_offset {
                map.insert(
                    b.last_offset + 1,
                    StateBatch {
                        first_offset: b.last_offset + 1,
                        ..before
                    },
                );
            }
        }
    }
    // Batches that start inside `b` are dropped, but for a tail past its end.
    let inside: Vec<i64> = map
        .range(b.first_offset..=b.last_offset)
        .map(|(k, _)| *k)
        .collect();
    for k in inside {
        if let Some(old) = map.remove(&k) {
            if old.last_offset > b.last_offset {
                map.insert(
                    b.last_offset + 1,
                    StateBatch {
                        first_offset: b.last_offset + 1,
                        ..old
                    },
                );
            }
        }
    }
    map.insert(b.first_offset, b);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use RecordState::*;

    fn b(f: i64, l: i64, s: RecordState, c: i16) -> StateBatch {
        StateBatch::new(f, l, s, c)
    }

    #[test]
    fn newer_batches_cut_older_ones_and_equal_neighbours_merge() {
        let current = [b(0, 9, Available, 1), b(10, 19, Acknowledged, 1)];
        let newer = [b(5, 12, Archived, 2), b(13, 19, Acknowledged, 1)];
        assert_eq!(
            combine(&current, &newer, -1),
            vec![
                b(0, 4, Available, 1),
                b(5, 12, Archived, 2),
                b(13, 19, Acknowledged, 1)
            ]
        );
        // A batch inside an older one splits it in three.
        assert_eq!(
            combine(&[b(0, 9, Available, 1)], &[b(3, 4, Acknowledged, 1)], -1),
            vec![
                b(0, 2, Available, 1),
                b(3, 4, Acknowledged, 1),
                b(5, 9, Available, 1)
            ]
        );
        // Touching batches of one state and count become one.
        assert_eq!(
            combine(&[b(0, 4, Archived, 1)], &[b(5, 9, Archived, 1)], -1),
            vec![b(0, 9, Archived, 1)]
        );
    }

    #[test]
    fn what_is_below_the_start_offset_is_dropped() {
        let current = [b(0, 9, Acknowledged, 1), b(10, 19, Available, 2)];
        assert_eq!(combine(&current, &[], 15), vec![b(15, 19, Available, 2)]);
        assert_eq!(combine(&current, &[], 30), vec![]);
    }

    fn arb_batch() -> impl Strategy<Value = StateBatch> {
        (0i64..60, 0i64..8, 0usize..3, 0i16..4).prop_map(|(f, len, s, c)| {
            let s = [Available, Acknowledged, Archived][s];
            b(f, f + len, s, c)
        })
    }

    proptest! {
        /// Every offset ends up with the state of the last batch that named it, or none.
        #[test]
        fn combine_is_an_offset_by_offset_overlay(
            current in proptest::collection::vec(arb_batch(), 0..6),
            newer in proptest::collection::vec(arb_batch(), 0..6),
            start in -1i64..40,
        ) {
            let out = combine(&current, &newer, start);
            for w in out.windows(2) {
                prop_assert!(w[0].last_offset < w[1].first_offset);
                prop_assert!(!(w[0].last_offset + 1 == w[1].first_offset && w[0].same_delivery(&w[1])));
            }
            for offset in 0..80 {
                let expected = current.iter().chain(&newer).rev()
                    .find(|b| b.first_offset <= offset && offset <= b.last_offset)
                    .filter(|_| start < 0 || offset >= start)
                    .map(|b| (b.delivery_state, b.delivery_count));
                let got = out.iter()
                    .find(|b| b.first_offset <= offset && offset <= b.last_offset)
                    .map(|b| (b.delivery_state, b.delivery_count));
                prop_assert_eq!(got, expected, "offset {}", offset);
            }
        }
    }
}
