//! Delegation tokens on the admin client (KIP-48): CreateDelegationToken,
//! RenewDelegationToken, ExpireDelegationToken and DescribeDelegationToken, sent to any
//! broker (which takes them to the controller), as Kafka's admin client sends them.
//!
//! A token logs in over SCRAM with its id as the user name and its HMAC in base64 as the
//! password, with `tokenauth="true"` in `sasl.jaas.config` ([`DelegationToken::jaas_config`]).
//! Brokers answer these requests only on a connection authenticated with something other
//! than a token (SASL, or TLS with a client certificate).

use base64::Engine;
use rill_protocol::generated::create_delegation_token_request::CreatableRenewers;
use rill_protocol::generated::describe_delegation_token_request::DescribeDelegationTokenOwner;
use rill_protocol::generated::{
    CreateDelegationTokenRequest, DescribeDelegationTokenRequest, ExpireDelegationTokenRequest,
    RenewDelegationTokenRequest,
};

use super::Admin;
use crate::error::{check, Error, Result};

/// Kafka 4.1 offers CreateDelegationToken and DescribeDelegationToken 1-3 (3 names the
/// owner), RenewDelegationToken and ExpireDelegationToken 1-2.
const CREATE_VERSION: i16 = 3;
const DESCRIBE_VERSION: i16 = 3;
const RENEW_EXPIRE_VERSION: i16 = 2;

/// A delegation token as the broker describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DelegationToken {
    pub token_id: String,
    /// Its secret: what a client logs in with, in base64 ([`DelegationToken::hmac_base64`]).
    pub hmac: Vec<u8>,
    /// `Type:name` principals.
    pub owner: String,
    pub requester: String,
    pub renewers: Vec<String>,
    pub issue_timestamp_ms: i64,
    pub expiry_timestamp_ms: i64,
    pub max_timestamp_ms: i64,
}

impl DelegationToken {
    /// The password of a login with this token.
    pub fn hmac_base64(&self) -> String {
        base64::engine::general_purpose::STANDARD.encode(&self.hmac)
    }

    /// The `sasl.jaas.config` of a SCRAM login with this token, as Kafka's clients take it.
    pub fn jaas_config(&self) -> String {
        format!(
            "org.apache.kafka.common.security.scram.ScramLoginModule required \
             username=\"{}\" password=\"{}\" tokenauth=\"true\";",
            self.token_id,
            self.hmac_base64()
        )
    }
}

/// `Type:name` as `(type, name)`.
fn principal(p: &str) -> Result<(String, String)> {
    p.split_once(':')
        .filter(|(t, n)| !t.is_empty() && !n.is_empty())
        .map(|(t, n)| (t.to_string(), n.to_string()))
        .ok_or_else(|| Error::InvalidConfig(format!("{p:?} is not a principal (Type:name)")))
}

/// A token's secret, from its base64 form (what `--hmac` takes in Kafka's tool).
pub fn hmac_from_base64(hmac: &str) -> Result<Vec<u8>> {
    base64::engine::general_purpose::STANDARD
        .decode(hmac.trim())
        .map_err(|e| Error::InvalidConfig(format!("the HMAC is not base64: {e}")))
}

impl Admin {
    /// Creates a token for the connection's principal, or for `owner` (which needs
    /// CREATE_TOKENS on that user), renewable by `renewers`; `max_lifetime_ms` of -1 takes
    /// the broker's `delegation.token.max.lifetime.ms`.
    pub async fn create_delegation_token(
        &self,
        owner: Option<&str>,
        renewers: &[String],
        max_lifetime_ms: i64,
    ) -> Result<DelegationToken> {
        let owner = owner.map(principal).transpose()?;
        let request = CreateDelegationTokenRequest {
            owner_principal_type: owner.as_ref().map(|(t, _)| t.clone()),
            owner_principal_name: owner.as_ref().map(|(_, n)| n.clone()),
            renewers: renewers
                .iter()
                .map(|r| {
                    principal(r).map(|(t, n)| CreatableRenewers {
                        principal_type: t,
                        principal_name: n,
                        ..Default::default()
                    })
                })
                .collect::<Result<_>>()?,
            max_lifetime_ms,
            ..Default::default()
        };
        let r = self.net().send_any(&request, CREATE_VERSION).await?;
        check(r.error_code, || "creating a delegation token".to_string())?;
        Ok(DelegationToken {
            token_id: r.token_id,
            hmac: r.hmac.to_vec(),
            owner: format!("{}:{}", r.principal_type, r.principal_name),
            requester: format!(
                "{}:{}",
                r.token_requester_principal_type, r.token_requester_principal_name
            ),
            renewers: renewers.to_vec(),
            issue_timestamp_ms: r.issue_timestamp_ms,
            expiry_timestamp_ms: r.expiry_timestamp_ms,
            max_timestamp_ms: r.max_timestamp_ms,
        })
    }

    /// Renews the token whose secret is `hmac` for `renew_period_ms` (-1: the broker's
    /// `delegation.token.expiry.time.ms`): its new expiry.
    pub async fn renew_delegation_token(&self, hmac: &[u8], renew_period_ms: i64) -> Result<i64> {
        let request = RenewDelegationTokenRequest {
            hmac: hmac.to_vec().into(),
            renew_period_ms,
            ..Default::default()
        };
        let r = self.net().send_any(&request, RENEW_EXPIRE_VERSION).await?;
        check(r.error_code, || "renewing a delegation token".to_string())?;
        Ok(r.expiry_timestamp_ms)
    }

    /// Sets the expiry of the token whose secret is `hmac` to `expiry_time_period_ms`
    /// from now (never past its maximum); a negative period expires it at once. Its new
    /// expiry.
    pub async fn expire_delegation_token(
        &self,
        hmac: &[u8],
        expiry_time_period_ms: i64,
    ) -> Result<i64> {
        let request = ExpireDelegationTokenRequest {
            hmac: hmac.to_vec().into(),
            expiry_time_period_ms,
            ..Default::default()
        };
        let r = self.net().send_any(&request, RENEW_EXPIRE_VERSION).await?;
        check(r.error_code, || "expiring a delegation token".to_string())?;
        Ok(r.expiry_timestamp_ms)
    }

    /// The tokens the principal may see, of every owner (`None`) or of those `owners`
    /// (owned or renewable by them).
    pub async fn describe_delegation_tokens(
        &self,
        owners: Option<&[String]>,
    ) -> Result<Vec<DelegationToken>> {
        let request = DescribeDelegationTokenRequest {
            owners: owners
                .map(|o| {
                    o.iter()
                        .map(|p| {
                            principal(p).map(|(t, n)| DescribeDelegationTokenOwner {
                                principal_type: t,
                                principal_name: n,
                                ..Default::default()
                            })
                        })
                        .collect::<Result<_>>()
                })
                .transpose()?,
            ..Default::default()
        };
        let r = self.net().send_any(&request, DESCRIBE_VERSION).await?;
        check(r.error_code, || "describing delegation tokens".to_string())?;
        Ok(r.tokens
            .into_iter()
            .map(|t| DelegationToken {
                token_id: t.token_id,
                hmac: t.hmac.to_vec(),
                owner: format!("{}:{}", t.principal_type, t.principal_name),
                requester: format!(
                    "{}:{}",
                    t.token_requester_principal_type, t.token_requester_principal_name
                ),
                renewers: t
                    .renewers
                    .iter()
                    .map(|r| format!("{}:{}", r.principal_type, r.principal_name))
                    .collect(),
                issue_timestamp_ms: t.issue_timestamp,
                expiry_timestamp_ms: t.expiry_timestamp,
                max_timestamp_ms: t.max_timestamp,
            })
            .collect())
    }
}
