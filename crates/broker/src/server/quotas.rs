//! Client quotas enforced on this broker (Kafka's `ClientQuotaManager` for produce and
//! fetch bytes and `ClientRequestQuotaManager` for request time): the rate each user and
//! client id uses, measured as Kafka measures it, and the throttle time that brings it
//! back under its quota.
//!
//! # Protocol
//!
//! - Which quota governs a request, and whose rate it counts against, is the metadata
//!   image's to say ([`rill_metadata::client_quotas::governing_quota`]); without any quota
//!   in the image nothing is measured.
//! - A rate is Kafka's `Rate` over `quota.window.num` samples of
//!   `quota.window.size.seconds` each: the sum of the samples over the time they span,
//!   that span counted as at least `num - 1` whole windows. A value recorded that takes
//!   the rate over the bound earns a throttle of `(rate - bound) / bound * span` (KIP-219's
//!   formula), the request-time one capped at one window as in Kafka.
//! - Produce bytes are the request's size, recorded when it arrives; fetch bytes are the
//!   response's, recorded once it is read, and a fetch that earns a throttle is answered
//!   empty and its bytes taken back (Kafka's `unrecordQuotaSensor`), so that a throttled
//!   consumer is sent nothing it was not allowed. Request time is the time the request's
//!   handler spent being polled, recorded after it ran; the throttle it earns is applied to
//!   the next request of that user and client id (Kafka applies it to the one that earned
//!   it, whose response is not yet encoded there).
//! - Each broker enforces each quota on its own, as in Kafka. The throttle time goes into
//!   the response and the network layer stops reading the connection for that long
//!   (`network::Reply`): a client that ignores the throttle gains nothing.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rill_metadata::client_quotas::{
    governing_quota, CONSUMER_BYTE_RATE, CONTROLLER_MUTATION_RATE, PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE,
};
use rill_metadata::MetadataImage;
use rill_protocol::generated::create_partitions_response::CreatePartitionsTopicResult;
use rill_protocol::generated::create_topics_response::CreatableTopicResult;
use rill_protocol::generated::delete_topics_response::DeletableTopicResult;
use rill_protocol::generated::{ApiKey, RequestBody, ResponseBody};
use rill_protocol::{ErrorCode, Uuid};

use crate::rate::{QuotaWindows, Rate};
use crate::server::request_authorization::Patch;

/// What a quota limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum QuotaKind {
    Produce,
    Fetch,
    Request,
    /// Partitions created or deleted (CreateTopics, CreatePartitions, DeleteTopics).
    Mutation,
}

impl QuotaKind {
    fn key(self) -> &'static str {
        match self {
            QuotaKind::Produce => PRODUCER_BYTE_RATE,
            QuotaKind::Fetch => CONSUMER_BYTE_RATE,
            QuotaKind::Request => REQUEST_PERCENTAGE,
            QuotaKind::Mutation => CONTROLLER_MUTATION_RATE,
        }
    }
}

/// Whom a request is measured for: the principal's name (Kafka's sanitized user) and the
/// client id of its header.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ClientIdentity<'a> {
    pub(crate) user: &'a str,
    pub(crate) client_id: &'a str,
}

type SensorKey = (QuotaKind, String, String);

/// Sensors idle this long are dropped (Kafka's inactive sensor expiration is an hour).
const SENSOR_IDLE: Duration = Duration::from_secs(3600);

/// The rates of every user and client id with a quota, on this broker.
pub(crate) struct ClientQuotaManager {
    windows: QuotaWindows,
    replication_windows: QuotaWindows,
    epoch: Instant,
    sensors: Mutex<Sensors>,
    /// `leader.replication.throttled.rate` as the latest image sets it, as f64 bits
    /// ([`NO_REPLICATION_LIMIT`] when it limits nothing): set on each image, read on
    /// each follower fetch.
    leader_replication_limit: AtomicU64,
}

const NO_REPLICATION_LIMIT: u64 = u64::MAX;

#[derive(Default)]
struct Sensors {
    rates: HashMap<SensorKey, Rate>,
    /// Bytes of throttled replicas this broker sent as a leader.
    leader_replication: Rate,
    buckets: HashMap<(String, String), TokenBucket>,
    records_since_sweep: u32,
}

/// Kafka's `TokenBucket` for controller mutations: it refills at the quota up to a burst
/// of `samples * window * quota` and starts full; a mutation takes its partitions out of
/// it, down below zero if need be.
#[derive(Debug)]
struct TokenBucket {
    tokens: f64,
    last_ms: u64,
}

impl TokenBucket {
    fn refill(&mut self, quota: f64, burst: f64, now_ms: u64) {
        let elapsed = now_ms.saturating_sub(self.last_ms) as f64 / 1000.0;
        self.tokens = (self.tokens + quota * elapsed).min(burst);
        self.last_ms = now_ms;
    }
}

/// What a controller-mutation quota decided for one request's topics.
#[derive(Debug, PartialEq)]
pub(crate) struct MutationAdmission {
    /// Per topic, in request order: whether it may go to the controller.
    pub(crate) admitted: Vec<bool>,
    pub(crate) throttle: Duration,
}

/// A quota that governs one request, to record against.
#[derive(Debug, Clone)]
pub(crate) struct Governed {
    kind: QuotaKind,
    limit: f64,
    tags: (String, String),
}

impl ClientQuotaManager {
    pub(crate) fn new(windows: QuotaWindows, replication_windows: QuotaWindows) -> Self {
        Self {
            windows,
            replication_windows,
            epoch: Instant::now(),
            sensors: Mutex::new(Sensors::default()),
            leader_replication_limit: AtomicU64::new(NO_REPLICATION_LIMIT),
        }
    }

    /// Takes `leader.replication.throttled.rate` from a new image (`None`: no limit).
    pub(crate) fn set_leader_replication_limit(&self, limit: Option<f64>) {
        let bits = limit.map_or(NO_REPLICATION_LIMIT, f64::to_bits);
        self.leader_replication_limit.store(bits, Ordering::Relaxed);
    }

    /// `leader.replication.throttled.rate` when it limits anything.
    pub(crate) fn leader_replication_limit(&self) -> Option<f64> {
        match self.leader_replication_limit.load(Ordering::Relaxed) {
            NO_REPLICATION_LIMIT => None,
            bits => Some(f64::from_bits(bits)),
        }
    }

    fn now_ms(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.epoch).as_millis() as u64
    }

    /// The quota of `kind` that governs `who`, if the image has one.
    pub(crate) fn governed(
        image: &MetadataImage,
        kind: QuotaKind,
        who: ClientIdentity<'_>,
    ) -> Option<Governed> {
        let (limit, tags) = governing_quota(image, kind.key(), who.user, who.client_id)?;
        Some(Governed { kind, limit, tags })
    }

    /// The most bytes a fetch may return without being throttled for sure (Kafka's
    /// `getMaxValueInQuotaWindow`): what the quota allows over all but one window.
    pub(crate) fn max_value_in_window(&self, g: &Governed) -> f64 {
        g.limit
            * f64::from(self.windows.samples.saturating_sub(1))
            * self.windows.window.as_secs_f64()
    }

    /// Records `value` and answers the throttle it earns (zero when within the quota).
    pub(crate) fn record(&self, g: &Governed, value: f64, now: Instant) -> Duration {
        let now_ms = self.now_ms(now);
        let mut sensors = self.sensors.lock().unwrap_or_else(|e| e.into_inner());
        sensors.records_since_sweep += 1;
        if sensors.records_since_sweep >= 10_000 {
            sensors.records_since_sweep = 0;
            let idle = SENSOR_IDLE.as_millis() as u64;
            sensors
                .rates
                .retain(|_, r| now_ms.saturating_sub(r.last_ms) < idle);
        }
        let key = (g.kind, g.tags.0.clone(), g.tags.1.clone());
        let rate = sensors.rates.entry(key).or_default();
        let throttle = rate.record_and_throttle(value, g.limit, now_ms, self.windows);
        if g.kind == QuotaKind::Request {
            return throttle.min(self.windows.window);
        }
        throttle
    }

    /// The throttle the rate already recorded earns, recording nothing.
    pub(crate) fn check(&self, g: &Governed, now: Instant) -> Duration {
        self.record(g, 0.0, now)
    }

    /// Admits the topics of a CreateTopics, CreatePartitions or DeleteTopics (`permits`:
    /// the partitions each creates or deletes) against a `controller_mutation_rate`, as
    /// Kafka's controller-mutation quotas do. `strict` (the versions that know
    /// THROTTLING_QUOTA_EXCEEDED): a topic is refused while the bucket is below zero, one
    /// admitted takes its partitions even below zero, and only a refusal earns a throttle.
    /// Otherwise every topic is admitted and the request is throttled once the bucket is
    /// below zero. The throttle is the time the bucket takes to refill to zero.
    pub(crate) fn admit_mutations(
        &self,
        g: &Governed,
        permits: &[f64],
        strict: bool,
        now: Instant,
    ) -> MutationAdmission {
        let now_ms = self.now_ms(now);
        let burst = g.limit * f64::from(self.windows.samples) * self.windows.window.as_secs_f64();
        let mut sensors = self.sensors.lock().unwrap_or_else(|e| e.into_inner());
        let bucket = sensors
            .buckets
            .entry(g.tags.clone())
            .or_insert(TokenBucket {
                tokens: burst,
                last_ms: now_ms,
            });
        bucket.refill(g.limit, burst, now_ms);
        let deficit = |tokens: f64| {
            let ms = (-tokens / g.limit * 1000.0)
                .round()
                .clamp(0.0, i32::MAX as f64);
            Duration::from_millis(ms as u64)
        };
        let mut admitted = Vec::with_capacity(permits.len());
        let mut throttle = Duration::ZERO;
        for p in permits {
            if strict && bucket.tokens < 0.0 {
                admitted.push(false);
                throttle = deficit(bucket.tokens);
            } else {
                bucket.tokens = (bucket.tokens - p).min(burst);
                admitted.push(true);
            }
        }
        if !strict && bucket.tokens < 0.0 {
            throttle = deficit(bucket.tokens);
        }
        MutationAdmission { admitted, throttle }
    }

    /// Whether the bytes sent to throttled followers are over
    /// `leader.replication.throttled.rate`, measured over `replication.quota.window.*`.
    pub(crate) fn leader_replication_exceeded(&self, limit: f64, now: Instant) -> bool {
        let now_ms = self.now_ms(now);
        let mut sensors = self.sensors.lock().unwrap_or_else(|e| e.into_inner());
        let (observed, _) = sensors
            .leader_replication
            .measure(now_ms, self.replication_windows);
        observed > limit
    }

    /// Records bytes sent to throttled followers.
    pub(crate) fn record_leader_replication(&self, bytes: f64, now: Instant) {
        let now_ms = self.now_ms(now);
        let mut sensors = self.sensors.lock().unwrap_or_else(|e| e.into_inner());
        sensors
            .leader_replication
            .record(bytes, now_ms, self.replication_windows);
    }

    /// Takes back a value recorded for a response that was not sent.
    pub(crate) fn unrecord(&self, g: &Governed, value: f64, now: Instant) {
        let now_ms = self.now_ms(now);
        let mut sensors = self.sensors.lock().unwrap_or_else(|e| e.into_inner());
        let key = (g.kind, g.tags.0.clone(), g.tags.1.clone());
        if let Some(rate) = sensors.rates.get_mut(&key) {
            rate.record(-value, now_ms, self.windows);
        }
    }
}

/// The first version of each mutating API that knows THROTTLING_QUOTA_EXCEEDED: from it on
/// the quota is strict (Kafka's `strictSinceVersion`).
fn strict_since(api: ApiKey) -> Option<i16> {
    match api {
        ApiKey::CreateTopics => Some(6),
        ApiKey::DeleteTopics => Some(5),
        ApiKey::CreatePartitions => Some(3),
        _ => None,
    }
}

const THROTTLED_MESSAGE: &str = "The throttling quota has been exceeded.";

/// The controller-mutation quota of a CreateTopics, CreatePartitions or DeleteTopics: the
/// topics it refuses are taken out of the request, and the patch answers them with
/// THROTTLING_QUOTA_EXCEEDED (the way the authorization gates answer refused topics); the
/// throttle is the request's. Partitions are counted when the request arrives, so a topic
/// the controller then refuses (one that exists already, say) still counts, where Kafka's
/// controller counts only the topics it has validated.
pub(crate) fn mutation_gate(
    manager: &ClientQuotaManager,
    g: &Governed,
    image: &MetadataImage,
    default_partitions: i32,
    version: i16,
    request: &mut RequestBody,
    now: Instant,
) -> (Option<Patch>, Duration) {
    let Some(since) = strict_since(request.api_key()) else {
        return (None, Duration::ZERO);
    };
    let strict = version >= since;
    let partitions_of = |name: &str| image.topic(name).map_or(0, |t| t.partitions.len()) as f64;
    let permits: Vec<f64> = match &*request {
        RequestBody::CreateTopics(r) => r
            .topics
            .iter()
            .map(|t| {
                if !t.assignments.is_empty() {
                    t.assignments.len() as f64
                } else if t.num_partitions < 0 {
                    f64::from(default_partitions)
                } else {
                    f64::from(t.num_partitions)
                }
            })
            .collect(),
        RequestBody::CreatePartitions(r) => r
            .topics
            .iter()
            .map(|t| (f64::from(t.count) - partitions_of(&t.name)).max(0.0))
            .collect(),
        RequestBody::DeleteTopics(r) if version >= 6 => r
            .topics
            .iter()
            .map(|t| match &t.name {
                Some(n) => partitions_of(n),
                None => image
                    .topics
                    .get(&t.topic_id)
                    .map_or(0, |t| t.partitions.len()) as f64,
            })
            .collect(),
        RequestBody::DeleteTopics(r) => r.topic_names.iter().map(|n| partitions_of(n)).collect(),
        _ => return (None, Duration::ZERO),
    };
    let admission = manager.admit_mutations(g, &permits, strict, now);
    if admission.admitted.iter().all(|a| *a) {
        return (None, admission.throttle);
    }
    let mut admitted = admission.admitted.into_iter();
    let mut keep = move || admitted.next().unwrap_or(true);
    let code = ErrorCode::THROTTLING_QUOTA_EXCEEDED.code();
    let patch: Patch = match request {
        RequestBody::CreateTopics(r) => {
            let (kept, refused): (Vec<_>, Vec<_>) = r.topics.drain(..).partition(|_| keep());
            r.topics = kept;
            Box::new(move |body: &mut ResponseBody| {
                if let ResponseBody::CreateTopics(resp) = body {
                    resp.topics
                        .extend(refused.into_iter().map(|t| CreatableTopicResult {
                            name: t.name,
                            error_code: code,
                            error_message: Some(THROTTLED_MESSAGE.into()),
                            num_partitions: -1,
                            replication_factor: -1,
                            ..Default::default()
                        }));
                }
            })
        }
        RequestBody::CreatePartitions(r) => {
            let (kept, refused): (Vec<_>, Vec<_>) = r.topics.drain(..).partition(|_| keep());
            r.topics = kept;
            Box::new(move |body: &mut ResponseBody| {
                if let ResponseBody::CreatePartitions(resp) = body {
                    resp.results
                        .extend(refused.into_iter().map(|t| CreatePartitionsTopicResult {
                            name: t.name,
                            error_code: code,
                            error_message: Some(THROTTLED_MESSAGE.into()),
                            ..Default::default()
                        }));
                }
            })
        }
        RequestBody::DeleteTopics(r) => {
            let refused: Vec<(Option<String>, Uuid)> = if version >= 6 {
                let (kept, refused): (Vec<_>, Vec<_>) = r.topics.drain(..).partition(|_| keep());
                r.topics = kept;
                refused.into_iter().map(|t| (t.name, t.topic_id)).collect()
            } else {
                let (kept, refused): (Vec<_>, Vec<_>) =
                    r.topic_names.drain(..).partition(|_| keep());
                r.topic_names = kept;
                refused
                    .into_iter()
                    .map(|n| {
                        let id = image.topic(&n).map_or(Uuid::default(), |t| t.id);
                        (Some(n), id)
                    })
                    .collect()
            };
            Box::new(move |body: &mut ResponseBody| {
                if let ResponseBody::DeleteTopics(resp) = body {
                    resp.responses
                        .extend(
                            refused
                                .into_iter()
                                .map(|(name, topic_id)| DeletableTopicResult {
                                    name,
                                    topic_id,
                                    error_code: code,
                                    error_message: Some(THROTTLED_MESSAGE.into()),
                                    ..Default::default()
                                }),
                        );
                }
            })
        }
        _ => return (None, admission.throttle),
    };
    (Some(patch), admission.throttle)
}

/// Whether the client waits out the throttle itself at this version (KIP-219); for older
/// versions the broker holds the response back instead. Kafka's
/// `AbstractResponse.shouldClientThrottle` per API.
pub(crate) fn client_throttles(api: ApiKey, version: i16) -> bool {
    use ApiKey::*;
    let from = match api {
        Produce | Metadata => 6,
        Fetch => 8,
        ListOffsets | CreateTopics | JoinGroup => 3,
        OffsetCommit | OffsetFetch => 4,
        FindCoordinator | Heartbeat | LeaveGroup | SyncGroup | DescribeGroups | ListGroups
        | ApiVersions | DeleteTopics | DescribeConfigs => 2,
        AddOffsetsToTxn
        | AddPartitionsToTxn
        | AlterConfigs
        | AlterReplicaLogDirs
        | CreateAcls
        | CreatePartitions
        | DeleteAcls
        | DeleteGroups
        | DeleteRecords
        | DescribeAcls
        | DescribeLogDirs
        | EndTxn
        | InitProducerId
        | TxnOffsetCommit
        | CreateDelegationToken
        | DescribeDelegationToken
        | ExpireDelegationToken
        | RenewDelegationToken => 1,
        _ => 0,
    };
    version >= from
}

#[cfg(test)]
mod tests {
    use super::*;
    use rill_metadata::client_quotas::{QuotaEntity, CLIENT_ID, USER};
    use rill_metadata::{AlterClientQuotasRequest, ClientQuotaAlteration, ControllerEvent};

    fn governed(limit: f64) -> Governed {
        Governed {
            kind: QuotaKind::Produce,
            limit,
            tags: ("u".into(), "c".into()),
        }
    }

    #[test]
    fn a_rate_under_the_quota_is_not_throttled_and_one_over_it_is_by_kip_219s_formula() {
        let m = ClientQuotaManager::new(QuotaWindows::default(), QuotaWindows::default());
        let g = governed(1000.0);
        let t0 = m.epoch;
        // 10 windows' worth at the quota over 10 s: never throttled.
        for i in 0..100u64 {
            let now = t0 + Duration::from_millis(i * 100);
            assert_eq!(m.record(&g, 100.0, now), Duration::ZERO, "at {i}");
        }
        // A burst of 20,000 bytes at 10 s: the 10 whole windows span 10,000 ms, so the
        // rate is (10,000 + 20,000) / 10 s = 3,000/s and the throttle
        // (3000 - 1000) / 1000 * 10,000 ms = 20 s.
        let now = t0 + Duration::from_millis(10_000);
        let t = m.record(&g, 20_000.0, now);
        assert_eq!(t, Duration::from_millis(20_000));
        // Taken back, the rate is under the quota again.
        m.unrecord(&g, 20_000.0, now);
        assert_eq!(m.check(&g, now), Duration::ZERO);
    }

    #[test]
    fn a_fresh_sensor_counts_its_span_as_all_but_one_window() {
        let m = ClientQuotaManager::new(QuotaWindows::default(), QuotaWindows::default());
        let g = governed(1000.0);
        // 10,000 bytes at once on a fresh sensor: span 10 windows, rate 1,000/s: at the
        // quota, not over it. One byte more is over.
        assert_eq!(m.record(&g, 10_000.0, m.epoch), Duration::ZERO);
        assert!(m.record(&g, 1.0, m.epoch) > Duration::ZERO);
        assert_eq!(m.max_value_in_window(&g), 10_000.0);
    }

    #[test]
    fn request_time_throttles_are_capped_at_one_window() {
        let m = ClientQuotaManager::new(QuotaWindows::default(), QuotaWindows::default());
        let g = Governed {
            kind: QuotaKind::Request,
            limit: 1.0,
            tags: ("u".into(), String::new()),
        };
        assert_eq!(m.record(&g, 1e6, m.epoch), Duration::from_secs(1));
    }

    #[test]
    fn old_samples_expire() {
        let m = ClientQuotaManager::new(QuotaWindows::default(), QuotaWindows::default());
        let g = governed(1000.0);
        assert!(m.record(&g, 1e6, m.epoch) > Duration::ZERO);
        assert_eq!(
            m.check(&g, m.epoch + Duration::from_secs(12)),
            Duration::ZERO
        );
    }

    #[test]
    fn the_image_says_which_quota_governs() {
        let mut image = MetadataImage::new();
        let entity: QuotaEntity = [(USER.to_string(), None), (CLIENT_ID.to_string(), None)]
            .into_iter()
            .collect();
        let event = ControllerEvent::AlterClientQuotas(AlterClientQuotasRequest {
            entries: vec![ClientQuotaAlteration {
                entity,
                ops: vec![(PRODUCER_BYTE_RATE.into(), Some(5e6))],
            }],
            validate_only: false,
        });
        let mut controller = rill_metadata::QuorumController::new(Default::default());
        let result = controller.handle(event, &image, 0, 0);
        for r in &result.records {
            image.apply(r).unwrap();
        }
        let who = ClientIdentity {
            user: "ANONYMOUS",
            client_id: "rdkafka",
        };
        let g = ClientQuotaManager::governed(&image, QuotaKind::Produce, who).unwrap();
        assert_eq!(g.limit, 5e6);
        assert_eq!(g.tags, ("ANONYMOUS".into(), "rdkafka".into()));
        assert!(ClientQuotaManager::governed(&image, QuotaKind::Fetch, who).is_none());
    }

    #[test]
    fn mutations_are_admitted_from_a_full_bucket_and_refused_once_it_is_below_zero() {
        let m = ClientQuotaManager::new(QuotaWindows::default(), QuotaWindows::default());
        let g = Governed {
            kind: QuotaKind::Mutation,
            limit: 2.0,
            tags: ("u".into(), "c".into()),
        };
        let t0 = m.epoch;
        // The bucket holds 11 windows * 2/s = 22 partitions and starts full: a topic of
        // 20 and one of 5 pass (it goes to -3), the third is refused, and the refusal
        // says how long the bucket takes to reach zero again: 3 / 2 per s = 1.5 s.
        let a = m.admit_mutations(&g, &[20.0, 5.0, 1.0], true, t0);
        assert_eq!(a.admitted, vec![true, true, false]);
        assert_eq!(a.throttle, Duration::from_millis(1500));
        // 2 s later it holds 1 token again.
        let a = m.admit_mutations(&g, &[1.0, 1.0], true, t0 + Duration::from_secs(2));
        assert_eq!(a.admitted, vec![true, true]);
        assert_eq!(a.throttle, Duration::ZERO);
        // Old versions: everything passes, and the request is throttled below zero.
        let a = m.admit_mutations(&g, &[3.0], false, t0 + Duration::from_secs(2));
        assert_eq!(a.admitted, vec![true]);
        assert_eq!(a.throttle, Duration::from_millis(2000));
    }

    #[test]
    fn kip_219_versions() {
        use rill_protocol::generated::ApiKey;
        assert!(!client_throttles(ApiKey::Produce, 5));
        assert!(client_throttles(ApiKey::Produce, 6));
        assert!(!client_throttles(ApiKey::Fetch, 7));
        assert!(client_throttles(ApiKey::Fetch, 8));
        assert!(client_throttles(ApiKey::DescribeClientQuotas, 0));
    }
}
