//! `queued.max.requests` slots, given back when a request parks.
//!
//! In Kafka the limit bounds the queue between the network threads and the request
//! handlers: a request leaves it when a handler takes it, and a Fetch waiting in the
//! fetch purgatory, a Produce waiting for its replicas or a JoinGroup waiting for the
//! rest of its group holds no slot. Here a request takes a slot when its frame is
//! complete and the connection task runs its handler; a handler that is about to wait
//! on something other than its own work calls [`park`], which gives the slot back.
//! Without that, 500 consumers long-polling quiet partitions held every slot and a
//! producer's requests waited for their fetches to time out (2 MB/s instead of
//! 500 MB/s; `bench/parked_fetches.py`).
//!
//! The slot rides in a task-local for the handler's future, so the handlers need no
//! extra parameter; outside a connection task (unit tests calling a handler) `park`
//! does nothing. The first `park` also notes when it happened: the time before it is
//! the request's local time and the time after it its remote time, Kafka's
//! `LocalTimeMs` and `RemoteTimeMs` (`crate::metrics::ApiMetrics`).
//!
//! A Produce that has appended and only waits for its replicas calls [`settle`] instead:
//! it parks, and tells its connection that whatever orders it among the connection's
//! requests is done, so that the connection may start the next Produce while this one
//! waits (see the network module's notes on pipelined produce).

use std::cell::RefCell;
use std::future::Future;
use std::time::Instant;

use tokio::sync::{oneshot, OwnedSemaphorePermit};

/// What rides with a handler: its slot until it parks, when it first parked, and whom to
/// tell when it settles.
struct Held {
    slot: Option<OwnedSemaphorePermit>,
    parked_at: Option<Instant>,
    settled: Option<oneshot::Sender<()>>,
}

tokio::task_local! {
    static SLOT: RefCell<Held>;
}

/// Runs a request's handler holding `slot` until the handler parks or ends.
pub async fn holding<F: Future>(slot: OwnedSemaphorePermit, handler: F) -> F::Output {
    holding_timed(slot, handler).await.0
}

/// As [`holding`], and when the handler first parked (`None`: it never did).
pub async fn holding_timed<F: Future>(
    slot: OwnedSemaphorePermit,
    handler: F,
) -> (F::Output, Option<Instant>) {
    holding_settled(slot, None, handler).await
}

/// As [`holding_timed`], and `settled` hears when the handler calls [`settle`] (or is
/// dropped unsent when the handler ends without settling).
pub async fn holding_settled<F: Future>(
    slot: OwnedSemaphorePermit,
    settled: Option<oneshot::Sender<()>>,
    handler: F,
) -> (F::Output, Option<Instant>) {
    let held = RefCell::new(Held {
        slot: Some(slot),
        parked_at: None,
        settled,
    });
    SLOT.scope(held, async move {
        let out = handler.await;
        let parked_at = SLOT.with(|h| h.borrow().parked_at);
        (out, parked_at)
    })
    .await
}

/// Gives the running request's slot back: it is about to wait for others (new data,
/// its replicas, its group), not to work.
pub fn park() {
    let _ = SLOT.try_with(|held| {
        let mut held = held.borrow_mut();
        held.slot.take();
        held.parked_at.get_or_insert_with(Instant::now);
    });
}

/// Parks, and says that the running request has done all that orders it among its
/// connection's requests: a Produce whose records are appended, waiting for its replicas.
/// The connection may then start its next Produce.
pub fn settle() {
    park();
    let _ = SLOT.try_with(|held| {
        if let Some(settled) = held.borrow_mut().settled.take() {
            let _ = settled.send(());
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use tokio::sync::Semaphore;

    #[tokio::test]
    async fn park_gives_the_slot_back_once() {
        let pool = Arc::new(Semaphore::new(1));
        let slot = pool.clone().acquire_owned().await.unwrap();
        let observed = holding(slot, {
            let pool = pool.clone();
            async move {
                let before = pool.available_permits();
                park();
                park();
                (before, pool.available_permits())
            }
        })
        .await;
        assert_eq!(observed, (0, 1));
        assert_eq!(pool.available_permits(), 1);
        // Outside a request: nothing to give back, and no panic.
        park();
    }

    #[tokio::test]
    async fn the_first_park_is_when_the_remote_time_starts() {
        let pool = Arc::new(Semaphore::new(1));
        let slot = pool.clone().acquire_owned().await.unwrap();
        let before = Instant::now();
        let ((), parked) = holding_timed(slot, async {
            park();
            let first = SLOT.with(|h| h.borrow().parked_at);
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            park();
            assert_eq!(SLOT.with(|h| h.borrow().parked_at), first);
        })
        .await;
        let parked = parked.expect("parked");
        assert!(parked >= before && parked.elapsed() >= std::time::Duration::from_millis(5));
        let slot = pool.clone().acquire_owned().await.unwrap();
        let ((), parked) = holding_timed(slot, async {}).await;
        assert_eq!(parked, None);
    }

    #[tokio::test]
    async fn settling_parks_and_tells_the_connection() {
        let pool = Arc::new(Semaphore::new(1));
        let slot = pool.clone().acquire_owned().await.unwrap();
        let (tx, mut rx) = oneshot::channel();
        let observed = holding_settled(slot, Some(tx), {
            let pool = pool.clone();
            async move {
                park();
                let parked_only = pool.available_permits();
                settle();
                settle();
                parked_only
            }
        })
        .await;
        assert_eq!(observed.0, 1);
        assert_eq!(rx.try_recv(), Ok(()));
        // A handler that ends without settling drops the sender: the connection hears
        // that too.
        let slot = pool.clone().acquire_owned().await.unwrap();
        let (tx, rx) = oneshot::channel::<()>();
        holding_settled(slot, Some(tx), async {}).await;
        assert!(rx.await.is_err());
        settle();
    }

    #[tokio::test]
    async fn the_slot_is_held_until_the_handler_ends() {
        let pool = Arc::new(Semaphore::new(1));
        let slot = pool.clone().acquire_owned().await.unwrap();
        let during = holding(slot, {
            let pool = pool.clone();
            async move { pool.available_permits() }
        })
        .await;
        assert_eq!(during, 0);
        assert_eq!(pool.available_permits(), 1);
    }
}
