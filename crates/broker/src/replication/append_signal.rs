//! Wake-ups for requests parked on partitions: fetches waiting for `min_bytes`, and
//! acks=all produces waiting for the high watermark (Kafka's fetch and produce
//! purgatories, keyed by partition).
//!
//! One `Notify` for the whole broker woke every parked fetch on every append: with a
//! thousand consumers long-polling their own partitions, each append cost a thousand
//! wake-ups and a thousand re-reads that find nothing. The partitions are spread over
//! [`SHARDS`] notifiers instead, by a hash of the topic and partition: an append wakes
//! only the requests waiting on a partition of its shard, and a request waits on the
//! shards of its partitions (usually one or a few; a follower's fetch of every
//! partition waits on all of them). A wake-up for another partition of the same shard
//! costs one more read, as before.

use std::collections::hash_map::DefaultHasher;
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::pin::Pin;
use std::task::Poll;

use rill_storage::TopicPartition;
use tokio::sync::futures::Notified;
use tokio::sync::Notify;

/// Notifiers the partitions are spread over: enough that a broker's consumers rarely
/// share one, few enough that waiting on all of them stays cheap.
pub const SHARDS: usize = 64;

/// The broker's notifiers, one per shard of partitions.
pub struct AppendSignals {
    shards: Box<[Notify]>,
}

impl Default for AppendSignals {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Notify::new()).collect(),
        }
    }
}

impl AppendSignals {
    /// The shard of a partition.
    pub fn shard(topic: &str, partition: i32) -> usize {
        let mut h = DefaultHasher::new();
        topic.hash(&mut h);
        partition.hash(&mut h);
        (h.finish() % SHARDS as u64) as usize
    }

    /// Wakes every request parked on a partition of `tp`'s shard: data was appended,
    /// the high watermark moved, or the partition changed hands or went away.
    pub fn notify(&self, tp: &TopicPartition) {
        if let Some(n) = self.shards.get(Self::shard(&tp.topic, tp.partition)) {
            n.notify_waiters();
        }
    }

    /// Wakes every parked request of every partition (the broker lost or regained its
    /// controller lease: every leadership changed at once).
    pub fn notify_all(&self) {
        for n in self.shards.iter() {
            n.notify_waiters();
        }
    }

    /// A future that resolves at the next [`Self::notify`] of any partition in one of
    /// `shards` (indices from [`Self::shard`]; duplicates are harmless). It is
    /// registered at once, so a notify between this call and the first poll is not
    /// missed: create it before reading, await it after.
    pub fn any_of(&self, shards: &[usize]) -> AnyNotified<'_> {
        let mut waits: Vec<Pin<Box<Notified<'_>>>> = Vec::with_capacity(shards.len());
        let mut taken = [false; SHARDS];
        for &s in shards {
            let (Some(n), Some(seen)) = (self.shards.get(s), taken.get_mut(s)) else {
                continue;
            };
            if std::mem::replace(seen, true) {
                continue;
            }
            let mut wait = Box::pin(n.notified());
            wait.as_mut().enable();
            waits.push(wait);
        }
        AnyNotified { waits }
    }

    /// [`Self::any_of`] for one partition.
    pub fn one(&self, tp: &TopicPartition) -> AnyNotified<'_> {
        self.any_of(&[Self::shard(&tp.topic, tp.partition)])
    }
}

/// See [`AppendSignals::any_of`]. With no shards it never resolves (the caller's
/// deadline ends the wait).
pub struct AnyNotified<'a> {
    waits: Vec<Pin<Box<Notified<'a>>>>,
}

impl Future for AnyNotified<'_> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<()> {
        for wait in &mut self.waits {
            if wait.as_mut().poll(cx).is_ready() {
                return Poll::Ready(());
            }
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn tp(topic: &str, partition: i32) -> TopicPartition {
        TopicPartition {
            topic: topic.into(),
            partition,
        }
    }

    /// Two partitions in different shards.
    fn apart() -> (TopicPartition, TopicPartition) {
        let a = tp("a", 0);
        let sa = AppendSignals::shard(&a.topic, a.partition);
        let b = (0..)
            .map(|p| tp("b", p))
            .find(|b| AppendSignals::shard(&b.topic, b.partition) != sa)
            .unwrap();
        (a, b)
    }

    #[tokio::test]
    async fn a_notify_before_the_await_is_not_missed() {
        let signals = AppendSignals::default();
        let (a, _) = apart();
        let wait = signals.one(&a);
        signals.notify(&a);
        tokio::time::timeout(Duration::from_secs(5), wait)
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn only_the_partitions_shard_wakes() {
        let signals = AppendSignals::default();
        let (a, b) = apart();
        let wait = signals.one(&a);
        signals.notify(&b);
        assert!(
            tokio::time::timeout(Duration::from_millis(50), wait)
                .await
                .is_err(),
            "a notify of another shard woke the wait"
        );
        let both = signals.any_of(&[
            AppendSignals::shard(&a.topic, a.partition),
            AppendSignals::shard(&b.topic, b.partition),
            AppendSignals::shard(&b.topic, b.partition),
        ]);
        assert_eq!(both.waits.len(), 2);
        signals.notify(&b);
        tokio::time::timeout(Duration::from_secs(5), both)
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn no_shards_waits_for_the_deadline() {
        let signals = AppendSignals::default();
        let wait = signals.any_of(&[SHARDS, SHARDS + 1]);
        signals.notify(&tp("a", 0));
        assert!(tokio::time::timeout(Duration::from_millis(20), wait)
            .await
            .is_err());
    }
}
