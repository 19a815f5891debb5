//! The follower's side of KIP-227's incremental fetch sessions (Kafka's
//! `FetchSessionHandler`): which partitions a replica fetch names, and what an answer
//! does to the session. Pure; the fetcher (`replica_fetcher`) sends and reads.
//!
//! # Protocol
//! 1. Without a session the fetch is *full* (epoch 0): it names every partition, and the
//!    leader answers with the id of the session it opened (0 when it opened none: the
//!    next fetch is full again).
//! 2. In a session the fetch is *incremental* (the session's next epoch): it names only
//!    the partitions whose fetch position, log start, leader epoch or size limit changed
//!    since they were last named, and forgets those no longer fetched. The leader answers
//!    only the partitions with something new; an absent one has nothing.
//! 3. A session error (FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH, ...), an
//!    answer naming a partition outside the session, or session id 0 in answer to an
//!    incremental fetch: the answer's partitions are not used, and the next fetch is full.
//!    A new connection starts without a session.

use std::collections::HashMap;

use rill_protocol::generated::fetch_request::{FetchPartition, FetchTopic, ForgottenTopic};
use rill_protocol::generated::fetch_response::FetchResponse;
use rill_protocol::ErrorCode;
use rill_storage::TopicPartition;

/// The epoch after `epoch` (Kafka's `FetchMetadata.nextEpoch`).
fn next_epoch(epoch: i32) -> i32 {
    if epoch < 0 {
        -1
    } else if epoch == i32::MAX {
        1
    } else {
        epoch + 1
    }
}

/// What one fetch sends (step 1 or 2).
#[derive(Debug, Default)]
pub struct SessionFetch {
    pub session_id: i32,
    pub session_epoch: i32,
    pub topics: Vec<FetchTopic>,
    pub forgotten: Vec<ForgottenTopic>,
    /// Whether it named every partition.
    pub full: bool,
}

/// One follower connection's fetch session with its leader.
#[derive(Debug, Default)]
pub struct FetchSessionHandler {
    /// 0 without a session.
    id: i32,
    /// The epoch of the next fetch: 0 for a full one.
    epoch: i32,
    /// Each partition as the session holds it (as it was last named), and the last
    /// build that wanted it.
    partitions: HashMap<TopicPartition, (FetchPartition, u64)>,
    generation: u64,
}

impl FetchSessionHandler {
    /// Steps 1 and 2: the fetch for `wanted`, in its order. The session is taken to hold
    /// `wanted` from here on; [`Self::answered`] says whether the leader agreed.
    pub fn build(&mut self, wanted: Vec<(TopicPartition, FetchPartition)>) -> SessionFetch {
        let full = self.epoch == 0;
        if full {
            self.partitions.clear();
        }
        self.generation = self.generation.wrapping_add(1);
        let generation = self.generation;
        let mut topics: Vec<FetchTopic> = Vec::new();
        for (tp, p) in wanted {
            let named = match self.partitions.get_mut(&tp) {
                Some((had, seen)) => {
                    *seen = generation;
                    let changed = had.fetch_offset != p.fetch_offset
                        || had.log_start_offset != p.log_start_offset
                        || had.current_leader_epoch != p.current_leader_epoch
                        || had.last_fetched_epoch != p.last_fetched_epoch
                        || had.partition_max_bytes != p.partition_max_bytes;
                    if changed {
                        *had = p.clone();
                    }
                    full || changed
                }
                None => {
                    self.partitions.insert(tp.clone(), (p.clone(), generation));
                    true
                }
            };
            if named {
                match topics.last_mut() {
                    Some(t) if t.topic == tp.topic => t.partitions.push(p),
                    _ => topics.push(FetchTopic {
                        topic: tp.topic,
                        partitions: vec![p],
                        ..Default::default()
                    }),
                }
            }
        }
        let mut forgotten: Vec<ForgottenTopic> = Vec::new();
        if !full {
            let mut gone: Vec<TopicPartition> = self
                .partitions
                .iter()
                .filter(|(_, (_, seen))| *seen != generation)
                .map(|(tp, _)| tp.clone())
                .collect();
            gone.sort();
            for tp in gone {
                self.partitions.remove(&tp);
                match forgotten.last_mut() {
                    Some(t) if t.topic == tp.topic => t.partitions.push(tp.partition),
                    _ => forgotten.push(ForgottenTopic {
                        topic: tp.topic,
                        partitions: vec![tp.partition],
                        ..Default::default()
                    }),
                }
            }
        }
        SessionFetch {
            session_id: self.id,
            session_epoch: self.epoch,
            topics,
            forgotten,
            full,
        }
    }

    /// Step 3, for the answer to `sent`: whether its partitions may be used.
    pub fn answered(&mut self, sent: &SessionFetch, response: &FetchResponse) -> bool {
        if response.error_code != ErrorCode::NONE.code() {
            self.reset();
            return false;
        }
        if sent.full {
            self.id = response.session_id;
            self.epoch = if response.session_id == 0 { 0 } else { 1 };
            return true;
        }
        if response.session_id == 0 {
            self.reset();
            return false;
        }
        let outside = response.responses.iter().any(|t| {
            t.partitions.iter().any(|p| {
                !self.partitions.contains_key(&TopicPartition {
                    topic: t.topic.clone(),
                    partition: p.partition_index,
                })
            })
        });
        if outside || response.session_id != self.id {
            self.reset();
            return false;
        }
        self.epoch = next_epoch(self.epoch);
        true
    }

    /// Forgets the session: the next fetch is full.
    pub fn reset(&mut self) {
        self.id = 0;
        self.epoch = 0;
        self.partitions.clear();
    }
}

#[cfg(test)]
mod tests {
    use rill_protocol::generated::fetch_response::{FetchableTopicResponse, PartitionData};

    use super::*;

    fn tp(topic: &str, partition: i32) -> TopicPartition {
        TopicPartition {
            topic: topic.into(),
            partition,
        }
    }

    fn wanted(parts: &[(&str, i32, i64)]) -> Vec<(TopicPartition, FetchPartition)> {
        parts
            .iter()
            .map(|&(t, p, offset)| {
                (
                    tp(t, p),
                    FetchPartition {
                        partition: p,
                        fetch_offset: offset,
                        partition_max_bytes: 1 << 20,
                        ..Default::default()
                    },
                )
            })
            .collect()
    }

    fn named(fetch: &SessionFetch) -> Vec<(String, i32, i64)> {
        fetch
            .topics
            .iter()
            .flat_map(|t| {
                t.partitions
                    .iter()
                    .map(|p| (t.topic.clone(), p.partition, p.fetch_offset))
            })
            .collect()
    }

    fn answer(session_id: i32, parts: &[(&str, i32)]) -> FetchResponse {
        FetchResponse {
            session_id,
            responses: parts
                .iter()
                .map(|&(t, p)| FetchableTopicResponse {
                    topic: t.into(),
                    partitions: vec![PartitionData {
                        partition_index: p,
                        ..Default::default()
                    }],
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn a_session_names_only_what_changed_and_forgets_what_left() {
        let mut h = FetchSessionHandler::default();
        let first = h.build(wanted(&[("a", 0, 0), ("a", 1, 0), ("b", 0, 0)]));
        assert!(first.full);
        assert_eq!((first.session_id, first.session_epoch), (0, 0));
        assert_eq!(named(&first).len(), 3);
        assert!(h.answered(&first, &answer(42, &[("a", 0), ("a", 1), ("b", 0)])));

        // a:1 moved on; b:0 is no longer fetched.
        let next = h.build(wanted(&[("a", 0, 0), ("a", 1, 5)]));
        assert!(!next.full);
        assert_eq!((next.session_id, next.session_epoch), (42, 1));
        assert_eq!(named(&next), vec![("a".into(), 1, 5)]);
        assert_eq!(next.forgotten.len(), 1);
        assert_eq!(
            (
                next.forgotten[0].topic.as_str(),
                next.forgotten[0].partitions.as_slice()
            ),
            ("b", &[0][..])
        );
        assert!(h.answered(&next, &answer(42, &[("a", 1)])));

        // Nothing changed: nothing named, the epoch moves on.
        let idle = h.build(wanted(&[("a", 0, 0), ("a", 1, 5)]));
        assert!(idle.topics.is_empty() && idle.forgotten.is_empty());
        assert_eq!(idle.session_epoch, 2);
        assert!(h.answered(&idle, &answer(42, &[])));
        assert_eq!(h.build(wanted(&[("a", 0, 0)])).session_epoch, 3);
    }

    #[test]
    fn no_session_opened_means_full_fetches() {
        let mut h = FetchSessionHandler::default();
        let first = h.build(wanted(&[("a", 0, 0)]));
        assert!(h.answered(&first, &answer(0, &[("a", 0)])));
        let again = h.build(wanted(&[("a", 0, 3)]));
        assert!(again.full);
        assert_eq!((again.session_id, again.session_epoch), (0, 0));
    }

    #[test]
    fn session_errors_and_strange_answers_start_over() {
        for bad in [
            FetchResponse {
                error_code: ErrorCode::FETCH_SESSION_ID_NOT_FOUND.code(),
                ..Default::default()
            },
            FetchResponse {
                error_code: ErrorCode::INVALID_FETCH_SESSION_EPOCH.code(),
                session_id: 42,
                ..Default::default()
            },
            // Closed by the leader.
            answer(0, &[]),
            // A partition the session does not hold.
            answer(42, &[("z", 9)]),
            // Another session's answer.
            answer(43, &[]),
        ] {
            let mut h = FetchSessionHandler::default();
            let first = h.build(wanted(&[("a", 0, 0)]));
            assert!(h.answered(&first, &answer(42, &[("a", 0)])));
            let next = h.build(wanted(&[("a", 0, 1)]));
            assert!(!next.full);
            assert!(!h.answered(&next, &bad), "{bad:?}");
            let after = h.build(wanted(&[("a", 0, 1)]));
            assert!(after.full, "{bad:?}");
            assert_eq!((after.session_id, after.session_epoch), (0, 0));
            assert_eq!(named(&after), vec![("a".into(), 0, 1)]);
        }
    }
}
