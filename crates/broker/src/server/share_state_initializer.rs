//! The share groups' initialisation of share-partition state (Kafka's
//! `GroupCoordinatorService.persisterInitialize`): the group coordinator asks for it
//! before it assigns a share-partition to a member; this task asks the share coordinator.
//!
//! # Protocol
//! 1. The group coordinator marks the partitions initializing (a replicated record) and
//!    queues a [`ShareStateInitialization`] (`coordinator::group_coordinator`'s step 5).
//! 2. Here, off the group coordinator's task, every share-partition of it gets an
//!    InitializeShareGroupState through the [`super::share_persister`] (routed to its
//!    share coordinator, retried while that moves or loads): state epoch = the group
//!    epoch, start offset -1, which tells the share-partition leader to apply
//!    `share.auto.offset.reset` when it first loads the state.
//! 3. Only when every one succeeded does the group coordinator hear
//!    `ShareGroupStateInitialized`, which marks them initialised and bumps the group epoch,
//!    so that the next heartbeat assigns them; else `ShareGroupStateInitializeFailed`, and
//!    the group's next heartbeat asks again.
//!
//! # Why it is correct
//! A partition is assignable only once it is marked initialised, and that mark is written
//! only after the share coordinator answered the initialisation, which it does once its
//! record is replicated: no member is sent to a share-partition whose state a failover of
//! the share coordinator could lose. At most [`MAX_IN_FLIGHT`] asks run at once; and [`CALLS_PER_ASK`] calls of
//! each; the queue before them is bounded where it is made.

use std::sync::{Arc, Weak};

use futures::StreamExt;
use rill_protocol::ErrorCode;
use rill_share::SharePartitionKey;
use tokio::sync::{mpsc, Semaphore};

use crate::coordinator::group_coordinator::{GroupCall, ShareStateInitialization};
use crate::server::Broker;

/// Initialisations running at once.
pub const MAX_IN_FLIGHT: usize = 16;
/// Share-partition calls of one initialisation running at once.
const CALLS_PER_ASK: usize = 32;

/// Runs the group coordinator's asks until its queue closes.
pub fn start(broker: Weak<Broker>, mut asks: mpsc::Receiver<ShareStateInitialization>) {
    tokio::spawn(async move {
        let slots = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
        while let Some(ask) = asks.recv().await {
            let Ok(slot) = slots.clone().acquire_owned().await else {
                return;
            };
            let broker = broker.clone();
            tokio::spawn(async move {
                if let Some(broker) = broker.upgrade() {
                    initialize(&broker, ask).await;
                }
                drop(slot);
            });
        }
    });
}

/// Protocol steps 2 and 3 for one ask.
async fn initialize(broker: &Broker, ask: ShareStateInitialization) {
    let keys: Vec<SharePartitionKey> = ask
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions.iter().map(|p| SharePartitionKey {
                group_id: ask.group_id.clone(),
                topic_id: t.topic_id,
                partition: *p,
            })
        })
        .collect();
    let persister = broker.share_persister.clone();
    let epoch = ask.group_epoch;
    let answers: Vec<Result<(), ErrorCode>> = futures::stream::iter(keys)
        .map(move |key| {
            let persister = persister.clone();
            async move { persister.initialize(key, epoch, -1).await }
        })
        .buffer_unordered(CALLS_PER_ASK)
        .collect()
        .await;
    let failed = answers.iter().find_map(|a| a.err());
    let call = match failed {
        None => GroupCall::ShareGroupStateInitialized {
            group_id: ask.group_id,
            topics: ask.topics,
        },
        Some(error) => {
            tracing::warn!(group = %ask.group_id, error = error.name(), "share-partition state not initialised");
            GroupCall::ShareGroupStateInitializeFailed {
                group_id: ask.group_id,
                topics: ask.topics,
            }
        }
    };
    // A coordinator gone (shutting down, or the group moved) has nothing to hear: the
    // next one asks again from its load.
    let _ = broker.groups.call(call).await;
}
