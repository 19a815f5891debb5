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
//!
//! Two kinds of change are signalled apart, because their waiters are different requests:
//! the log end moved (an append: what a follower's fetch parked at the log end waits
//! for) and the high watermark moved (what an acks=all produce and a consumer wait for).
//! On a replicated topic every acks=all append moves the high watermark once its
//! followers' next fetches come in; signalled as one kind, that woke the follower fetch
//! already parked for the next records, which re-read its partitions to find nothing new
//! and parked again — a wasted wake-up and read per request. Kafka's purgatories keep
//! the same distinction: a follower's `DelayedFetch` completes on bytes past its fetch
//! offset, which a high watermark increment does not add. Leadership and other state
//! changes ([`AppendSignals::notify`]) wake both kinds, and consumers' fetches wait on
//! both.

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

/// Which changes a wait wakes for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kinds {
    LogEnd,
    HighWatermark,
    Both,
}

/// The broker's notifiers, one per shard of partitions and kind of change.
pub struct AppendSignals {
    log_end: Box<[Notify]>,
    high_watermark: Box<[Notify]>,
}

impl Default for AppendSignals {
    fn default() -> Self {
        Self {
            log_end: (0..SHARDS).map(|_| Notify::new()).collect(),
            high_watermark: (0..SHARDS).map(|_| Notify::new()).collect(),
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

    /// Wakes every request parked on a partition of `tp`'s shard, whatever it waits
    /// for: the partition changed hands or went away, its ISR or its durable end moved.
    pub fn notify(&self, tp: &TopicPartition) {
        self.notify_log_end(tp);
        self.notify_high_watermark(tp);
    }

    /// Wakes the requests waiting for `tp`'s shard's log end: records were appended.
    pub fn notify_log_end(&self, tp: &TopicPartition) {
        if let Some(n) = self.log_end.get(Self::shard(&tp.topic, tp.partition)) {
            n.notify_waiters();
        }
    }

    /// Wakes the requests waiting for `tp`'s shard's high watermark.
    pub fn notify_high_watermark(&self, tp: &TopicPartition) {
        if let Some(n) = self
            .high_watermark
            .get(Self::shard(&tp.topic, tp.partition))
        {
            n.notify_waiters();
        }
    }

    /// Wakes every parked request of every partition (the broker lost or regained its
    /// controller lease: every leadership changed at once).
    pub fn notify_all(&self) {
        for n in self.log_end.iter().chain(self.high_watermark.iter()) {
            n.notify_waiters();
        }
    }

    /// A future that resolves at the next change of any kind to a partition in one of
    /// `shards` (indices from [`Self::shard`]; duplicates are harmless). It is
    /// registered at once, so a notify between this call and the first poll is not
    /// missed: create it before reading, await it after.
    pub fn any_of(&self, shards: &[usize]) -> AnyNotified<'_> {
        self.waits(shards, Kinds::Both)
    }

    /// As [`Self::any_of`], for appends and [`Self::notify`] only: a follower's fetch,
    /// which has nothing more to read when only the high watermark moved.
    pub fn log_end_of(&self, shards: &[usize]) -> AnyNotified<'_> {
        self.waits(shards, Kinds::LogEnd)
    }

    /// As [`Self::any_of`] for one partition, for high watermark moves and
    /// [`Self::notify`] only: an acks=all produce.
    pub fn high_watermark_of(&self, tp: &TopicPartition) -> AnyNotified<'_> {
        self.waits(
            &[Self::shard(&tp.topic, tp.partition)],
            Kinds::HighWatermark,
        )
    }

    fn waits(&self, shards: &[usize], kinds: Kinds) -> AnyNotified<'_> {
        let families: &[&[Notify]] = match kinds {
            Kinds::LogEnd => &[&self.log_end],
            Kinds::HighWatermark => &[&self.high_watermark],
            Kinds::Both => &[&self.log_end, &self.high_watermark],
        };
        let mut waits: Vec<Pin<Box<Notified<'_>>>> =
            Vec::with_capacity(shards.len() * families.len());
        let mut taken = [false; SHARDS];
        for &s in shards {
            let Some(seen) = taken.get_mut(s) else {
                continue;
            };
            if std::mem::replace(seen, true) {
                continue;
            }
            for family in families {
                if let Some(n) = family.get(s) {
                    let mut wait = Box::pin(n.notified());
                    wait.as_mut().enable();
                    waits.push(wait);
                }
            }
        }
        AnyNotified { waits }
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
        let wait = signals.high_watermark_of(&a);
        signals.notify(&a);
        tokio::time::timeout(Duration::from_secs(5), wait)
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn only_the_partitions_shard_wakes() {
        let signals = AppendSignals::default();
        let (a, b) = apart();
        let wait = signals.high_watermark_of(&a);
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
        // Two shards, each for both kinds of change.
        assert_eq!(both.waits.len(), 4);
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

    #[tokio::test]
    async fn a_high_watermark_move_does_not_wake_a_log_end_wait() {
        let signals = AppendSignals::default();
        let a = tp("a", 0);
        let shard = [AppendSignals::shard(&a.topic, a.partition)];
        let follower = signals.log_end_of(&shard);
        let consumer = signals.any_of(&shard);
        let producer = signals.high_watermark_of(&a);
        signals.notify_high_watermark(&a);
        for (what, wait) in [("consumer", consumer), ("producer", producer)] {
            assert!(
                tokio::time::timeout(Duration::from_secs(5), wait)
                    .await
                    .is_ok(),
                "the {what} wait missed a high watermark move"
            );
        }
        assert!(
            tokio::time::timeout(Duration::from_millis(50), follower)
                .await
                .is_err(),
            "a high watermark move woke a follower's fetch"
        );
        let follower = signals.log_end_of(&shard);
        let producer = signals.high_watermark_of(&a);
        signals.notify_log_end(&a);
        assert!(tokio::time::timeout(Duration::from_secs(5), follower)
            .await
            .is_ok());
        assert!(
            tokio::time::timeout(Duration::from_millis(50), producer)
                .await
                .is_err(),
            "an append that left the high watermark woke an acks=all wait"
        );
        let follower = signals.log_end_of(&shard);
        let producer = signals.high_watermark_of(&a);
        signals.notify(&a);
        assert!(tokio::time::timeout(Duration::from_secs(5), follower)
            .await
            .is_ok());
        assert!(tokio::time::timeout(Duration::from_secs(5), producer)
            .await
            .is_ok());
    }
}
