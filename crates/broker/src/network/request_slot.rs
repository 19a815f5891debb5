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
//! does nothing.

use std::cell::RefCell;
use std::future::Future;

use tokio::sync::OwnedSemaphorePermit;

tokio::task_local! {
    static SLOT: RefCell<Option<OwnedSemaphorePermit>>;
}

/// Runs a request's handler holding `slot` until the handler parks or ends.
pub async fn holding<F: Future>(slot: OwnedSemaphorePermit, handler: F) -> F::Output {
    SLOT.scope(RefCell::new(Some(slot)), handler).await
}

/// Gives the running request's slot back: it is about to wait for others (new data,
/// its replicas, its group), not to work.
pub fn park() {
    let _ = SLOT.try_with(|slot| slot.borrow_mut().take());
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
