//! DescribeLogDirs: the log directory of this broker, what it holds and how full its
//! volume is (`kafka-log-dirs.sh --describe`, `Admin.describeLogDirs`).
//!
//! Rill keeps every log in one data directory, so the answer names one directory. As in
//! Kafka, a directory that failed is reported with KAFKA_STORAGE_ERROR and no topics;
//! a partition's offset lag is how far its log end lies behind the high watermark (zero
//! on a leader, and on a follower that is caught up); a null topic list asks for every
//! partition, and partitions asked for that this broker does not host are left out.

use std::collections::BTreeMap;

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
        let dir = self.replicas.data_dir();
        let log_dir = std::fs::canonicalize(dir)
            .unwrap_or_else(|_| dir.to_path_buf())
            .display()
            .to_string();
        // The volume's size as statvfs reports it; -1 (Kafka's "unknown") if it fails.
        let (total_bytes, usable_bytes) = match rustix::fs::statvfs(dir) {
            Ok(v) => {
                let block = v.f_frsize.max(1);
                let bytes =
                    |blocks: u64| i64::try_from(blocks.saturating_mul(block)).unwrap_or(i64::MAX);
                (bytes(v.f_blocks), bytes(v.f_bavail))
            }
            Err(_) => (-1, -1),
        };
        if self.replicas.log_dir_failure().is_offline() {
            return DescribeLogDirsResponse {
                results: vec![DescribeLogDirsResult {
                    error_code: ErrorCode::KAFKA_STORAGE_ERROR.code(),
                    log_dir,
                    total_bytes,
                    usable_bytes,
                    ..Default::default()
                }],
                ..Default::default()
            };
        }
        let wanted = |topic: &str, partition: i32| match &request.topics {
            None => true,
            Some(topics) => topics
                .iter()
                .any(|t| t.topic == topic && t.partitions.contains(&partition)),
        };
        let mut topics: BTreeMap<String, Vec<DescribeLogDirsPartition>> = BTreeMap::new();
        for (tp, partition) in self.replicas.partitions() {
            if !wanted(&tp.topic, tp.partition) {
                continue;
            }
            let Ok((size, hw, leo)) = partition
                .with_log(|log| (log.size_bytes(), log.high_watermark(), log.log_end_offset()))
            else {
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
        }
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
        DescribeLogDirsResponse {
            results: vec![DescribeLogDirsResult {
                error_code: ErrorCode::NONE.code(),
                log_dir,
                topics,
                total_bytes,
                usable_bytes,
                ..Default::default()
            }],
            ..Default::default()
        }
    }
}
