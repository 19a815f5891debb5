//! What the controller event loop reports about its own work, for the node's metrics:
//! how long events wait on the queue and take to decide and commit, how often this node
//! became the active controller, and the partition leader elections it decided.
//!
//! The metadata crate knows no metrics library: the node installs a [`ControllerStats`]
//! sink once per process ([`set_controller_stats`]), as its other metrics are one
//! registry per process, and the loop calls it; without one, nothing is recorded.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::record::MetadataRecord;

/// Where the event loop's figures go (Kafka's `ControllerEventManager` and
/// `ControllerStats` MBeans).
pub trait ControllerStats: Send + Sync {
    /// An event was taken off the queue after `queued`, and decided and committed in
    /// `processed`.
    fn event(&self, queued: Duration, processed: Duration);
    /// This node became the active controller (of a new term).
    fn activated(&self);
    /// Committed partition leader changes: `elections` in all, `unclean` of them chose a
    /// leader outside the ISR.
    fn leader_elections(&self, elections: u64, unclean: u64);
}

static STATS: OnceLock<Arc<dyn ControllerStats>> = OnceLock::new();

/// Installs the process's sink; the first one stays.
pub fn set_controller_stats(stats: Arc<dyn ControllerStats>) {
    let _ = STATS.set(stats);
}

pub(crate) fn stats() -> Option<&'static Arc<dyn ControllerStats>> {
    STATS.get()
}

/// Leader elections among `records`: partition changes that name a leader (not "no
/// change", -2, nor "no leader", -1); an unclean one marks the partition's leader as
/// recovering, Kafka's `LeaderRecoveryState.RECOVERING`.
pub(crate) fn leader_elections(records: &[MetadataRecord]) -> (u64, u64) {
    let mut elections = 0;
    let mut unclean = 0;
    for record in records {
        if let MetadataRecord::PartitionChange(r) = record {
            if r.leader >= 0 {
                elections += 1;
                if r.leader_recovery_state == LEADER_RECOVERING {
                    unclean += 1;
                }
            }
        }
    }
    (elections, unclean)
}

/// `LeaderRecoveryState.RECOVERING`.
const LEADER_RECOVERING: i8 = 1;

#[cfg(test)]
mod tests {
    use super::*;
    use rill_protocol::generated::metadata::PartitionChangeRecord;

    fn change(leader: i32, recovery: i8) -> MetadataRecord {
        MetadataRecord::PartitionChange(PartitionChangeRecord {
            leader,
            leader_recovery_state: recovery,
            ..Default::default()
        })
    }

    #[test]
    fn only_changes_that_name_a_leader_are_elections() {
        let records = [
            change(2, -1),
            change(-2, -1), // an ISR change only
            change(-1, -1), // the partition went offline
            change(3, LEADER_RECOVERING),
        ];
        assert_eq!(leader_elections(&records), (2, 1));
        assert_eq!(leader_elections(&[]), (0, 0));
    }
}
