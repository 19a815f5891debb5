//! Network threads (`num.network.threads`): the threads client connections are served
//! on, each a single-threaded tokio runtime of its own, and where a connection goes.
//!
//! On tokio's work-stealing runtime every message a node receives (a Produce, a
//! follower's Fetch, the follower's next Fetch that moves the high watermark) woke a
//! second worker: an append wakes the followers' parked fetches, and the idle worker is
//! unparked to steal one; a high watermark move wakes the produce. On a small request
//! those wake-ups were most of its cost (issue #25, BENCHMARKS.md). A connection here
//! stays on one thread, so a wake-up between two connections of the same thread costs
//! nothing but a queue push.
//!
//! That only pays when the connections that wake each other share a thread: a
//! partition's producers, its followers' fetches and its consumers' long polls. Placed
//! round robin they mostly do not, and measured that way it cost more than the
//! work-stealing runtime. So each partition belongs to one thread (by the hash its
//! append signal uses), the Produce and Fetch handlers tell the connection which thread
//! the partitions of each request belong to ([`Affinity`]), and a plaintext connection
//! whose data requests keep naming another thread's partitions moves there
//! ([`Placement`]) between two requests, with nothing in flight. A connection whose
//! requests span threads (a producer to many partitions) stays where it was accepted, as
//! a connection of Seastar's shards does; a TLS connection stays too, because its
//! session state is rustls's and not ours to carry across.
//!
//! Replica fetchers have threads of their own (`replication::replica_fetcher`);
//! everything else of the node (coordinators, the cleaner, fsyncs) stays on the
//! multi-thread runtime. `num.network.threads` is dynamic: [`NetworkThreads::resize`].

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::{oneshot, Notify};

/// No data request since the connection last looked.
const NO_VOTE: usize = usize::MAX;
/// The last data request named partitions of more than one thread.
const MIXED: usize = usize::MAX - 1;

/// Consecutive looks at a connection's requests that must name the same other thread
/// before it moves: a producer alternating between two threads' partitions would
/// otherwise move on every request.
pub const MOVE_AFTER: u32 = 4;

/// How long a network thread, told to stop, waits for its connections to end (they end
/// on the broker's shutdown signal) before it drops those left.
const DRAIN: Duration = Duration::from_secs(10);

/// What a connection's data requests say about where it belongs; shared between the
/// connection and its requests' handlers through the `Session`.
#[derive(Debug)]
pub struct Affinity {
    threads: Threads,
    vote: AtomicUsize,
}

/// How many network threads there are, as an [`Affinity`] sees it.
#[derive(Debug)]
enum Threads {
    Fixed(usize),
    /// The count of a [`NetworkThreads`], which `num.network.threads` may change.
    Shared(Arc<AtomicUsize>),
}

impl Affinity {
    /// For `threads` threads that never change in number (one: no network threads).
    pub fn new(threads: usize) -> Self {
        Self {
            threads: Threads::Fixed(threads.max(1)),
            vote: AtomicUsize::new(NO_VOTE),
        }
    }

    fn threads(&self) -> usize {
        match &self.threads {
            Threads::Fixed(n) => *n,
            Threads::Shared(n) => n.load(Ordering::Acquire).max(1),
        }
    }

    /// Whether votes can move anything: a handler skips working out its partitions'
    /// shards when not.
    pub fn matters(&self) -> bool {
        self.threads() > 1
    }

    /// One data request's partitions, as their append-signal shards
    /// (`AppendSignals::shard`). A request naming none (a fetch whose partitions the
    /// authorizer all refused, say) says nothing.
    pub fn vote(&self, shards: impl IntoIterator<Item = usize>) {
        let n = self.threads();
        if n < 2 {
            return;
        }
        let mut threads = shards.into_iter().map(|s| s % n);
        let Some(first) = threads.next() else {
            return;
        };
        let vote = if threads.all(|t| t == first) {
            first
        } else {
            MIXED
        };
        self.vote.store(vote, Ordering::Relaxed);
    }

    /// The thread the requests since the last call belong to: `None` if there were
    /// none, `Some(None)` if they span threads.
    fn take(&self) -> Option<Option<usize>> {
        match self.vote.swap(NO_VOTE, Ordering::Relaxed) {
            NO_VOTE => None,
            MIXED => Some(None),
            t => Some(Some(t)),
        }
    }
}

/// Where a connection is and where its requests have been pointing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub here: usize,
    candidate: usize,
    streak: u32,
}

impl Placement {
    pub fn new(here: usize) -> Self {
        Self {
            here,
            candidate: here,
            streak: 0,
        }
    }

    /// Looks at the requests since the last look: the thread to move to, once
    /// [`MOVE_AFTER`] looks in a row have named it.
    ///
    /// A connection on a thread that was removed (`num.network.threads` lowered) leaves
    /// at once: for the thread its requests name, or any that remains.
    pub fn observe(&mut self, affinity: &Affinity) -> Option<usize> {
        let vote = affinity.take();
        let threads = affinity.threads();
        if self.here >= threads {
            return Some(match vote {
                Some(Some(t)) if t < threads => t,
                _ => self.here % threads,
            });
        }
        match vote {
            None => None,
            // Voted before the thread count changed.
            Some(Some(t)) if t >= threads => None,
            Some(None) => {
                self.streak = 0;
                None
            }
            Some(Some(t)) if t == self.here => {
                self.streak = 0;
                None
            }
            Some(Some(t)) => {
                if t == self.candidate {
                    self.streak += 1;
                } else {
                    self.candidate = t;
                    self.streak = 1;
                }
                (self.streak >= MOVE_AFTER).then_some(t)
            }
        }
    }
}

/// Counts a thread's connections, so that a stopping thread can wait for them.
#[derive(Default)]
struct Live {
    count: AtomicUsize,
    gone: Notify,
}

/// Held by a connection's task while it runs on a network thread.
pub struct LiveGuard(Arc<Live>);

impl Drop for LiveGuard {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.gone.notify_waiters();
        }
    }
}

/// One network thread: its runtime's handle, its connections, and the sender whose drop
/// tells it to stop.
struct Thread {
    handle: Handle,
    live: Arc<Live>,
    _stop: oneshot::Sender<()>,
}

impl Thread {
    /// Starts thread `i`, named `rill-network-<i>`. Once told to stop it waits for its
    /// connections to end (on the broker's shutdown, or by moving to a thread that
    /// stays) for up to [`DRAIN`], then drops those left: a client reconnects, as it
    /// does when Kafka removes a processor.
    fn start(i: usize) -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let live = Arc::new(Live::default());
        let (tx, rx) = oneshot::channel::<()>();
        let handle = runtime.handle().clone();
        let draining = live.clone();
        std::thread::Builder::new()
            .name(format!("rill-network-{i}"))
            .spawn(move || {
                runtime.block_on(async move {
                    let _ = rx.await;
                    let _ = tokio::time::timeout(DRAIN, async {
                        loop {
                            let gone = draining.gone.notified();
                            if draining.count.load(Ordering::Acquire) == 0 {
                                break;
                            }
                            gone.await;
                        }
                    })
                    .await;
                });
                // The runtime drops here, off any async context, with whatever
                // connections did not end in time.
            })?;
        Ok(Self {
            handle,
            live,
            _stop: tx,
        })
    }
}

/// The running network threads of one `serve`.
pub struct NetworkThreads {
    threads: RwLock<Vec<Thread>>,
    /// How many there are, shared with every connection's [`Affinity`].
    count: Arc<AtomicUsize>,
    next: AtomicUsize,
    stopped: AtomicBool,
}

impl NetworkThreads {
    /// Starts `n` threads (at least one), named `rill-network-<i>`.
    pub fn start(n: usize) -> std::io::Result<Self> {
        let threads = (0..n.max(1))
            .map(Thread::start)
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(Self {
            count: Arc::new(AtomicUsize::new(threads.len())),
            threads: RwLock::new(threads),
            next: AtomicUsize::new(0),
            stopped: AtomicBool::new(false),
        })
    }

    fn threads(&self) -> std::sync::RwLockReadGuard<'_, Vec<Thread>> {
        self.threads.read().unwrap_or_else(|e| e.into_inner())
    }

    pub fn count(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }

    /// A new connection's [`Affinity`], which follows the thread count as it changes.
    pub fn affinity(&self) -> Affinity {
        Affinity {
            threads: Threads::Shared(self.count.clone()),
            vote: AtomicUsize::new(NO_VOTE),
        }
    }

    /// Grows or shrinks to `n` threads (at least one), as Kafka adds and removes
    /// processors when `num.network.threads` changes. A removed thread stops: its
    /// plaintext connections move to a remaining thread at their next request (see
    /// [`Placement::observe`]), and any still there after [`DRAIN`] are closed.
    pub fn resize(&self, n: usize) {
        let n = n.max(1);
        let mut threads = self.threads.write().unwrap_or_else(|e| e.into_inner());
        if self.stopped.load(Ordering::Acquire) || threads.len() == n {
            return;
        }
        let before = threads.len();
        threads.truncate(n);
        while threads.len() < n {
            match Thread::start(threads.len()) {
                Ok(thread) => threads.push(thread),
                Err(e) => {
                    tracing::error!(error = %e, "cannot start another network thread");
                    break;
                }
            }
        }
        self.count.store(threads.len(), Ordering::Release);
        tracing::info!(
            from = before,
            to = threads.len(),
            "num.network.threads changed"
        );
    }

    /// The thread for a new connection: round robin, as Kafka's acceptor hands
    /// connections to its processors.
    pub fn next(&self) -> usize {
        self.next.fetch_add(1, Ordering::Relaxed) % self.count().max(1)
    }

    /// Runs a connection's task on thread `i`; `false` once the threads are stopping,
    /// or if `i` is gone (the task is dropped).
    pub fn spawn<F>(&self, i: usize, task: impl FnOnce(LiveGuard) -> F) -> bool
    where
        F: Future<Output = ()> + Send + 'static,
    {
        if self.stopped.load(Ordering::Acquire) {
            return false;
        }
        let threads = self.threads();
        let Some(thread) = threads.get(i) else {
            return false;
        };
        thread.live.count.fetch_add(1, Ordering::AcqRel);
        thread.handle.spawn(task(LiveGuard(thread.live.clone())));
        true
    }

    /// Tells every thread to stop once its connections have ended (or after [`DRAIN`]).
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
        self.threads
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }
}

impl Drop for NetworkThreads {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vote_names_the_thread_of_every_shard_or_none() {
        let a = Affinity::new(3);
        assert_eq!(a.take(), None, "no request yet");
        a.vote([4, 7, 1]); // all thread 1 of 3
        assert_eq!(a.take(), Some(Some(1)));
        assert_eq!(a.take(), None, "taken");
        a.vote([4, 5]);
        assert_eq!(a.take(), Some(None), "threads 1 and 2");
        a.vote([]);
        assert_eq!(a.take(), None, "a request naming no partition says nothing");
        let one = Affinity::new(1);
        one.vote([4]);
        assert_eq!(one.take(), None, "one thread: nothing to decide");
    }

    #[test]
    fn a_connection_moves_after_enough_requests_name_one_other_thread() {
        let a = Affinity::new(2);
        let mut p = Placement::new(0);
        for _ in 1..MOVE_AFTER {
            a.vote([1]);
            assert_eq!(p.observe(&a), None);
            // Requests naming no partition in between do not break the streak.
            assert_eq!(p.observe(&a), None);
        }
        a.vote([3]);
        assert_eq!(p.observe(&a), Some(1));
    }

    #[test]
    fn requests_here_or_across_threads_break_the_streak() {
        let a = Affinity::new(2);
        let mut p = Placement::new(0);
        for breaker in [vec![0], vec![0, 1]] {
            for _ in 1..MOVE_AFTER {
                a.vote([1]);
                assert_eq!(p.observe(&a), None);
            }
            a.vote(breaker);
            assert_eq!(p.observe(&a), None);
            a.vote([1]);
            assert_eq!(p.observe(&a), None, "the streak starts over");
            p = Placement::new(0);
        }
        // Alternating between two other threads never moves.
        let a = Affinity::new(3);
        let mut p = Placement::new(0);
        for i in 0..20 {
            a.vote([1 + i % 2]);
            assert_eq!(p.observe(&a), None);
        }
    }

    #[tokio::test]
    async fn a_stopped_set_of_threads_takes_no_more_connections() {
        let threads = NetworkThreads::start(2).unwrap();
        assert_eq!(threads.count(), 2);
        assert_eq!((threads.next(), threads.next(), threads.next()), (0, 1, 0));
        let (tx, rx) = oneshot::channel();
        assert!(threads.spawn(1, move |live| async move {
            let _live = live;
            let _ = tx.send(std::thread::current().name().map(str::to_owned));
        }));
        assert_eq!(rx.await.unwrap().as_deref(), Some("rill-network-1"));
        assert!(!threads.spawn(5, |_| async {}), "no such thread");
        threads.stop();
        assert!(!threads.spawn(0, |_| async {}), "stopping");
    }

    #[tokio::test]
    async fn threads_grow_and_shrink_and_connections_on_a_removed_one_leave() {
        let threads = NetworkThreads::start(2).unwrap();
        let affinity = threads.affinity();
        let mut on_last = Placement::new(1);
        threads.resize(3);
        assert_eq!(threads.count(), 3);
        let (tx, rx) = oneshot::channel();
        assert!(threads.spawn(2, move |live| async move {
            let _live = live;
            let _ = tx.send(std::thread::current().name().map(str::to_owned));
        }));
        assert_eq!(rx.await.unwrap().as_deref(), Some("rill-network-2"));
        // Votes follow the new count: shard 5 is thread 2 of 3.
        affinity.vote([5]);
        assert_eq!(affinity.take(), Some(Some(2)));

        threads.resize(1);
        assert_eq!(threads.count(), 1);
        assert!(!affinity.matters(), "one thread left: nothing to decide");
        assert!(!threads.spawn(1, |_| async {}), "thread 1 is gone");
        assert_eq!(
            on_last.observe(&affinity),
            Some(0),
            "leaves the removed thread"
        );
        threads.resize(0);
        assert_eq!(threads.count(), 1, "never fewer than one");
    }
}
