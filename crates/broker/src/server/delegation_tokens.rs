//! Delegation tokens (KIP-48): CreateDelegationToken, RenewDelegationToken,
//! ExpireDelegationToken and DescribeDelegationToken, and the SCRAM credential a token
//! authenticates with.
//!
//! # Protocol
//!
//! 1. A client authenticated some other way (SASL, or TLS with a certificate; never a
//!    PLAINTEXT listener, an anonymous TLS client, or a token itself:
//!    DELEGATION_TOKEN_REQUEST_NOT_ALLOWED, as Kafka's `allowTokenRequests`) asks for a
//!    token for itself, or for another owner if it may CREATE_TOKENS on that `User`.
//! 2. The broker draws the token id from the operating system's randomness and the
//!    controller records the token (`rill_metadata::delegation_tokens`), so every broker
//!    knows it. The token's secret is `HMAC-SHA512(delegation.token.secret.key, id)`,
//!    computed by whichever node needs it and never stored or replicated.
//! 3. The client logs in over SCRAM-SHA-256/512 with the id as user name, the secret in
//!    base64 as password, and the `tokenauth=true` extension; it is then the token's
//!    owner, until the token's expiry ends the session (KIP-368's lifetime). The broker
//!    derives the token's SCRAM credential from the secret (4096 iterations, Kafka's
//!    minimum, with a salt of its own) once per token and mechanism.
//! 4. Renew and expire name the token by its secret: the broker finds the id whose
//!    secret it is and the controller decides; only the owner and the renewers may.
//! 5. Describe lists the tokens the principal owns or renews, and those it may DESCRIBE
//!    (as a `DelegationToken` resource) or whose owner it may DESCRIBE_TOKENS for, with
//!    their secrets, as Kafka answers.
//!
//! Every node must have the same secret key, as in Kafka: a node with another key derives
//! other secrets, and a token does not log in there.

use std::collections::HashMap;
use std::sync::Mutex;

use bytes::Bytes;
use hmac::{Hmac, Mac};
use rill_metadata::delegation_tokens::{
    ChangeDelegationTokenRequest, CreateDelegationTokenRequest as CtlCreate, DelegationTokenData,
};
use rill_metadata::{
    AclOperation, ControllerEvent, ControllerResponse, MetadataImage, ResourceType,
};
use rill_protocol::generated::create_delegation_token_request::CreateDelegationTokenRequest;
use rill_protocol::generated::create_delegation_token_response::CreateDelegationTokenResponse;
use rill_protocol::generated::describe_delegation_token_request::DescribeDelegationTokenRequest;
use rill_protocol::generated::describe_delegation_token_response::{
    DescribeDelegationTokenResponse, DescribedDelegationToken, DescribedDelegationTokenRenewer,
};
use rill_protocol::generated::expire_delegation_token_request::ExpireDelegationTokenRequest;
use rill_protocol::generated::expire_delegation_token_response::ExpireDelegationTokenResponse;
use rill_protocol::generated::renew_delegation_token_request::RenewDelegationTokenRequest;
use rill_protocol::generated::renew_delegation_token_response::RenewDelegationTokenResponse;
use rill_protocol::ErrorCode;
use sha2::Sha512;
use subtle::ConstantTimeEq;

use crate::config::SecurityProtocol;
use crate::network::scram::{
    random_bytes, ScramCredential, ScramIdentity, ScramMechanism, TokenOwner, MIN_ITERATIONS,
};
use crate::network::security::ANONYMOUS;
use crate::network::Session;
use crate::server::auth_helper::Authz;
use crate::server::Broker;

/// Times a broker draws a new token id when the controller finds the one it drew taken.
const TOKEN_ID_DRAWS: usize = 3;

/// A broker's delegation token secrets: the key, and the SCRAM credentials derived from
/// each token's secret.
pub(crate) struct DelegationTokenSecrets {
    /// `delegation.token.secret.key`; `None`: tokens are off on this broker.
    key: Option<Vec<u8>>,
    /// Derived credentials by (token id, mechanism). Deriving one costs 4096 PBKDF2
    /// rounds; entries of tokens no longer in the image are dropped when it grows.
    credentials: Mutex<HashMap<(String, ScramMechanism), ScramCredential>>,
}

impl DelegationTokenSecrets {
    pub(crate) fn new(key: Option<&str>) -> Self {
        Self {
            key: key.map(|k| k.as_bytes().to_vec()),
            credentials: Mutex::new(HashMap::new()),
        }
    }

    pub(crate) fn enabled(&self) -> bool {
        self.key.is_some()
    }

    /// The token's secret: HMAC-SHA512 of its id under the key (Kafka's `createHmac`).
    fn hmac(&self, token_id: &str) -> Option<Vec<u8>> {
        let key = self.key.as_ref()?;
        // HMAC takes keys of any length, so this cannot fail.
        let mut mac = Hmac::<Sha512>::new_from_slice(key).ok()?;
        mac.update(token_id.as_bytes());
        Some(mac.finalize().into_bytes().to_vec())
    }

    /// The id of the token of `image` whose secret is `hmac`, compared in constant time.
    fn token_for_hmac(&self, image: &MetadataImage, hmac: &[u8]) -> Option<String> {
        image
            .delegation_tokens
            .keys()
            .find(|id| {
                self.hmac(id)
                    .is_some_and(|h| bool::from(h.as_slice().ct_eq(hmac)))
            })
            .cloned()
    }

    /// What a SCRAM exchange with `tokenauth` authenticates against: the credential
    /// derived from the token's secret, and the token's owner and expiry.
    pub(crate) fn identity(
        &self,
        image: &MetadataImage,
        token_id: &str,
        mechanism: ScramMechanism,
    ) -> Option<ScramIdentity> {
        let token = image.delegation_tokens.get(token_id)?;
        let key = (token_id.to_string(), mechanism);
        let cached = self.lock().get(&key).cloned();
        let credential = match cached {
            Some(c) => c,
            None => {
                let password = base64_secret(&self.hmac(token_id)?);
                let salt = random_bytes(32).ok()?;
                let iterations = u32::try_from(MIN_ITERATIONS).unwrap_or(4096);
                let salted = mechanism.salted_password(password.as_bytes(), &salt, iterations);
                let c = mechanism.credential(&salt, &salted, MIN_ITERATIONS);
                let mut credentials = self.lock();
                if credentials.len() > 2 * image.delegation_tokens.len() + 16 {
                    credentials.retain(|(id, _), _| image.delegation_tokens.contains_key(id));
                }
                credentials.insert(key, c.clone());
                c
            }
        };
        Some(ScramIdentity {
            credential,
            token_owner: Some(TokenOwner {
                principal: token.owner.clone(),
                expiry_timestamp_ms: token.expiry_timestamp_ms,
            }),
        })
    }

    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<(String, ScramMechanism), ScramCredential>> {
        // A panic while holding the lock leaves a map of whole entries.
        self.credentials
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The password a client logs in with: the secret in base64 (Kafka's
/// `hmacAsBase64String`).
fn base64_secret(hmac: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(hmac)
}

/// Kafka's `allowTokenRequests`: token requests need a principal authenticated with
/// something other than a token, and never come over PLAINTEXT or anonymous TLS.
fn token_requests_allowed(session: &Session) -> bool {
    !(session.token_authenticated
        || session.security_protocol == SecurityProtocol::Plaintext
        || (session.security_protocol == SecurityProtocol::Ssl && &*session.principal == ANONYMOUS))
}

/// `Type:name` as `(type, name)`; a principal without a type is a user's.
fn split_principal(principal: &str) -> (&str, &str) {
    principal.split_once(':').unwrap_or(("User", principal))
}

/// A fresh token id, as Kafka's `Uuid.randomUuid().toString()` makes one: never the
/// zero id, nor one that starts with `-`.
fn new_token_id() -> Option<String> {
    loop {
        let bytes = random_bytes(16).ok()?;
        let mut b = [0u8; 16];
        b.copy_from_slice(&bytes);
        let id = rill_protocol::Uuid(b);
        let s = id.to_string();
        if !id.is_zero() && !s.starts_with('-') {
            return Some(s);
        }
    }
}

impl Broker {
    pub(crate) async fn handle_create_delegation_token(
        &self,
        r: CreateDelegationTokenRequest,
        session: &Session,
        authz: &Authz,
    ) -> CreateDelegationTokenResponse {
        let requester = session.principal.to_string();
        let owner = match (&r.owner_principal_type, &r.owner_principal_name) {
            (Some(t), Some(n)) if !n.is_empty() => format!("{t}:{n}"),
            _ => requester.clone(),
        };
        let (owner_type, owner_name) = split_principal(&owner);
        let (requester_type, requester_name) = split_principal(&requester);
        let mut response = CreateDelegationTokenResponse {
            principal_type: owner_type.to_string(),
            principal_name: owner_name.to_string(),
            token_requester_principal_type: requester_type.to_string(),
            token_requester_principal_name: requester_name.to_string(),
            issue_timestamp_ms: -1,
            expiry_timestamp_ms: -1,
            max_timestamp_ms: -1,
            ..Default::default()
        };
        let renewers: Vec<String> = r
            .renewers
            .iter()
            .map(|p| format!("{}:{}", p.principal_type, p.principal_name))
            .collect();
        let refused = if !token_requests_allowed(session) {
            Some(ErrorCode::DELEGATION_TOKEN_REQUEST_NOT_ALLOWED)
        } else if owner != requester
            && !authz.authorize(AclOperation::CreateTokens, ResourceType::User, &owner)
        {
            Some(ErrorCode::DELEGATION_TOKEN_AUTHORIZATION_FAILED)
        } else if r.renewers.iter().any(|p| p.principal_type != "User") {
            Some(ErrorCode::INVALID_PRINCIPAL_TYPE)
        } else if !self.delegation_tokens.enabled() {
            Some(ErrorCode::DELEGATION_TOKEN_AUTH_DISABLED)
        } else {
            None
        };
        if let Some(code) = refused {
            response.error_code = code.code();
            return response;
        }
        for _ in 0..TOKEN_ID_DRAWS {
            let Some(token_id) = new_token_id() else {
                response.error_code = ErrorCode::UNKNOWN_SERVER_ERROR.code();
                return response;
            };
            let event = ControllerEvent::CreateDelegationToken(CtlCreate {
                token_id: token_id.clone(),
                owner: owner.clone(),
                requester: requester.clone(),
                renewers: renewers.clone(),
                max_lifetime_ms: r.max_lifetime_ms,
            });
            let created = match self.controller_call(event).await {
                Ok(ControllerResponse::CreateDelegationToken(c)) => c,
                Ok(_) => {
                    response.error_code = ErrorCode::UNKNOWN_SERVER_ERROR.code();
                    return response;
                }
                Err(code) => {
                    response.error_code = code.code();
                    return response;
                }
            };
            if created.error_code == ErrorCode::DUPLICATE_RESOURCE {
                continue;
            }
            response.error_code = created.error_code.code();
            if created.error_code == ErrorCode::NONE {
                response.issue_timestamp_ms = created.issue_timestamp_ms;
                response.expiry_timestamp_ms = created.expiry_timestamp_ms;
                response.max_timestamp_ms = created.max_timestamp_ms;
                response.hmac =
                    Bytes::from(self.delegation_tokens.hmac(&token_id).unwrap_or_default());
                response.token_id = token_id;
            }
            return response;
        }
        response.error_code = ErrorCode::UNKNOWN_SERVER_ERROR.code();
        response
    }

    /// Renew (`renew`) or expire a token: `(error, new expiry)`.
    async fn change_delegation_token(
        &self,
        hmac: &[u8],
        period_ms: i64,
        renew: bool,
        session: &Session,
    ) -> (ErrorCode, i64) {
        if !token_requests_allowed(session) {
            return (ErrorCode::DELEGATION_TOKEN_REQUEST_NOT_ALLOWED, -1);
        }
        if !self.delegation_tokens.enabled() {
            return (ErrorCode::DELEGATION_TOKEN_AUTH_DISABLED, -1);
        }
        let Some(token_id) = self.delegation_tokens.token_for_hmac(&self.image(), hmac) else {
            return (ErrorCode::DELEGATION_TOKEN_NOT_FOUND, -1);
        };
        let req = ChangeDelegationTokenRequest {
            token_id,
            principal: session.principal.to_string(),
            period_ms,
        };
        let event = if renew {
            ControllerEvent::RenewDelegationToken(req)
        } else {
            ControllerEvent::ExpireDelegationToken(req)
        };
        match self.controller_call(event).await {
            Ok(ControllerResponse::ChangeDelegationToken(r)) => {
                (r.error_code, r.expiry_timestamp_ms)
            }
            Ok(_) => (ErrorCode::UNKNOWN_SERVER_ERROR, -1),
            Err(code) => (code, -1),
        }
    }

    pub(crate) async fn handle_renew_delegation_token(
        &self,
        r: RenewDelegationTokenRequest,
        session: &Session,
    ) -> RenewDelegationTokenResponse {
        let (code, expiry) = self
            .change_delegation_token(&r.hmac, r.renew_period_ms, true, session)
            .await;
        RenewDelegationTokenResponse {
            error_code: code.code(),
            expiry_timestamp_ms: expiry,
            ..Default::default()
        }
    }

    pub(crate) async fn handle_expire_delegation_token(
        &self,
        r: ExpireDelegationTokenRequest,
        session: &Session,
    ) -> ExpireDelegationTokenResponse {
        let (code, expiry) = self
            .change_delegation_token(&r.hmac, r.expiry_time_period_ms, false, session)
            .await;
        ExpireDelegationTokenResponse {
            error_code: code.code(),
            expiry_timestamp_ms: expiry,
            ..Default::default()
        }
    }

    pub(crate) fn handle_describe_delegation_token(
        &self,
        r: DescribeDelegationTokenRequest,
        session: &Session,
        authz: &Authz,
    ) -> DescribeDelegationTokenResponse {
        let refused = if !token_requests_allowed(session) {
            Some(ErrorCode::DELEGATION_TOKEN_REQUEST_NOT_ALLOWED)
        } else if !self.delegation_tokens.enabled() {
            Some(ErrorCode::DELEGATION_TOKEN_AUTH_DISABLED)
        } else {
            None
        };
        if let Some(code) = refused {
            return DescribeDelegationTokenResponse {
                error_code: code.code(),
                ..Default::default()
            };
        }
        let owners: Option<Vec<String>> = r.owners.map(|owners| {
            owners
                .iter()
                .map(|o| format!("{}:{}", o.principal_type, o.principal_name))
                .collect()
        });
        let requester = &*session.principal;
        // Kafka's `DelegationTokenManager.filterToken`.
        let eligible = |id: &str, t: &DelegationTokenData| {
            if let Some(owners) = &owners {
                if !owners.iter().any(|o| t.owner_or_renewer(o)) {
                    return false;
                }
            }
            t.owner_or_renewer(requester)
                || authz.authorize(AclOperation::Describe, ResourceType::DelegationToken, id)
                || authz.authorize(AclOperation::DescribeTokens, ResourceType::User, &t.owner)
        };
        let image = self.image();
        let tokens = if owners.as_ref().is_some_and(Vec::is_empty) {
            Vec::new()
        } else {
            image
                .delegation_tokens
                .iter()
                .filter(|(id, t)| eligible(id, t))
                .map(|(id, t)| {
                    let (principal_type, principal_name) = split_principal(&t.owner);
                    let (rt, rn) = split_principal(&t.requester);
                    DescribedDelegationToken {
                        principal_type: principal_type.to_string(),
                        principal_name: principal_name.to_string(),
                        token_requester_principal_type: rt.to_string(),
                        token_requester_principal_name: rn.to_string(),
                        issue_timestamp: t.issue_timestamp_ms,
                        expiry_timestamp: t.expiry_timestamp_ms,
                        max_timestamp: t.max_timestamp_ms,
                        token_id: id.clone(),
                        hmac: Bytes::from(self.delegation_tokens.hmac(id).unwrap_or_default()),
                        renewers: t
                            .renewers
                            .iter()
                            .map(|p| {
                                let (pt, pn) = split_principal(p);
                                DescribedDelegationTokenRenewer {
                                    principal_type: pt.to_string(),
                                    principal_name: pn.to_string(),
                                    ..Default::default()
                                }
                            })
                            .collect(),
                        ..Default::default()
                    }
                })
                .collect()
        };
        DescribeDelegationTokenResponse {
            tokens,
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_secret_is_hmac_sha512_of_the_id_under_the_key() {
        let s = DelegationTokenSecrets::new(Some("secret"));
        let h = s.hmac("token").unwrap();
        assert_eq!(h.len(), 64);
        // Python's `hmac.new(b'secret', b'token', hashlib.sha512)`.
        assert_eq!(
            h.iter().map(|b| format!("{b:02x}")).collect::<String>()[..16],
            *"a4866aa82ef1dbfa"
        );
        assert!(DelegationTokenSecrets::new(None).hmac("token").is_none());
    }

    #[test]
    fn token_ids_are_kafka_uuids() {
        for _ in 0..100 {
            let id = new_token_id().unwrap();
            assert_eq!(id.len(), 22);
            assert!(!id.starts_with('-'));
            assert!(id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
        }
    }
}
