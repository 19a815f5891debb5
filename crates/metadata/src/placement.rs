//! Rack-unaware replica placement: where the replicas of new partitions go.
//!
//! The algorithm is Kafka's rack-unaware assignment (`assignReplicasToBrokersRackUnaware`,
//! which `StripedReplicaPlacer` reduces to when no broker has a rack):
//!
//! 1. the usable brokers in id order, a start index and a replica shift drawn at random;
//! 2. partition `p`'s first replica (its preferred leader) is broker
//!    `(start + p) mod n`, so leaders go round-robin over the brokers;
//! 3. its other replicas follow the first at distance `1 + (shift + j) mod (n - 1)`,
//!    never the first replica itself, and the shift grows by one after every `n`
//!    partitions so that followers of successive rounds land on different brokers.
//!
//! The randomness comes from the caller, so placement is reproducible in tests.

/// Places `partitions` partitions of `replication_factor` replicas over `brokers` (ids,
/// any order), starting at partition `first_partition`. `random` seeds the start and the
/// shift. Returns `None` when there are fewer brokers than the replication factor.
pub fn place_replicas(
    brokers: &[i32],
    first_partition: i32,
    partitions: i32,
    replication_factor: i16,
    random: u64,
) -> Option<Vec<Vec<i32>>> {
    let mut brokers = brokers.to_vec();
    brokers.sort_unstable();
    brokers.dedup();
    let n = brokers.len();
    let rf = usize::try_from(replication_factor).ok()?;
    if rf == 0 || rf > n || partitions < 0 {
        return None;
    }
    let start = (random % n as u64) as usize;
    let mut shift = ((random >> 32) % n as u64) as usize;
    let mut out = Vec::with_capacity(usize::try_from(partitions).unwrap_or(0));
    for i in 0..partitions {
        // The partition's number in the whole topic, so that adding partitions later
        // continues the same round-robin.
        let p = usize::try_from(first_partition + i).ok()?;
        if p > 0 && p % n == 0 {
            shift += 1;
        }
        let first = (p + start) % n;
        let mut replicas = Vec::with_capacity(rf);
        replicas.push(brokers[first]);
        for j in 0..rf - 1 {
            let distance = 1 + (shift + j) % (n - 1);
            replicas.push(brokers[(first + distance) % n]);
        }
        out.push(replicas);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leaders_are_spread_and_replicas_distinct() {
        let placed = place_replicas(&[3, 1, 2], 0, 6, 3, 0).unwrap();
        let leaders: Vec<i32> = placed.iter().map(|r| r[0]).collect();
        assert_eq!(leaders, vec![1, 2, 3, 1, 2, 3]);
        for r in &placed {
            let mut s = r.clone();
            s.sort_unstable();
            s.dedup();
            assert_eq!(s.len(), 3);
        }
    }

    #[test]
    fn followers_shift_between_rounds() {
        let placed = place_replicas(&[1, 2, 3, 4], 0, 8, 2, 0).unwrap();
        assert_eq!(placed[0], vec![1, 2]);
        assert_eq!(placed[4], vec![1, 3]);
    }

    #[test]
    fn too_few_brokers() {
        assert!(place_replicas(&[1, 2], 0, 1, 3, 7).is_none());
        assert!(place_replicas(&[], 0, 1, 1, 7).is_none());
    }

    #[test]
    fn single_broker() {
        assert_eq!(
            place_replicas(&[5], 0, 2, 1, 99).unwrap(),
            vec![vec![5], vec![5]]
        );
    }
}
