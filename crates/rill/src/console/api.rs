//! The console's JSON API handlers: each one a few `rill-client` calls against this
//! node, the answer shaped for the page. Inputs are checked here (names, numbers,
//! bounds); the pure rules are in `render.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{json, Value};

use rill_client::{
    Admin, AlterConfigOp, ConfigResource, Consumer, ConsumerConfig, Error, NewPartitions, NewTopic,
    OffsetSpec, TopicPartition,
};
use rill_protocol::ErrorCode;

use super::render::{self, Encoding, PartitionState, StartAt};
use super::Console;

/// The most records one browse returns.
pub const RECORDS_MAX: usize = 500;
/// The most records one browse reads while looking for keys that match its filter.
pub const SCAN_MAX: usize = 20_000;
/// How long one browse may read before it returns what it has.
pub const BROWSE_TIME_MAX: Duration = Duration::from_secs(5);
/// The most groups the group list describes (for their member counts).
pub const GROUPS_MAX: usize = 200;

type Shared = State<Arc<Console>>;

/// A JSON answer (axum's `Json` needs a feature, and serde_json is here anyway).
pub struct Json(Value);

impl IntoResponse for Json {
    fn into_response(self) -> Response {
        (
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            self.0.to_string(),
        )
            .into_response()
    }
}

/// An answer other than 200: a status and a sentence, as `{"error": "..."}`.
pub struct ApiError(StatusCode, String);

impl ApiError {
    fn bad(message: impl Into<String>) -> Self {
        ApiError(StatusCode::BAD_REQUEST, message.into())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(json!({ "error": self.1 }))).into_response()
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        let status = match &e {
            Error::UnknownTopic(_) | Error::UnknownPartition { .. } => StatusCode::NOT_FOUND,
            Error::Kafka { code, .. } => match *code {
                ErrorCode::UNKNOWN_TOPIC_OR_PARTITION
                | ErrorCode::GROUP_ID_NOT_FOUND
                | ErrorCode::UNKNOWN_TOPIC_ID => StatusCode::NOT_FOUND,
                ErrorCode::TOPIC_ALREADY_EXISTS | ErrorCode::NON_EMPTY_GROUP => {
                    StatusCode::CONFLICT
                }
                ErrorCode::INVALID_TOPIC_EXCEPTION
                | ErrorCode::INVALID_PARTITIONS
                | ErrorCode::INVALID_REPLICATION_FACTOR
                | ErrorCode::INVALID_CONFIG
                | ErrorCode::INVALID_REQUEST
                | ErrorCode::POLICY_VIOLATION => StatusCode::BAD_REQUEST,
                ErrorCode::TOPIC_AUTHORIZATION_FAILED
                | ErrorCode::GROUP_AUTHORIZATION_FAILED
                | ErrorCode::CLUSTER_AUTHORIZATION_FAILED => StatusCode::FORBIDDEN,
                _ => StatusCode::BAD_GATEWAY,
            },
            Error::InvalidConfig(_) => StatusCode::BAD_REQUEST,
            Error::Timeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            _ => StatusCode::BAD_GATEWAY,
        };
        ApiError(status, e.to_string())
    }
}

type ApiResult = Result<Json, ApiError>;

fn admin(console: &Console) -> Result<&Admin, ApiError> {
    console
        .admin
        .as_ref()
        .map_err(|reason| ApiError(StatusCode::SERVICE_UNAVAILABLE, reason.clone()))
}

fn topic_name(name: &str) -> Result<(), ApiError> {
    render::check_topic_name(name).map_err(ApiError::bad)
}

fn body<'a, T: Deserialize<'a>>(bytes: &'a Bytes) -> Result<T, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| ApiError::bad(format!("request body: {e}")))
}

/// Refuses a write (any method but GET and HEAD) whose body is not declared JSON, with
/// 415: the CSRF guard the module doc explains.
pub async fn json_writes_only(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let method = request.method();
    if method == axum::http::Method::GET || method == axum::http::Method::HEAD {
        return next.run(request).await;
    }
    let json = request
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"));
    if json {
        next.run(request).await
    } else {
        ApiError(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "a change must be sent as content-type: application/json".into(),
        )
        .into_response()
    }
}

pub async fn not_found() -> ApiError {
    ApiError(StatusCode::NOT_FOUND, "no such API".into())
}

/// Whether the console can reach the cluster, and through which listener.
pub async fn status(State(console): Shared) -> Json {
    Json(match &console.admin {
        Ok(_) => json!({ "available": true, "bootstrap": console.bootstrap }),
        Err(reason) => json!({ "available": false, "reason": reason }),
    })
}

/// Brokers, the active controller, topic and partition counts, partitions by state.
pub async fn cluster(State(console): Shared) -> ApiResult {
    let admin = admin(&console)?;
    let cluster = admin.describe_cluster().await?;
    let topics = admin.list_topics(true).await?;
    let mut states: BTreeMap<&str, usize> = BTreeMap::new();
    let mut partitions = 0usize;
    let mut named: BTreeSet<i32> = BTreeSet::new();
    for t in &topics {
        for p in &t.partitions {
            partitions += 1;
            named.extend(p.replicas.iter().copied());
            *states
                .entry(PartitionState::of(p.leader, p.replicas.len(), p.isr.len()).as_str())
                .or_default() += 1;
        }
    }
    let brokers: Vec<Value> = cluster
        .brokers
        .values()
        .map(|b| {
            json!({
                "id": b.node_id,
                "host": b.host,
                "port": b.port,
                "rack": b.rack,
                "fenced": false,
            })
        })
        .collect();
    // DescribeCluster lists only the brokers that are registered and unfenced; a broker a
    // partition names that is not among them is fenced or gone.
    let absent: Vec<Value> = named
        .iter()
        .filter(|id| !cluster.brokers.contains_key(id))
        .map(|id| json!({ "id": id, "host": null, "port": null, "rack": null, "fenced": true }))
        .collect();
    Ok(Json(json!({
        "cluster_id": cluster.cluster_id,
        "controller_id": cluster.controller_id,
        "brokers": brokers.into_iter().chain(absent).collect::<Vec<_>>(),
        "topics": topics.iter().filter(|t| !t.is_internal).count(),
        "internal_topics": topics.iter().filter(|t| t.is_internal).count(),
        "partitions": partitions,
        "partition_states": {
            "online": states.get("online").copied().unwrap_or(0),
            "under_replicated": states.get("under-replicated").copied().unwrap_or(0),
            "offline": states.get("offline").copied().unwrap_or(0),
        },
    })))
}

/// The size of each partition: its leader's replica when the leader reported one, else
/// the largest replica.
fn partition_sizes(
    sizes: &BTreeMap<(i32, TopicPartition), i64>,
) -> BTreeMap<TopicPartition, (i64, Vec<(i32, i64)>)> {
    let mut out: BTreeMap<TopicPartition, (i64, Vec<(i32, i64)>)> = BTreeMap::new();
    for ((broker, tp), size) in sizes {
        let entry = out.entry(tp.clone()).or_default();
        entry.0 = entry.0.max(*size);
        entry.1.push((*broker, *size));
    }
    out
}

/// Every topic: partitions, replication factor, size (the leaders' replicas), states.
pub async fn topics(State(console): Shared) -> ApiResult {
    let admin = admin(&console)?;
    let topics = admin.list_topics(true).await?;
    // Sizes are a nicety: a broker that cannot say leaves them out rather than the page.
    let sizes = admin.describe_replica_sizes().await.unwrap_or_default();
    let sizes = partition_sizes(&sizes);
    let list: Vec<Value> = topics
        .iter()
        .map(|t| {
            let mut size = 0i64;
            let mut under = 0;
            let mut offline = 0;
            for p in &t.partitions {
                let tp = TopicPartition::new(t.name.clone(), p.partition);
                if let Some((max, per_broker)) = sizes.get(&tp) {
                    let leader = per_broker.iter().find(|(b, _)| *b == p.leader);
                    size = size.saturating_add(leader.map(|(_, s)| *s).unwrap_or(*max));
                }
                match PartitionState::of(p.leader, p.replicas.len(), p.isr.len()) {
                    PartitionState::UnderReplicated => under += 1,
                    PartitionState::Offline => offline += 1,
                    PartitionState::Online => {}
                }
            }
            let rf = t
                .partitions
                .iter()
                .map(|p| p.replicas.len())
                .max()
                .unwrap_or(0);
            json!({
                "name": t.name,
                "internal": t.is_internal,
                "partitions": t.partitions.len(),
                "replication_factor": rf,
                "size_bytes": size,
                "under_replicated": under,
                "offline": offline,
            })
        })
        .collect();
    Ok(Json(Value::Array(list)))
}

/// A topic: each partition's leader, replicas, ISR, log start and end offsets and size,
/// and the topic's configs.
pub async fn topic(State(console): Shared, Path(name): Path<String>) -> ApiResult {
    topic_name(&name)?;
    let admin = admin(&console)?;
    let topic = admin
        .describe_topics(std::slice::from_ref(&name))
        .await?
        .into_iter()
        .next()
        .ok_or_else(|| ApiError(StatusCode::NOT_FOUND, format!("unknown topic {name}")))?;
    let tps: Vec<TopicPartition> = topic
        .partitions
        .iter()
        .map(|p| TopicPartition::new(name.clone(), p.partition))
        .collect();
    let (starts, ends) = if tps.is_empty() {
        (BTreeMap::new(), BTreeMap::new())
    } else {
        (
            admin
                .list_offsets(&tps, OffsetSpec::Earliest)
                .await
                .unwrap_or_default(),
            admin
                .list_offsets(&tps, OffsetSpec::Latest)
                .await
                .unwrap_or_default(),
        )
    };
    let sizes = partition_sizes(&admin.describe_replica_sizes().await.unwrap_or_default());
    let partitions: Vec<Value> = topic
        .partitions
        .iter()
        .map(|p| {
            let tp = TopicPartition::new(name.clone(), p.partition);
            let size = sizes.get(&tp).map(|(max, per_broker)| {
                per_broker
                    .iter()
                    .find(|(b, _)| *b == p.leader)
                    .map(|(_, s)| *s)
                    .unwrap_or(*max)
            });
            json!({
                "partition": p.partition,
                "leader": (p.leader >= 0).then_some(p.leader),
                "leader_epoch": p.leader_epoch,
                "replicas": p.replicas,
                "isr": p.isr,
                "offline_replicas": p.offline_replicas,
                "state": PartitionState::of(p.leader, p.replicas.len(), p.isr.len()).as_str(),
                "log_start_offset": starts.get(&tp),
                "log_end_offset": ends.get(&tp),
                "size_bytes": size,
            })
        })
        .collect();
    let configs = admin
        .describe_configs(&ConfigResource::topic(name.clone()))
        .await?;
    let configs: Vec<Value> = configs
        .iter()
        .map(|c| {
            json!({
                "name": c.name,
                "value": if c.is_sensitive { None } else { c.value.clone() },
                "is_default": c.is_default,
                "read_only": c.read_only,
                "is_sensitive": c.is_sensitive,
            })
        })
        .collect();
    Ok(Json(json!({
        "name": name,
        "internal": topic.is_internal,
        "partitions": partitions,
        "configs": configs,
    })))
}

#[derive(Deserialize)]
struct CreateTopic {
    name: String,
    partitions: Option<i32>,
    replication_factor: Option<i16>,
    #[serde(default)]
    configs: BTreeMap<String, String>,
}

pub async fn create_topic(State(console): Shared, bytes: Bytes) -> Result<Response, ApiError> {
    let request: CreateTopic = body(&bytes)?;
    topic_name(&request.name)?;
    let partitions = request.partitions.unwrap_or(-1);
    if partitions == 0 || !(-1..=100_000).contains(&partitions) {
        return Err(ApiError::bad(
            "partitions: 1 to 100000 (or leave it empty for the default)",
        ));
    }
    let rf = request.replication_factor.unwrap_or(-1);
    if rf == 0 || rf < -1 {
        return Err(ApiError::bad(
            "replication factor: at least 1 (or empty for the default)",
        ));
    }
    if request.configs.len() > 64 {
        return Err(ApiError::bad("at most 64 configs"));
    }
    let mut topic = NewTopic::new(request.name.clone(), partitions).replication_factor(rf);
    for (k, v) in request.configs {
        topic = topic.config(k, v);
    }
    admin(&console)?.create_topics(&[topic]).await?;
    Ok((
        StatusCode::CREATED,
        Json(json!({ "created": request.name })),
    )
        .into_response())
}

pub async fn delete_topic(State(console): Shared, Path(name): Path<String>) -> ApiResult {
    topic_name(&name)?;
    admin(&console)?
        .delete_topics(std::slice::from_ref(&name))
        .await?;
    Ok(Json(json!({ "deleted": name })))
}

#[derive(Deserialize)]
struct AddPartitions {
    /// The new total number of partitions.
    count: i32,
}

pub async fn add_partitions(
    State(console): Shared,
    Path(name): Path<String>,
    bytes: Bytes,
) -> ApiResult {
    topic_name(&name)?;
    let request: AddPartitions = body(&bytes)?;
    if !(1..=100_000).contains(&request.count) {
        return Err(ApiError::bad("count: the new total, 1 to 100000"));
    }
    admin(&console)?
        .create_partitions(&[NewPartitions {
            topic: name.clone(),
            total_count: request.count,
        }])
        .await?;
    Ok(Json(json!({ "topic": name, "partitions": request.count })))
}

#[derive(Deserialize)]
struct AlterConfig {
    name: String,
    /// `null` deletes the topic's value (back to the default).
    value: Option<String>,
}

pub async fn alter_config(
    State(console): Shared,
    Path(name): Path<String>,
    bytes: Bytes,
) -> ApiResult {
    topic_name(&name)?;
    let request: AlterConfig = body(&bytes)?;
    if request.name.is_empty() || request.name.len() > 255 {
        return Err(ApiError::bad("a config name has 1 to 255 bytes"));
    }
    let op = match request.value {
        Some(v) => AlterConfigOp::Set(request.name.clone(), v),
        None => AlterConfigOp::Delete(request.name.clone()),
    };
    admin(&console)?
        .alter_configs(&ConfigResource::topic(name.clone()), &[op])
        .await?;
    Ok(Json(json!({ "topic": name, "config": request.name })))
}

/// What a browse asked for, from its query string.
struct Browse {
    partition: i32,
    start: StartAt,
    limit: usize,
    key: String,
    encoding: Encoding,
}

impl Browse {
    fn parse(query: &str) -> Result<Self, ApiError> {
        let q = render::parse_query(query);
        let number = |key: &str| -> Result<Option<i64>, ApiError> {
            q.get(key)
                .filter(|v| !v.is_empty())
                .map(|v| {
                    v.trim()
                        .parse::<i64>()
                        .map_err(|_| ApiError::bad(format!("{key}: not a number: {v:?}")))
                })
                .transpose()
        };
        let partition = i32::try_from(number("partition")?.unwrap_or(0))
            .map_err(|_| ApiError::bad("partition: out of range"))?;
        let start = match q.get("from").map(String::as_str).unwrap_or("end") {
            "offset" => {
                StartAt::Offset(number("offset")?.ok_or_else(|| ApiError::bad("offset: required"))?)
            }
            "timestamp" => StartAt::Timestamp(
                number("timestamp")?.ok_or_else(|| ApiError::bad("timestamp: required"))?,
            ),
            "end" => StartAt::End,
            other => {
                return Err(ApiError::bad(format!(
                    "from {other:?}: expected offset, timestamp or end"
                )))
            }
        };
        let limit = number("limit")?.unwrap_or(50);
        if !(1..=RECORDS_MAX as i64).contains(&limit) {
            return Err(ApiError::bad(format!("limit: 1 to {RECORDS_MAX}")));
        }
        let key = q.get("key").cloned().unwrap_or_default();
        if key.len() > 1024 {
            return Err(ApiError::bad("key filter: at most 1024 bytes"));
        }
        let encoding = q
            .get("encoding")
            .map(|e| e.parse())
            .transpose()
            .map_err(ApiError::bad)?
            .unwrap_or(Encoding::Text);
        Ok(Browse {
            partition,
            start,
            limit: usize::try_from(limit).unwrap_or(RECORDS_MAX),
            key,
            encoding,
        })
    }
}

/// Reads records of one partition: from an offset, a timestamp, or the last `limit`
/// before the end, up to the end offset seen at the start, at most `limit` records whose
/// key contains the filter, and within [`SCAN_MAX`] records and [`BROWSE_TIME_MAX`].
pub async fn messages(
    State(console): Shared,
    Path(name): Path<String>,
    RawQuery(query): RawQuery,
) -> ApiResult {
    topic_name(&name)?;
    let browse = Browse::parse(query.as_deref().unwrap_or(""))?;
    let admin = admin(&console)?;
    let tp = TopicPartition::new(name.clone(), browse.partition);
    let one = std::slice::from_ref(&tp);
    let log_start = admin.list_offsets(one, OffsetSpec::Earliest).await?;
    let log_end = admin.list_offsets(one, OffsetSpec::Latest).await?;
    let (Some(&log_start), Some(&log_end)) = (log_start.get(&tp), log_end.get(&tp)) else {
        return Err(ApiError(
            StatusCode::NOT_FOUND,
            format!("unknown partition {tp}"),
        ));
    };
    let from = match browse.start {
        StartAt::Offset(o) => o.clamp(log_start, log_end),
        StartAt::End => render::tail_start(log_start, log_end, browse.limit),
        StartAt::Timestamp(t) => {
            let found = admin.list_offsets(one, OffsetSpec::Timestamp(t)).await?;
            // -1: no record at or after that time.
            match found.get(&tp) {
                Some(&o) if o >= 0 => o.clamp(log_start, log_end),
                _ => log_end,
            }
        }
    };
    let mut records = Vec::new();
    let mut scanned = 0usize;
    let mut next = from;
    let mut timed_out = false;
    if from < log_end {
        let config = ConsumerConfig::new(console.client.clone().client_id("rill-console-browser"))
            .enable_auto_commit(false);
        let mut consumer = Consumer::new(config)?;
        consumer.assign(one)?;
        consumer.seek(&tp, from)?;
        let deadline = Instant::now() + BROWSE_TIME_MAX;
        'read: while next < log_end && records.len() < browse.limit && scanned < SCAN_MAX {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                timed_out = true;
                break;
            }
            let batch = consumer.poll(left.min(Duration::from_millis(500))).await?;
            for r in batch {
                if r.offset < next {
                    continue;
                }
                next = r.offset + 1;
                scanned += 1;
                if render::key_matches(r.key.as_deref(), &browse.key) {
                    records.push(json!({
                        "partition": r.partition,
                        "offset": r.offset,
                        "timestamp": r.timestamp,
                        "key": render::show(r.key.as_deref(), browse.encoding),
                        "value": render::show(r.value.as_deref(), browse.encoding),
                        "headers": r.headers.iter().take(64).map(|h| json!({
                            "key": h.key,
                            "value": render::show(h.value.as_deref(), browse.encoding),
                        })).collect::<Vec<_>>(),
                    }));
                }
                if records.len() >= browse.limit || next >= log_end || scanned >= SCAN_MAX {
                    break 'read;
                }
            }
            // Control batches (transaction markers) take offsets no record shows: the
            // consumer's position says how far it really got.
            if let Some(position) = consumer.position(&tp) {
                next = next.max(position);
            }
        }
        // Closing a consumer without a group commits nothing; an error here loses nothing.
        let _ = consumer.close().await;
    }
    Ok(Json(json!({
        "topic": name,
        "partition": browse.partition,
        "log_start_offset": log_start,
        "log_end_offset": log_end,
        "from": from,
        "next_offset": next,
        "scanned": scanned,
        "timed_out": timed_out,
        "records": records,
    })))
}

/// Every group with its state and (for the first [`GROUPS_MAX`]) its member count.
pub async fn groups(State(console): Shared) -> ApiResult {
    let admin = admin(&console)?;
    let groups = admin.list_groups().await?;
    let ids: Vec<String> = groups
        .iter()
        .take(GROUPS_MAX)
        .map(|g| g.group_id.clone())
        .collect();
    let described = admin.describe_groups(&ids).await.unwrap_or_default();
    let members: BTreeMap<&str, usize> = described
        .iter()
        .map(|g| (g.group_id.as_str(), g.members.len()))
        .collect();
    let list: Vec<Value> = groups
        .iter()
        .map(|g| {
            json!({
                "group_id": g.group_id,
                "state": g.state,
                "protocol_type": g.protocol_type,
                "coordinator": g.coordinator,
                "members": members.get(g.group_id.as_str()),
            })
        })
        .collect();
    Ok(Json(Value::Array(list)))
}

/// A group: members and their assignments; per partition the committed offset, the end
/// offset and the lag; the total lag.
pub async fn group(State(console): Shared, Path(id): Path<String>) -> ApiResult {
    render::check_group_id(&id).map_err(ApiError::bad)?;
    let admin = admin(&console)?;
    let description = admin
        .describe_groups(std::slice::from_ref(&id))
        .await?
        .into_iter()
        .next()
        .ok_or_else(|| ApiError(StatusCode::NOT_FOUND, format!("unknown group {id}")))?;
    let committed = admin.list_group_offsets(&id, None).await?;
    let mut owner: BTreeMap<TopicPartition, &str> = BTreeMap::new();
    for m in &description.members {
        for tp in &m.assignment {
            owner.insert(tp.clone(), m.member_id.as_str());
        }
    }
    let partitions: BTreeSet<TopicPartition> = committed
        .keys()
        .cloned()
        .chain(owner.keys().cloned())
        .collect();
    let partitions: Vec<TopicPartition> = partitions.into_iter().collect();
    let ends = if partitions.is_empty() {
        BTreeMap::new()
    } else {
        admin.list_offsets(&partitions, OffsetSpec::Latest).await?
    };
    let mut lags = Vec::new();
    let offsets: Vec<Value> = partitions
        .iter()
        .map(|tp| {
            let c = committed.get(tp).copied().filter(|c| *c >= 0);
            let e = ends.get(tp).copied();
            let lag = render::lag(c, e);
            lags.push(lag);
            json!({
                "topic": tp.topic,
                "partition": tp.partition,
                "committed_offset": c,
                "end_offset": e,
                "lag": lag,
                "member_id": owner.get(tp),
            })
        })
        .collect();
    let members: Vec<Value> = description
        .members
        .iter()
        .map(|m| {
            json!({
                "member_id": m.member_id,
                "group_instance_id": m.group_instance_id,
                "client_id": m.client_id,
                "client_host": m.client_host,
                "assignment": m.assignment.iter().map(|tp| json!({
                    "topic": tp.topic, "partition": tp.partition,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    Ok(Json(json!({
        "group_id": description.group_id,
        "state": description.state,
        "protocol_type": description.protocol_type,
        "protocol": description.protocol,
        "coordinator": description.coordinator.node_id,
        "members": members,
        "offsets": offsets,
        "total_lag": render::total_lag(lags),
    })))
}

#[derive(Deserialize)]
struct ResetOffsets {
    /// `earliest` or `latest`.
    to: String,
}

/// Moves every committed offset of an empty group to the log start or the log end.
pub async fn reset_offsets(
    State(console): Shared,
    Path(id): Path<String>,
    bytes: Bytes,
) -> ApiResult {
    render::check_group_id(&id).map_err(ApiError::bad)?;
    let request: ResetOffsets = body(&bytes)?;
    let spec = match request.to.as_str() {
        "earliest" => OffsetSpec::Earliest,
        "latest" => OffsetSpec::Latest,
        other => {
            return Err(ApiError::bad(format!(
                "to {other:?}: expected earliest or latest"
            )))
        }
    };
    let admin = admin(&console)?;
    let description = admin
        .describe_groups(std::slice::from_ref(&id))
        .await?
        .into_iter()
        .next();
    // Kafka's rule too: a group with members would overwrite what we set on its next
    // commit, so only an empty group is reset.
    if let Some(d) = &description {
        if !d.members.is_empty() || !matches!(d.state.as_str(), "Empty" | "Dead") {
            return Err(ApiError(
                StatusCode::CONFLICT,
                format!(
                    "group {id} is {} with {} member(s): stop its consumers first",
                    d.state,
                    d.members.len()
                ),
            ));
        }
    }
    let committed = admin.list_group_offsets(&id, None).await?;
    let partitions: Vec<TopicPartition> = committed.keys().cloned().collect();
    if partitions.is_empty() {
        return Err(ApiError::bad(format!(
            "group {id} has no committed offsets"
        )));
    }
    let targets = admin.list_offsets(&partitions, spec).await?;
    admin.alter_group_offsets(&id, &targets).await?;
    Ok(Json(
        json!({ "group_id": id, "reset": targets.len(), "to": request.to }),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn browse_queries_are_checked() {
        let b = Browse::parse("partition=3&from=offset&offset=10&limit=20&key=u1&encoding=hex")
            .ok()
            .unwrap();
        assert_eq!(b.partition, 3);
        assert_eq!(b.start, StartAt::Offset(10));
        assert_eq!(b.limit, 20);
        assert_eq!(b.key, "u1");
        assert_eq!(b.encoding, Encoding::Hex);

        let d = Browse::parse("").ok().unwrap();
        assert_eq!((d.partition, d.start, d.limit), (0, StartAt::End, 50));

        for bad in [
            "limit=0",
            "limit=501",
            "from=offset",
            "from=timestamp&timestamp=x",
            "from=start",
            "encoding=base64",
            "partition=99999999999",
        ] {
            assert!(Browse::parse(bad).is_err(), "{bad} should be refused");
        }
    }

    #[test]
    fn client_errors_map_to_statuses() {
        let status = |e: Error| ApiError::from(e).0;
        let kafka = |code| Error::Kafka {
            code,
            context: "test".into(),
            message: None,
        };
        assert_eq!(
            status(Error::UnknownTopic("t".into())),
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            status(kafka(ErrorCode::TOPIC_ALREADY_EXISTS)),
            StatusCode::CONFLICT
        );
        assert_eq!(
            status(kafka(ErrorCode::INVALID_PARTITIONS)),
            StatusCode::BAD_REQUEST
        );
    }
}
