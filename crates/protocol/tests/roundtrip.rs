//! Property tests: random messages round-trip at every valid version.
//!
//! proptest chooses a seed; the message is built from it by the generated `RandomValue`
//! impls (edge values, unicode strings, nulls, unknown tagged fields), then encoded,
//! decoded, re-encoded and truncated at every byte (see `support::check_round_trip`).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "helpers of tests"
)]

#[macro_use]
mod support;

use proptest::prelude::*;
use rill_protocol::generated::*;
use rill_protocol::primitives::{Decodable, Encodable, Request};
use support::{check_round_trip, Outcome, RandomValue, Rng};

fn all_versions<T>(seed: u64, lo: i16, hi: i16) -> usize
where
    T: RandomValue + Encodable + Decodable + PartialEq + std::fmt::Debug,
{
    let mut rng = Rng::new(seed);
    let value = T::random(&mut rng);
    (lo..=hi)
        .filter(|&v| check_round_trip(&value, v, true) == Outcome::RoundTripped)
        .count()
}

/// A request and its response, over the request's valid versions.
fn pair<R>(seed: u64)
where
    R: Request + RandomValue + PartialEq + std::fmt::Debug,
    R::Response: RandomValue + PartialEq + std::fmt::Debug,
{
    all_versions::<R>(seed, R::MIN_VERSION, R::MAX_VERSION);
    all_versions::<R::Response>(seed, R::MIN_VERSION, R::MAX_VERSION);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn produce(seed in any::<u64>()) { pair::<ProduceRequest>(seed) }
    #[test]
    fn fetch(seed in any::<u64>()) { pair::<FetchRequest>(seed) }
    #[test]
    fn metadata(seed in any::<u64>()) { pair::<MetadataRequest>(seed) }
    #[test]
    fn api_versions(seed in any::<u64>()) { pair::<ApiVersionsRequest>(seed) }
    #[test]
    fn list_offsets(seed in any::<u64>()) { pair::<ListOffsetsRequest>(seed) }
    #[test]
    fn create_topics(seed in any::<u64>()) { pair::<CreateTopicsRequest>(seed) }
    #[test]
    fn join_group(seed in any::<u64>()) { pair::<JoinGroupRequest>(seed) }
    #[test]
    fn offset_commit(seed in any::<u64>()) { pair::<OffsetCommitRequest>(seed) }
    #[test]
    fn sync_group(seed in any::<u64>()) { pair::<SyncGroupRequest>(seed) }
    #[test]
    fn offset_fetch(seed in any::<u64>()) { pair::<OffsetFetchRequest>(seed) }
    #[test]
    fn find_coordinator(seed in any::<u64>()) { pair::<FindCoordinatorRequest>(seed) }
    #[test]
    fn headers(seed in any::<u64>()) {
        all_versions::<RequestHeader>(seed, 0, 2);
        all_versions::<ResponseHeader>(seed, 0, 1);
    }
}

/// Every message of every spec, a few seeds each, at every valid version: the generator
/// has no message-specific code, so this catches a mistake in any shape it emits.
#[test]
fn every_message_round_trips() {
    let mut checked = 0usize;
    macro_rules! sweep {
        ($t:path, $lo:expr, $hi:expr) => {
            for seed in 0..6u64 {
                checked += all_versions::<$t>(seed * 7919 + 1, $lo, $hi);
            }
        };
    }
    for_each_message!(sweep);
    assert!(checked > 1000, "only {checked} round trips ran");
}
