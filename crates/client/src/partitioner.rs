//! Choosing a partition for a record, the way Kafka's Java producer does.
//!
//! - A record with a key goes to `toPositive(murmur2(key)) % numPartitions`, with Kafka's
//!   murmur2 (seed `0x9747b28c`) bit for bit, so that a key lands on the same partition
//!   whichever client produced it (librdkafka's `murmur2_random` partitioner agrees).
//! - A record without a key goes to the topic's current "sticky" partition (KIP-480), which
//!   changes when the batch being filled for it is sent, so that keyless records fill
//!   batches instead of spreading one record per partition.

/// Kafka's `Utils.murmur2`: 32-bit MurmurHash2 with seed `0x9747b28c`, little-endian
/// 4-byte blocks, returned as the signed `int` Java sees.
///
/// ```
/// assert_eq!(rill_client::murmur2(b"foobar"), -790332482);
/// ```
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let mut h: u32 = SEED ^ (data.len() as u32);
    let mut blocks = data.chunks_exact(4);
    for block in &mut blocks {
        let mut k = u32::from_le_bytes([block[0], block[1], block[2], block[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let tail = blocks.remainder();
    if tail.len() >= 3 {
        h ^= u32::from(tail[2]) << 16;
    }
    if tail.len() >= 2 {
        h ^= u32::from(tail[1]) << 8;
    }
    if !tail.is_empty() {
        h ^= u32::from(tail[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// Kafka's `Utils.toPositive`: clears the sign bit (not `abs`, which overflows on
/// `i32::MIN`).
pub fn to_positive(n: i32) -> i32 {
    n & 0x7fff_ffff
}

/// The partition the Java client's default partitioner picks for `key` among
/// `partition_count` partitions.
///
/// ```
/// use rill_client::partition_for_key;
/// assert_eq!(partition_for_key(b"foobar", 6), ((-790332482i32 & 0x7fffffff) % 6));
/// ```
pub fn partition_for_key(key: &[u8], partition_count: usize) -> i32 {
    if partition_count == 0 {
        return 0;
    }
    let n = i32::try_from(partition_count).unwrap_or(i32::MAX);
    to_positive(murmur2(key)) % n
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vectors of Kafka's `UtilsTest.testMurmur2` (Java client).
    #[test]
    fn matches_java_utils_test_vectors() {
        let cases: &[(&str, i32)] = &[
            ("21", -973932308),
            ("foobar", -790332482),
            ("a-little-bit-long-string", -985981536),
            ("a-little-bit-longer-string", -1486304829),
            (
                "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58897971,
            ),
            ("abc", 479470107),
        ];
        for (input, expected) in cases {
            assert_eq!(murmur2(input.as_bytes()), *expected, "murmur2({input:?})");
        }
    }

    /// Values of Kafka's implementation for every tail length (1 to 4 trailing bytes).
    #[test]
    fn matches_more_java_values() {
        let cases: &[(&str, i32)] = &[
            ("1", -1993445489),
            ("12", 126087238),
            ("123", -267702483),
            ("1234", -1614185708),
            ("12345", -1188365604),
        ];
        for (input, expected) in cases {
            assert_eq!(murmur2(input.as_bytes()), *expected, "murmur2({input:?})");
        }
    }

    #[test]
    fn to_positive_clears_the_sign_bit() {
        assert_eq!(to_positive(i32::MIN), 0);
        assert_eq!(to_positive(-1), i32::MAX);
        assert_eq!(to_positive(5), 5);
    }

    #[test]
    fn partition_is_in_range() {
        for i in 0..1000 {
            let p = partition_for_key(format!("key-{i}").as_bytes(), 7);
            assert!((0..7).contains(&p));
        }
    }
}
