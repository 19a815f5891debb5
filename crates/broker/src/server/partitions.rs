//! Partition administration: ElectLeaders, AlterPartitionReassignments and
//! ListPartitionReassignments.
//!
//! ElectLeaders and AlterPartitionReassignments become one event each for the active
//! controller, which decides every partition in one batch of records; the answer goes
//! back once this broker has applied that batch, so the client's next Metadata request
//! here already shows the new leaders or the reassignment under way. The per-partition
//! error codes are the controller's, unchanged (ELECTION_NOT_NEEDED,
//! PREFERRED_LEADER_NOT_AVAILABLE, ELIGIBLE_LEADERS_NOT_AVAILABLE,
//! UNKNOWN_TOPIC_OR_PARTITION, INVALID_REPLICA_ASSIGNMENT, NO_REASSIGNMENT_IN_PROGRESS).
//!
//! ListPartitionReassignments is answered from this broker's image, as a KRaft
//! controller answers it from its own state: a partition is being reassigned while its
//! `adding_replicas` or `removing_replicas` is non-empty, and unknown topics or
//! partitions are left out rather than reported as errors.

use rill_metadata::{
    AlterPartitionReassignmentsRequest as CtlAlterReassignments, ControllerEvent,
    ControllerResponse, ElectLeadersRequest as CtlElectLeaders, ElectionType, MetadataImage,
    PartitionRegistration,
};
use rill_protocol::generated::alter_partition_reassignments_request::AlterPartitionReassignmentsRequest;
use rill_protocol::generated::alter_partition_reassignments_response::{
    AlterPartitionReassignmentsResponse, ReassignablePartitionResponse, ReassignableTopicResponse,
};
use rill_protocol::generated::elect_leaders_request::ElectLeadersRequest;
use rill_protocol::generated::elect_leaders_response::{
    ElectLeadersResponse, PartitionResult, ReplicaElectionResult,
};
use rill_protocol::generated::list_partition_reassignments_request::ListPartitionReassignmentsRequest;
use rill_protocol::generated::list_partition_reassignments_response::{
    ListPartitionReassignmentsResponse, OngoingPartitionReassignment, OngoingTopicReassignment,
};
use rill_protocol::ErrorCode;

use crate::server::Broker;

/// One partition's outcome as the wire wants it: `(topic, partition, code, message)`.
type Outcome = (String, i32, ErrorCode, Option<String>);
/// A partition's outcome within its topic: `(partition, code, message)`.
type PartitionOutcome = (i32, ErrorCode, Option<String>);

/// Groups outcomes by topic in the order each topic first appears, which is the order of
/// the request (or of the controller's walk over all topics), as Kafka's controller does.
fn by_topic(outcomes: Vec<Outcome>) -> Vec<(String, Vec<PartitionOutcome>)> {
    let mut grouped: Vec<(String, Vec<PartitionOutcome>)> = Vec::new();
    for (topic, partition, code, message) in outcomes {
        match grouped.iter_mut().find(|(t, _)| *t == topic) {
            Some((_, partitions)) => partitions.push((partition, code, message)),
            None => grouped.push((topic, vec![(partition, code, message)])),
        }
    }
    grouped
}

/// The controller's per-partition results as outcomes.
fn outcomes(results: Vec<rill_metadata::PartitionResult>) -> Vec<Outcome> {
    results
        .into_iter()
        .map(|r| (r.topic, r.partition, r.error_code, r.error_message))
        .collect()
}

/// Every requested partition failed with the same error (the controller could not be
/// reached, or the request itself is invalid), as Kafka's `getErrorResponse` reports it.
fn all_failed(requested: &[(String, i32)], code: ErrorCode, message: &str) -> Vec<Outcome> {
    requested
        .iter()
        .map(|(t, p)| (t.clone(), *p, code, Some(message.to_string())))
        .collect()
}

/// One partition under reassignment as ListPartitionReassignments shows it: all its
/// current replicas (targets first, then those being removed), and the two deltas.
fn ongoing(partition_index: i32, p: &PartitionRegistration) -> OngoingPartitionReassignment {
    OngoingPartitionReassignment {
        partition_index,
        replicas: p.replicas.clone(),
        adding_replicas: p.adding_replicas.clone(),
        removing_replicas: p.removing_replicas.clone(),
        ..Default::default()
    }
}

/// The reassignments in progress in `image`: of every topic when `topics` is `None`,
/// else of the named partitions (unknown or settled ones are left out).
pub(crate) fn list_reassignments(
    image: &MetadataImage,
    topics: Option<&[(String, Vec<i32>)]>,
) -> Vec<OngoingTopicReassignment> {
    let mut out = Vec::new();
    match topics {
        None => {
            // By name, so that the listing is stable from one call to the next.
            for (name, id) in &image.topics_by_name {
                let Some(t) = image.topics.get(id) else {
                    continue;
                };
                let partitions: Vec<_> = t
                    .partitions
                    .iter()
                    .filter(|(_, p)| p.is_reassigning())
                    .map(|(i, p)| ongoing(*i, p))
                    .collect();
                if !partitions.is_empty() {
                    out.push(OngoingTopicReassignment {
                        name: name.clone(),
                        partitions,
                        ..Default::default()
                    });
                }
            }
        }
        Some(requested) => {
            for (name, indexes) in requested {
                let Some(t) = image.topic(name) else {
                    continue;
                };
                let partitions: Vec<_> = indexes
                    .iter()
                    .filter_map(|i| {
                        t.partitions
                            .get(i)
                            .filter(|p| p.is_reassigning())
                            .map(|p| ongoing(*i, p))
                    })
                    .collect();
                if !partitions.is_empty() {
                    out.push(OngoingTopicReassignment {
                        name: name.clone(),
                        partitions,
                        ..Default::default()
                    });
                }
            }
        }
    }
    out
}

impl Broker {
    pub(crate) async fn handle_elect_leaders(
        &self,
        request: ElectLeadersRequest,
        version: i16,
    ) -> ElectLeadersResponse {
        let requested: Option<Vec<(String, i32)>> = request.topic_partitions.map(|topics| {
            topics
                .into_iter()
                .flat_map(|t| {
                    let topic = t.topic;
                    t.partitions.into_iter().map(move |p| (topic.clone(), p))
                })
                .collect()
        });
        // v0 has no election type: it always meant the preferred replica.
        let election_type = match (version, request.election_type) {
            (0, _) | (_, 0) => Some(ElectionType::Preferred),
            (_, 1) => Some(ElectionType::Unclean),
            _ => None,
        };
        let (error_code, outcomes) = match election_type {
            None => {
                let message = format!("unknown election type {}", request.election_type);
                let code = ErrorCode::INVALID_REQUEST;
                (
                    code,
                    all_failed(requested.as_deref().unwrap_or_default(), code, &message),
                )
            }
            Some(election_type) => {
                let event = ControllerEvent::ElectLeaders(CtlElectLeaders {
                    election_type,
                    partitions: requested.clone(),
                });
                match self.controller_call(event).await {
                    Ok(ControllerResponse::ElectLeaders(results)) => {
                        for r in results.iter().filter(|r| r.error_code == ErrorCode::NONE) {
                            tracing::info!(
                                topic = %r.topic, partition = r.partition, ?election_type,
                                "elected leader"
                            );
                        }
                        (ErrorCode::NONE, outcomes(results))
                    }
                    Ok(_) => {
                        let code = ErrorCode::UNKNOWN_SERVER_ERROR;
                        let requested = requested.as_deref().unwrap_or_default();
                        (
                            code,
                            all_failed(requested, code, "unexpected controller answer"),
                        )
                    }
                    Err(code) => {
                        let message = format!("controller: {}", code.name());
                        let requested = requested.as_deref().unwrap_or_default();
                        (code, all_failed(requested, code, &message))
                    }
                }
            }
        };
        ElectLeadersResponse {
            error_code: error_code.code(),
            replica_election_results: by_topic(outcomes)
                .into_iter()
                .map(|(topic, partitions)| ReplicaElectionResult {
                    topic,
                    partition_result: partitions
                        .into_iter()
                        .map(|(partition_id, code, message)| PartitionResult {
                            partition_id,
                            error_code: code.code(),
                            error_message: message,
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    pub(crate) async fn handle_alter_partition_reassignments(
        &self,
        request: AlterPartitionReassignmentsRequest,
    ) -> AlterPartitionReassignmentsResponse {
        let partitions: Vec<(String, i32, Option<Vec<i32>>)> = request
            .topics
            .into_iter()
            .flat_map(|t| {
                let topic = t.name;
                t.partitions
                    .into_iter()
                    .map(move |p| (topic.clone(), p.partition_index, p.replicas))
            })
            .collect();
        // Version 1 (KIP-860) may forbid a new replica count: a partition whose target has
        // another count than its replicas (those it had before an ongoing reassignment
        // began) is refused here and not sent to the controller.
        let allow_rf_change = request.allow_replication_factor_change;
        let mut refused: Vec<Outcome> = Vec::new();
        let partitions: Vec<(String, i32, Option<Vec<i32>>)> = if allow_rf_change {
            partitions
        } else {
            let image = self.image();
            partitions
                .into_iter()
                .filter(|(topic, partition, target)| {
                    let (Some(target), Some(current)) =
                        (target, image.partition(topic, *partition))
                    else {
                        return true;
                    };
                    // As Kafka, a target that is no valid assignment (empty, a replica twice,
                    // a broker not registered) is the controller's INVALID_REPLICA_ASSIGNMENT
                    // first.
                    let distinct: std::collections::BTreeSet<&i32> = target.iter().collect();
                    if target.is_empty()
                        || distinct.len() != target.len()
                        || target.iter().any(|b| !image.brokers.contains_key(b))
                    {
                        return true;
                    }
                    let before = current
                        .replicas
                        .iter()
                        .filter(|r| !current.adding_replicas.contains(r))
                        .count();
                    if target.len() == before {
                        return true;
                    }
                    refused.push((
                        topic.clone(),
                        *partition,
                        ErrorCode::INVALID_REPLICATION_FACTOR,
                        Some(format!(
                            "The replication factor is changed from {before} to {} but \
                             allowReplicationFactorChange is false.",
                            target.len()
                        )),
                    ));
                    false
                })
                .collect()
        };
        let requested: Vec<(String, i32)> =
            partitions.iter().map(|(t, p, _)| (t.clone(), *p)).collect();
        let mut response = AlterPartitionReassignmentsResponse {
            allow_replication_factor_change: allow_rf_change,
            ..Default::default()
        };
        let outcomes = if partitions.is_empty() {
            Vec::new()
        } else {
            let event = ControllerEvent::AlterPartitionReassignments(CtlAlterReassignments {
                partitions: partitions.clone(),
            });
            match self.controller_call(event).await {
                Ok(ControllerResponse::AlterPartitionReassignments(results)) => {
                    for r in results.iter().filter(|r| r.error_code == ErrorCode::NONE) {
                        let target = partitions
                            .iter()
                            .find(|(t, p, _)| *t == r.topic && *p == r.partition)
                            .and_then(|(_, _, target)| target.as_ref());
                        match target {
                            Some(replicas) => tracing::info!(
                                topic = %r.topic, partition = r.partition, ?replicas,
                                "reassigning partition"
                            ),
                            None => tracing::info!(
                                topic = %r.topic, partition = r.partition,
                                "cancelled partition reassignment"
                            ),
                        }
                    }
                    outcomes(results)
                }
                Ok(_) => {
                    let code = ErrorCode::UNKNOWN_SERVER_ERROR;
                    response.error_code = code.code();
                    all_failed(&requested, code, "unexpected controller answer")
                }
                Err(code) => {
                    // Kafka puts a request-wide failure in the top-level error and repeats it
                    // for every partition, so that clients reading either see it.
                    let message = format!("controller: {}", code.name());
                    response.error_code = code.code();
                    response.error_message = Some(message.clone());
                    all_failed(&requested, code, &message)
                }
            }
        };
        response.responses = by_topic(outcomes.into_iter().chain(refused).collect())
            .into_iter()
            .map(|(name, partitions)| ReassignableTopicResponse {
                name,
                partitions: partitions
                    .into_iter()
                    .map(
                        |(partition_index, code, message)| ReassignablePartitionResponse {
                            partition_index,
                            error_code: code.code(),
                            error_message: message,
                            ..Default::default()
                        },
                    )
                    .collect(),
                ..Default::default()
            })
            .collect();
        response
    }

    pub(crate) fn handle_list_partition_reassignments(
        &self,
        request: ListPartitionReassignmentsRequest,
    ) -> ListPartitionReassignmentsResponse {
        let requested: Option<Vec<(String, Vec<i32>)>> = request.topics.map(|topics| {
            topics
                .into_iter()
                .map(|t| (t.name, t.partition_indexes))
                .collect()
        });
        ListPartitionReassignmentsResponse {
            topics: list_reassignments(&self.image(), requested.as_deref()),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use rill_metadata::TopicImage;
    use rill_protocol::Uuid;

    use super::*;

    fn partition(replicas: &[i32], adding: &[i32], removing: &[i32]) -> PartitionRegistration {
        PartitionRegistration {
            replicas: replicas.to_vec(),
            isr: replicas.to_vec(),
            removing_replicas: removing.to_vec(),
            adding_replicas: adding.to_vec(),
            leader: replicas[0],
            leader_recovery_state: 0,
            leader_epoch: 0,
            partition_epoch: 0,
            directories: vec![],
        }
    }

    fn image() -> MetadataImage {
        let mut image = MetadataImage::new();
        let topics = [
            (
                "b",
                Uuid([2; 16]),
                vec![
                    partition(&[1, 2], &[], &[]),
                    partition(&[3, 1, 2], &[3], &[2]),
                ],
            ),
            (
                "a",
                Uuid([1; 16]),
                vec![partition(&[2, 3, 1], &[2, 3], &[1])],
            ),
            ("c", Uuid([3; 16]), vec![partition(&[1], &[], &[])]),
        ];
        for (name, id, partitions) in topics {
            image.topics_by_name.insert(name.to_string(), id);
            image.topics.insert(
                id,
                TopicImage {
                    name: name.to_string(),
                    id,
                    partitions: partitions
                        .into_iter()
                        .enumerate()
                        .map(|(i, p)| (i32::try_from(i).unwrap(), p))
                        .collect::<BTreeMap<_, _>>(),
                },
            );
        }
        image
    }

    #[test]
    fn listing_everything_shows_only_partitions_being_reassigned_by_topic_name() {
        let listed = list_reassignments(&image(), None);
        let names: Vec<&str> = listed.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        let b = &listed[1].partitions;
        assert_eq!(b.len(), 1);
        assert_eq!(b[0].partition_index, 1);
        assert_eq!(b[0].replicas, [3, 1, 2]);
        assert_eq!(b[0].adding_replicas, [3]);
        assert_eq!(b[0].removing_replicas, [2]);
    }

    #[test]
    fn listing_named_partitions_leaves_out_unknown_and_settled_ones() {
        let asked = vec![
            ("b".to_string(), vec![0, 1, 7]),
            ("nope".to_string(), vec![0]),
            ("c".to_string(), vec![0]),
        ];
        let listed = list_reassignments(&image(), Some(&asked));
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].name, "b");
        assert_eq!(listed[0].partitions.len(), 1);
        assert_eq!(listed[0].partitions[0].partition_index, 1);
    }

    #[test]
    fn outcomes_are_grouped_by_topic_in_first_seen_order() {
        let grouped = by_topic(vec![
            ("y".into(), 0, ErrorCode::NONE, None),
            ("x".into(), 1, ErrorCode::ELECTION_NOT_NEEDED, None),
            (
                "y".into(),
                2,
                ErrorCode::PREFERRED_LEADER_NOT_AVAILABLE,
                None,
            ),
        ]);
        assert_eq!(grouped.len(), 2);
        assert_eq!(grouped[0].0, "y");
        assert_eq!(
            grouped[0].1.iter().map(|(p, _, _)| *p).collect::<Vec<_>>(),
            [0, 2]
        );
        assert_eq!(grouped[1].0, "x");
    }

    #[test]
    fn a_request_wide_failure_is_repeated_for_every_partition() {
        let asked = vec![("t".to_string(), 0), ("t".to_string(), 1)];
        let failed = all_failed(&asked, ErrorCode::REQUEST_TIMED_OUT, "controller");
        assert_eq!(failed.len(), 2);
        assert!(failed
            .iter()
            .all(|(_, _, c, m)| *c == ErrorCode::REQUEST_TIMED_OUT && m.is_some()));
    }
}
