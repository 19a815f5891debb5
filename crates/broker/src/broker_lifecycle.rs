//! The broker's life as the controller sees it (Kafka's `BrokerLifecycleManager`):
//! registration, heartbeats that keep its lease, and controlled shutdown.
//!
//! # Design note
//!
//! 1. At start the broker registers with a fresh incarnation id; the controller answers
//!    with the broker epoch (the offset of the registration record). A second live
//!    process with the same `node.id` is refused (DUPLICATE_BROKER_REGISTRATION) and keeps
//!    retrying, logging why, until the other one's lease lapses.
//! 2. It then heartbeats, reporting the last metadata offset it has applied. The
//!    controller unfences it once that offset covers its own registration (it has caught
//!    up, so it knows which replicas are its own), and fences it again when heartbeats stop
//!    for `broker.session.timeout.ms`; a fenced broker leads nothing.
//! 3. Heartbeats go every `broker.heartbeat.interval.ms`, and every 100 ms while the broker
//!    is still fenced or shutting down, so that start-up and shutdown take round trips,
//!    not intervals. A heartbeat refused for a stale epoch means the controller forgot this
//!    incarnation: register again.
//! 4. Controlled shutdown: heartbeats ask to shut down; the controller moves every
//!    leadership away and answers `should_shut_down` when none is left, and only then does
//!    the server stop (bounded by the session timeout), so a rolling restart keeps every
//!    partition available.
//! 5. The broker keeps its own view of the lease: it holds it until
//!    `broker.session.timeout.ms` after it *sent* the last heartbeat the controller
//!    answered unfenced. The controller counts from when it *received* that heartbeat,
//!    so the broker's lease ends first. Without it (the lease lapsed, or the controller
//!    said it is fenced) the broker acts as the leader of nothing
//!    ([`crate::replication::replica_manager::ReplicaManager::set_lease_held`]): produce and fetch get
//!    NOT_LEADER_OR_FOLLOWER, Metadata and FindCoordinator stop naming it, and its group
//!    coordinator drops its groups. A broker that held its lease and lost it also
//!    closes its clients' connections at their next request (ApiVersions excepted):
//!    its image may be stale, and a client that keeps asking it for metadata would never
//!    learn the new leaders. A leader cut off from the controller thus stops taking
//!    writes once the others may have elected a new one, and its clients move on to the
//!    other brokers instead of waiting out the fault. It takes the lease back at the next unfenced
//!    answer, once it has applied the metadata up to that answer, so it acts on the
//!    leaderships the controller decided meanwhile, not on its stale ones.
//! 6. The lease must not flap. An answer to a heartbeat sent more than half a session ago
//!    (held up while the controller quorum elected a leader) does not give the lease back,
//!    since it would lapse again within moments; the broker asks again at once. And every
//!    loss bumps the connection generation, so each connection that was served before
//!    it is closed at its next request even if the lease is back by then: a client whose
//!    pipelined produce requests were refused in part must not have the rest answered
//!    OUT_OF_ORDER_SEQUENCE, which librdkafka reads as "the refused batches were not
//!    written" and answers by re-sending them under a bumped epoch, storing twice any
//!    batch that was written after all.
//! 7. Log directories (KIP-858): the registration names the ids of the broker's online
//!    log directories, and every heartbeat the ids of those that failed
//!    (`offline_log_dirs`); a directory failure sends a heartbeat at once, so that the
//!    controller moves the leaderships of its partitions away within a round trip.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use rill_metadata::{
    BrokerHeartbeatRequest, BrokerRegistrationRequest, ControllerEvent, ControllerResponse,
};
use rill_protocol::{ErrorCode, Uuid};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::server::Broker;

/// Retry pace while not registered, fenced, or shutting down.
const FAST_INTERVAL: Duration = Duration::from_millis(100);

/// How long a controlled shutdown waits for the controller when no other broker is live.
///
/// Then no leadership can move, so all the controller would do is fence this broker,
/// which a live quorum answers within a heartbeat or two, and which the session timeout
/// does anyway. The last node of a cluster to stop has no quorum left to answer at all:
/// it used to wait the whole session timeout (9 s by default) for nothing.
const ALONE_WAIT: Duration = Duration::from_millis(500);

/// Talks to the lifecycle task.
pub struct LifecycleHandle {
    unfenced: watch::Receiver<bool>,
    want_shut_down: watch::Sender<bool>,
    shut_down_ok: watch::Receiver<bool>,
    session_timeout: Duration,
}

impl LifecycleHandle {
    /// Waits until the controller has unfenced this broker, or three session timeouts
    /// (a cluster whose quorum is not up yet: the broker serves anyway, and clients see
    /// it once it joins).
    pub async fn wait_unfenced(&self) {
        let mut rx = self.unfenced.clone();
        let limit = self.session_timeout * 3;
        if tokio::time::timeout(limit, rx.wait_for(|u| *u))
            .await
            .is_err()
        {
            tracing::warn!("not unfenced by the controller yet; serving anyway");
        }
    }

    /// Asks the controller to move this broker's leaderships away, and waits until it
    /// says none is left (or the session timeout; [`ALONE_WAIT`] when no other broker
    /// is live to take them).
    pub async fn controlled_shutdown(&self, broker: &Broker) {
        let _ = self.want_shut_down.send(true);
        let alone = !broker
            .image()
            .live_brokers()
            .iter()
            .any(|&id| id != broker.node_id);
        let limit = if alone {
            ALONE_WAIT.min(self.session_timeout)
        } else {
            self.session_timeout
        };
        let mut rx = self.shut_down_ok.clone();
        let done = tokio::time::timeout(limit, rx.wait_for(|ok| *ok))
            .await
            .is_ok_and(|r| r.is_ok());
        if done {
            tracing::info!("controlled shutdown complete");
        } else if alone {
            tracing::info!(
                "controlled shutdown not answered, and no other broker is live to lead \
                 this one's partitions; stopping"
            );
        } else {
            tracing::warn!("controlled shutdown timed out; stopping anyway");
        }
    }
}

pub fn start(broker: Arc<Broker>, shutdown: watch::Receiver<bool>) -> LifecycleHandle {
    let (unfenced_tx, unfenced) = watch::channel(false);
    let (want_shut_down, want_rx) = watch::channel(false);
    let (ok_tx, shut_down_ok) = watch::channel(false);
    let session_timeout = broker
        .config
        .duration_ms("broker.session.timeout.ms")
        .unwrap_or(Duration::from_secs(9));
    tokio::spawn(take_failed_dirs_offline(broker.clone(), shutdown.clone()));
    tokio::spawn(run(broker, shutdown, unfenced_tx, want_rx, ok_tx));
    LifecycleHandle {
        unfenced,
        want_shut_down,
        shut_down_ok,
        session_timeout,
    }
}

async fn run(
    broker: Arc<Broker>,
    mut shutdown: watch::Receiver<bool>,
    unfenced: watch::Sender<bool>,
    want_shut_down: watch::Receiver<bool>,
    shut_down_ok: watch::Sender<bool>,
) {
    let interval = broker
        .config
        .duration_ms("broker.heartbeat.interval.ms")
        .unwrap_or(Duration::from_secs(2))
        .max(Duration::from_millis(10));
    let request_timeout = interval.max(Duration::from_secs(2));
    let incarnation_id = broker.incarnation_id;
    let session_timeout = broker
        .config
        .duration_ms("broker.session.timeout.ms")
        .unwrap_or(Duration::from_secs(9));
    // When this broker's own view of its lease ends (design note, point 5); `None` while
    // it holds none.
    let mut lease_until: Option<Instant> = None;
    let mut strays_removed = false;
    let mut dir_failures = broker.replicas.log_dir_failure().changed();
    'register: loop {
        let epoch = loop {
            if *shutdown.borrow() {
                return;
            }
            match register(&broker, incarnation_id, request_timeout).await {
                Ok(epoch) => break epoch,
                Err(why) => {
                    tracing::info!(reason = %why, "broker registration not accepted yet; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(interval.min(Duration::from_secs(1))) => {}
                        _ = shutdown.changed() => return,
                    }
                }
            }
        };
        broker.broker_epoch.store(epoch, Ordering::Release);
        broker.replicas.set_local_broker_epoch(epoch);
        tracing::info!(
            node_id = broker.node_id,
            epoch,
            "registered with the controller"
        );
        // Report progress only once the registration itself is applied here.
        broker.wait_published(epoch + 1, request_timeout).await;
        loop {
            let shutting_down = *want_shut_down.borrow();
            let event = ControllerEvent::BrokerHeartbeat(BrokerHeartbeatRequest {
                broker_id: broker.node_id,
                broker_epoch: epoch,
                current_metadata_offset: broker.image().last_offset(),
                want_fence: false,
                want_shut_down: shutting_down,
                offline_log_dirs: broker.replicas.offline_log_dir_ids(),
            });
            let mut fast = true;
            let mut again_now = false;
            let sent_at = Instant::now();
            let submit = broker.quorum.submit(event, request_timeout);
            tokio::pin!(submit);
            let outcome = loop {
                tokio::select! {
                    outcome = &mut submit => break outcome,
                    _ = lapse(lease_until) => {
                        lease_until = None;
                        let was_unfenced = *unfenced.borrow();
                        lose_lease(&broker, "no heartbeat answered within broker.session.timeout.ms", was_unfenced).await;
                    }
                }
            };
            match outcome {
                Ok(result) => match result.response {
                    ControllerResponse::BrokerHeartbeat(r) if r.error_code == ErrorCode::NONE => {
                        if !r.is_fenced && (!*unfenced.borrow() || !broker.replicas.lease_held()) {
                            // The unfencing came with leader elections for this broker's
                            // partitions: apply them before telling anyone we are ready,
                            // so a client's first Metadata here already shows leaders.
                            // Likewise after a lapsed lease: act on what the controller
                            // decided meanwhile, not on the leaderships held before.
                            broker
                                .wait_published(result.next_offset, request_timeout)
                                .await;
                        }
                        if r.is_fenced {
                            lease_until = None;
                            // A controlled shutdown ends fenced, as it should: no warning.
                            let was_unfenced = *unfenced.borrow() && !shutting_down;
                            lose_lease(&broker, "fenced by the controller", was_unfenced).await;
                        } else if !broker.replicas.lease_held()
                            && sent_at.elapsed() > session_timeout / 2
                        {
                            // An answer to a heartbeat sent long ago (held up by a
                            // controller election) would give back a lease that lapses
                            // again within moments, and each flap refuses some of the
                            // clients' pipelined requests: ask again at once instead.
                            tracing::debug!(
                                sent_ms_ago = sent_at.elapsed().as_millis() as u64,
                                "heartbeat answered too late to take the lease back on"
                            );
                            again_now = true;
                        } else {
                            lease_until = Some(sent_at + session_timeout);
                            regain_lease(&broker).await;
                        }
                        unfenced.send_if_modified(|u| {
                            let changed = *u == r.is_fenced;
                            *u = !r.is_fenced;
                            changed
                        });
                        if !r.is_fenced && r.is_caught_up && !strays_removed {
                            strays_removed = true;
                            crate::metadata_publisher::remove_stray_partitions(&broker);
                        }
                        if r.should_shut_down {
                            let _ = shut_down_ok.send(true);
                        }
                        fast = r.is_fenced || shutting_down;
                    }
                    ControllerResponse::BrokerHeartbeat(r) => {
                        tracing::warn!(
                            error = r.error_code.name(),
                            "heartbeat refused; registering again"
                        );
                        let was_unfenced = unfenced.send_replace(false);
                        lease_until = None;
                        lose_lease(
                            &broker,
                            "the controller no longer knows this broker epoch",
                            was_unfenced,
                        )
                        .await;
                        continue 'register;
                    }
                    _ => {}
                },
                Err(e) => tracing::debug!(error = %e, "heartbeat failed"),
            }
            let wait = match (again_now, fast) {
                (true, _) => Duration::ZERO,
                (false, true) => FAST_INTERVAL,
                (false, false) => interval,
            };
            let mut want = want_shut_down.clone();
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = want.changed() => {}
                // A log directory failed: tell the controller now (KIP-858), so that it
                // moves the leaderships of the partitions in it away.
                _ = dir_failures.changed() => {}
                _ = shutdown.changed() => return,
                _ = lapse(lease_until) => {
                    lease_until = None;
                    let was_unfenced = *unfenced.borrow();
                        lose_lease(&broker, "no heartbeat answered within broker.session.timeout.ms", was_unfenced).await;
                }
            }
        }
    }
}

/// Stops the work on the partitions of each log directory that fails (their fetchers,
/// their leader state); the heartbeat reports the directory (design note, point 7).
async fn take_failed_dirs_offline(broker: Arc<Broker>, mut shutdown: watch::Receiver<bool>) {
    let mut failures = broker.replicas.log_dir_failure().changed();
    loop {
        tokio::select! {
            changed = failures.changed() => if changed.is_err() { return },
            _ = shutdown.changed() => return,
        }
        broker.replicas.handle_log_dir_failure();
    }
}

/// Resolves when the lease held until `until` lapses; never without a lease.
async fn lapse(until: Option<Instant>) {
    match until {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Stops acting as a leader (design note, point 5).
async fn lose_lease(broker: &Broker, why: &str, was_unfenced: bool) {
    // Only this task moves the lease. The generation goes first, so that a request refused
    // for want of the lease cannot be followed on its connection by one served under the
    // old generation.
    if was_unfenced && broker.replicas.lease_held() {
        broker.lease_losses.fetch_add(1, Ordering::AcqRel);
        broker.lost_lease.store(true, Ordering::Release);
    }
    if broker.replicas.set_lease_held(false) {
        if was_unfenced {
            tracing::warn!(
                reason = why,
                "controller lease lost: leading nothing until the controller answers"
            );
        } else {
            tracing::debug!(reason = why, "no controller lease yet");
        }
        broker.groups.resign_all().await;
        broker.transactions.resign_all().await;
        broker.shares.resign_all().await;
    }
}

/// Acts on its leaderships again: the lease is back.
async fn regain_lease(broker: &Broker) {
    if broker.replicas.set_lease_held(true) {
        broker.lost_lease.store(false, Ordering::Release);
        tracing::info!("controller lease held");
        broker.groups.elect_led().await;
        broker.transactions.elect_led().await;
        broker.shares.elect_led().await;
    }
}

/// One registration attempt: the broker epoch, or why not.
async fn register(broker: &Broker, incarnation_id: Uuid, timeout: Duration) -> Result<i64, String> {
    let event = ControllerEvent::BrokerRegistration(BrokerRegistrationRequest {
        broker_id: broker.node_id,
        incarnation_id,
        listeners: broker.endpoints.clone(),
        rack: broker.config.get("broker.rack").map(str::to_string),
        log_dirs: broker.replicas.online_log_dir_ids(),
    });
    let result = broker
        .quorum
        .submit(event, timeout)
        .await
        .map_err(|e| e.to_string())?;
    match result.response {
        ControllerResponse::BrokerRegistration(r) if r.error_code == ErrorCode::NONE => {
            Ok(r.broker_epoch)
        }
        ControllerResponse::BrokerRegistration(r) => Err(r.error_code.name().to_string()),
        other => Err(format!("unexpected answer {other:?}")),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bytes::BytesMut;
    use rill_protocol::generated::{ApiVersionsRequest, MetadataRequest, RequestHeader};
    use rill_protocol::{encode_request_frame, ApiKey, Encodable};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    use crate::config::BrokerConfig;
    use crate::Server;

    const WAIT: Duration = Duration::from_secs(10);

    fn frame<B: Encodable>(api: ApiKey, version: i16, id: i32, body: &B) -> BytesMut {
        let header = RequestHeader {
            request_api_key: api.as_i16(),
            request_api_version: version,
            correlation_id: id,
            client_id: Some("lease-test".into()),
            ..Default::default()
        };
        let mut buf = BytesMut::new();
        encode_request_frame(&mut buf, &header, body).unwrap();
        buf
    }

    /// Sends one request; its correlation id back, or `None` when the server closed.
    async fn ask(sock: &mut TcpStream, request: BytesMut) -> Option<i32> {
        sock.write_all(&request).await.ok()?;
        let read = async {
            let size = sock.read_i32().await.ok()?;
            let mut body = vec![0; usize::try_from(size).ok()?];
            sock.read_exact(&mut body).await.ok()?;
            Some(i32::from_be_bytes(body[..4].try_into().ok()?))
        };
        tokio::time::timeout(WAIT, read)
            .await
            .expect("no answer and no close")
    }

    fn metadata(id: i32) -> BytesMut {
        frame(ApiKey::Metadata, 9, id, &MetadataRequest::default())
    }

    /// Design note, point 6: a lease that flapped (lost, then back before the client's
    /// next request) still ends every connection served before the loss, while new
    /// connections are served.
    #[tokio::test]
    async fn a_connection_served_before_a_lost_lease_is_closed_even_once_it_is_back() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = BrokerConfig::default();
        config.set("listeners", "127.0.0.1:0");
        config.set("log.dirs", &dir.path().display().to_string());
        // Off: tests run in parallel and would all take the default 9644.
        config.set("http.listeners", "");
        let server = Server::start(config).await.unwrap();
        let broker = server.broker.clone();
        let deadline = tokio::time::Instant::now() + WAIT;
        while !broker.replicas.lease_held() {
            assert!(tokio::time::Instant::now() < deadline, "lease never held");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }

        let mut old = TcpStream::connect(server.local_addr).await.unwrap();
        let versions = frame(ApiKey::ApiVersions, 3, 1, &ApiVersionsRequest::default());
        assert_eq!(ask(&mut old, versions).await, Some(1));
        assert_eq!(ask(&mut old, metadata(2)).await, Some(2));

        super::lose_lease(&broker, "test", true).await;
        super::regain_lease(&broker).await;
        assert!(broker.replicas.lease_held());

        assert_eq!(
            ask(&mut old, metadata(3)).await,
            None,
            "served across a lost lease"
        );
        let mut new = TcpStream::connect(server.local_addr).await.unwrap();
        assert_eq!(ask(&mut new, metadata(4)).await, Some(4));
        assert_eq!(ask(&mut new, metadata(5)).await, Some(5));
        server.shutdown().await;
    }
}
