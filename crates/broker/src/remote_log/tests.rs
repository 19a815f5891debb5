//! The store's copies and the read cache, against `object_store`'s in-memory store (the
//! S3 path is the e2e suite's, `tests/e2e/test_tiered_storage.py`, against moto).

use std::collections::BTreeMap;
use std::sync::Arc;

use object_store::memory::InMemory;
use rill_metadata::{RemoteLogSegmentMetadata, RemoteLogSegmentState};
use rill_protocol::records::{CompressionType, RecordBatchBuilder};
use rill_protocol::Uuid;
use rill_storage::{AppendOrigin, LogConfig, PreviousShutdown, RemoteCopyCandidate, UnifiedLog};

use super::reader::RemoteLogReader;
use super::storage::{RemotePartition, RemoteStorageManager};

const T0: i64 = 1_700_000_000_000;

fn tiered_log(dir: &std::path::Path) -> UnifiedLog {
    let config = LogConfig {
        segment_bytes: 4096,
        remote_storage_enable: true,
        ..LogConfig::default()
    };
    let mut log = UnifiedLog::open(dir, config, T0, PreviousShutdown::Unclean).unwrap();
    for i in 0..200i64 {
        let mut b = RecordBatchBuilder::new(CompressionType::None, 0);
        let value = format!("value-{i:05}-{}", "x".repeat(200));
        b.append(
            T0 + i,
            Some(format!("k{i}").as_bytes()),
            Some(value.as_bytes()),
            &[],
        )
        .unwrap();
        log.append_as_leader(b.build().unwrap(), 3, AppendOrigin::Client, T0 + i)
            .unwrap();
    }
    let end = log.log_end_offset();
    log.update_high_watermark(end);
    log
}

fn partition() -> RemotePartition {
    RemotePartition {
        topic: "t".into(),
        topic_id: Uuid::from_u64_pair(1, 2),
        partition: 0,
    }
}

fn metadata(c: &RemoteCopyCandidate, id: Uuid) -> RemoteLogSegmentMetadata {
    RemoteLogSegmentMetadata {
        segment_id: id,
        start_offset: c.base_offset,
        end_offset: c.end_offset,
        broker_id: 1,
        max_timestamp_ms: c.max_timestamp,
        event_timestamp_ms: T0,
        segment_leader_epochs: BTreeMap::from([(3, c.base_offset)]),
        segment_size_in_bytes: c.size_bytes as i32,
        state: RemoteLogSegmentState::CopySegmentFinished,
    }
}

#[tokio::test]
async fn copies_read_back_like_the_log_and_the_cache_keeps_to_its_bound() {
    let dir = tempfile::tempdir().unwrap();
    let log = tiered_log(&dir.path().join("t-0"));
    let candidates = log.remote_copy_candidates(-1);
    assert!(candidates.len() >= 3, "{}", candidates.len());
    let store = Arc::new(InMemory::new());
    let rsm = Arc::new(RemoteStorageManager::with_store(store.clone(), "pre/"));
    let p = partition();
    let mut copies = Vec::new();
    for (i, c) in candidates.iter().take(3).enumerate() {
        let id = Uuid::from_u64_pair(9, i as u64);
        let sent = rsm
            .copy_log_segment_data(&p, id, c, bytes::Bytes::from_static(b"0\n0\n"))
            .await
            .unwrap();
        assert!(sent >= c.size_bytes);
        copies.push(metadata(c, id));
    }
    // A cache that holds about one copy: each read of another evicts the older one.
    let one = candidates[0].size_bytes + 1024;
    let reader = Arc::new(RemoteLogReader::new(rsm.clone(), dir.path(), one).unwrap());
    for m in &copies {
        for offset in [
            m.start_offset,
            (m.start_offset + m.end_offset) / 2,
            m.end_offset,
        ] {
            let remote = reader
                .read(&p, m, None, offset, 1000, i64::MAX, true)
                .await
                .unwrap()
                .unwrap();
            let local = log.read(offset, 1000, i64::MAX, true).unwrap();
            assert_eq!(remote.records, local.records, "offset {offset}");
        }
    }
    let cached: Vec<_> = std::fs::read_dir(dir.path().join(super::reader::CACHE_DIR))
        .unwrap()
        .collect();
    assert_eq!(cached.len(), 1, "the cache keeps to its bound");
    // Timestamps and aborted transactions come from the copy too.
    let (offset, ts, epoch) = reader
        .offset_for_timestamp(&p, &copies[1], T0 + copies[1].start_offset)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (offset, ts, epoch),
        (copies[1].start_offset, T0 + copies[1].start_offset, 3)
    );
    assert!(reader
        .aborted_txns(&p, &copies[1], 0, i64::MAX)
        .await
        .unwrap()
        .is_empty());
    // A new replica's state: the epochs checkpoint and the producer snapshot of a copy.
    let (epochs, _snapshot) = reader.aux_state(&p, &copies[0]).await.unwrap();
    assert_eq!(epochs, vec![]);
    // Deleting one copy, then the partition, leaves nothing.
    rsm.delete_log_segment_data(&p, copies[0].start_offset, copies[0].segment_id)
        .await
        .unwrap();
    assert!(reader
        .read(
            &p,
            &copies[0],
            None,
            copies[0].start_offset,
            1000,
            i64::MAX,
            true
        )
        .await
        .is_err());
    let left = rsm.delete_partition(&p).await.unwrap();
    assert!(left >= 8, "{left}");
    assert_eq!(rsm.delete_partition(&p).await.unwrap(), 0);
}
