//! The controller's side of log directories (KIP-858, JBOD): where each replica lives,
//! and what a failed directory takes offline.
//!
//! # Protocol
//!
//! 1. A broker registers the ids of its online log directories (`log_dirs` of its
//!    `RegisterBrokerRecord`). A new replica is placed by the controller in its broker's
//!    only directory, or left [`directory_id::UNASSIGNED`] when the broker has several
//!    ([`MetadataImage::default_dir`]); the partition's `directories` hold one id per
//!    replica.
//! 2. The broker picks a directory for an unassigned replica (the one with the fewest
//!    partitions, Kafka's policy) and reports it: [`assign_replicas_to_dirs`] records it
//!    with a `PartitionChangeRecord` that changes `directories` only (the partition epoch
//!    moves, as in Kafka). It reports the same when it finds a replica somewhere other
//!    than where the metadata says (a directory that came back empty under a new id, a
//!    replica moved by AlterReplicaLogDirs).
//! 3. When a directory fails, the broker's next heartbeat names it in
//!    `offline_log_dirs`. [`handle_directories_offline`] takes the broker out of the ISR
//!    of every partition whose replica on it is assigned to that directory, elects other
//!    leaders where it led, and drops the directory from the broker's registered
//!    `log_dirs` (`BrokerRegistrationChangeRecord`).
//! 4. From then on the replica is not acceptable (`MetadataImage::is_live_replica`,
//!    Kafka's `isAcceptableReplica`): no election picks it and no ISR expansion takes it
//!    back, until the broker registers the directory again (a restart) or places the
//!    replica in an online directory (step 2).
//!
//! # Why it is correct
//!
//! The broker stops serving a failed directory's partitions before it reports it (every
//! read and write of them answers KAFKA_STORAGE_ERROR), so nothing acknowledged after the
//! failure depends on that replica; taking it out of the ISR is then the same step as
//! fencing a broker, limited to those partitions, and the leader election that follows
//! obeys the same rules (an ISR member, or an unclean election where the topic allows).

use rill_protocol::{ErrorCode, Uuid};

use crate::api::{
    AssignReplicasToDirsRequest, AssignReplicasToDirsResponse, ControllerResponse,
    ControllerResult, ReplicaDirAssignmentResult,
};
use crate::controller::{change_record, QuorumController, Scratch, Target, REGULAR};
use crate::image::{directory_id, BrokerRegistration, MetadataImage};
use crate::record::MetadataRecord;
use rill_protocol::generated::metadata::BrokerRegistrationChangeRecord;

/// AssignReplicasToDirs (step 2): records where the broker placed each replica.
pub(crate) fn assign_replicas_to_dirs(
    req: AssignReplicasToDirsRequest,
    image: &MetadataImage,
) -> ControllerResult {
    let mut s = Scratch::new(image);
    let whole = |s: Scratch<'_>, code: ErrorCode| {
        s.finish(ControllerResponse::AssignReplicasToDirs(
            AssignReplicasToDirsResponse {
                error_code: code,
                results: Vec::new(),
            },
        ))
    };
    let Some(broker) = image.broker(req.broker_id).cloned() else {
        return whole(s, ErrorCode::BROKER_ID_NOT_REGISTERED);
    };
    if broker.epoch != req.broker_epoch {
        return whole(s, ErrorCode::STALE_BROKER_EPOCH);
    }
    let mut results = Vec::with_capacity(req.assignments.len());
    for a in &req.assignments {
        let code = assign_one(&mut s, &broker, a.topic_id, a.partition, a.directory);
        results.push(ReplicaDirAssignmentResult {
            topic_id: a.topic_id,
            partition: a.partition,
            error_code: code,
        });
    }
    s.finish(ControllerResponse::AssignReplicasToDirs(
        AssignReplicasToDirsResponse {
            error_code: ErrorCode::NONE,
            results,
        },
    ))
}

fn assign_one(
    s: &mut Scratch<'_>,
    broker: &BrokerRegistration,
    topic_id: Uuid,
    partition: i32,
    directory: Uuid,
) -> ErrorCode {
    let image = s.image();
    let Some(topic) = image.topics.get(&topic_id) else {
        return ErrorCode::UNKNOWN_TOPIC_ID;
    };
    let Some(current) = topic.partitions.get(&partition) else {
        return ErrorCode::UNKNOWN_TOPIC_OR_PARTITION;
    };
    let Some(index) = current.replicas.iter().position(|b| *b == broker.id) else {
        return ErrorCode::NOT_LEADER_OR_FOLLOWER;
    };
    if current.directory(broker.id) == directory
        && current.directories.len() == current.replicas.len()
    {
        return ErrorCode::NONE;
    }
    // The partition as it is with the new directory: a replica that comes back online
    // this way may be elected where the partition has no leader.
    let mut placed = current.clone();
    if placed.directories.len() != placed.replicas.len() {
        placed.directories = placed
            .replicas
            .iter()
            .map(|b| current.directory(*b))
            .collect();
    }
    placed.directories[index] = directory;
    let eligible = |b: i32| image.is_live(b);
    let mut record = change_record(
        image,
        topic_id,
        partition,
        &placed,
        Target::from(&placed),
        &eligible,
        REGULAR,
    )
    .unwrap_or_else(
        || rill_protocol::generated::metadata::PartitionChangeRecord {
            partition_id: partition,
            topic_id,
            leader: crate::image::NO_LEADER_CHANGE,
            ..Default::default()
        },
    );
    record.directories = Some(placed.directories);
    s.emit(MetadataRecord::PartitionChange(record));
    ErrorCode::NONE
}

/// A heartbeat named failed log directories (step 3).
pub(crate) fn handle_directories_offline(
    controller: &QuorumController,
    s: &mut Scratch<'_>,
    broker: &BrokerRegistration,
    offline: &[Uuid],
) {
    let newly_offline: Vec<Uuid> = offline
        .iter()
        .copied()
        .filter(|d| broker.log_dirs.contains(d) && !directory_id::reserved(*d))
        .collect();
    if newly_offline.is_empty() {
        return;
    }
    tracing::warn!(
        broker = broker.id,
        dirs = ?newly_offline,
        "log directories failed; moving their replicas' leaderships away"
    );
    controller.remove_from_partitions_where(s, broker.id, &|p| {
        newly_offline.contains(&p.directory(broker.id))
    });
    let online: Vec<Uuid> = broker
        .log_dirs
        .iter()
        .copied()
        .filter(|d| !newly_offline.contains(d))
        .collect();
    // An empty list would mean "no change" (a broker whose every directory failed stops
    // instead): LOST stands for none.
    let online = if online.is_empty() {
        vec![directory_id::LOST]
    } else {
        online
    };
    s.emit(MetadataRecord::BrokerRegistrationChange(
        BrokerRegistrationChangeRecord {
            broker_id: broker.id,
            broker_epoch: broker.epoch,
            log_dirs: online,
            ..Default::default()
        },
    ));
}
