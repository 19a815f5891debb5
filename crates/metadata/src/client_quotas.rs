//! Client quotas in the metadata log: what AlterClientQuotas may store (Kafka's
//! `ClientQuotaControlManager`), what DescribeClientQuotas answers from the image
//! (`ClientQuotasImage.describe`), and which stored quota governs a connection's
//! requests (the precedence of Kafka's `DefaultQuotaCallback`). Pure: the broker's quota
//! manager measures the rates and throttles; this module only says what the limits are.
//!
//! An entity is a map from entity type (`user`, `client-id`, `ip`) to a name, `None`
//! being the default entity of that type, as in Kafka's `ClientQuotaEntity`.

use std::collections::BTreeMap;
use std::net::IpAddr;

use rill_protocol::generated::metadata::client_quota_record::EntityData;
use rill_protocol::generated::metadata::ClientQuotaRecord;
use rill_protocol::ErrorCode;
use serde::{Deserialize, Serialize};

use crate::api::{AlterClientQuotasRequest, ControllerResponse, ControllerResult};
use crate::controller::Scratch;
use crate::image::MetadataImage;
use crate::record::MetadataRecord;

pub const USER: &str = "user";
pub const CLIENT_ID: &str = "client-id";
pub const IP: &str = "ip";

/// Kafka's quota keys for users and client ids (`QuotaConfig.userAndClientQuotaConfigs`).
pub const PRODUCER_BYTE_RATE: &str = "producer_byte_rate";
pub const CONSUMER_BYTE_RATE: &str = "consumer_byte_rate";
pub const REQUEST_PERCENTAGE: &str = "request_percentage";
pub const CONTROLLER_MUTATION_RATE: &str = "controller_mutation_rate";
/// Kafka's quota key for ip entities (`QuotaConfig.ipConfigs`).
pub const CONNECTION_CREATION_RATE: &str = "connection_creation_rate";

/// A quota entity: entity type to name, `None` for the type's default entity.
pub type QuotaEntity = BTreeMap<String, Option<String>>;

/// The type Kafka's `ConfigDef` gives a quota key, which decides what values it takes.
#[derive(Clone, Copy)]
enum KeyType {
    Long,
    Int,
    Double,
}

fn user_and_client_key(key: &str) -> Option<KeyType> {
    match key {
        PRODUCER_BYTE_RATE | CONSUMER_BYTE_RATE => Some(KeyType::Long),
        REQUEST_PERCENTAGE | CONTROLLER_MUTATION_RATE => Some(KeyType::Double),
        _ => None,
    }
}

fn ip_key(key: &str) -> Option<KeyType> {
    (key == CONNECTION_CREATION_RATE).then_some(KeyType::Int)
}

/// An entity as Kafka's `ClientQuotaEntity.toString` prints it in messages.
pub fn entity_display(entity: &QuotaEntity) -> String {
    let parts: Vec<String> = entity
        .iter()
        .map(|(t, n)| format!("{t}={}", n.as_deref().unwrap_or("<default>")))
        .collect();
    format!("ClientQuotaEntity(entries={{{}}})", parts.join(", "))
}

/// The outcome for one entity of an AlterClientQuotas request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClientQuotaResult {
    pub entity: QuotaEntity,
    #[serde(with = "crate::api::ErrorCodeDef")]
    pub error_code: ErrorCode,
    pub error_message: Option<String>,
}

type Refusal = (ErrorCode, String);

fn invalid(message: impl Into<String>) -> Refusal {
    (ErrorCode::INVALID_REQUEST, message.into())
}

/// The keys an entity may hold, from the combination of its types.
fn keys_for(entity: &QuotaEntity) -> Result<fn(&str) -> Option<KeyType>, Refusal> {
    if entity.is_empty() {
        return Err(invalid("Invalid empty client quota entity"));
    }
    for (entity_type, name) in entity {
        if ![USER, CLIENT_ID, IP].contains(&entity_type.as_str()) {
            return Err(invalid(format!(
                "Unhandled client quota entity type: {entity_type}"
            )));
        }
        if name.as_deref() == Some("") {
            return Err(invalid(format!("Empty {entity_type} not supported")));
        }
    }
    if let Some(ip) = entity.get(IP) {
        if entity.contains_key(USER) || entity.contains_key(CLIENT_ID) {
            return Err(invalid(
                "Invalid quota entity combination, IP entity shouldnot be combined with User \
                 or ClientId",
            ));
        }
        // Kafka also takes a host name it can resolve; the controller is pure and takes
        // addresses only.
        if let Some(ip) = ip {
            if ip.parse::<IpAddr>().is_err() {
                return Err(invalid(format!(
                    "{ip} is not a valid IP or resolvable host."
                )));
            }
        }
        return Ok(ip_key);
    }
    Ok(user_and_client_key)
}

/// Kafka's checks of one value (`validateQuotaKeyValue`), comparisons and all: a NaN
/// passes them, as it does in Kafka.
fn validate_value(keys: fn(&str) -> Option<KeyType>, key: &str, value: f64) -> Result<(), Refusal> {
    let Some(ty) = keys(key) else {
        return Err(invalid(format!("Invalid configuration key {key}")));
    };
    if value <= 0.0 {
        return Err(invalid(format!("Quota {key} must be greater than 0")));
    }
    let (max, name) = match ty {
        KeyType::Double => return Ok(()),
        KeyType::Int => (i32::MAX as f64, "an INT"),
        KeyType::Long => (i64::MAX as f64, "a LONG"),
    };
    if value > max {
        return Err(invalid(format!(
            "Proposed value for {key} is too large for {name}."
        )));
    }
    if (value % 1.0).abs() > 1e-6 {
        return Err(invalid(format!("{key} cannot be a fractional value.")));
    }
    Ok(())
}

fn record_entity(entity: &QuotaEntity) -> Vec<EntityData> {
    entity
        .iter()
        .map(|(t, n)| EntityData {
            entity_type: t.clone(),
            entity_name: n.clone(),
            ..Default::default()
        })
        .collect()
}

/// The records that set (or remove) one entity's quotas, or why none may be written.
fn alter_entity(
    image: &MetadataImage,
    entity: &QuotaEntity,
    ops: &BTreeMap<String, Option<f64>>,
) -> Result<Vec<MetadataRecord>, Refusal> {
    let keys = keys_for(entity)?;
    let current = image.client_quotas.get(entity);
    let mut records = Vec::new();
    for (key, value) in ops {
        let stored = current.and_then(|c| c.get(key)).copied();
        match value {
            None => {
                if stored.is_some() {
                    records.push(MetadataRecord::ClientQuota(ClientQuotaRecord {
                        entity: record_entity(entity),
                        key: key.clone(),
                        remove: true,
                        ..Default::default()
                    }));
                }
            }
            Some(value) => {
                validate_value(keys, key, *value)?;
                if stored != Some(*value) {
                    records.push(MetadataRecord::ClientQuota(ClientQuotaRecord {
                        entity: record_entity(entity),
                        key: key.clone(),
                        value: *value,
                        ..Default::default()
                    }));
                }
            }
        }
    }
    Ok(records)
}

/// AlterClientQuotas as Kafka's controller decides it: each entity's changes are
/// checked on their own; those that pass are written together, the others answered
/// INVALID_REQUEST with Kafka's messages. `validate_only` writes nothing.
pub(crate) fn alter_client_quotas(
    req: AlterClientQuotasRequest,
    image: &MetadataImage,
) -> ControllerResult {
    let mut s = Scratch::new(image);
    let mut results: Vec<ClientQuotaResult> = Vec::new();
    let set =
        |results: &mut Vec<ClientQuotaResult>, entity: &QuotaEntity, r: Result<(), Refusal>| {
            let (error_code, error_message) = match r {
                Ok(()) => (ErrorCode::NONE, None),
                Err((code, message)) => (code, Some(message)),
            };
            match results.iter_mut().find(|x| &x.entity == entity) {
                Some(x) => {
                    x.error_code = error_code;
                    x.error_message = error_message;
                }
                None => results.push(ClientQuotaResult {
                    entity: entity.clone(),
                    error_code,
                    error_message,
                }),
            }
        };
    for alteration in req.entries {
        let entity = alteration.entity;
        let mut ops: BTreeMap<String, Option<f64>> = BTreeMap::new();
        let mut duplicate = false;
        for (key, value) in alteration.ops {
            match ops.entry(key) {
                std::collections::btree_map::Entry::Occupied(_) => duplicate = true,
                std::collections::btree_map::Entry::Vacant(v) => {
                    v.insert(value);
                }
            }
        }
        // Kafka answers a duplicate key, and a second alteration of an entity, with the
        // same message: its duplicate-key error is overwritten by the entity check.
        if duplicate || results.iter().any(|r| r.entity == entity) {
            let message = format!("Ignoring duplicate entity {}", entity_display(&entity));
            set(&mut results, &entity, Err(invalid(message)));
            continue;
        }
        match alter_entity(s.image(), &entity, &ops) {
            Ok(records) => {
                if !req.validate_only {
                    for r in records {
                        s.emit(r);
                    }
                }
                set(&mut results, &entity, Ok(()));
            }
            Err(refusal) => set(&mut results, &entity, Err(refusal)),
        }
    }
    s.finish(ControllerResponse::AlterClientQuotas(results))
}

/// How a DescribeClientQuotas component matches (the request's `MatchType`).
#[derive(Debug, Clone, PartialEq)]
pub enum ComponentMatch {
    /// `MATCH_TYPE_EXACT` (0): this name.
    Exact(String),
    /// `MATCH_TYPE_DEFAULT` (1): the default entity of the type.
    Default,
    /// `MATCH_TYPE_SPECIFIED` (2): any entity that has the type.
    Specified,
}

/// One filter component as the request sends it.
#[derive(Debug, Clone, PartialEq)]
pub struct QuotaFilterComponent {
    pub entity_type: String,
    pub match_type: i8,
    pub r#match: Option<String>,
}

/// DescribeClientQuotas over the image (Kafka's `ClientQuotasImage.describe`): the entities
/// and their quotas that the filter matches, or the error and message of a bad filter.
#[allow(clippy::type_complexity)]
pub fn describe_client_quotas(
    image: &MetadataImage,
    components: &[QuotaFilterComponent],
    strict: bool,
) -> Result<Vec<(QuotaEntity, BTreeMap<String, f64>)>, Refusal> {
    let mut exact: BTreeMap<&str, Option<&str>> = BTreeMap::new();
    let mut specified: Vec<&str> = Vec::new();
    for c in components {
        let t = c.entity_type.as_str();
        if t.is_empty() {
            return Err(invalid("Invalid empty entity type."));
        }
        if exact.contains_key(t) || specified.contains(&t) {
            return Err(invalid(format!(
                "Entity type {t} cannot appear more than once in the filter."
            )));
        }
        if ![IP, USER, CLIENT_ID].contains(&t) {
            return Err((
                ErrorCode::UNSUPPORTED_VERSION,
                format!("Unsupported entity type {t}"),
            ));
        }
        match (c.match_type, &c.r#match) {
            (0, None) => {
                return Err(invalid(
                    "Request specified MATCH_TYPE_EXACT, but set match string to null.",
                ))
            }
            (0, Some(name)) => {
                exact.insert(t, Some(name.as_str()));
            }
            (1, Some(_)) => {
                return Err(invalid(
                    "Request specified MATCH_TYPE_DEFAULT, but also specified a match string.",
                ))
            }
            (1, None) => {
                exact.insert(t, None);
            }
            (2, Some(_)) => {
                return Err(invalid(
                    "Request specified MATCH_TYPE_SPECIFIED, but also specified a match string.",
                ))
            }
            (2, None) => specified.push(t),
            (other, _) => return Err(invalid(format!("Unknown match type {other}"))),
        }
    }
    let has = |t: &str| exact.contains_key(t) || specified.contains(&t);
    if has(IP) && (has(USER) || has(CLIENT_ID)) {
        return Err(invalid(
            "Invalid entity filter component combination. IP filter component should not be \
             used with user or clientId filter component.",
        ));
    }
    let matches = |entity: &QuotaEntity| {
        if strict && entity.len() != exact.len() + specified.len() {
            return false;
        }
        exact
            .iter()
            .all(|(t, name)| entity.get(*t).is_some_and(|n| n.as_deref() == *name))
            && specified.iter().all(|t| entity.contains_key(*t))
    };
    Ok(image
        .client_quotas
        .iter()
        .filter(|(entity, _)| matches(entity))
        .map(|(entity, values)| (entity.clone(), values.clone()))
        .collect())
}

/// Which quota governs a connection for one key, and the rate it is measured under:
/// the limit and the `(user, client-id)` tags of the shared measurement, following
/// Kafka's `DefaultQuotaCallback`. A quota set on `/users/<user>` is shared by all of
/// that user's client ids (tags `(user, "")`); a default entity applies to each user or
/// client id on its own.
pub fn governing_quota(
    image: &MetadataImage,
    key: &str,
    user: &str,
    client_id: &str,
) -> Option<(f64, (String, String))> {
    if image.client_quotas.is_empty() {
        return None;
    }
    let entity = |u: Option<Option<&str>>, c: Option<Option<&str>>| {
        let mut e = QuotaEntity::new();
        if let Some(u) = u {
            e.insert(USER.to_string(), u.map(str::to_string));
        }
        if let Some(c) = c {
            e.insert(CLIENT_ID.to_string(), c.map(str::to_string));
        }
        e
    };
    // Which tags each entity measures under: 0 (user, client-id), 1 (user, ""),
    // 2 ("", client-id).
    let order = [
        (entity(Some(Some(user)), Some(Some(client_id))), 0),
        (entity(Some(Some(user)), Some(None)), 0),
        (entity(Some(Some(user)), None), 1),
        (entity(Some(None), Some(Some(client_id))), 0),
        (entity(Some(None), Some(None)), 0),
        (entity(Some(None), None), 1),
        (entity(None, Some(Some(client_id))), 2),
        (entity(None, Some(None)), 2),
    ];
    order.into_iter().find_map(|(e, tags)| {
        let limit = *image.client_quotas.get(&e)?.get(key)?;
        let tags = match tags {
            0 => (user.to_string(), client_id.to_string()),
            1 => (user.to_string(), String::new()),
            _ => (String::new(), client_id.to_string()),
        };
        Some((limit, tags))
    })
}

/// The `connection_creation_rate` of connections from `ip`: its own entity's, else the
/// default `ip` entity's (Kafka's `ConnectionQuotas` precedence).
pub fn ip_quota(image: &MetadataImage, ip: IpAddr) -> Option<f64> {
    let entity = |name: Option<String>| QuotaEntity::from([(IP.to_string(), name)]);
    [Some(ip.to_string()), None].into_iter().find_map(|name| {
        image
            .client_quotas
            .get(&entity(name))
            .and_then(|q| q.get(CONNECTION_CREATION_RATE))
            .copied()
    })
}

/// Applies a `ClientQuotaRecord` to the image's quotas (Kafka's `replay`).
pub(crate) fn apply(
    quotas: &mut BTreeMap<QuotaEntity, BTreeMap<String, f64>>,
    r: &ClientQuotaRecord,
) {
    let entity: QuotaEntity = r
        .entity
        .iter()
        .map(|e| (e.entity_type.clone(), e.entity_name.clone()))
        .collect();
    if r.remove {
        if let Some(q) = quotas.get_mut(&entity) {
            q.remove(&r.key);
            if q.is_empty() {
                quotas.remove(&entity);
            }
        }
    } else {
        quotas
            .entry(entity)
            .or_default()
            .insert(r.key.clone(), r.value);
    }
}

/// The records that rebuild `quotas` (for snapshots).
pub(crate) fn records(
    quotas: &BTreeMap<QuotaEntity, BTreeMap<String, f64>>,
) -> Vec<MetadataRecord> {
    let mut out = Vec::new();
    for (entity, values) in quotas {
        for (key, value) in values {
            out.push(MetadataRecord::ClientQuota(ClientQuotaRecord {
                entity: record_entity(entity),
                key: key.clone(),
                value: *value,
                ..Default::default()
            }));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ClientQuotaAlteration;

    fn entity(parts: &[(&str, Option<&str>)]) -> QuotaEntity {
        parts
            .iter()
            .map(|(t, n)| (t.to_string(), n.map(str::to_string)))
            .collect()
    }

    type Ops<'a> = Vec<(&'a str, Option<f64>)>;

    fn alter(
        image: &mut MetadataImage,
        entries: Vec<(QuotaEntity, Ops<'_>)>,
        validate_only: bool,
    ) -> Vec<ClientQuotaResult> {
        let req = AlterClientQuotasRequest {
            entries: entries
                .into_iter()
                .map(|(entity, ops)| ClientQuotaAlteration {
                    entity,
                    ops: ops.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
                })
                .collect(),
            validate_only,
        };
        let r = alter_client_quotas(req, image);
        for record in &r.records {
            image.apply(record).unwrap();
        }
        let ControllerResponse::AlterClientQuotas(results) = r.response else {
            panic!("{:?}", r.response)
        };
        results
    }

    fn codes(results: &[ClientQuotaResult]) -> Vec<(ErrorCode, Option<String>)> {
        results
            .iter()
            .map(|r| (r.error_code, r.error_message.clone()))
            .collect()
    }

    #[test]
    fn quotas_are_set_changed_and_removed_and_survive_a_snapshot() {
        let mut image = MetadataImage::new();
        let alice = entity(&[(USER, Some("alice"))]);
        let r = alter(
            &mut image,
            vec![(
                alice.clone(),
                vec![
                    (PRODUCER_BYTE_RATE, Some(5e6)),
                    (REQUEST_PERCENTAGE, Some(12.5)),
                ],
            )],
            false,
        );
        assert_eq!(codes(&r), vec![(ErrorCode::NONE, None)]);
        assert_eq!(image.client_quotas[&alice][PRODUCER_BYTE_RATE], 5e6);
        // The same value again writes nothing; a removal of a key not set neither.
        let req = AlterClientQuotasRequest {
            entries: vec![ClientQuotaAlteration {
                entity: alice.clone(),
                ops: vec![
                    (PRODUCER_BYTE_RATE.into(), Some(5e6)),
                    (CONSUMER_BYTE_RATE.into(), None),
                ],
            }],
            validate_only: false,
        };
        assert!(alter_client_quotas(req, &image).records.is_empty());
        let snapshot = image.to_snapshot().unwrap();
        assert_eq!(MetadataImage::from_snapshot(snapshot).unwrap(), image);
        alter(
            &mut image,
            vec![(
                alice.clone(),
                vec![(PRODUCER_BYTE_RATE, None), (REQUEST_PERCENTAGE, None)],
            )],
            false,
        );
        assert!(image.client_quotas.is_empty(), "{:?}", image.client_quotas);
    }

    #[test]
    fn bad_alterations_get_kafkas_errors_and_write_nothing() {
        let mut image = MetadataImage::new();
        let invalid = |m: &str| (ErrorCode::INVALID_REQUEST, Some(m.to_string()));
        let cases: Vec<(QuotaEntity, Ops<'_>, &str)> = vec![
            (entity(&[]), vec![(PRODUCER_BYTE_RATE, Some(1.0))], "Invalid empty client quota entity"),
            (
                entity(&[("group", Some("g"))]),
                vec![(PRODUCER_BYTE_RATE, Some(1.0))],
                "Unhandled client quota entity type: group",
            ),
            (
                entity(&[(USER, Some(""))]),
                vec![(PRODUCER_BYTE_RATE, Some(1.0))],
                "Empty user not supported",
            ),
            (
                entity(&[(USER, Some("u")), (IP, Some("10.0.0.1"))]),
                vec![(CONNECTION_CREATION_RATE, Some(1.0))],
                "Invalid quota entity combination, IP entity shouldnot be combined with User or ClientId",
            ),
            (
                entity(&[(IP, Some("not an address"))]),
                vec![(CONNECTION_CREATION_RATE, Some(1.0))],
                "not an address is not a valid IP or resolvable host.",
            ),
            (
                entity(&[(IP, Some("10.0.0.1"))]),
                vec![(PRODUCER_BYTE_RATE, Some(1.0))],
                "Invalid configuration key producer_byte_rate",
            ),
            (
                entity(&[(CLIENT_ID, Some("c"))]),
                vec![("bogus", Some(1.0))],
                "Invalid configuration key bogus",
            ),
            (
                entity(&[(CLIENT_ID, Some("c"))]),
                vec![(CONSUMER_BYTE_RATE, Some(0.0))],
                "Quota consumer_byte_rate must be greater than 0",
            ),
            (
                entity(&[(CLIENT_ID, Some("c"))]),
                vec![(CONSUMER_BYTE_RATE, Some(1.5))],
                "consumer_byte_rate cannot be a fractional value.",
            ),
            (
                entity(&[(IP, None)]),
                vec![(CONNECTION_CREATION_RATE, Some(3e9))],
                "Proposed value for connection_creation_rate is too large for an INT.",
            ),
            (
                entity(&[(CLIENT_ID, Some("c"))]),
                vec![(CONSUMER_BYTE_RATE, Some(1.0)), (CONSUMER_BYTE_RATE, Some(2.0))],
                "Ignoring duplicate entity ClientQuotaEntity(entries={client-id=c})",
            ),
        ];
        for (e, ops, message) in cases {
            let r = alter(&mut image, vec![(e, ops)], false);
            assert_eq!(codes(&r), vec![invalid(message)]);
        }
        assert!(image.client_quotas.is_empty());
        // One good entity among bad ones is written; validate_only writes none.
        let good = entity(&[(USER, None), (CLIENT_ID, None)]);
        let r = alter(
            &mut image,
            vec![(good.clone(), vec![(CONTROLLER_MUTATION_RATE, Some(0.5))])],
            true,
        );
        assert_eq!(codes(&r), vec![(ErrorCode::NONE, None)]);
        assert!(image.client_quotas.is_empty());
        let r = alter(
            &mut image,
            vec![
                (good.clone(), vec![(CONTROLLER_MUTATION_RATE, Some(0.5))]),
                (
                    entity(&[(USER, Some(""))]),
                    vec![(PRODUCER_BYTE_RATE, Some(1.0))],
                ),
            ],
            false,
        );
        assert_eq!(r[0].error_code, ErrorCode::NONE);
        assert_eq!(r[1].error_code, ErrorCode::INVALID_REQUEST);
        assert_eq!(image.client_quotas[&good][CONTROLLER_MUTATION_RATE], 0.5);
    }

    fn component(t: &str, match_type: i8, m: Option<&str>) -> QuotaFilterComponent {
        QuotaFilterComponent {
            entity_type: t.to_string(),
            match_type,
            r#match: m.map(str::to_string),
        }
    }

    #[test]
    fn describe_filters_as_kafka_does() {
        let mut image = MetadataImage::new();
        let alice = entity(&[(USER, Some("alice"))]);
        let alice_c1 = entity(&[(USER, Some("alice")), (CLIENT_ID, Some("c1"))]);
        let default_user = entity(&[(USER, None)]);
        let c1 = entity(&[(CLIENT_ID, Some("c1"))]);
        for e in [&alice, &alice_c1, &default_user, &c1] {
            alter(
                &mut image,
                vec![(e.clone(), vec![(PRODUCER_BYTE_RATE, Some(100.0))])],
                false,
            );
        }
        let names = |components: &[QuotaFilterComponent], strict| -> Vec<QuotaEntity> {
            describe_client_quotas(&image, components, strict)
                .unwrap()
                .into_iter()
                .map(|(e, _)| e)
                .collect()
        };
        let mut got = names(&[component(USER, 0, Some("alice"))], false);
        got.sort();
        let mut want = vec![alice.clone(), alice_c1.clone()];
        want.sort();
        assert_eq!(got, want);
        assert_eq!(
            names(&[component(USER, 0, Some("alice"))], true),
            vec![alice.clone()]
        );
        assert_eq!(
            names(&[component(USER, 1, None)], false),
            vec![default_user.clone()]
        );
        assert_eq!(names(&[component(CLIENT_ID, 2, None)], false).len(), 2);
        assert_eq!(names(&[], false).len(), 4);
        assert!(names(&[], true).is_empty());
        let err = |components: &[QuotaFilterComponent]| {
            describe_client_quotas(&image, components, false).unwrap_err()
        };
        assert_eq!(
            err(&[component("group", 2, None)]).0,
            ErrorCode::UNSUPPORTED_VERSION
        );
        assert_eq!(
            err(&[component(USER, 0, None)]).0,
            ErrorCode::INVALID_REQUEST
        );
        assert_eq!(
            err(&[component(USER, 1, Some("x"))]).0,
            ErrorCode::INVALID_REQUEST
        );
        assert_eq!(
            err(&[component(USER, 2, None), component(USER, 2, None)]).1,
            "Entity type user cannot appear more than once in the filter."
        );
        assert_eq!(
            err(&[component(IP, 2, None), component(CLIENT_ID, 2, None)]).0,
            ErrorCode::INVALID_REQUEST
        );
        assert_eq!(err(&[component(USER, 7, None)]).1, "Unknown match type 7");
    }

    #[test]
    fn the_most_specific_entity_governs_with_kafkas_tags() {
        let mut image = MetadataImage::new();
        let set = |image: &mut MetadataImage, e: QuotaEntity, v: f64| {
            alter(image, vec![(e, vec![(PRODUCER_BYTE_RATE, Some(v))])], false);
        };
        assert_eq!(
            governing_quota(&image, PRODUCER_BYTE_RATE, "alice", "c1"),
            None
        );
        set(&mut image, entity(&[(CLIENT_ID, None)]), 8.0);
        let tags = |u: &str, c: &str| (u.to_string(), c.to_string());
        assert_eq!(
            governing_quota(&image, PRODUCER_BYTE_RATE, "alice", "c1"),
            Some((8.0, tags("", "c1")))
        );
        set(&mut image, entity(&[(CLIENT_ID, Some("c1"))]), 7.0);
        assert_eq!(
            governing_quota(&image, PRODUCER_BYTE_RATE, "alice", "c1"),
            Some((7.0, tags("", "c1")))
        );
        set(&mut image, entity(&[(USER, None)]), 6.0);
        assert_eq!(
            governing_quota(&image, PRODUCER_BYTE_RATE, "alice", "c1"),
            Some((6.0, tags("alice", "")))
        );
        set(&mut image, entity(&[(USER, None), (CLIENT_ID, None)]), 5.0);
        set(&mut image, entity(&[(USER, Some("alice"))]), 3.0);
        assert_eq!(
            governing_quota(&image, PRODUCER_BYTE_RATE, "alice", "c1"),
            Some((3.0, tags("alice", "")))
        );
        assert_eq!(
            governing_quota(&image, PRODUCER_BYTE_RATE, "bob", "c1"),
            Some((5.0, tags("bob", "c1")))
        );
        set(
            &mut image,
            entity(&[(USER, Some("alice")), (CLIENT_ID, Some("c1"))]),
            1.0,
        );
        assert_eq!(
            governing_quota(&image, PRODUCER_BYTE_RATE, "alice", "c1"),
            Some((1.0, tags("alice", "c1")))
        );
        assert_eq!(
            governing_quota(&image, CONSUMER_BYTE_RATE, "alice", "c1"),
            None
        );
    }
}
