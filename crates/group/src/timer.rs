//! Deadlines keyed by what they are for, like Kafka's coordinator timer: scheduling a key
//! again replaces its deadline, so a fired key always carries its latest deadline.

use std::collections::{BTreeSet, HashMap};

/// What a deadline is for.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum TimerKey {
    /// A member's session (or a pending member's, or a new member's join) timeout.
    Heartbeat { group_id: String, member_id: String },
    /// The end of the join phase (initial delay or rebalance timeout).
    Join { group_id: String },
    /// The rebalance timeout for members that got a JoinGroup response but did not sync.
    PendingSync { group_id: String },
    /// The periodic offsets retention check (`offsets.retention.check.interval.ms`).
    OffsetExpiration,
    /// A consumer group member's session (KIP-848).
    ConsumerSession { group_id: String, member_id: String },
    /// How long a consumer group member may take to revoke partitions (its rebalance
    /// timeout), armed while it is in UnrevokedPartitions.
    ConsumerRebalance { group_id: String, member_id: String },
    /// A share group member's session (KIP-932).
    ShareSession { group_id: String, member_id: String },
}

impl TimerKey {
    fn group_id(&self) -> Option<&str> {
        match self {
            TimerKey::Heartbeat { group_id, .. }
            | TimerKey::Join { group_id }
            | TimerKey::PendingSync { group_id }
            | TimerKey::ConsumerSession { group_id, .. }
            | TimerKey::ConsumerRebalance { group_id, .. }
            | TimerKey::ShareSession { group_id, .. } => Some(group_id),
            TimerKey::OffsetExpiration => None,
        }
    }
}

#[derive(Debug, Default)]
pub(crate) struct Timer {
    by_deadline: BTreeSet<(i64, TimerKey)>,
    by_key: HashMap<TimerKey, i64>,
}

impl Timer {
    pub(crate) fn schedule(&mut self, key: TimerKey, deadline_ms: i64) {
        if let Some(old) = self.by_key.insert(key.clone(), deadline_ms) {
            self.by_deadline.remove(&(old, key.clone()));
        }
        self.by_deadline.insert((deadline_ms, key));
    }

    pub(crate) fn cancel(&mut self, key: &TimerKey) {
        if let Some(old) = self.by_key.remove(key) {
            self.by_deadline.remove(&(old, key.clone()));
        }
    }

    pub(crate) fn is_scheduled(&self, key: &TimerKey) -> bool {
        self.by_key.contains_key(key)
    }

    /// Cancels every deadline of a group (unload, deletion).
    pub(crate) fn cancel_group(&mut self, group_id: &str) {
        let keys: Vec<TimerKey> = self
            .by_key
            .keys()
            .filter(|k| k.group_id() == Some(group_id))
            .cloned()
            .collect();
        for k in keys {
            self.cancel(&k);
        }
    }

    pub(crate) fn next_deadline(&self) -> Option<i64> {
        self.by_deadline.first().map(|(d, _)| *d)
    }

    /// Removes and returns the earliest key whose deadline is at or before `now_ms`.
    pub(crate) fn pop_expired(&mut self, now_ms: i64) -> Option<TimerKey> {
        let (deadline, _) = self.by_deadline.first()?;
        if *deadline > now_ms {
            return None;
        }
        let (_, key) = self.by_deadline.pop_first()?;
        self.by_key.remove(&key);
        Some(key)
    }
}
