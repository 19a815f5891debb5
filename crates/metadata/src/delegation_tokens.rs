//! Delegation tokens (KIP-48) in the metadata log: what the controller decides for
//! CreateDelegationToken, RenewDelegationToken and ExpireDelegationToken, and when it
//! removes an expired token (Kafka's `DelegationTokenControlManager`), and the tokens of
//! the image (`DelegationTokenImage`).
//!
//! A token is a record (`DelegationTokenRecord`): its id, owner, requester, renewers and
//! three times — issued, the end of its renewals (`max`), and its current expiry. Its
//! secret, the HMAC of its id under `delegation.token.secret.key`, is not in the log:
//! every node that knows the key derives it, so the log says who holds which token and
//! never what the token is. Deriving it (and authenticating with it over SCRAM) is the
//! broker's; this module only decides.
//!
//! The controller draws no token id: the broker that took the request brings one from the
//! operating system's randomness, and the controller refuses an id the image already has
//! (the broker then draws again), so that a token id is never used twice, which would
//! bring an expired token's secret back.

use std::collections::BTreeMap;

use rill_protocol::generated::metadata::{DelegationTokenRecord, RemoveDelegationTokenRecord};
use rill_protocol::ErrorCode;
use serde::{Deserialize, Serialize};

use crate::api::{ControllerResponse, ControllerResult, ErrorCodeDef};
use crate::controller::Scratch;
use crate::image::MetadataImage;
use crate::record::MetadataRecord;

/// Renewers must be users (Kafka's `KafkaPrincipal.USER_TYPE`).
const USER_PRINCIPAL_PREFIX: &str = "User:";

/// The controller's delegation token settings, under Kafka's names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DelegationTokenConfig {
    /// `delegation.token.secret.key` is set: tokens are on.
    pub enabled: bool,
    /// `delegation.token.max.lifetime.ms`: no token lives longer, renewals included.
    pub max_lifetime_ms: i64,
    /// `delegation.token.expiry.time.ms`: a token expires this long after its creation or
    /// its last renewal unless renewed.
    pub expiry_time_ms: i64,
    /// `delegation.token.expiry.check.interval.ms`: how often expired tokens are removed.
    pub expiry_check_interval_ms: i64,
}

impl Default for DelegationTokenConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            max_lifetime_ms: 7 * 24 * 3_600_000,
            expiry_time_ms: 24 * 3_600_000,
            expiry_check_interval_ms: 3_600_000,
        }
    }
}

/// One token of the image: `DelegationTokenRecord` without its id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DelegationTokenData {
    /// The principal the token stands for (`User:alice`).
    pub owner: String,
    /// Who asked for it (the owner, or someone allowed to CREATE_TOKENS for the owner).
    pub requester: String,
    /// Principals besides the owner that may renew or expire it.
    pub renewers: Vec<String>,
    pub issue_timestamp_ms: i64,
    /// Renewals never take the expiry past this.
    pub max_timestamp_ms: i64,
    pub expiry_timestamp_ms: i64,
}

impl DelegationTokenData {
    /// The token has passed its expiry or its maximum lifetime at `now_ms`.
    pub fn expired(&self, now_ms: i64) -> bool {
        self.max_timestamp_ms < now_ms || self.expiry_timestamp_ms < now_ms
    }

    /// The principal owns the token or may renew it (Kafka's `ownerOrRenewer`).
    pub fn owner_or_renewer(&self, principal: &str) -> bool {
        self.owner == principal || self.renewers.iter().any(|r| r == principal)
    }
}

/// The tokens of an image by id.
pub type DelegationTokens = BTreeMap<String, DelegationTokenData>;

/// Applies a token record to the image's tokens.
pub(crate) fn apply(tokens: &mut DelegationTokens, record: &MetadataRecord) {
    match record {
        MetadataRecord::DelegationToken(r) => {
            tokens.insert(
                r.token_id.clone(),
                DelegationTokenData {
                    owner: r.owner.clone(),
                    requester: r.requester.clone(),
                    renewers: r.renewers.clone(),
                    issue_timestamp_ms: r.issue_timestamp,
                    max_timestamp_ms: r.max_timestamp,
                    expiry_timestamp_ms: r.expiration_timestamp,
                },
            );
        }
        MetadataRecord::RemoveDelegationToken(r) => {
            tokens.remove(&r.token_id);
        }
        _ => {}
    }
}

fn token_record(token_id: &str, t: &DelegationTokenData) -> MetadataRecord {
    MetadataRecord::DelegationToken(DelegationTokenRecord {
        owner: t.owner.clone(),
        requester: t.requester.clone(),
        renewers: t.renewers.clone(),
        issue_timestamp: t.issue_timestamp_ms,
        max_timestamp: t.max_timestamp_ms,
        expiration_timestamp: t.expiry_timestamp_ms,
        token_id: token_id.to_string(),
        ..Default::default()
    })
}

fn remove_record(token_id: &str) -> MetadataRecord {
    MetadataRecord::RemoveDelegationToken(RemoveDelegationTokenRecord {
        token_id: token_id.to_string(),
        ..Default::default()
    })
}

/// Records that rebuild `tokens` from empty (for snapshots).
pub(crate) fn records(tokens: &DelegationTokens) -> impl Iterator<Item = MetadataRecord> + '_ {
    tokens.iter().map(|(id, t)| token_record(id, t))
}

/// CreateDelegationToken, once the broker has checked who may ask (see the module docs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CreateDelegationTokenRequest {
    /// A fresh random id the broker drew.
    pub token_id: String,
    /// `Type:name` of the owner: the requester unless the request named another.
    pub owner: String,
    pub requester: String,
    pub renewers: Vec<String>,
    /// The lifetime asked for; zero or less for the configured maximum.
    pub max_lifetime_ms: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CreateDelegationTokenResponse {
    #[serde(with = "ErrorCodeDef")]
    pub error_code: ErrorCode,
    pub issue_timestamp_ms: i64,
    pub expiry_timestamp_ms: i64,
    pub max_timestamp_ms: i64,
}

/// RenewDelegationToken or ExpireDelegationToken of the token the broker found for the
/// request's HMAC, asked by `principal`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChangeDelegationTokenRequest {
    pub token_id: String,
    pub principal: String,
    /// Renew: the renewal period asked for (zero or less for the configured one).
    /// Expire: the time left to give the token; negative expires it now.
    pub period_ms: i64,
}

/// The answer to a renewal or an expiry: the token's new expiry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DelegationTokenExpiryResponse {
    #[serde(with = "ErrorCodeDef")]
    pub error_code: ErrorCode,
    pub expiry_timestamp_ms: i64,
}

impl DelegationTokenExpiryResponse {
    fn error(error_code: ErrorCode) -> Self {
        Self {
            error_code,
            expiry_timestamp_ms: -1,
        }
    }
}

/// `now + duration` without overflow (Kafka's `sum`).
fn later(now_ms: i64, duration_ms: i64) -> i64 {
    now_ms.saturating_add(duration_ms)
}

/// CreateDelegationToken: the token's times from the configured lifetimes, the shorter
/// maximum lifetime if the request asked for one.
pub(crate) fn create(
    config: &DelegationTokenConfig,
    req: CreateDelegationTokenRequest,
    image: &MetadataImage,
    now_ms: i64,
) -> ControllerResult {
    let mut s = Scratch::new(image);
    let refuse = |s: Scratch<'_>, error_code| {
        s.finish(ControllerResponse::CreateDelegationToken(
            CreateDelegationTokenResponse {
                error_code,
                issue_timestamp_ms: -1,
                expiry_timestamp_ms: -1,
                max_timestamp_ms: -1,
            },
        ))
    };
    if !config.enabled {
        return refuse(s, ErrorCode::DELEGATION_TOKEN_AUTH_DISABLED);
    }
    if req
        .renewers
        .iter()
        .any(|r| !r.starts_with(USER_PRINCIPAL_PREFIX))
    {
        return refuse(s, ErrorCode::INVALID_PRINCIPAL_TYPE);
    }
    if req.token_id.is_empty() || image.delegation_tokens.contains_key(&req.token_id) {
        // The broker draws another id (see the module docs).
        return refuse(s, ErrorCode::DUPLICATE_RESOURCE);
    }
    let lifetime = if req.max_lifetime_ms > 0 {
        config.max_lifetime_ms.min(req.max_lifetime_ms)
    } else {
        config.max_lifetime_ms
    };
    let max_timestamp_ms = later(now_ms, lifetime);
    let expiry_timestamp_ms = max_timestamp_ms.min(later(now_ms, config.expiry_time_ms));
    let token = DelegationTokenData {
        owner: req.owner,
        requester: req.requester,
        renewers: req.renewers,
        issue_timestamp_ms: now_ms,
        max_timestamp_ms,
        expiry_timestamp_ms,
    };
    tracing::info!(token = %req.token_id, owner = %token.owner, "delegation token created");
    s.emit(token_record(&req.token_id, &token));
    s.finish(ControllerResponse::CreateDelegationToken(
        CreateDelegationTokenResponse {
            error_code: ErrorCode::NONE,
            issue_timestamp_ms: now_ms,
            expiry_timestamp_ms,
            max_timestamp_ms,
        },
    ))
}

/// The checks renewal and expiry begin with, in Kafka's order: tokens on, the token
/// known. (Each then checks expiry and the principal in its own order, as Kafka does.)
fn changeable<'i>(
    config: &DelegationTokenConfig,
    req: &ChangeDelegationTokenRequest,
    image: &'i MetadataImage,
) -> Result<&'i DelegationTokenData, ErrorCode> {
    if !config.enabled {
        return Err(ErrorCode::DELEGATION_TOKEN_AUTH_DISABLED);
    }
    let token = image
        .delegation_tokens
        .get(&req.token_id)
        .ok_or(ErrorCode::DELEGATION_TOKEN_NOT_FOUND)?;
    Ok(token)
}

/// RenewDelegationToken: the expiry moves to now plus the renewal period (the configured
/// one, or a shorter one asked for), never past the token's maximum.
pub(crate) fn renew(
    config: &DelegationTokenConfig,
    req: ChangeDelegationTokenRequest,
    image: &MetadataImage,
    now_ms: i64,
) -> ControllerResult {
    let s = Scratch::new(image);
    let answer = |s: Scratch<'_>, r| s.finish(ControllerResponse::ChangeDelegationToken(r));
    let token = match changeable(config, &req, image) {
        Ok(t) => t.clone(),
        Err(code) => return answer(s, DelegationTokenExpiryResponse::error(code)),
    };
    if token.expired(now_ms) {
        return answer(
            s,
            DelegationTokenExpiryResponse::error(ErrorCode::DELEGATION_TOKEN_EXPIRED),
        );
    }
    if !token.owner_or_renewer(&req.principal) {
        return answer(
            s,
            DelegationTokenExpiryResponse::error(ErrorCode::DELEGATION_TOKEN_OWNER_MISMATCH),
        );
    }
    let period = if req.period_ms > 0 {
        config.expiry_time_ms.min(req.period_ms)
    } else {
        config.expiry_time_ms
    };
    let expiry_timestamp_ms = token.max_timestamp_ms.min(later(now_ms, period));
    set_expiry(s, &req.token_id, token, expiry_timestamp_ms)
}

/// ExpireDelegationToken: a negative period removes the token now; otherwise its expiry
/// moves to now plus the period, never past its maximum (which may bring it forward).
pub(crate) fn expire(
    config: &DelegationTokenConfig,
    req: ChangeDelegationTokenRequest,
    image: &MetadataImage,
    now_ms: i64,
) -> ControllerResult {
    let mut s = Scratch::new(image);
    let answer = |s: Scratch<'_>, r| s.finish(ControllerResponse::ChangeDelegationToken(r));
    let token = match changeable(config, &req, image) {
        Ok(t) => t.clone(),
        Err(code) => return answer(s, DelegationTokenExpiryResponse::error(code)),
    };
    if !token.owner_or_renewer(&req.principal) {
        return answer(
            s,
            DelegationTokenExpiryResponse::error(ErrorCode::DELEGATION_TOKEN_OWNER_MISMATCH),
        );
    }
    if req.period_ms < 0 {
        tracing::info!(token = %req.token_id, "delegation token expired on request");
        s.emit(remove_record(&req.token_id));
        return answer(
            s,
            DelegationTokenExpiryResponse {
                error_code: ErrorCode::NONE,
                expiry_timestamp_ms: now_ms,
            },
        );
    }
    if token.expired(now_ms) {
        return answer(
            s,
            DelegationTokenExpiryResponse::error(ErrorCode::DELEGATION_TOKEN_EXPIRED),
        );
    }
    let expiry_timestamp_ms = token.max_timestamp_ms.min(later(now_ms, req.period_ms));
    set_expiry(s, &req.token_id, token, expiry_timestamp_ms)
}

/// The token with its new expiry, recorded, and the answer that names it.
fn set_expiry(
    mut s: Scratch<'_>,
    token_id: &str,
    token: DelegationTokenData,
    expiry_timestamp_ms: i64,
) -> ControllerResult {
    s.emit(token_record(
        token_id,
        &DelegationTokenData {
            expiry_timestamp_ms,
            ..token
        },
    ));
    s.finish(ControllerResponse::ChangeDelegationToken(
        DelegationTokenExpiryResponse {
            error_code: ErrorCode::NONE,
            expiry_timestamp_ms,
        },
    ))
}

/// The removal of every token expired at `now_ms` (the controller's periodic sweep).
pub(crate) fn sweep(s: &mut Scratch<'_>, now_ms: i64) {
    let expired: Vec<String> = s
        .image()
        .delegation_tokens
        .iter()
        .filter(|(_, t)| t.expired(now_ms))
        .map(|(id, _)| id.clone())
        .collect();
    for id in expired {
        tracing::info!(token = %id, "delegation token expired; removing it");
        s.emit(remove_record(&id));
    }
}
