//! KIP-227's incremental fetch sessions, on the broker that answers a Fetch: the cache of
//! sessions and what each request and its answer do to it. A pure state machine (time
//! comes in as milliseconds); `data.rs` reads the partitions and sends the answer.
//!
//! # Protocol (Kafka's `FetchManager.newContext` and its fetch contexts)
//! 1. A request names its session with `session_id` and `session_epoch`.
//!    - Epoch -1 with session 0: no session; the request is read as it is.
//!    - Epoch -1 with a session: that session is closed, then as above.
//!    - Epoch 0: a *full* fetch. A session it names is closed; once answered, a new one
//!      holding every partition of the request is opened when the cache has room (or
//!      can make it), and its id goes back in the answer (0 when none was opened).
//!    - Any other epoch: an *incremental* fetch in an open session. An unknown session
//!      is FETCH_SESSION_ID_NOT_FOUND, an epoch other than the session's is
//!      INVALID_FETCH_SESSION_EPOCH, and a session opened with topic ids (v13+) used
//!      without them, or the other way round, is FETCH_SESSION_TOPIC_ID_ERROR: each
//!      answered with the error alone and session id 0. Otherwise the partitions the
//!      request names are added to the session or update it, the forgotten ones leave
//!      it, the session's epoch moves on (wrapping to 1 past `i32::MAX`), and the
//!      request is read as if it had named every partition of the session, in the
//!      session's order. A session left with no partitions is closed instead, and the
//!      request is read as it is.
//! 2. An incremental fetch's answer leaves out each partition that has nothing new for
//!    the fetcher: no records, the same high watermark and log start offset as it was
//!    last sent, no error, no diverging epoch and no preferred read replica. An error
//!    forgets the high watermark sent, so that the partition comes back once the error
//!    is gone. Partitions that answered with records go to the end of the session's
//!    order, so that under `max_bytes` the others are read first next time.
//! 3. When the session's epoch has moved on between the request and its answer (a
//!    duplicate request), the answer is INVALID_FETCH_SESSION_EPOCH.
//! 4. The cache holds at most `max.incremental.fetch.session.cache.slots` sessions. A
//!    new one may take the place of one unused for two minutes; failing that, of the
//!    least valuable evictable one if the new one is worth more: a follower's session
//!    (privileged) over a consumer's, then more partitions over fewer. A consumer's
//!    session is evictable at once by a follower's and after two minutes by anyone's;
//!    a follower's after two minutes.

use std::collections::HashMap;

use rill_protocol::generated::fetch_request::{FetchPartition, FetchRequest, FetchTopic};
use rill_protocol::generated::fetch_response::FetchResponse;
use rill_protocol::{ErrorCode, Uuid};

/// `max.incremental.fetch.session.cache.slots`' default.
pub const DEFAULT_MAX_SESSIONS: usize = 1_000;
/// How long a session must go unused, or have existed, before another may evict it
/// (Kafka's `MIN_INCREMENTAL_FETCH_SESSION_EVICTION_MS`).
pub const EVICTION_MS: u64 = 120_000;

const INITIAL_EPOCH: i32 = 0;
const FINAL_EPOCH: i32 = -1;

/// The epoch after `epoch` (Kafka's `FetchMetadata.nextEpoch`).
fn next_epoch(epoch: i32) -> i32 {
    if epoch < 0 {
        FINAL_EPOCH
    } else if epoch == i32::MAX {
        1
    } else {
        epoch + 1
    }
}

/// A partition of a session: by topic id in a session of topic ids, else by name.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct PartitionKey {
    topic_id: Uuid,
    topic: String,
    partition: i32,
}

impl PartitionKey {
    fn new(uses_topic_ids: bool, topic_id: Uuid, topic: &str, partition: i32) -> Self {
        if uses_topic_ids {
            Self {
                topic_id,
                topic: String::new(),
                partition,
            }
        } else {
            Self {
                topic_id: Uuid::ZERO,
                topic: topic.to_owned(),
                partition,
            }
        }
    }
}

/// What a session remembers of one partition: what the fetcher last asked of it, and
/// what it was last told.
#[derive(Clone, Debug)]
struct CachedPartition {
    key: PartitionKey,
    /// What the fetcher last asked of the partition.
    request: FetchPartition,
    high_watermark: i64,
    local_log_start_offset: i64,
}

#[derive(Debug)]
struct FetchSession {
    privileged: bool,
    uses_topic_ids: bool,
    creation_ms: u64,
    last_used_ms: u64,
    /// The epoch the next request must carry.
    epoch: i32,
    /// In the order the partitions are read.
    partitions: Vec<CachedPartition>,
    index: HashMap<PartitionKey, usize>,
}

impl FetchSession {
    /// Where the session holds a partition: looked for at `hint` first (requests and
    /// answers mostly come in the session's order), then by key.
    fn find(
        &self,
        topic_ids: bool,
        topic_id: Uuid,
        topic: &str,
        partition: i32,
        hint: usize,
    ) -> Option<usize> {
        let same = |c: &CachedPartition| {
            c.key.partition == partition
                && if topic_ids {
                    c.key.topic_id == topic_id
                } else {
                    c.key.topic == topic
                }
        };
        match self.partitions.get(hint) {
            Some(c) if same(c) => Some(hint),
            _ => self
                .index
                .get(&PartitionKey::new(topic_ids, topic_id, topic, partition))
                .copied(),
        }
    }

    fn reindex(&mut self) {
        self.index = self
            .partitions
            .iter()
            .enumerate()
            .map(|(i, p)| (p.key.clone(), i))
            .collect();
    }

    /// The request's partitions in the order they were read: grouped by topic where
    /// neighbours share one, as Kafka's request builder groups them.
    fn topics(&self) -> Vec<FetchTopic> {
        let mut topics: Vec<FetchTopic> = Vec::new();
        for p in &self.partitions {
            match topics.last_mut() {
                Some(t) if t.topic_id == p.key.topic_id && t.topic == p.key.topic => {
                    t.partitions.push(p.request.clone());
                }
                _ => topics.push(FetchTopic {
                    topic: p.key.topic.clone(),
                    topic_id: p.key.topic_id,
                    partitions: vec![p.request.clone()],
                    ..Default::default()
                }),
            }
        }
        topics
    }
}

/// What a Fetch is to its session, decided before it is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FetchContext {
    /// No session: read and answered as it is.
    Sessionless,
    /// A full fetch: may open a session once answered.
    Full { privileged: bool, topic_ids: bool },
    /// An incremental fetch in session `id`, sent at `epoch`.
    Incremental { id: i32, epoch: i32 },
    /// Answered with this error alone.
    Error(ErrorCode),
}

/// The broker's incremental fetch sessions (Kafka's `FetchSessionCache`).
#[derive(Debug)]
pub struct FetchSessionCache {
    max_sessions: usize,
    sessions: HashMap<i32, FetchSession>,
    evictions: u64,
}

impl FetchSessionCache {
    pub fn new(max_sessions: usize) -> Self {
        Self {
            max_sessions,
            sessions: HashMap::new(),
            evictions: 0,
        }
    }

    /// Sessions open.
    pub fn len(&self) -> usize {
        self.sessions.len()
    }

    /// Partitions held by all sessions together.
    pub fn partitions(&self) -> usize {
        self.sessions.values().map(|s| s.partitions.len()).sum()
    }

    /// Sessions evicted to make room for new ones, since start.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// Whether `new_context` needs the cache at all (a fetch without a session does not).
    pub fn sessionless(request: &FetchRequest, version: i16) -> bool {
        version < 7 || (request.session_id == 0 && request.session_epoch == FINAL_EPOCH)
    }

    /// Step 1: what `request` is to its session. An incremental fetch's `topics` become
    /// the session's partitions and its forgotten topics are emptied, so that the
    /// request is read as if it had named them all.
    pub fn new_context(
        &mut self,
        request: &mut FetchRequest,
        version: i16,
        follower: bool,
        now_ms: u64,
    ) -> FetchContext {
        if Self::sessionless(request, version) {
            return FetchContext::Sessionless;
        }
        let topic_ids = version >= 13;
        let (id, epoch) = (request.session_id, request.session_epoch);
        if epoch == INITIAL_EPOCH || epoch == FINAL_EPOCH {
            if id != 0 {
                self.sessions.remove(&id);
            }
            return if epoch == FINAL_EPOCH {
                FetchContext::Sessionless
            } else {
                FetchContext::Full {
                    privileged: follower,
                    topic_ids,
                }
            };
        }
        let Some(session) = self.sessions.get_mut(&id) else {
            return FetchContext::Error(ErrorCode::FETCH_SESSION_ID_NOT_FOUND);
        };
        if session.epoch != epoch {
            return FetchContext::Error(ErrorCode::INVALID_FETCH_SESSION_EPOCH);
        }
        if session.uses_topic_ids != topic_ids {
            return FetchContext::Error(ErrorCode::FETCH_SESSION_TOPIC_ID_ERROR);
        }
        // Whether the request named every partition of the session, in its order: then
        // it is read as it came.
        let mut in_order = true;
        let mut at = 0;
        for topic in &request.topics {
            for p in &topic.partitions {
                let found = session.find(topic_ids, topic.topic_id, &topic.topic, p.partition, at);
                in_order &= found == Some(at);
                at += 1;
                match found {
                    Some(i) => session.partitions[i].request = p.clone(),
                    None => {
                        let key =
                            PartitionKey::new(topic_ids, topic.topic_id, &topic.topic, p.partition);
                        session.index.insert(key.clone(), session.partitions.len());
                        session.partitions.push(CachedPartition {
                            key,
                            request: p.clone(),
                            high_watermark: -1,
                            local_log_start_offset: -1,
                        });
                    }
                }
            }
        }
        let mut forgot = false;
        for topic in &request.forgotten_topics_data {
            for &partition in &topic.partitions {
                let key = PartitionKey::new(topic_ids, topic.topic_id, &topic.topic, partition);
                if session.index.remove(&key).is_some() {
                    forgot = true;
                }
            }
        }
        if forgot {
            session
                .partitions
                .retain(|p| session.index.contains_key(&p.key));
            session.reindex();
        }
        request.forgotten_topics_data.clear();
        if session.partitions.is_empty() {
            self.sessions.remove(&id);
            return FetchContext::Sessionless;
        }
        session.last_used_ms = now_ms;
        session.epoch = next_epoch(session.epoch);
        if !(in_order && !forgot && at == session.partitions.len()) {
            request.topics = session.topics();
        }
        FetchContext::Incremental { id, epoch }
    }

    /// Steps 2 to 4, once the request has been read into `response`: opens the session
    /// of a full fetch (with the partitions it `asked` for, those the authorizer refused
    /// included, as Kafka's session holds them), or leaves out of an incremental one's
    /// answer what is not new. `records` holds each answered partition's record bytes,
    /// in answer order; the returned mask says which partitions stay.
    pub fn answer(
        &mut self,
        context: FetchContext,
        asked: &[FetchTopic],
        response: &mut FetchResponse,
        records: &[usize],
        now_ms: u64,
    ) -> Vec<bool> {
        let all = vec![true; records.len()];
        match context {
            FetchContext::Sessionless => {
                response.session_id = 0;
                all
            }
            FetchContext::Error(code) => {
                response.error_code = code.code();
                response.session_id = 0;
                response.responses.clear();
                Vec::new()
            }
            FetchContext::Full {
                privileged,
                topic_ids,
            } => {
                response.session_id = self.open(asked, response, privileged, topic_ids, now_ms);
                all
            }
            FetchContext::Incremental { id, epoch } => {
                let session = match self.sessions.get_mut(&id) {
                    Some(s) if s.epoch == next_epoch(epoch) => s,
                    // Closed or moved on meanwhile: a duplicate of this request won.
                    _ => {
                        response.error_code = ErrorCode::INVALID_FETCH_SESSION_EPOCH.code();
                        response.session_id = id;
                        response.responses.clear();
                        return Vec::new();
                    }
                };
                response.session_id = id;
                let mut keep = Vec::with_capacity(records.len());
                let mut moved = vec![false; session.partitions.len()];
                let mut at = 0;
                let topic_ids = session.uses_topic_ids;
                for topic in &mut response.responses {
                    topic.partitions.retain(|p| {
                        let bytes = records.get(at).copied().unwrap_or(0);
                        // The answer is read in the session's order, so the partition
                        // is found where it was asked for; those the gate answered
                        // come after the rest and are looked up.
                        let i = session.find(
                            topic_ids,
                            topic.topic_id,
                            &topic.topic,
                            p.partition_index,
                            at,
                        );
                        at += 1;
                        let mut respond = bytes > 0
                            || p.error_code != 0
                            || p.preferred_read_replica >= 0
                            || p.diverging_epoch.epoch >= 0;
                        match i.and_then(|i| session.partitions.get_mut(i).map(|c| (i, c))) {
                            Some((i, c)) => {
                                if c.high_watermark != p.high_watermark {
                                    c.high_watermark = p.high_watermark;
                                    respond = true;
                                }
                                if c.local_log_start_offset != p.log_start_offset {
                                    c.local_log_start_offset = p.log_start_offset;
                                    respond = true;
                                }
                                if p.error_code != 0 {
                                    c.high_watermark = -1;
                                }
                                if bytes > 0 {
                                    moved[i] = true;
                                }
                            }
                            // Not in the session (an error answer for a partition
                            // the gate refused before it reached the session): sent.
                            None => respond = true,
                        }
                        keep.push(respond);
                        respond
                    });
                }
                response.responses.retain(|t| !t.partitions.is_empty());
                // Those with records go last, unless they are last already.
                let first_moved = moved.iter().position(|m| *m);
                if first_moved.is_some_and(|f| moved[f..].iter().any(|m| !*m)) {
                    let mut flags = moved.into_iter();
                    let (mut stay, go): (Vec<_>, Vec<_>) = std::mem::take(&mut session.partitions)
                        .into_iter()
                        .partition(|_| !flags.next().unwrap_or(false));
                    stay.extend(go);
                    session.partitions = stay;
                    session.reindex();
                }
                session.last_used_ms = now_ms;
                keep
            }
        }
    }

    /// An incremental fetch's answer when its quota holds its records back (Kafka's
    /// `getThrottledResponse`): nothing, under its session; a full fetch opens none.
    pub fn throttled(&self, context: FetchContext, response: &mut FetchResponse) {
        response.responses.clear();
        match context {
            FetchContext::Incremental { id, epoch } => {
                response.session_id = id;
                if self.sessions.get(&id).map(|s| s.epoch) != Some(next_epoch(epoch)) {
                    response.error_code = ErrorCode::INVALID_FETCH_SESSION_EPOCH.code();
                }
            }
            FetchContext::Error(code) => {
                response.error_code = code.code();
                response.session_id = 0;
            }
            FetchContext::Sessionless | FetchContext::Full { .. } => response.session_id = 0,
        }
    }

    /// Opens a full fetch's session, holding every partition it asked for with what it
    /// was answered; 0 when the cache has no room for it.
    fn open(
        &mut self,
        asked: &[FetchTopic],
        response: &FetchResponse,
        privileged: bool,
        topic_ids: bool,
        now_ms: u64,
    ) -> i32 {
        let answered: HashMap<PartitionKey, (i64, i64)> = response
            .responses
            .iter()
            .flat_map(|t| {
                t.partitions.iter().map(move |p| {
                    (
                        PartitionKey::new(topic_ids, t.topic_id, &t.topic, p.partition_index),
                        (
                            if p.error_code != 0 {
                                -1
                            } else {
                                p.high_watermark
                            },
                            p.log_start_offset,
                        ),
                    )
                })
            })
            .collect();
        let mut partitions = Vec::new();
        let mut index = HashMap::new();
        for topic in asked {
            for p in &topic.partitions {
                let key = PartitionKey::new(topic_ids, topic.topic_id, &topic.topic, p.partition);
                if index.contains_key(&key) {
                    continue;
                }
                let (high_watermark, local_log_start_offset) =
                    answered.get(&key).copied().unwrap_or((-1, -1));
                index.insert(key.clone(), partitions.len());
                partitions.push(CachedPartition {
                    key,
                    request: p.clone(),
                    high_watermark,
                    local_log_start_offset,
                });
            }
        }
        if partitions.is_empty() {
            return 0;
        }
        if self.sessions.len() >= self.max_sessions
            && !self.evict_for(privileged, partitions.len(), now_ms)
        {
            return 0;
        }
        let id = self.new_session_id();
        self.sessions.insert(
            id,
            FetchSession {
                privileged,
                uses_topic_ids: topic_ids,
                creation_ms: now_ms,
                last_used_ms: now_ms,
                epoch: next_epoch(INITIAL_EPOCH),
                partitions,
                index,
            },
        );
        id
    }

    /// Step 4: makes room for a new session of `size` partitions if one may go.
    fn evict_for(&mut self, privileged: bool, size: usize, now_ms: u64) -> bool {
        let stale = self
            .sessions
            .iter()
            .min_by_key(|(id, s)| (s.last_used_ms, **id))
            .filter(|(_, s)| now_ms.saturating_sub(s.last_used_ms) > EVICTION_MS)
            .map(|(id, _)| *id);
        if let Some(id) = stale {
            self.sessions.remove(&id);
            self.evictions += 1;
            return true;
        }
        let old = |s: &FetchSession| now_ms.saturating_sub(s.creation_ms) > EVICTION_MS;
        let least = self
            .sessions
            .iter()
            .filter(|(_, s)| {
                if privileged {
                    !s.privileged || old(s)
                } else {
                    old(s)
                }
            })
            .map(|(id, s)| (s.privileged, s.partitions.len(), *id))
            .min();
        match least {
            Some(key) if (privileged, size, 0) >= key => {
                self.sessions.remove(&key.2);
                self.evictions += 1;
                true
            }
            _ => false,
        }
    }

    /// A random positive id no open session has (not a secret: Kafka's are
    /// `ThreadLocalRandom`'s). Each `RandomState` is keyed afresh.
    fn new_session_id(&self) -> i32 {
        use std::hash::BuildHasher;
        let mut salt = 0u64;
        loop {
            let raw = std::collections::hash_map::RandomState::new().hash_one(salt);
            let id = (raw & 0x7fff_ffff) as i32;
            if id != 0 && !self.sessions.contains_key(&id) {
                return id;
            }
            salt += 1;
        }
    }
}

#[cfg(test)]
mod tests;
