//! Decompression bombs: a gigabyte of zeros squeezed into a few hundred kilobytes must be
//! refused under a 1 MiB cap, quickly, and without the decoder allocating much past the
//! cap. A counting global allocator measures the peak of live heap bytes during each
//! decode (zstd's C allocations are outside it; its window is bounded separately by
//! `window_log_max`).
//!
//! One `#[test]` only, so that no other test in this binary allocates concurrently.

// Helpers outside `#[test]` functions unwrap too; this is test code.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
// A `GlobalAlloc` impl is unsafe by definition; it only forwards to the system allocator.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rill_protocol::records::{
    compression, BatchError, CompressionType, RecordBatch, RecordBatchBuilder,
};

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const GIB: usize = 1 << 30;
const MIB: usize = 1 << 20;
const CAP: usize = MIB;

/// Runs `f`, returning its result, the peak growth of the heap while it ran, and the time.
fn measured<T>(f: impl FnOnce() -> T) -> (T, usize, Duration) {
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let start = Instant::now();
    let out = f();
    let elapsed = start.elapsed();
    (
        out,
        PEAK.load(Ordering::Relaxed).saturating_sub(base),
        elapsed,
    )
}

fn zeros_gzip() -> Vec<u8> {
    // One member of 64 MiB, repeated: a multi-member stream Java's reader (and ours)
    // reads through, 1 GiB in all, for the cost of compressing 64 MiB once.
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    let chunk = vec![0u8; MIB];
    for _ in 0..64 {
        enc.write_all(&chunk).unwrap();
    }
    enc.finish().unwrap().repeat(GIB / (64 * MIB))
}

fn zeros_zstd() -> Vec<u8> {
    let mut enc = zstd::stream::write::Encoder::new(Vec::new(), 1).unwrap();
    let chunk = vec![0u8; MIB];
    for _ in 0..GIB / MIB {
        enc.write_all(&chunk).unwrap();
    }
    enc.finish().unwrap()
}

fn zeros_lz4() -> Vec<u8> {
    // One 64 KiB block of zeros, repeated 16384 times inside one frame.
    let one = compression::compress(CompressionType::Lz4, &vec![0u8; 64 * 1024]).unwrap();
    let header = &one[..7]; // magic, FLG, BD, HC: no content size in our frames
    let block = &one[7..one.len() - 4]; // everything but the end mark
    let mut out = header.to_vec();
    for _ in 0..GIB / (64 * 1024) {
        out.extend_from_slice(block);
    }
    out.extend_from_slice(&0u32.to_le_bytes());
    out
}

fn zeros_xerial_snappy() -> Vec<u8> {
    // 32 KiB blocks of zeros; 256 MiB of them (snappy cannot squeeze much harder).
    let one = compression::compress(CompressionType::Snappy, &vec![0u8; 32 * 1024]).unwrap();
    let (header, block) = one.split_at(16);
    let mut out = header.to_vec();
    for _ in 0..(256 * MIB) / (32 * 1024) {
        out.extend_from_slice(block);
    }
    out
}

/// A raw snappy block whose preamble claims 4 GiB - 1: refused before any allocation.
fn lying_raw_snappy() -> Vec<u8> {
    vec![0xff, 0xff, 0xff, 0xff, 0x0f, 0x00]
}

#[test]
fn bombs_are_refused_quickly_and_without_big_allocations() {
    let bombs = [
        ("gzip", CompressionType::Gzip, zeros_gzip()),
        ("zstd", CompressionType::Zstd, zeros_zstd()),
        ("lz4", CompressionType::Lz4, zeros_lz4()),
        (
            "snappy xerial",
            CompressionType::Snappy,
            zeros_xerial_snappy(),
        ),
        ("snappy raw", CompressionType::Snappy, lying_raw_snappy()),
    ];
    for (name, codec, bomb) in &bombs {
        let (result, peak, elapsed) = measured(|| compression::decompress(*codec, bomb, CAP));
        eprintln!(
            "{name}: {} input bytes, peak +{peak} bytes, {elapsed:?}",
            bomb.len()
        );
        assert_eq!(result, Err(BatchError::DecompressedTooLarge(CAP)), "{name}");
        assert!(
            peak < 4 * MIB,
            "{name}: decoder allocated {peak} bytes under a 1 MiB cap"
        );
        assert!(elapsed < Duration::from_secs(5), "{name}: took {elapsed:?}");
    }

    // The same through a whole batch: a gzip bomb inside a valid, CRC-correct batch.
    let mut raw = RecordBatchBuilder::new(CompressionType::None, 0)
        .build()
        .unwrap()
        .to_vec();
    raw.extend_from_slice(&bombs[0].2);
    let len = (raw.len() - 12) as i32;
    raw[8..12].copy_from_slice(&len.to_be_bytes());
    raw[21..23].copy_from_slice(&CompressionType::Gzip.id().to_be_bytes());
    raw[57..61].copy_from_slice(&1i32.to_be_bytes());
    let crc = crc32c::crc32c(&raw[21..]);
    raw[17..21].copy_from_slice(&crc.to_be_bytes());
    let batch = RecordBatch::new(raw.into()).unwrap();
    batch.validate().unwrap();
    let (result, peak, _) = measured(|| batch.records(CAP));
    assert_eq!(result.unwrap_err(), BatchError::DecompressedTooLarge(CAP));
    assert!(peak < 4 * MIB, "batch decode allocated {peak} bytes");
}
