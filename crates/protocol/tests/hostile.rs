//! Hostile input: absurd lengths fail at once, without allocating, and random bytes never
//! panic any decoder.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "helpers of tests"
)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use bytes::Bytes;
use proptest::prelude::*;
use rill_protocol::generated::MetadataRequest;
use rill_protocol::primitives::Decodable;
use rill_protocol::{decode_request_header, ApiKey, DecodeError, RequestBody, ResponseBody};

/// Records the largest single allocation each thread makes, so that a test can prove a
/// decoder did not reserve memory from a length it read.
struct LargestAllocation;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

#[allow(
    unsafe_code,
    reason = "a global allocator is unsafe by definition; this one forwards to System"
)]
unsafe impl GlobalAlloc for LargestAllocation {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = LARGEST.try_with(|l| l.set(l.get().max(layout.size())));
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: LargestAllocation = LargestAllocation;

fn largest_allocation_during<T>(f: impl FnOnce() -> T) -> (T, usize) {
    LARGEST.with(|l| l.set(0));
    let out = f();
    (out, LARGEST.with(Cell::get))
}

/// The `kafka-protocol` crate aborted on exactly this: a topic count of 0x7fffffff with a
/// handful of bytes behind it made it reserve ~150 GB. Here it is an error, and the error
/// comes before any allocation (the test would abort otherwise).
#[test]
fn metadata_topic_count_of_i32_max_is_an_error() {
    let mut buf = Bytes::from_static(&[
        0x7f, 0xff, 0xff, 0xff, 0, 3, b'f', b'o', b'o', 0, 0, 0, 0, 0,
    ]);
    let (result, largest) = largest_allocation_during(|| MetadataRequest::decode(&mut buf, 0));
    assert!(matches!(result, Err(DecodeError::InvalidLength { .. })));
    assert!(largest < 1024, "decoding allocated {largest} bytes at once");
    // The compact form: varint 0xffffffff is count 0xfffffffe.
    let mut buf = Bytes::from_static(&[0xff, 0xff, 0xff, 0xff, 0x0f, 0, 0, 0]);
    assert!(matches!(
        MetadataRequest::decode(&mut buf, 12),
        Err(DecodeError::InvalidLength { .. })
    ));
    // 200 topics announced, 10 sent.
    let mut v = vec![0, 0, 0, 200];
    for _ in 0..10 {
        v.extend_from_slice(&[0, 1, b'x']);
    }
    let bytes = Bytes::from(v);
    let (result, largest) =
        largest_allocation_during(|| MetadataRequest::decode(&mut bytes.clone(), 0));
    assert!(result.is_err());
    // At most as many topics as the 30 bytes behind the count could hold, not 200.
    assert!(
        largest
            <= 15
                * std::mem::size_of::<
                    rill_protocol::generated::metadata_request::MetadataRequestTopic,
                >()
    );
}

#[test]
fn negative_lengths_and_bad_utf8_are_errors() {
    // Topic name length -2.
    let mut buf = Bytes::from_static(&[0, 0, 0, 1, 0xff, 0xfe]);
    assert!(matches!(
        MetadataRequest::decode(&mut buf, 0),
        Err(DecodeError::InvalidLength { .. })
    ));
    // Null topic name where names are not nullable (v0-v9).
    let mut buf = Bytes::from_static(&[0, 0, 0, 1, 0xff, 0xff]);
    assert_eq!(
        MetadataRequest::decode(&mut buf, 0),
        Err(DecodeError::UnexpectedNull)
    );
    // Null topic array in v0.
    let mut buf = Bytes::from_static(&[0xff, 0xff, 0xff, 0xff]);
    assert_eq!(
        MetadataRequest::decode(&mut buf, 0),
        Err(DecodeError::UnexpectedNull)
    );
    // Invalid UTF-8 in a name.
    let mut buf = Bytes::from_static(&[0, 0, 0, 1, 0, 2, 0xc3, 0x28]);
    assert_eq!(
        MetadataRequest::decode(&mut buf, 0),
        Err(DecodeError::InvalidUtf8)
    );
}

#[test]
fn tagged_field_counts_are_bounded_too() {
    // v12, null topics, two bools, then a tagged section claiming 2^28 fields.
    let mut buf = Bytes::from_static(&[0, 1, 0, 0x80, 0x80, 0x80, 0x80, 0x01, 0, 0]);
    assert!(matches!(
        MetadataRequest::decode(&mut buf, 12),
        Err(DecodeError::InvalidLength { .. })
    ));
    // A tagged field whose size runs past the end.
    let mut buf = Bytes::from_static(&[0, 1, 0, 1, 9, 100, 0]);
    assert!(matches!(
        MetadataRequest::decode(&mut buf, 12),
        Err(DecodeError::InvalidLength { .. })
    ));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Random bytes as any request or response, at every version: errors, never panics.
    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..96)) {
        let bytes = Bytes::from(bytes);
        for key in ApiKey::ALL {
            let (lo, hi) = key.valid_versions();
            for v in lo..=hi {
                let _ = RequestBody::decode(*key, v, &mut bytes.clone());
                let _ = ResponseBody::decode(*key, v, &mut bytes.clone());
            }
        }
        let _ = decode_request_header(&mut bytes.clone());
    }
}
