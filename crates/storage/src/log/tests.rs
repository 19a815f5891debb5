//! Tests of `UnifiedLog`: append/read, rolls, recovery, idempotence, epochs, timestamps.

use std::fs::{self, OpenOptions};
use std::path::Path;

use bytes::Bytes;
use proptest::prelude::*;
use rill_protocol::records::RecordBatch;

use super::*;
use crate::epoch::{UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET};
use crate::error::RecordErrors;
use crate::test_util::TestBatch;

const T0: i64 = 1_700_000_000_000;

fn config(segment_bytes: u64) -> LogConfig {
    LogConfig {
        segment_bytes,
        index_interval_bytes: 256,
        ..LogConfig::default()
    }
}

fn batches(records: &Bytes) -> Vec<RecordBatch> {
    RecordBatch::iter(records.clone())
        .map(|b| b.unwrap())
        .collect()
}

/// Appends `n` client batches of 1..=4 records; returns (base offset, record count) each.
fn fill(log: &mut UnifiedLog, n: usize) -> Vec<(i64, i64)> {
    let mut out = Vec::new();
    for i in 0..n {
        let count = 1 + i % 4;
        let b = TestBatch::new(count, T0 + i as i64 * 10).value_len(30 + i % 50);
        let info = log
            .append_as_leader(b.bytes(), 1, AppendOrigin::Client, T0)
            .unwrap();
        assert_eq!(info.first_offset, log.log_end_offset() - count as i64);
        out.push((info.first_offset, count as i64));
    }
    out
}

/// Reads the whole log from its start with fetches of `max_bytes`.
fn read_all(log: &UnifiedLog, max_bytes: usize) -> Vec<RecordBatch> {
    let mut out = Vec::new();
    let mut next = log.log_start_offset();
    while next < log.log_end_offset() {
        let info = log.read(next, max_bytes, i64::MAX, true).unwrap();
        let bs = batches(&info.records);
        assert!(!bs.is_empty(), "no progress at {next}");
        for b in bs {
            b.validate().unwrap();
            assert_eq!(b.base_offset(), next, "offsets are dense");
            next = b.next_offset();
            out.push(b);
        }
    }
    out
}

#[test]
fn append_and_read_across_many_rolls() {
    let dir = tempfile::tempdir().unwrap();
    let mut log =
        UnifiedLog::open(dir.path(), config(2000), T0, PreviousShutdown::Unclean).unwrap();
    let appended = fill(&mut log, 300);
    assert!(
        log.segment_count() > 10,
        "segments: {}",
        log.segment_count()
    );
    for seg in log.segments.values() {
        assert!(seg.size() <= 2000);
    }
    let all = read_all(&log, 700);
    assert_eq!(all.len(), appended.len());
    for (b, (base, count)) in all.iter().zip(&appended) {
        assert_eq!(
            (b.base_offset(), i64::from(b.record_count())),
            (*base, *count)
        );
        assert_eq!(b.partition_leader_epoch(), 1);
    }
    // Every offset lands on the batch that contains it.
    for o in 0..log.log_end_offset() {
        let info = log.read(o, 1, i64::MAX, true).unwrap();
        let bs = batches(&info.records);
        assert_eq!(bs.len(), 1);
        assert!(
            bs[0].base_offset() <= o && o <= bs[0].last_offset(),
            "offset {o}"
        );
        let range = info.file_range.unwrap();
        assert_eq!(range.len as usize, info.records.len());
        let mut on_disk = vec![0u8; range.len as usize];
        std::os::unix::fs::FileExt::read_exact_at(&*range.file, &mut on_disk, range.position)
            .unwrap();
        assert_eq!(on_disk, info.records.to_vec());
    }
    assert_eq!(
        log.size_bytes(),
        all.iter().map(|b| b.size() as u64).sum::<u64>()
    );
}

#[test]
fn read_honours_max_bytes_max_offset_and_min_one_message() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = UnifiedLog::open(
        dir.path(),
        LogConfig::default(),
        T0,
        PreviousShutdown::Unclean,
    )
    .unwrap();
    for _ in 0..10 {
        log.append_as_leader(
            TestBatch::new(2, T0).value_len(100).bytes(),
            0,
            AppendOrigin::Client,
            T0,
        )
        .unwrap();
    }
    let one = batches(&log.read(0, usize::MAX, i64::MAX, false).unwrap().records)[0].size();
    // max_bytes below one batch: nothing unless min_one_message.
    assert!(log
        .read(0, one - 1, i64::MAX, false)
        .unwrap()
        .records
        .is_empty());
    assert_eq!(
        batches(&log.read(0, one - 1, i64::MAX, true).unwrap().records).len(),
        1
    );
    assert_eq!(
        batches(&log.read(0, 3 * one + 5, i64::MAX, false).unwrap().records).len(),
        3
    );
    // From the middle of a batch: the whole batch.
    let bs = batches(&log.read(5, 2 * one, i64::MAX, false).unwrap().records);
    assert_eq!(bs[0].base_offset(), 4);
    // max_offset excludes batches holding it or anything after.
    assert_eq!(
        batches(&log.read(0, usize::MAX, 6, false).unwrap().records).len(),
        3
    );
    assert_eq!(
        batches(&log.read(0, usize::MAX, 7, false).unwrap().records).len(),
        3
    );
    assert!(log.read(6, usize::MAX, 6, true).unwrap().records.is_empty());
    assert!(log.read(0, usize::MAX, 0, true).unwrap().records.is_empty());
    // At the log end: empty; beyond it: out of range.
    assert!(log
        .read(20, usize::MAX, i64::MAX, true)
        .unwrap()
        .records
        .is_empty());
    assert!(matches!(
        log.read(21, 1, i64::MAX, true),
        Err(ReadError::OffsetOutOfRange {
            offset: 21,
            log_start: 0,
            log_end: 20
        })
    ));
    assert!(matches!(
        log.read(-1, 1, i64::MAX, true),
        Err(ReadError::OffsetOutOfRange { .. })
    ));
}

#[test]
fn validation_errors() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = LogConfig {
        max_message_bytes: 500,
        ..LogConfig::default()
    };
    let mut log = UnifiedLog::open(dir.path(), cfg, T0, PreviousShutdown::Unclean).unwrap();
    let big = TestBatch::new(1, T0).value_len(600).bytes();
    assert!(matches!(
        log.append_as_leader(big, 0, AppendOrigin::Client, T0),
        Err(AppendError::MessageTooLarge { max: 500, .. })
    ));
    let mut bad = TestBatch::new(1, T0).build();
    let last = bad.len() - 1;
    bad[last] ^= 1;
    assert!(matches!(
        log.append_as_leader(Bytes::from(bad), 0, AppendOrigin::Client, T0),
        Err(AppendError::CorruptMessage(_))
    ));
    let torn = TestBatch::new(1, T0).build();
    assert!(matches!(
        log.append_as_leader(
            Bytes::copy_from_slice(&torn[..30]),
            0,
            AppendOrigin::Client,
            T0
        ),
        Err(AppendError::CorruptMessage(_))
    ));
    let control = TestBatch::new(1, T0).producer(7, 0, 0).control().bytes();
    assert!(matches!(
        log.append_as_leader(control.clone(), 0, AppendOrigin::Client, T0),
        Err(AppendError::InvalidRecord(_))
    ));
    let info = log
        .append_as_leader(control, 0, AppendOrigin::Coordinator, T0)
        .unwrap();
    assert_eq!((info.first_offset, log.log_end_offset()), (0, 1));
    let no_seq = TestBatch::new(1, T0).producer(8, 0, -1).bytes();
    assert!(matches!(
        log.append_as_leader(no_seq, 0, AppendOrigin::Client, T0),
        Err(AppendError::InvalidRecord(_))
    ));
    let empty = log
        .append_as_leader(Bytes::new(), 0, AppendOrigin::Client, T0)
        .unwrap();
    assert_eq!(empty.first_offset, -1);
    assert_eq!(log.log_end_offset(), 1);
}

/// A client computes the CRC over whatever it sends, so a batch whose header claims more
/// or fewer records than it holds passes the CRC check: only the record walk, which the
/// leader keeps for every batch whatever the topic's settings, can refuse it.
#[test]
fn record_count_lies_with_a_valid_crc_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = UnifiedLog::open(
        dir.path(),
        LogConfig::default(),
        T0,
        PreviousShutdown::Unclean,
    )
    .unwrap();
    let honest = TestBatch::new(3, T0).value_len(20).build();
    for claimed in [1i32, 2, 4, 1_000] {
        let mut lie = honest.clone();
        lie[23..27].copy_from_slice(&(claimed - 1).to_be_bytes()); // lastOffsetDelta
        lie[57..61].copy_from_slice(&claimed.to_be_bytes()); // recordCount
        let crc = crc32c::crc32c(&lie[21..]);
        lie[17..21].copy_from_slice(&crc.to_be_bytes());
        RecordBatch::new(Bytes::from(lie.clone()))
            .unwrap()
            .validate()
            .unwrap();
        assert!(
            matches!(
                log.append_as_leader(Bytes::from(lie), 0, AppendOrigin::Client, T0),
                Err(AppendError::InvalidRecord(_))
            ),
            "a batch of 3 records claiming {claimed} was accepted"
        );
    }
    assert_eq!(log.log_end_offset(), 0);
    log.append_as_leader(Bytes::from(honest), 0, AppendOrigin::Client, T0)
        .unwrap();
    assert_eq!(log.log_end_offset(), 3);
}

#[test]
fn several_batches_in_one_record_set() {
    let dir = tempfile::tempdir().unwrap();
    let mut log =
        UnifiedLog::open(dir.path(), config(1000), T0, PreviousShutdown::Unclean).unwrap();
    let mut set = Vec::new();
    for i in 0..10 {
        set.extend(TestBatch::new(3, T0 + i).value_len(40).build());
    }
    let info = log
        .append_as_leader(Bytes::from(set), 4, AppendOrigin::Client, T0)
        .unwrap();
    assert_eq!(
        (info.first_offset, info.last_offset, info.record_count),
        (0, 29, 30)
    );
    assert!(log.segment_count() > 1, "a large set may span segments");
    assert_eq!(read_all(&log, 100).len(), 10);
}

#[test]
fn log_append_time_rewrites_max_timestamp() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = LogConfig {
        message_timestamp_type: MessageTimestampType::LogAppendTime,
        ..LogConfig::default()
    };
    let mut log = UnifiedLog::open(dir.path(), cfg, T0, PreviousShutdown::Unclean).unwrap();
    let info = log
        .append_as_leader(
            TestBatch::new(3, 5).bytes(),
            0,
            AppendOrigin::Client,
            T0 + 7,
        )
        .unwrap();
    assert_eq!(info.log_append_time_ms, T0 + 7);
    let b = &batches(&log.read(0, usize::MAX, i64::MAX, true).unwrap().records)[0];
    b.validate().unwrap();
    assert_eq!(b.max_timestamp(), T0 + 7);
    let found = log.offset_for_timestamp(T0).unwrap().unwrap();
    assert_eq!((found.offset, found.timestamp), (0, T0 + 7));
}

#[test]
fn a_wrong_client_max_timestamp_is_replaced_by_the_records_largest() {
    use rill_protocol::records::batch::{set_max_timestamp_split, HEADER_LEN};
    let dir = tempfile::tempdir().unwrap();
    let mut log =
        UnifiedLog::open(dir.path(), config(1 << 20), T0, PreviousShutdown::Unclean).unwrap();
    // Records at T0+100..T0+103, and a header that claims T0+1 (with a CRC to match).
    let mut raw = TestBatch::new(4, T0 + 100).build();
    let (head, body) = raw.split_at_mut(HEADER_LEN);
    let mut header: [u8; HEADER_LEN] = (&*head).try_into().unwrap();
    set_max_timestamp_split(&mut header, body, T0 + 1);
    head.copy_from_slice(&header);
    assert_eq!(
        RecordBatch::new(Bytes::from(raw.clone()))
            .unwrap()
            .max_timestamp(),
        T0 + 1
    );
    let info = log
        .append_as_leader(Bytes::from(raw), 0, AppendOrigin::Client, T0 + 200)
        .unwrap();
    assert_eq!(info.max_timestamp, T0 + 103);
    let b = &batches(&log.read(0, usize::MAX, i64::MAX, true).unwrap().records)[0];
    b.validate().unwrap();
    assert_eq!(b.max_timestamp(), T0 + 103);
    assert_eq!(
        b.timestamp_type(),
        rill_protocol::records::TimestampType::CreateTime
    );
    // With the client's claim (T0+1) the log would hold nothing at or after T0+50.
    let found = log.offset_for_timestamp(T0 + 50).unwrap().unwrap();
    assert_eq!((found.offset, found.timestamp), (0, T0 + 100));
    assert_eq!(
        log.max_timestamp_and_offset()
            .unwrap()
            .map(|t| (t.offset, t.timestamp)),
        Some((3, T0 + 103))
    );
    // A right one is left as it came: the bytes on disk are the client's but the offset
    // and the leader epoch (the first 16 bytes, which the CRC does not cover).
    let right = TestBatch::new(2, T0 + 300).bytes();
    log.append_as_leader(right.clone(), 0, AppendOrigin::Client, T0 + 400)
        .unwrap();
    let stored = &batches(&log.read(4, usize::MAX, i64::MAX, true).unwrap().records)[0];
    assert_eq!(stored.as_bytes()[16..], right[16..]);
}

/// The concatenation of every `.log` file of the log, in offset order.
fn log_file_bytes(dir: &Path) -> Vec<u8> {
    let mut logs: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    logs.sort();
    logs.iter().flat_map(|p| fs::read(p).unwrap()).collect()
}

/// What the leader used to write, by copying each batch and rewriting the copy: the
/// reference the vectored write (rewritten header, untouched rest) must match byte for byte.
fn copied_and_rewritten(
    set: &[u8],
    first_offset: i64,
    epoch: i32,
    append_time: Option<i64>,
) -> Vec<u8> {
    use rill_protocol::records::batch::{
        set_base_offset, set_log_append_time, set_partition_leader_epoch,
    };
    let mut out = Vec::new();
    let mut offset = first_offset;
    for b in batches(&Bytes::copy_from_slice(set)) {
        let mut copy = b.as_bytes().to_vec();
        set_base_offset(&mut copy, offset);
        set_partition_leader_epoch(&mut copy, epoch);
        if let Some(t) = append_time {
            set_log_append_time(&mut copy, t);
        }
        offset += i64::from(b.last_offset_delta()) + 1;
        out.extend(copy);
    }
    out
}

#[test]
fn leader_writes_the_bytes_the_copying_path_wrote() {
    for timestamp_type in [
        MessageTimestampType::CreateTime,
        MessageTimestampType::LogAppendTime,
    ] {
        // 1,500 batches in one record set: 3,000 slices, more than one `pwritev` takes; and a
        // small segment size, so that the set is also split across rolls.
        for segment_bytes in [1 << 30, 20_000] {
            let dir = tempfile::tempdir().unwrap();
            let cfg = LogConfig {
                message_timestamp_type: timestamp_type,
                ..config(segment_bytes)
            };
            let mut log = UnifiedLog::open(dir.path(), cfg, T0, PreviousShutdown::Unclean).unwrap();
            let lead = TestBatch::new(2, T0).value_len(10).build();
            log.append_as_leader(Bytes::from(lead.clone()), 3, AppendOrigin::Client, T0)
                .unwrap();
            let mut set = Vec::new();
            for i in 0..1_500 {
                set.extend(
                    TestBatch::new(1 + i % 3, T0 + i as i64)
                        .value_len(i % 40)
                        .build(),
                );
            }
            let now = T0 + 99;
            log.append_as_leader(Bytes::from(set.clone()), 4, AppendOrigin::Client, now)
                .unwrap();
            let append_time =
                (timestamp_type == MessageTimestampType::LogAppendTime).then_some(now);
            let mut want = copied_and_rewritten(&lead, 0, 3, append_time.map(|_| T0));
            want.extend(copied_and_rewritten(&set, 2, 4, append_time));
            assert_eq!(
                log_file_bytes(dir.path()),
                want,
                "{timestamp_type:?}, {segment_bytes}"
            );
            assert_eq!(segment_bytes == 20_000, log.segment_count() > 1);
            // Every batch on disk passes the CRC check, the LogAppendTime ones included.
            for b in read_all(&log, 1 << 20) {
                b.validate().unwrap();
                if let Some(t) = append_time {
                    assert!(b.max_timestamp() == t || b.max_timestamp() == T0);
                }
            }
            log.close().unwrap();
            let log = UnifiedLog::open(
                dir.path(),
                config(segment_bytes),
                T0,
                PreviousShutdown::Clean,
            )
            .unwrap();
            assert_eq!(
                log.log_end_offset(),
                2 + (0..1_500).map(|i| 1 + i % 3).sum::<i64>()
            );
        }
    }
}

#[test]
fn segment_ms_rolls_by_time() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = LogConfig {
        segment_ms: 1000,
        ..LogConfig::default()
    };
    let mut log = UnifiedLog::open(dir.path(), cfg, T0, PreviousShutdown::Unclean).unwrap();
    log.append_as_leader(TestBatch::new(1, T0).bytes(), 0, AppendOrigin::Client, T0)
        .unwrap();
    log.append_as_leader(
        TestBatch::new(1, T0 + 500).bytes(),
        0,
        AppendOrigin::Client,
        T0 + 500,
    )
    .unwrap();
    assert_eq!(log.segment_count(), 1);
    log.append_as_leader(
        TestBatch::new(1, T0 + 1000).bytes(),
        0,
        AppendOrigin::Client,
        T0 + 1000,
    )
    .unwrap();
    assert_eq!(log.segment_base_offsets(), vec![0, 2]);
}

#[test]
fn flush_messages_moves_the_recovery_point() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = LogConfig {
        flush_messages: Some(3),
        ..LogConfig::default()
    };
    let mut log = UnifiedLog::open(dir.path(), cfg, T0, PreviousShutdown::Unclean).unwrap();
    log.append_as_leader(TestBatch::new(2, T0).bytes(), 0, AppendOrigin::Client, T0)
        .unwrap();
    assert_eq!(log.recovery_point(), 0);
    log.append_as_leader(TestBatch::new(1, T0).bytes(), 0, AppendOrigin::Client, T0)
        .unwrap();
    assert_eq!(log.recovery_point(), 3);
}

fn last_log_file(dir: &Path) -> std::path::PathBuf {
    let mut logs: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    logs.sort();
    logs.pop().unwrap()
}

/// Writes batches, "crashes" (drops the log without close), cuts the active segment at
/// `cut` (a fraction of its size) and appends `garbage`, then reopens.
fn crash_and_recover(cut_permille: u64, garbage: Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    let mut log =
        UnifiedLog::open(dir.path(), config(4000), T0, PreviousShutdown::Unclean).unwrap();
    fill(&mut log, 60);
    let before = read_all(&log, usize::MAX);
    drop(log);
    let path = last_log_file(dir.path());
    let size = fs::metadata(&path).unwrap().len();
    let cut = size * cut_permille / 1000;
    let f = OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(cut).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &garbage, cut).unwrap();
    drop(f);

    let mut log =
        UnifiedLog::open(dir.path(), config(4000), T0, PreviousShutdown::Unclean).unwrap();
    let seg_base: i64 = path.file_stem().unwrap().to_str().unwrap().parse().unwrap();
    // Every batch wholly before the cut survives; nothing after it does.
    let mut pos = 0u64;
    let expected: Vec<_> = before
        .iter()
        .filter(|b| {
            if b.base_offset() < seg_base {
                return true;
            }
            pos += b.size() as u64;
            pos <= cut
        })
        .collect();
    let after = read_all(&log, 1000);
    assert_eq!(after.len(), expected.len());
    for (a, e) in after.iter().zip(&expected) {
        assert_eq!(a.as_bytes(), e.as_bytes());
    }
    let end = expected.last().map_or(0, |b| b.next_offset());
    assert_eq!(log.log_end_offset(), end);
    let info = log
        .append_as_leader(TestBatch::new(2, T0).bytes(), 1, AppendOrigin::Client, T0)
        .unwrap();
    assert_eq!(info.first_offset, end);
    assert_eq!(read_all(&log, 1000).len(), expected.len() + 1);
    log.close().unwrap();
    let log = UnifiedLog::open(dir.path(), config(4000), T0, PreviousShutdown::Clean).unwrap();
    assert_eq!(log.log_end_offset(), end + 2);
}

#[test]
fn recovery_truncates_a_torn_tail() {
    crash_and_recover(1000, vec![]);
    crash_and_recover(0, vec![]);
    crash_and_recover(500, vec![0; 100]);
    crash_and_recover(999, vec![0xff; 3]);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
    #[test]
    fn recovery_after_a_cut_anywhere(cut in 0u64..=1000, garbage in proptest::collection::vec(any::<u8>(), 0..200)) {
        crash_and_recover(cut, garbage);
    }
}

#[test]
fn clean_close_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let mut log =
        UnifiedLog::open(dir.path(), config(4000), T0, PreviousShutdown::Unclean).unwrap();
    fill(&mut log, 20);
    log.update_high_watermark(15);
    log.close().unwrap();
    // The marker is the data directory's now (see `clean_shutdown`), never the log's.
    assert!(!dir.path().join(CLEAN_SHUTDOWN_FILE).exists());
    let log = UnifiedLog::open(dir.path(), config(4000), T0, PreviousShutdown::Clean).unwrap();
    assert_eq!(log.high_watermark(), 15);
    assert_eq!(log.log_end_offset(), 50);
    assert_eq!(read_all(&log, 1000).len(), 20);
}

/// A log closed by an earlier version carries its own marker: it still means a clean
/// shutdown (the producer snapshot is used), and open removes it, so that a crash later
/// in this run is taken for what it is.
#[test]
fn a_per_log_marker_of_an_earlier_version_is_honoured_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut log =
        UnifiedLog::open(dir.path(), config(4000), T0, PreviousShutdown::Unclean).unwrap();
    let b = TestBatch::new(2, T0).producer(7, 0, 0).bytes();
    log.append_as_leader(b, 0, AppendOrigin::Client, T0)
        .unwrap();
    log.close().unwrap();
    fs::write(dir.path().join(CLEAN_SHUTDOWN_FILE), b"").unwrap();
    // Take the batches' producer state away: only a clean open reads the snapshot.
    let snapshot = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "snapshot"))
        .unwrap();
    let text = fs::read_to_string(&snapshot).unwrap();
    fs::write(&snapshot, text.replacen("\n7 0 ", "\n8 0 ", 1)).unwrap();
    let log = UnifiedLog::open(dir.path(), config(4000), T0, PreviousShutdown::Unclean).unwrap();
    assert!(!dir.path().join(CLEAN_SHUTDOWN_FILE).exists());
    assert!(log.producer_state(8).is_some(), "the snapshot was used");
    drop(log);
    let log = UnifiedLog::open(dir.path(), config(4000), T0, PreviousShutdown::Unclean).unwrap();
    assert!(log.producer_state(7).is_some(), "rebuilt from the batches");
    assert!(log.producer_state(8).is_none());
}

#[test]
fn clean_close_leaves_index_files_for_a_segment_without_entries() {
    // One small batch: below index.interval.bytes, so the active segment has no index
    // entries; its index files must still exist for the next open to trust them.
    let dir = tempfile::tempdir().unwrap();
    let mut log =
        UnifiedLog::open(dir.path(), config(4000), T0, PreviousShutdown::Unclean).unwrap();
    fill(&mut log, 1);
    log.close().unwrap();
    for suffix in ["index", "timeindex"] {
        assert!(crate::segment::segment_file(dir.path(), 0, suffix).exists());
    }
}

#[test]
fn missing_or_corrupt_indexes_are_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    let mut log =
        UnifiedLog::open(dir.path(), config(4000), T0, PreviousShutdown::Unclean).unwrap();
    fill(&mut log, 100);
    let bases = log.segment_base_offsets();
    assert!(bases.len() >= 3);
    let lookups: Vec<_> = (0..log.log_end_offset())
        .map(|o| batches(&log.read(o, 1, i64::MAX, true).unwrap().records)[0].base_offset())
        .collect();
    let by_ts = log.offset_for_timestamp(T0 + 455).unwrap();
    log.close().unwrap();
    let index = |b: i64, s: &str| crate::segment::segment_file(dir.path(), b, s);
    let index_len = fs::metadata(index(bases[0], "index")).unwrap().len();
    assert!(index_len > 0);
    fs::remove_file(index(bases[0], "index")).unwrap();
    fs::write(index(bases[1], "timeindex"), [1, 2, 3]).unwrap();
    fs::write(index(bases[2], "index"), [0xff; 16]).unwrap();
    let log = UnifiedLog::open(dir.path(), config(4000), T0, PreviousShutdown::Clean).unwrap();
    assert_eq!(
        fs::metadata(index(bases[0], "index")).unwrap().len(),
        index_len
    );
    for (o, want) in lookups.iter().enumerate() {
        let got = batches(&log.read(o as i64, 1, i64::MAX, true).unwrap().records)[0].base_offset();
        assert_eq!(got, *want);
    }
    assert_eq!(log.offset_for_timestamp(T0 + 455).unwrap(), by_ts);
}

#[test]
fn idempotent_producer_duplicates_gaps_and_fencing() {
    let dir = tempfile::tempdir().unwrap();
    let mut log =
        UnifiedLog::open(dir.path(), config(4000), T0, PreviousShutdown::Unclean).unwrap();
    let pid = 1000;
    let mut sent = Vec::new();
    let mut seq = 0;
    for i in 0..7 {
        let b = TestBatch::new(2 + i % 2, T0 + i as i64).producer(pid, 0, seq);
        seq += b.timestamps.len() as i32;
        // Interleave another producer and non-idempotent data.
        log.append_as_leader(TestBatch::new(1, T0).bytes(), 0, AppendOrigin::Client, T0)
            .unwrap();
        let info = log
            .append_as_leader(b.bytes(), 0, AppendOrigin::Client, T0)
            .unwrap();
        assert!(!info.duplicate);
        sent.push((b, info));
    }
    let end = log.log_end_offset();
    // Each of the last five is a duplicate with its original offsets; older ones are not.
    for (b, info) in &sent[2..] {
        let dup = log
            .append_as_leader(b.bytes(), 0, AppendOrigin::Client, T0)
            .unwrap();
        assert!(dup.duplicate);
        assert_eq!(
            (dup.first_offset, dup.last_offset),
            (info.first_offset, info.last_offset)
        );
    }
    assert!(matches!(
        log.append_as_leader(sent[0].0.bytes(), 0, AppendOrigin::Client, T0),
        Err(AppendError::OutOfOrderSequence { .. })
    ));
    assert_eq!(log.log_end_offset(), end);
    // A gap.
    let gap = TestBatch::new(1, T0).producer(pid, 0, seq + 1).bytes();
    assert!(matches!(
        log.append_as_leader(gap, 0, AppendOrigin::Client, T0),
        Err(AppendError::OutOfOrderSequence { expected, found, .. }) if expected == seq && found == seq + 1
    ));
    // A bumped epoch restarts at 0, after which the old epoch is fenced.
    log.append_as_leader(
        TestBatch::new(1, T0).producer(pid, 1, 0).bytes(),
        0,
        AppendOrigin::Client,
        T0,
    )
    .unwrap();
    let stale = TestBatch::new(1, T0).producer(pid, 0, seq).bytes();
    assert!(matches!(
        log.append_as_leader(stale, 0, AppendOrigin::Client, T0),
        Err(AppendError::InvalidProducerEpoch {
            current: 1,
            found: 0,
            ..
        })
    ));
    let state = log.producer_state(pid).unwrap().clone();
    assert_eq!((state.producer_epoch, state.last_seq()), (1, 0));

    // State survives a clean reopen and a crash.
    let end = log.log_end_offset();
    log.close().unwrap();
    let snapshot = crate::segment::segment_file(dir.path(), end, "snapshot");
    assert!(snapshot.exists());
    let log2 = UnifiedLog::open(dir.path(), config(4000), T0, PreviousShutdown::Clean).unwrap();
    assert!(!snapshot.exists(), "a snapshot is consumed by open");
    assert_eq!(log2.producer_state(pid), Some(&state));
    log2.close().unwrap();
    // A corrupt snapshot falls back to reading the log.
    fs::write(&snapshot, "0\n1\n1000 x\n").unwrap();
    let log2 = UnifiedLog::open(dir.path(), config(4000), T0, PreviousShutdown::Clean).unwrap();
    assert_eq!(log2.producer_state(pid), Some(&state));
    drop(log2);
    let mut log3 =
        UnifiedLog::open(dir.path(), config(4000), T0, PreviousShutdown::Unclean).unwrap();
    assert_eq!(log3.producer_state(pid), Some(&state));
    let again = TestBatch::new(1, T0).producer(pid, 1, 0).bytes();
    assert!(
        log3.append_as_leader(again, 0, AppendOrigin::Client, T0)
            .unwrap()
            .duplicate
    );
}

#[test]
fn duplicates_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let mut log =
        UnifiedLog::open(dir.path(), config(4000), T0, PreviousShutdown::Unclean).unwrap();
    let b = TestBatch::new(3, T0).producer(5, 2, 0);
    let info = log
        .append_as_leader(b.bytes(), 0, AppendOrigin::Client, T0)
        .unwrap();
    drop(log);
    let mut log =
        UnifiedLog::open(dir.path(), config(4000), T0, PreviousShutdown::Unclean).unwrap();
    let dup = log
        .append_as_leader(b.bytes(), 0, AppendOrigin::Client, T0)
        .unwrap();
    assert!(dup.duplicate);
    assert_eq!(
        (dup.first_offset, dup.last_offset),
        (info.first_offset, info.last_offset)
    );
}

#[test]
fn offset_for_timestamp_and_max_timestamp() {
    let dir = tempfile::tempdir().unwrap();
    let mut log =
        UnifiedLog::open(dir.path(), config(2000), T0, PreviousShutdown::Unclean).unwrap();
    // Batch i has records with timestamps T0 + 10 i + j for j in 0..count.
    let appended = fill(&mut log, 100);
    assert!(log.segment_count() > 3);
    for (i, (base, count)) in appended.iter().enumerate() {
        for j in 0..*count {
            let ts = T0 + i as i64 * 10 + j;
            let found = log.offset_for_timestamp(ts).unwrap().unwrap();
            assert_eq!(
                (found.offset, found.timestamp, found.leader_epoch),
                (base + j, ts, Some(1))
            );
        }
        // Between batches: the next batch's first record.
        if i + 1 < appended.len() {
            let found = log
                .offset_for_timestamp(T0 + i as i64 * 10 + 5)
                .unwrap()
                .unwrap();
            assert_eq!(found.offset, appended[i + 1].0);
        }
    }
    assert_eq!(log.offset_for_timestamp(T0 + 100_000).unwrap(), None);
    assert_eq!(log.offset_for_timestamp(0).unwrap().unwrap().offset, 0);
    let (last_base, last_count) = *appended.last().unwrap();
    let max = log.max_timestamp_and_offset().unwrap().unwrap();
    assert_eq!(max.offset, last_base + last_count - 1);
    assert_eq!(max.timestamp, T0 + 990 + last_count - 1);
    // An out-of-order timestamp: the max is in an earlier batch.
    log.append_as_leader(
        TestBatch::new(2, T0 + 5000).bytes(),
        1,
        AppendOrigin::Client,
        T0,
    )
    .unwrap();
    log.append_as_leader(TestBatch::new(1, T0).bytes(), 1, AppendOrigin::Client, T0)
        .unwrap();
    let max = log.max_timestamp_and_offset().unwrap().unwrap();
    assert_eq!(
        (max.offset, max.timestamp),
        (last_base + last_count + 1, T0 + 5001)
    );
}

#[test]
fn truncate_to_and_leader_epochs() {
    let dir = tempfile::tempdir().unwrap();
    let mut log =
        UnifiedLog::open(dir.path(), config(1000), T0, PreviousShutdown::Unclean).unwrap();
    for epoch in [1, 1, 2, 2, 2, 5] {
        for _ in 0..10 {
            log.append_as_leader(
                TestBatch::new(2, T0).bytes(),
                epoch,
                AppendOrigin::Client,
                T0,
            )
            .unwrap();
        }
    }
    assert_eq!(log.log_end_offset(), 120);
    assert_eq!(log.latest_epoch(), Some(5));
    let entries: Vec<_> = log
        .leader_epoch_cache()
        .entries()
        .iter()
        .map(|e| (e.epoch, e.start_offset))
        .collect();
    assert_eq!(entries, vec![(1, 0), (2, 40), (5, 100)]);
    assert_eq!(log.end_offset_for_epoch(1), (1, 40));
    assert_eq!(log.end_offset_for_epoch(3), (2, 100));
    assert_eq!(log.end_offset_for_epoch(5), (5, 120));
    assert_eq!(
        log.end_offset_for_epoch(6),
        (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)
    );
    log.update_high_watermark(110);

    // Truncating inside a batch removes the whole batch.
    assert!(log.truncate_to(51, T0).unwrap());
    assert_eq!(log.log_end_offset(), 50);
    assert_eq!(log.high_watermark(), 50);
    assert_eq!(log.latest_epoch(), Some(2));
    assert_eq!(log.end_offset_for_epoch(2), (2, 50));
    assert_eq!(read_all(&log, 500).len(), 25);
    assert!(!log.truncate_to(60, T0).unwrap());
    let info = log
        .append_as_leader(TestBatch::new(1, T0).bytes(), 6, AppendOrigin::Client, T0)
        .unwrap();
    assert_eq!(info.first_offset, 50);
    assert_eq!(log.end_offset_for_epoch(2), (2, 50));

    // The epoch cache checkpoint is rebuilt from the batches when it is missing.
    drop(log);
    fs::remove_file(dir.path().join(crate::epoch::LEADER_EPOCH_CHECKPOINT_FILE)).unwrap();
    let mut log =
        UnifiedLog::open(dir.path(), config(1000), T0, PreviousShutdown::Unclean).unwrap();
    let entries: Vec<_> = log
        .leader_epoch_cache()
        .entries()
        .iter()
        .map(|e| (e.epoch, e.start_offset))
        .collect();
    assert_eq!(entries, vec![(1, 0), (2, 40), (6, 50)]);

    log.truncate_fully_and_start_at(500, T0).unwrap();
    assert_eq!(
        (
            log.log_start_offset(),
            log.log_end_offset(),
            log.high_watermark()
        ),
        (500, 500, 500)
    );
    assert_eq!(log.segment_base_offsets(), vec![500]);
    assert_eq!(log.latest_epoch(), None);
    assert!(matches!(
        log.read(0, 1, i64::MAX, true),
        Err(ReadError::OffsetOutOfRange { .. })
    ));
    log.append_as_leader(TestBatch::new(1, T0).bytes(), 7, AppendOrigin::Client, T0)
        .unwrap();
    log.close().unwrap();
    let log = UnifiedLog::open(dir.path(), config(1000), T0, PreviousShutdown::Clean).unwrap();
    assert_eq!((log.log_start_offset(), log.log_end_offset()), (500, 501));
    log.delete().unwrap();
    assert!(!dir.path().exists());
}

#[test]
fn follower_append_keeps_offsets() {
    let dir = tempfile::tempdir().unwrap();
    let mut leader = UnifiedLog::open(
        &dir.path().join("leader"),
        config(1000),
        T0,
        PreviousShutdown::Unclean,
    )
    .unwrap();
    fill(&mut leader, 30);
    let mut follower = UnifiedLog::open(
        &dir.path().join("follower"),
        config(1000),
        T0,
        PreviousShutdown::Unclean,
    )
    .unwrap();
    while follower.log_end_offset() < leader.log_end_offset() {
        let data = leader
            .read(follower.log_end_offset(), 300, i64::MAX, true)
            .unwrap();
        follower.append_as_follower(data.records, T0).unwrap();
    }
    let a: Vec<_> = read_all(&leader, 10_000)
        .iter()
        .map(|b| b.as_bytes().clone())
        .collect();
    let b: Vec<_> = read_all(&follower, 10_000)
        .iter()
        .map(|b| b.as_bytes().clone())
        .collect();
    assert_eq!(a, b);
    assert_eq!(follower.latest_epoch(), Some(1));
    // Overlapping offsets are refused.
    let again = leader.read(0, 100, i64::MAX, true).unwrap();
    assert!(matches!(
        follower.append_as_follower(again.records, T0),
        Err(AppendError::OffsetsOutOfOrder { .. })
    ));
    // Producer state is replicated too.
    let b = TestBatch::new(1, T0)
        .producer(3, 0, 0)
        .at(follower.log_end_offset(), 2);
    follower.append_as_follower(b.bytes(), T0).unwrap();
    assert_eq!(follower.producer_state(3).unwrap().last_seq(), 0);
    assert_eq!(follower.latest_epoch(), Some(2));
}

#[test]
fn corruption_in_an_older_segment_drops_the_later_ones() {
    let dir = tempfile::tempdir().unwrap();
    let mut log =
        UnifiedLog::open(dir.path(), config(2000), T0, PreviousShutdown::Unclean).unwrap();
    fill(&mut log, 60);
    let bases = log.segment_base_offsets();
    assert!(bases.len() >= 4);
    log.close().unwrap();
    // Flip a byte in the middle of the second segment and lose its index, so that it is
    // rebuilt (and validated) at open.
    let seg = crate::segment::segment_file(dir.path(), bases[1], "log");
    let mut data = fs::read(&seg).unwrap();
    let mid = data.len() / 2;
    data[mid] ^= 0x55;
    fs::write(&seg, &data).unwrap();
    fs::remove_file(crate::segment::segment_file(dir.path(), bases[1], "index")).unwrap();
    let mut log = UnifiedLog::open(dir.path(), config(2000), T0, PreviousShutdown::Clean).unwrap();
    assert_eq!(log.segment_base_offsets(), bases[..2].to_vec());
    let end = log.log_end_offset();
    assert!(end > bases[1] && end < bases[2]);
    let all = read_all(&log, 1000);
    assert_eq!(all.last().unwrap().next_offset(), end);
    let info = log
        .append_as_leader(TestBatch::new(1, T0).bytes(), 1, AppendOrigin::Client, T0)
        .unwrap();
    assert_eq!(info.first_offset, end);
}

#[test]
fn truncate_below_the_log_start_moves_it_down() {
    let dir = tempfile::tempdir().unwrap();
    let mut log =
        UnifiedLog::open(dir.path(), config(1000), T0, PreviousShutdown::Unclean).unwrap();
    fill(&mut log, 40);
    log.update_high_watermark(80);
    assert!(log.maybe_increment_log_start_offset(60).unwrap());
    assert!(matches!(
        log.read(59, 1, i64::MAX, true),
        Err(ReadError::OffsetOutOfRange { .. })
    ));
    let info = log.read(60, 1, i64::MAX, true).unwrap();
    assert!(batches(&info.records)[0].last_offset() >= 60);
    assert!(log.truncate_to(50, T0).unwrap());
    assert!(log.log_end_offset() <= 50);
    assert_eq!(
        log.log_start_offset(),
        log.log_start_offset().min(log.log_end_offset())
    );
    assert!(log.log_start_offset() <= log.log_end_offset());
    log.close().unwrap();
    let log = UnifiedLog::open(dir.path(), config(1000), T0, PreviousShutdown::Clean).unwrap();
    assert!(log.log_start_offset() <= log.log_end_offset());
}

#[test]
fn follower_gaps_are_kept_and_readable() {
    let dir = tempfile::tempdir().unwrap();
    let mut log =
        UnifiedLog::open(dir.path(), config(4000), T0, PreviousShutdown::Unclean).unwrap();
    let mut set = TestBatch::new(2, T0).at(0, 3).build();
    set.extend(TestBatch::new(2, T0).at(10, 3).build());
    let info = log.append_as_follower(Bytes::from(set), T0).unwrap();
    assert_eq!(
        (info.first_offset, info.last_offset, log.log_end_offset()),
        (0, 11, 12)
    );
    let bs = batches(&log.read(5, usize::MAX, i64::MAX, false).unwrap().records);
    assert_eq!(bs[0].base_offset(), 10);
    // A gap wider than a relative offset rolls a new segment at the batch.
    let far = i64::from(u32::MAX) + 100;
    log.append_as_follower(TestBatch::new(1, T0).at(far, 4).bytes(), T0)
        .unwrap();
    assert_eq!(log.segment_base_offsets(), vec![0, far]);
    let bs = batches(&log.read(12, usize::MAX, i64::MAX, false).unwrap().records);
    assert_eq!(bs[0].base_offset(), far);
    log.close().unwrap();
    let log = UnifiedLog::open(dir.path(), config(4000), T0, PreviousShutdown::Clean).unwrap();
    assert_eq!(log.log_end_offset(), far + 1);
    assert_eq!(log.end_offset_for_epoch(3), (3, far));
}

/// A client batch built with `codec`: `n` records with keys, values and headers.
fn client_batch(codec: rill_protocol::records::CompressionType, n: u8, ts: i64) -> Bytes {
    use rill_protocol::records::{Header, RecordBatchBuilder};
    let mut b = RecordBatchBuilder::new(codec, 0).producer(7, 0, 0);
    for i in 0..n {
        b.append(
            ts + i64::from(i),
            Some(&[b'k', i]),
            Some(&[i; 64]),
            &[Header::new("i", Some(vec![i]))],
        )
        .unwrap();
    }
    b.build().unwrap()
}

#[test]
fn compression_type_reencodes_client_batches_on_the_leader_only() {
    use rill_protocol::records::CompressionType;
    let dir = tempfile::tempdir().unwrap();
    let cfg = LogConfig {
        compression_type: "zstd".parse().unwrap(),
        ..config(1 << 20)
    };
    let mut log = UnifiedLog::open(dir.path(), cfg.clone(), T0, PreviousShutdown::Unclean).unwrap();
    let sent = client_batch(CompressionType::None, 20, T0);
    let info = log
        .append_as_leader(sent.clone(), 3, AppendOrigin::Client, T0)
        .unwrap();
    assert_eq!((info.first_offset, info.last_offset), (0, 19));
    assert_eq!(info.max_timestamp, T0 + 19);
    // A retry of the same producer batch is still recognised as a duplicate.
    let dup = log
        .append_as_leader(sent.clone(), 3, AppendOrigin::Client, T0)
        .unwrap();
    assert!(dup.duplicate);
    // The coordinator's writes are kept as they are.
    let coordinator = TestBatch::new(2, T0).bytes();
    log.append_as_leader(coordinator, 3, AppendOrigin::Coordinator, T0)
        .unwrap();

    let stored = read_all(&log, 1 << 20);
    assert_eq!(stored.len(), 2);
    assert_eq!(stored[0].compression().unwrap(), CompressionType::Zstd);
    assert_eq!(stored[0].partition_leader_epoch(), 3);
    assert_eq!(stored[0].producer_id(), 7);
    assert_eq!(stored[1].compression().unwrap(), CompressionType::None);
    let original = RecordBatch::new(sent).unwrap().records(1 << 20).unwrap();
    assert_eq!(stored[0].records(1 << 20).unwrap(), original);

    // A follower copies the leader's zstd batch as it is, whatever its own config.
    let fdir = tempfile::tempdir().unwrap();
    let fcfg = LogConfig {
        compression_type: "gzip".parse().unwrap(),
        ..config(1 << 20)
    };
    let mut follower = UnifiedLog::open(fdir.path(), fcfg, T0, PreviousShutdown::Unclean).unwrap();
    follower
        .append_as_follower(stored[0].as_bytes().clone(), T0)
        .unwrap();
    let copied = read_all(&follower, 1 << 20);
    assert_eq!(copied[0].as_bytes(), stored[0].as_bytes());
}

#[test]
fn compression_type_producer_and_same_codec_keep_the_bytes_sent() {
    use rill_protocol::records::CompressionType;
    for (setting, codec) in [
        ("producer", CompressionType::Snappy),
        ("lz4", CompressionType::Lz4),
        ("uncompressed", CompressionType::None),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let cfg = LogConfig {
            compression_type: setting.parse().unwrap(),
            ..config(1 << 20)
        };
        let mut log = UnifiedLog::open(dir.path(), cfg, T0, PreviousShutdown::Unclean).unwrap();
        let sent = client_batch(codec, 5, T0);
        log.append_as_leader(sent.clone(), 0, AppendOrigin::Client, T0)
            .unwrap();
        let stored = read_all(&log, 1 << 20);
        // Only the offset and epoch fields (outside the CRC) were rewritten.
        assert_eq!(stored[0].as_bytes()[17..], sent[17..], "{setting}");
    }
}

#[test]
fn recompressed_batch_over_max_message_bytes_is_refused() {
    use rill_protocol::records::{CompressionType, RecordBatchBuilder};
    // Incompressible values: zstd framing makes the batch a little larger.
    let mut b = RecordBatchBuilder::new(CompressionType::None, 0);
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let noise: Vec<u8> = (0..4000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    b.append(T0, None, Some(&noise), &[]).unwrap();
    let sent = b.build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cfg = LogConfig {
        compression_type: "gzip".parse().unwrap(),
        max_message_bytes: sent.len(),
        ..config(1 << 20)
    };
    let mut log = UnifiedLog::open(dir.path(), cfg, T0, PreviousShutdown::Unclean).unwrap();
    let err = log
        .append_as_leader(sent, 0, AppendOrigin::Client, T0)
        .unwrap_err();
    assert!(matches!(err, AppendError::MessageTooLarge { .. }), "{err}");
    assert_eq!(log.log_end_offset(), 0);
}

#[test]
fn timestamp_bounds_refuse_client_batches_and_spare_followers() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = LogConfig {
        message_timestamp_before_max_ms: 3_600_000,
        message_timestamp_after_max_ms: 60_000,
        ..config(1 << 20)
    };
    let mut log = UnifiedLog::open(dir.path(), cfg.clone(), T0, PreviousShutdown::Unclean).unwrap();
    let two_days = 2 * 24 * 3_600_000;
    let old = TestBatch::new(3, T0 - two_days).bytes();
    let err = log
        .append_as_leader(old.clone(), 0, AppendOrigin::Client, T0)
        .unwrap_err();
    match &err {
        AppendError::RecordErrors(refused) => {
            assert_eq!(refused.total, 3, "{err}");
            assert!(refused.any_timestamp);
            assert_eq!(refused.errors[0].batch_index, 0);
        }
        other => panic!("{other}"),
    }
    let future = TestBatch::new(1, T0 + 60_001).bytes();
    assert!(matches!(
        log.append_as_leader(future, 0, AppendOrigin::Client, T0),
        Err(AppendError::RecordErrors(RecordErrors {
            any_timestamp: true,
            ..
        }))
    ));
    log.append_as_leader(
        TestBatch::new(2, T0 - 3_600_000).bytes(),
        0,
        AppendOrigin::Client,
        T0,
    )
    .unwrap();
    assert_eq!(log.log_end_offset(), 2);

    // Followers copy what the leader accepted, whatever their clock says.
    let fdir = tempfile::tempdir().unwrap();
    let mut follower =
        UnifiedLog::open(fdir.path(), cfg.clone(), T0, PreviousShutdown::Unclean).unwrap();
    follower
        .append_as_follower(TestBatch::new(3, T0 - two_days).at(0, 0).bytes(), T0)
        .unwrap();

    // Under LogAppendTime the producer's timestamps are replaced, not judged.
    let ldir = tempfile::tempdir().unwrap();
    let lcfg = LogConfig {
        message_timestamp_type: MessageTimestampType::LogAppendTime,
        ..cfg
    };
    let mut lat = UnifiedLog::open(ldir.path(), lcfg, T0, PreviousShutdown::Unclean).unwrap();
    let info = lat
        .append_as_leader(old, 0, AppendOrigin::Client, T0)
        .unwrap();
    assert_eq!(info.max_timestamp, T0);
}

/// A write the kernel refuses (ENOSPC from `/dev/full`, the same error a full disk
/// gives) takes the log offline: the append fails with the disk's error, every later
/// append and flush is refused without touching the disk, `close` refuses (so that no
/// clean shutdown is recorded), and a reopen on a healthy disk finds every earlier record.
#[test]
fn a_failed_write_takes_the_log_offline_and_close_leaves_it_unclean() {
    let dir = tempfile::tempdir().unwrap();
    let mut log =
        UnifiedLog::open(dir.path(), config(1024), T0, PreviousShutdown::Unclean).unwrap();
    let appended = fill(&mut log, 40);
    let end = log.log_end_offset();
    log.close().unwrap();
    // The next segment's file is the full device: the kernel answers every write to it
    // with ENOSPC.
    let full = crate::segment::segment_file(dir.path(), end, LOG_FILE_SUFFIX);
    std::os::unix::fs::symlink("/dev/full", &full).unwrap();
    let mut log = UnifiedLog::open(dir.path(), config(1024), T0, PreviousShutdown::Clean).unwrap();
    assert_eq!(log.log_end_offset(), end);

    let b = TestBatch::new(2, T0).bytes();
    match log.append_as_leader(b.clone(), 1, AppendOrigin::Client, T0) {
        Err(AppendError::Io(e)) => assert_eq!(
            e.io_error().and_then(|e| e.raw_os_error()),
            Some(28), // ENOSPC
            "{e}"
        ),
        other => panic!("expected an i/o error, got {other:?}"),
    }
    assert!(log.offline_cause().is_some_and(|c| c.contains("No space")));
    assert_eq!(log.log_end_offset(), end, "nothing was acknowledged");
    for _ in 0..2 {
        match log.append_as_leader(b.clone(), 1, AppendOrigin::Client, T0) {
            Err(AppendError::Io(StorageError::Offline { cause, .. })) => {
                assert!(cause.contains("No space"), "{cause}")
            }
            other => panic!("expected the log to be offline, got {other:?}"),
        }
    }
    let follower_batch = TestBatch::new(1, T0).at(end, 1).bytes();
    assert!(matches!(
        log.append_as_follower(follower_batch, T0),
        Err(AppendError::Io(StorageError::Offline { .. }))
    ));
    assert!(matches!(log.flush(), Err(StorageError::Offline { .. })));
    // The error is what keeps the data directory's owner from recording a clean
    // shutdown (see `clean_shutdown`): the next open recovers.
    assert!(matches!(log.close(), Err(StorageError::Offline { .. })));

    // The disk is healthy again (the device file is gone): everything acknowledged
    // before the failure is there, at its offsets, and the log takes writes again.
    fs::remove_file(&full).unwrap();
    let mut log =
        UnifiedLog::open(dir.path(), config(1024), T0, PreviousShutdown::Unclean).unwrap();
    assert_eq!(log.log_end_offset(), end);
    let all = read_all(&log, 4096);
    assert_eq!(all.len(), appended.len());
    for (b, (base, count)) in all.iter().zip(&appended) {
        assert_eq!(
            (b.base_offset(), i64::from(b.record_count())),
            (*base, *count)
        );
    }
    let info = log
        .append_as_leader(b, 1, AppendOrigin::Client, T0)
        .unwrap();
    assert_eq!(info.first_offset, end);
}

fn epoch_entries(log: &UnifiedLog) -> Vec<(i32, i64)> {
    log.leader_epoch_cache()
        .entries()
        .iter()
        .map(|e| (e.epoch, e.start_offset))
        .collect()
}

/// Appends `n` batches of two records as leader in `epoch`.
fn append_in_epoch(log: &mut UnifiedLog, epoch: i32, n: usize) {
    for _ in 0..n {
        log.append_as_leader(
            TestBatch::new(2, T0).bytes(),
            epoch,
            AppendOrigin::Client,
            T0,
        )
        .unwrap();
    }
}

/// KAFKA-15046: a new leader records its epoch without fsync, so a crash may leave the
/// checkpoint as it was before. The batches written in that epoch say where it started:
/// an unclean open finds the epoch again from them, and keeps the older entries.
#[test]
fn an_epoch_lost_in_a_crash_is_found_again_from_its_batches() {
    let dir = tempfile::tempdir().unwrap();
    let checkpoint = dir.path().join(crate::epoch::LEADER_EPOCH_CHECKPOINT_FILE);
    let mut log =
        UnifiedLog::open(dir.path(), config(4000), T0, PreviousShutdown::Unclean).unwrap();
    append_in_epoch(&mut log, 1, 5);
    let before = fs::read(&checkpoint).unwrap();
    // Becoming leader in epoch 3 at the log end, then appending in it.
    log.assign_epoch_start_offset(3, log.log_end_offset())
        .unwrap();
    append_in_epoch(&mut log, 3, 4);
    assert_eq!(epoch_entries(&log), vec![(1, 0), (3, 10)]);
    log.flush().unwrap();
    drop(log);
    // The crash lost the deferred rewrite: the file is the version before it.
    fs::write(&checkpoint, &before).unwrap();

    let log = UnifiedLog::open(dir.path(), config(4000), T0, PreviousShutdown::Unclean).unwrap();
    assert_eq!(epoch_entries(&log), vec![(1, 0), (3, 10)]);
    assert_eq!(log.end_offset_for_epoch(1), (1, 10));
    assert_eq!(log.end_offset_for_epoch(2), (1, 10));
    assert_eq!(log.end_offset_for_epoch(3), (3, 18));
    // What was found again is written back: the next open finds it in the file.
    drop(log);
    let log = UnifiedLog::open(dir.path(), config(4000), T0, PreviousShutdown::Clean).unwrap();
    assert_eq!(epoch_entries(&log), vec![(1, 0), (3, 10)]);
}

/// The same across segments, and the roll makes a deferred epoch durable first.
#[test]
fn an_epoch_lost_in_a_crash_is_found_again_in_older_segments() {
    let dir = tempfile::tempdir().unwrap();
    let checkpoint = dir.path().join(crate::epoch::LEADER_EPOCH_CHECKPOINT_FILE);
    let mut log =
        UnifiedLog::open(dir.path(), config(1000), T0, PreviousShutdown::Unclean).unwrap();
    append_in_epoch(&mut log, 1, 3);
    let before = fs::read(&checkpoint).unwrap();
    log.assign_epoch_start_offset(2, log.log_end_offset())
        .unwrap();
    assert!(log.leader_epoch_cache.is_deferred());
    append_in_epoch(&mut log, 2, 30);
    assert!(log.segment_count() > 2, "the epoch spans several segments");
    assert!(
        !log.leader_epoch_cache.is_deferred(),
        "a roll rewrites a deferred checkpoint durably"
    );
    let after_roll = fs::read(&checkpoint).unwrap();
    log.assign_epoch_start_offset(4, log.log_end_offset())
        .unwrap();
    append_in_epoch(&mut log, 4, 2);
    let entries = epoch_entries(&log);
    assert_eq!(entries, vec![(1, 0), (2, 6), (4, 66)]);
    drop(log);
    // What a crash can leave: the deferred rewrite after the roll lost. A recovery
    // reads the batches from the last roll's producer snapshot on, and finds epoch 4.
    fs::write(&checkpoint, &after_roll).unwrap();
    let log = UnifiedLog::open(dir.path(), config(1000), T0, PreviousShutdown::Unclean).unwrap();
    assert_eq!(epoch_entries(&log), entries);
    drop(log);
    // Worse than a crash can leave (both deferred rewrites lost, though the roll made
    // the first one durable): without a snapshot to start from, every segment is read.
    fs::write(&checkpoint, &before).unwrap();
    ProducerStateManager::delete_snapshots(dir.path(), None).unwrap();
    let log = UnifiedLog::open(dir.path(), config(1000), T0, PreviousShutdown::Unclean).unwrap();
    assert_eq!(epoch_entries(&log), entries);
}

/// A deferred rewrite may leave an empty or partial file after a crash: it is taken for
/// missing and the cache is rebuilt from every batch, after a clean or an unclean end.
#[test]
fn an_empty_or_torn_epoch_checkpoint_is_rebuilt_from_the_batches() {
    for (content, previous) in [
        (&b""[..], PreviousShutdown::Unclean),
        (&b"0\n2\n1 0\n"[..], PreviousShutdown::Unclean),
        (&b""[..], PreviousShutdown::Clean),
        (&b"0\n"[..], PreviousShutdown::Clean),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut log =
            UnifiedLog::open(dir.path(), config(1000), T0, PreviousShutdown::Unclean).unwrap();
        append_in_epoch(&mut log, 1, 10);
        log.assign_epoch_start_offset(5, log.log_end_offset())
            .unwrap();
        append_in_epoch(&mut log, 5, 10);
        let entries = epoch_entries(&log);
        assert_eq!(entries, vec![(1, 0), (5, 20)]);
        log.close().unwrap();
        let checkpoint = dir.path().join(crate::epoch::LEADER_EPOCH_CHECKPOINT_FILE);
        fs::write(&checkpoint, content).unwrap();
        let log = UnifiedLog::open(dir.path(), config(1000), T0, previous).unwrap();
        assert_eq!(epoch_entries(&log), entries, "{content:?} {previous:?}");
    }
}

/// A clean close writes its files without fsync; the next open after a clean shutdown
/// loads them as they are (no recovery, the producer snapshot used).
#[test]
fn close_writes_everything_a_clean_open_needs() {
    let dir = tempfile::tempdir().unwrap();
    let mut log =
        UnifiedLog::open(dir.path(), config(1000), T0, PreviousShutdown::Unclean).unwrap();
    append_in_epoch(&mut log, 1, 10);
    log.assign_epoch_start_offset(2, log.log_end_offset())
        .unwrap();
    log.append_as_leader(
        TestBatch::new(1, T0).producer(9, 0, 0).bytes(),
        2,
        AppendOrigin::Client,
        T0,
    )
    .unwrap();
    log.update_high_watermark(15);
    let end = log.log_end_offset();
    log.close().unwrap();
    for name in [HIGH_WATERMARK_FILE, LOG_START_OFFSET_FILE] {
        assert!(dir.path().join(name).exists(), "{name}");
    }
    let log = UnifiedLog::open(dir.path(), config(1000), T0, PreviousShutdown::Clean).unwrap();
    assert_eq!(log.high_watermark(), 15);
    assert_eq!(log.log_end_offset(), end);
    assert_eq!(epoch_entries(&log), vec![(1, 0), (2, 20)]);
    assert!(log.producer_state(9).is_some());
}

/// A close rewrites only the checkpoints whose content changed since they were read or
/// written (each rewrite allocates an inode for its temporary file).
#[test]
fn close_leaves_unchanged_checkpoints_alone() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let ino = |name: &str| fs::metadata(dir.path().join(name)).unwrap().ino();
    let epochs = crate::epoch::LEADER_EPOCH_CHECKPOINT_FILE;
    let mut log =
        UnifiedLog::open(dir.path(), config(1000), T0, PreviousShutdown::Unclean).unwrap();
    append_in_epoch(&mut log, 1, 3);
    log.update_high_watermark(4);
    log.close().unwrap();
    let before = [
        ino(HIGH_WATERMARK_FILE),
        ino(LOG_START_OFFSET_FILE),
        ino(epochs),
    ];

    let log = UnifiedLog::open(dir.path(), config(1000), T0, PreviousShutdown::Clean).unwrap();
    log.close().unwrap();
    let after = [
        ino(HIGH_WATERMARK_FILE),
        ino(LOG_START_OFFSET_FILE),
        ino(epochs),
    ];
    assert_eq!(before, after, "nothing changed, nothing rewritten");

    let mut log = UnifiedLog::open(dir.path(), config(1000), T0, PreviousShutdown::Clean).unwrap();
    log.update_high_watermark(6);
    log.assign_epoch_start_offset(2, 6).unwrap();
    log.close().unwrap();
    assert_ne!(ino(HIGH_WATERMARK_FILE), before[0]);
    assert_eq!(ino(LOG_START_OFFSET_FILE), before[1]);
    assert_ne!(ino(epochs), before[2], "the new epoch was written");
    let log = UnifiedLog::open(dir.path(), config(1000), T0, PreviousShutdown::Clean).unwrap();
    assert_eq!(log.high_watermark(), 6);
    // An epoch that starts at the log end has no batch: open trims it (as Kafka does).
    assert_eq!(epoch_entries(&log), vec![(1, 0)]);
}

/// KIP-390: the leader compresses at `compression.<codec>.level`.
#[test]
fn compression_levels_apply_when_the_leader_compresses() {
    use rill_protocol::records::{CompressionType, RecordBatchBuilder};
    let mut b = RecordBatchBuilder::new(CompressionType::None, 0);
    for i in 0..400u32 {
        let value = format!(
            "{i:05} the quick brown fox {} jumps over {} lazy dogs",
            i.wrapping_mul(7919) % 997,
            i.wrapping_mul(104_729) % 991
        );
        b.append(T0, None, Some(value.as_bytes()), &[]).unwrap();
    }
    let sent = b.build().unwrap();
    let stored_size = |codec: &str, gzip: Option<i32>, zstd: Option<i32>| {
        let dir = tempfile::tempdir().unwrap();
        let cfg = LogConfig {
            compression_type: codec.parse().unwrap(),
            compression_gzip_level: gzip,
            compression_zstd_level: zstd,
            ..config(1 << 20)
        };
        let mut log = UnifiedLog::open(dir.path(), cfg, T0, PreviousShutdown::Unclean).unwrap();
        log.append_as_leader(sent.clone(), 0, AppendOrigin::Client, T0)
            .unwrap();
        let stored = read_all(&log, 1 << 20);
        assert_eq!(stored.len(), 1);
        assert_eq!(stored[0].record_count(), 400);
        stored[0].size()
    };
    let (zstd_fast, zstd_best) = (
        stored_size("zstd", None, Some(1)),
        stored_size("zstd", None, Some(19)),
    );
    assert!(
        zstd_best < zstd_fast,
        "zstd 19: {zstd_best} B, 1: {zstd_fast} B"
    );
    let (gzip_fast, gzip_best) = (
        stored_size("gzip", Some(1), None),
        stored_size("gzip", Some(9), None),
    );
    assert!(
        gzip_best < gzip_fast,
        "gzip 9: {gzip_best} B, 1: {gzip_fast} B"
    );
}

/// Appends one batch of producer `pid` (epoch 0) at sequence `seq` with `n` records.
fn append_producer(log: &mut UnifiedLog, pid: i64, seq: i32, n: usize) {
    let b = TestBatch::new(n, T0)
        .value_len(60)
        .producer(pid, 0, seq)
        .bytes();
    log.append_as_leader(b, 0, AppendOrigin::Client, T0)
        .unwrap();
}

fn snapshot_offsets(dir: &Path) -> Vec<i64> {
    ProducerStateManager::snapshot_offsets(dir).unwrap()
}

/// Rewrites the snapshot at `offset` so that it names producer `to` where it named
/// `from`: a state the batches cannot give, which shows where a rebuild took its state.
fn tamper_snapshot(dir: &Path, offset: i64, from: i64, to: i64) {
    let path = crate::segment::segment_file(dir, offset, "snapshot");
    let text = fs::read_to_string(&path).unwrap();
    let tampered = text.replacen(&format!("\n{from} 0 "), &format!("\n{to} 0 "), 1);
    assert_ne!(text, tampered, "producer {from} is in the snapshot");
    fs::write(&path, tampered).unwrap();
}

/// A log of producer 7's batches over three segments (two rolls), and its bases.
fn three_segments_of_producer_7(dir: &Path) -> (UnifiedLog, Vec<i64>) {
    let mut log = UnifiedLog::open(dir, config(600), T0, PreviousShutdown::Unclean).unwrap();
    let mut seq = 0;
    while log.segment_count() < 3 {
        append_producer(&mut log, 7, seq, 2);
        seq += 2;
    }
    let bases = log.segment_base_offsets();
    (log, bases)
}

/// Kafka takes a producer snapshot at each roll; after a kill -9 the log starts from the
/// newest one at a segment base and reads only the batch headers after it.
#[test]
fn a_recovery_starts_from_the_snapshot_of_the_last_roll() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, bases) = three_segments_of_producer_7(dir.path());
    // One per roll, the newest two kept, each at the base of the segment it opened.
    assert_eq!(snapshot_offsets(dir.path()), bases[1..].to_vec());
    append_producer(&mut log, 9, 0, 1);
    let live_7 = log.producer_state(7).cloned().unwrap();
    let live_9 = log.producer_state(9).cloned().unwrap();
    drop(log); // kill -9

    // The untouched snapshot gives the live state back.
    let log = UnifiedLog::open(dir.path(), config(600), T0, PreviousShutdown::Unclean).unwrap();
    assert_eq!(log.producer_state(7), Some(&live_7));
    assert_eq!(log.producer_state(9), Some(&live_9));
    drop(log);

    // A tampered one shows that the batches below it were not read, and those above were.
    let newest = *bases.last().unwrap();
    tamper_snapshot(dir.path(), newest, 7, 8);
    let log = UnifiedLog::open(dir.path(), config(600), T0, PreviousShutdown::Unclean).unwrap();
    assert!(
        log.producer_state(8).is_some(),
        "the roll's snapshot was used"
    );
    assert_eq!(
        log.producer_state(9),
        Some(&live_9),
        "the batches after it were read"
    );
    // The batch that made the roll is in the last segment: replayed on top of it.
    assert_eq!(
        log.producer_state(7).map(|p| p.last_seq()),
        Some(live_7.last_seq())
    );
    drop(log);

    // A snapshot that is not at a segment's base is not used after a crash (the
    // `.txnindex` files below it may not be durable); a corrupt one falls back to the
    // one before it.
    let copy = crate::segment::segment_file(dir.path(), newest + 1, "snapshot");
    fs::copy(
        crate::segment::segment_file(dir.path(), newest, "snapshot"),
        &copy,
    )
    .unwrap();
    fs::write(
        crate::segment::segment_file(dir.path(), newest, "snapshot"),
        "garbage",
    )
    .unwrap();
    tamper_snapshot(dir.path(), bases[1], 7, 6);
    let log = UnifiedLog::open(dir.path(), config(600), T0, PreviousShutdown::Unclean).unwrap();
    assert!(
        log.producer_state(8).is_none(),
        "the copy off a segment base was not used"
    );
    assert!(
        log.producer_state(6).is_some(),
        "the older roll's snapshot was used"
    );
    assert_eq!(
        log.producer_state(7).map(|p| p.last_seq()),
        Some(live_7.last_seq()),
        "and the batches after it replayed"
    );
    assert_eq!(log.producer_state(9), Some(&live_9));
}

/// A truncation below a roll's snapshot deletes it: it describes batches that are gone.
#[test]
fn a_truncation_deletes_the_snapshots_above_the_new_log_end() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, bases) = three_segments_of_producer_7(dir.path());
    assert_eq!(snapshot_offsets(dir.path()), bases[1..].to_vec());
    // Into the middle segment: the last roll's snapshot goes, the one before stays.
    log.truncate_to(bases[2] - 2, T0).unwrap();
    assert_eq!(snapshot_offsets(dir.path()), vec![bases[1]]);
    let live = log.producer_state(7).cloned().unwrap();
    drop(log);
    let log = UnifiedLog::open(dir.path(), config(600), T0, PreviousShutdown::Unclean).unwrap();
    assert_eq!(log.producer_state(7), Some(&live));
    let end = log.log_end_offset();
    drop(log);
    // A follower starting over elsewhere keeps none.
    let mut log = UnifiedLog::open(dir.path(), config(600), T0, PreviousShutdown::Unclean).unwrap();
    log.truncate_fully_and_start_at(end + 100, T0).unwrap();
    assert!(snapshot_offsets(dir.path()).is_empty());
}

/// The periodic high-watermark checkpoint skips a file that holds the value already, as
/// a close does: with thousands of idle logs an fsync each made the pass take seconds.
#[test]
fn the_high_watermark_checkpoint_is_written_only_when_it_moved() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let ino = || {
        fs::metadata(dir.path().join(HIGH_WATERMARK_FILE))
            .unwrap()
            .ino()
    };
    let mut log =
        UnifiedLog::open(dir.path(), config(1000), T0, PreviousShutdown::Unclean).unwrap();
    append_in_epoch(&mut log, 1, 3);
    log.update_high_watermark(2);
    log.checkpoint_high_watermark().unwrap();
    let written = ino();
    log.checkpoint_high_watermark().unwrap();
    assert_eq!(ino(), written, "unchanged, not rewritten");
    log.update_high_watermark(3);
    log.checkpoint_high_watermark().unwrap();
    assert_ne!(ino(), written, "moved, rewritten");
    assert_eq!(
        checkpoint::read_offset(&dir.path().join(HIGH_WATERMARK_FILE)).unwrap(),
        Some(3)
    );
}

/// The file range a zero-copy read of `offset` names, as (position, len); `None` when the
/// read is empty.
fn range_at(log: &UnifiedLog, offset: i64) -> Option<(u64, u64)> {
    let info = log.read_file_range(offset, 1, i64::MAX, true).unwrap();
    info.file_range.map(|r| (r.position, r.len))
}

/// Every offset's zero-copy read names exactly the bytes of the batch holding it (the
/// loading read's), and a read at the log end names nothing.
fn assert_ranges_match_reads(log: &UnifiedLog) {
    for o in log.log_start_offset()..log.log_end_offset() {
        let loaded = log.read(o, 1, i64::MAX, true).unwrap();
        let range = loaded.file_range.map(|r| (r.position, r.len));
        assert!(range.is_some(), "offset {o}");
        assert_eq!(range_at(log, o), range, "offset {o}");
    }
    assert_eq!(range_at(log, log.log_end_offset()), None);
}

#[test]
fn reads_near_the_log_end_agree_with_the_index_after_appends_truncation_and_reopening() {
    // One segment of many more small batches than the segment remembers, so that reads
    // near the end are answered from the recent batches and reads further back from the
    // index and the headers.
    let dir = tempfile::tempdir().unwrap();
    let mut log =
        UnifiedLog::open(dir.path(), config(1 << 20), T0, PreviousShutdown::Unclean).unwrap();
    fill(&mut log, 200);
    assert_eq!(log.segment_count(), 1);
    assert_ranges_match_reads(&log);
    // Truncated into the remembered batches, then appended to again: nothing beyond the
    // cut may be remembered.
    let cut = log.log_end_offset() - 20;
    log.truncate_to(cut, T0).unwrap();
    assert!(log.log_end_offset() <= cut);
    assert_ranges_match_reads(&log);
    fill(&mut log, 30);
    assert_ranges_match_reads(&log);
    log.close().unwrap();
    // Reopened: nothing remembered until the next appends.
    let mut log =
        UnifiedLog::open(dir.path(), config(1 << 20), T0, PreviousShutdown::Clean).unwrap();
    assert_ranges_match_reads(&log);
    fill(&mut log, 3);
    assert_ranges_match_reads(&log);
}

/// Every read of the log, zero-copy or loading, at every offset and for several sizes,
/// gives the same bytes as the file holds, whether the tail copy answers it or not.
fn assert_reads_match_the_file(log: &UnifiedLog) {
    let end = log.log_end_offset();
    for o in log.log_start_offset()..=end {
        for max_bytes in [1, 200, 5_000] {
            for max_offset in [end - 1, end] {
                let loaded = log.read(o, max_bytes, max_offset, true).unwrap();
                let zero = log.read_file_range(o, max_bytes, max_offset, true).unwrap();
                assert_eq!(loaded.fetch_offset_metadata, zero.fetch_offset_metadata);
                let on_disk = zero.file_range.as_ref().map(|r| {
                    let mut buf = vec![0u8; r.len as usize];
                    std::os::unix::fs::FileExt::read_exact_at(&*r.file, &mut buf, r.position)
                        .unwrap();
                    buf
                });
                let want = (!loaded.records.is_empty()).then(|| loaded.records.to_vec());
                assert_eq!(
                    on_disk, want,
                    "offset {o}, {max_bytes} bytes, below {max_offset}"
                );
                if !zero.records.is_empty() {
                    assert_eq!(Some(zero.records.to_vec()), want, "copy at {o}");
                }
            }
        }
    }
}

#[test]
fn the_leaders_tail_copy_answers_reads_above_the_high_watermark_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let mut log =
        UnifiedLog::open(dir.path(), config(1 << 20), T0, PreviousShutdown::Unclean).unwrap();
    fill(&mut log, 10);
    // Off by default: no copy, reads come from the file.
    assert_eq!(log.tail_copy_len(), 0);
    log.set_tail_copy_limit(4_096);
    let hw = log.log_end_offset();
    log.update_high_watermark(hw);
    fill(&mut log, 6);
    let held = log.tail_copy_len();
    assert!(held > 0);
    // A follower's fetch at the old high watermark gets the copied records.
    let zero = log.read_file_range(hw, 1 << 20, i64::MAX, true).unwrap();
    assert_eq!(zero.records.len(), held);
    assert_reads_match_the_file(&log);
    // The high watermark releases what lies below it, batch by batch.
    let end = log.log_end_offset();
    log.update_high_watermark(end - 1);
    let partly = log.tail_copy_len();
    assert!(partly > 0 && partly < held, "{partly} of {held}");
    assert_reads_match_the_file(&log);
    log.update_high_watermark(end);
    assert_eq!(log.tail_copy_len(), 0);
    // Appends past the limit start the copy again at the batch that did not fit.
    fill(&mut log, 60);
    assert!(log.tail_copy_len() > 0 && log.tail_copy_len() <= 4_096);
    assert_reads_match_the_file(&log);
    // A truncation into the copy drops it; later appends are copied again.
    let cut = log.log_end_offset() - 3;
    log.truncate_to(cut, T0).unwrap();
    assert_eq!(log.tail_copy_len(), 0);
    fill(&mut log, 2);
    assert!(log.tail_copy_len() > 0);
    assert_reads_match_the_file(&log);
    // A batch bigger than the limit is not copied, and drops what was.
    let big = TestBatch::new(1, T0).value_len(5_000);
    log.append_as_leader(big.bytes(), 1, AppendOrigin::Client, T0)
        .unwrap();
    assert_eq!(log.tail_copy_len(), 0);
    assert_reads_match_the_file(&log);
    // Off again (this broker now follows): nothing is held.
    fill(&mut log, 2);
    log.set_tail_copy_limit(0);
    assert_eq!(log.tail_copy_len(), 0);
    fill(&mut log, 2);
    assert_eq!(log.tail_copy_len(), 0);
    assert_reads_match_the_file(&log);
}

#[test]
fn a_roll_moves_the_tail_copy_to_the_new_segment() {
    let dir = tempfile::tempdir().unwrap();
    let mut log =
        UnifiedLog::open(dir.path(), config(2_000), T0, PreviousShutdown::Unclean).unwrap();
    log.set_tail_copy_limit(64 * 1024);
    fill(&mut log, 40);
    assert!(log.segment_count() > 2);
    let active = *log.segment_base_offsets().last().unwrap();
    // The copy holds only the active segment's batches: what an older segment held was
    // dropped when it rolled.
    let zero = log
        .read_file_range(active, 1 << 20, i64::MAX, true)
        .unwrap();
    assert_eq!(zero.records.len(), log.tail_copy_len());
    assert_reads_match_the_file(&log);
}

#[test]
fn a_tail_copy_of_more_batches_than_the_segment_remembers_still_matches_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut log =
        UnifiedLog::open(dir.path(), config(1 << 20), T0, PreviousShutdown::Unclean).unwrap();
    log.set_tail_copy_limit(64 * 1024);
    let hw = log.log_end_offset();
    fill(&mut log, 150);
    let held = log.tail_copy_len();
    // The high watermark inside the copied batches the segment no longer remembers: what
    // cannot be placed is kept, and every read still gives the file's bytes.
    log.update_high_watermark(hw + 20);
    assert_eq!(log.tail_copy_len(), held);
    assert_reads_match_the_file(&log);
    // Inside the remembered ones: released up to the batch that holds it.
    log.update_high_watermark(log.log_end_offset() - 10);
    assert!(log.tail_copy_len() < held);
    assert_reads_match_the_file(&log);
}
