//! DescribeLogDirs: the log directories of this broker (`log.dirs`), what each holds and
//! how full its volume is (`kafka-log-dirs.sh --describe`, `Admin.describeLogDirs`); a
//! replica being moved shows in its destination as the future replica
//! (`is_future_key`). AlterReplicaLogDirs: moving replicas between them
//! (`kafka-reassign-partitions.sh` with `log_dirs`, `Admin.alterReplicaLogDirs`); the move
//! itself is the replica manager's (`replica_manager::alter_log_dirs`).
//!
//! As in Kafka, a directory that failed is reported with KAFKA_STORAGE_ERROR and no
//! topics;
//! a partition's offset lag is how far its log end lies behind the high watermark (zero
//! on a leader, and on a follower that is caught up); a null topic list asks for every
//! partition, and partitions asked for that this broker does not host are left out.

use std::collections::BTreeMap;

use rill_protocol::generated::alter_replica_log_dirs_request::AlterReplicaLogDirsRequest;
use rill_protocol::generated::alter_replica_log_dirs_response::{
    AlterReplicaLogDirPartitionResult, AlterReplicaLogDirTopicResult, AlterReplicaLogDirsResponse,
};
use rill_protocol::generated::describe_log_dirs_request::DescribeLogDirsRequest;
use rill_protocol::generated::describe_log_dirs_response::{
    DescribeLogDirsPartition, DescribeLogDirsResponse, DescribeLogDirsResult, DescribeLogDirsTopic,
};
use rill_protocol::ErrorCode;

use crate::server::Broker;

impl Broker {
    pub(crate) fn handle_describe_log_dirs(
        &self,
        request: DescribeLogDirsRequest,
    ) -> DescribeLogDirsResponse {
        let wanted = |topic: &str, partition: i32| match &request.topics {
            None => true,
            Some(topics) => topics
                .iter()
                .any(|t| t.topic == topic && t.partitions.contains(&partition)),
        };
        let mut by_dir: Vec<BTreeMap<String, Vec<DescribeLogDirsPartition>>> =
            vec![BTreeMap::new(); self.replicas.log_dirs().len()];
        for (tp, partition) in self.replicas.partitions() {
            if !wanted(&tp.topic, tp.partition) {
                continue;
            }
            let Ok((size, hw, leo)) = partition
                .with_log(|log| (log.size_bytes(), log.high_watermark(), log.log_end_offset()))
            else {
                continue;
            };
            let Some(topics) = by_dir.get_mut(partition.log_dir()) else {
                continue;
            };
            topics
                .entry(tp.topic.clone())
                .or_default()
                .push(DescribeLogDirsPartition {
                    partition_index: tp.partition,
                    partition_size: i64::try_from(size).unwrap_or(i64::MAX),
                    offset_lag: (hw - leo).max(0),
                    is_future_key: false,
                    ..Default::default()
                });
            // A replica being moved shows in its destination too, as the future replica,
            // its lag how far it is behind the current log (Kafka's `isFuture`).
            if let Some((dir, size, lag)) = partition.future_replica() {
                if let Some(topics) = by_dir.get_mut(dir) {
                    topics
                        .entry(tp.topic.clone())
                        .or_default()
                        .push(DescribeLogDirsPartition {
                            partition_index: tp.partition,
                            partition_size: i64::try_from(size).unwrap_or(i64::MAX),
                            offset_lag: lag,
                            is_future_key: true,
                            ..Default::default()
                        });
                }
            }
        }
        let failures = self.replicas.log_dir_failure();
        let results = self
            .replicas
            .log_dirs()
            .into_iter()
            .zip(by_dir)
            .enumerate()
            .map(|(index, (dir, topics))| {
                let log_dir = std::fs::canonicalize(&dir.path)
                    .unwrap_or_else(|_| dir.path.clone())
                    .display()
                    .to_string();
                if failures.is_offline(index) {
                    // As Kafka: the error and the path, nothing it would have to read.
                    return DescribeLogDirsResult {
                        error_code: ErrorCode::KAFKA_STORAGE_ERROR.code(),
                        log_dir,
                        ..Default::default()
                    };
                }
                // The volume's size as statvfs reports it; -1 (Kafka's "unknown") if it
                // fails.
                let (total_bytes, usable_bytes) = match rustix::fs::statvfs(&dir.path) {
                    Ok(v) => {
                        let block = v.f_frsize.max(1);
                        let bytes = |blocks: u64| {
                            i64::try_from(blocks.saturating_mul(block)).unwrap_or(i64::MAX)
                        };
                        (bytes(v.f_blocks), bytes(v.f_bavail))
                    }
                    Err(_) => (-1, -1),
                };
                let topics = topics
                    .into_iter()
                    .map(|(name, mut partitions)| {
                        partitions.sort_by_key(|p| p.partition_index);
                        DescribeLogDirsTopic {
                            name,
                            partitions,
                            ..Default::default()
                        }
                    })
                    .collect();
                DescribeLogDirsResult {
                    error_code: ErrorCode::NONE.code(),
                    log_dir,
                    topics,
                    total_bytes,
                    usable_bytes,
                    ..Default::default()
                }
            })
            .collect();
        DescribeLogDirsResponse {
            results,
            ..Default::default()
        }
    }

    pub(crate) fn handle_alter_replica_log_dirs(
        &self,
        request: AlterReplicaLogDirsRequest,
    ) -> AlterReplicaLogDirsResponse {
        let mut results: Vec<AlterReplicaLogDirTopicResult> = Vec::new();
        for dir in &request.dirs {
            for topic in &dir.topics {
                let partitions = topic.partitions.iter().map(|&partition_index| {
                    let tp = rill_storage::TopicPartition::new(topic.name.clone(), partition_index);
                    let code = self.replicas.alter_replica_log_dir(&tp, &dir.path);
                    AlterReplicaLogDirPartitionResult {
                        partition_index,
                        error_code: code.code(),
                        ..Default::default()
                    }
                });
                // One result per topic, as Kafka groups them.
                match results.iter_mut().find(|r| r.topic_name == topic.name) {
                    Some(r) => r.partitions.extend(partitions),
                    None => {
                        let partitions = partitions.collect();
                        results.push(AlterReplicaLogDirTopicResult {
                            topic_name: topic.name.clone(),
                            partitions,
                            ..Default::default()
                        });
                    }
                }
            }
        }
        AlterReplicaLogDirsResponse {
            results,
            ..Default::default()
        }
    }
}
