//! SASL/OAUTHBEARER on the server (KIP-255, KIP-768): the client's initial response in
//! RFC 7628's framing, as Kafka's `OAuthBearerClientInitialResponse` reads it, and the two
//! validators Kafka's broker offers for the bearer token.
//!
//! - **JWKS** (Kafka's `OAuthBearerValidatorCallbackHandler`): a signed JWT whose key is
//!   found by `kid` in the JSON Web Key Set of `sasl.oauthbearer.jwks.endpoint.url` (a
//!   `file:` URL; the server fetches nothing over the network). The signature is checked by
//!   `jsonwebtoken` with the asymmetric algorithm the header names, which must fit the key
//!   (RSA: RS*/PS*; EC: ES256 on P-256, ES384 on P-384; OKP: EdDSA) and its `alg` when the
//!   key has one; symmetric (`oct`) keys and `alg: none` are refused, and a key named
//!   in the token's own header (`jwk`, `jku`, `x5u`) is never used. The claims are then
//!   checked here, against the clock the caller passes, as jose4j does for Kafka: `exp`
//!   and `iat` required and numeric, `exp` and `nbf` within
//!   `sasl.oauthbearer.clock.skew.seconds` (30), `iss` equal to
//!   `sasl.oauthbearer.expected.issuer` and `aud` one of
//!   `sasl.oauthbearer.expected.audience` when those are set, the principal claim
//!   (`sasl.oauthbearer.sub.claim.name`, `sub`) a non-empty string, and the scope claim
//!   (`sasl.oauthbearer.scope.claim.name`, `scope`) a string or a list of strings.
//! - **Unsecured** (Kafka's `OAuthBearerUnsecuredValidatorCallbackHandler`, which Kafka's
//!   broker uses for OAUTHBEARER unless told otherwise): an unsigned JWS (`alg: none`, empty
//!   signature) whose claims are checked as that handler does, with the options of the
//!   listener's `oauthbearer.sasl.jaas.config` (`unsecuredValidatorPrincipalClaimName`,
//!   `unsecuredValidatorScopeClaimName`, `unsecuredValidatorRequiredScope`,
//!   `unsecuredValidatorAllowableClockSkewMs`). It proves nothing about who the client is,
//!   which is why Rill enables OAUTHBEARER only when `sasl.enabled.mechanisms` names it.
//!
//! Which one a listener uses: `listener.name.<l>.oauthbearer.sasl.server.callback.handler.class`
//! naming either Kafka class picks it; unset, a listener with a JWKS URL validates against
//! it (where Kafka would still use the unsecured validator and ignore the URL: the safer
//! reading of the same configuration) and one without uses the unsecured validator, as
//! Kafka does.

use std::collections::HashSet;

use jsonwebtoken::jwk::{
    AlgorithmParameters, EllipticCurve, Jwk, JwkSet, KeyAlgorithm, PublicKeyUse,
};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::Value;

use crate::config::BrokerConfig;
use crate::error::BrokerError;

/// The control byte that separates the parts of the client's message (RFC 7628 §3.1).
const SEPARATOR: char = '\u{1}';

/// Kafka's server callback handler class names, old and new packages.
const VALIDATOR_CLASSES: [&str; 2] = [
    "org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler",
    "org.apache.kafka.common.security.oauthbearer.secured.OAuthBearerValidatorCallbackHandler",
];
const UNSECURED_CLASS: &str =
    "org.apache.kafka.common.security.oauthbearer.internals.unsecured.OAuthBearerUnsecuredValidatorCallbackHandler";

/// The client's initial response: `n,[a=<authzid>],^Aauth=Bearer <token>^A[k=v^A]...^A`.
#[derive(Debug, PartialEq, Eq)]
pub struct ClientInitialResponse {
    /// Empty when the client named none; else it must be the token's principal.
    pub authorization_id: String,
    pub token: String,
    /// SASL extensions (KIP-342), accepted and otherwise unused, as Kafka's validators do.
    pub extensions: Vec<(String, String)>,
}

impl ClientInitialResponse {
    /// Parses the message as Kafka's `OAuthBearerClientInitialResponse` pattern does:
    /// GS2 header `n,` with an optional `a=` SASL name, then `key=value` pairs each ended
    /// by ^A, then a final ^A; `auth` is required and is `Bearer <b64token>`.
    pub fn parse(message: &[u8]) -> Result<Self, String> {
        let text = std::str::from_utf8(message)
            .map_err(|_| "Invalid OAUTHBEARER client first message: not UTF-8".to_string())?;
        let invalid = || "Invalid OAUTHBEARER client first message".to_string();
        let rest = text.strip_prefix("n,").ok_or_else(invalid)?;
        let (authzid, rest) = rest.split_once(',').ok_or_else(invalid)?;
        let authorization_id = match authzid {
            "" => String::new(),
            a => {
                let name = a.strip_prefix("a=").ok_or_else(invalid)?;
                if !is_sasl_name(name) {
                    return Err(invalid());
                }
                name.to_string()
            }
        };
        // ^A, then pairs each ended by ^A, then ^A: "\x01k=v\x01k=v\x01\x01".
        let pairs = rest
            .strip_prefix(SEPARATOR)
            .and_then(|r| r.strip_suffix(SEPARATOR))
            .ok_or_else(invalid)?;
        let mut auth = None;
        let mut extensions = Vec::new();
        if !pairs.is_empty() {
            let pairs = pairs.strip_suffix(SEPARATOR).ok_or_else(invalid)?;
            for pair in pairs.split(SEPARATOR) {
                let (key, value) = pair.split_once('=').ok_or_else(invalid)?;
                if key.is_empty()
                    || !key.bytes().all(|b| b.is_ascii_alphabetic())
                    || value.is_empty()
                    || !value
                        .bytes()
                        .all(|b| (0x21..=0x7e).contains(&b) || b" \t\r\n".contains(&b))
                {
                    return Err(invalid());
                }
                if key == "auth" {
                    auth = Some(value);
                } else {
                    extensions.push((key.to_string(), value.to_string()));
                }
            }
        }
        let auth = auth.ok_or_else(|| {
            "Invalid OAUTHBEARER client first message: 'auth' not specified".to_string()
        })?;
        let invalid_auth =
            || "Invalid OAUTHBEARER client first message: invalid 'auth' format".to_string();
        let (scheme, token) = auth.split_once(' ').ok_or_else(invalid_auth)?;
        let token = token.trim_start_matches(' ');
        let body = token.trim_end_matches('=');
        if scheme.is_empty()
            || !scheme
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_')
            || body.is_empty()
            || !body
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_~+/.".contains(&b))
        {
            return Err(invalid_auth());
        }
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Err(format!(
                "Invalid scheme in OAUTHBEARER client first message: {scheme}"
            ));
        }
        Ok(Self {
            authorization_id,
            token: token.to_string(),
            extensions,
        })
    }
}

/// RFC 7628's saslname: ASCII 0x01-0x7F but `=` and `,`, which come as `=3D` and `=2C`.
fn is_sasl_name(name: &str) -> bool {
    if name.is_empty() {
        return false;
    }
    let bytes = name.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'=' => {
                if !matches!(bytes.get(i + 1..i + 3), Some(b"2C") | Some(b"3D")) {
                    return false;
                }
                i += 3;
            }
            b',' | 0 | 0x80.. => return false,
            _ => i += 1,
        }
    }
    true
}

/// A token that validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OAuthBearerToken {
    /// The principal claim's value: the session's principal is `User:<this>`.
    pub principal_name: String,
    /// `exp`, in milliseconds since the epoch: the session may not outlive it (KIP-368).
    pub lifetime_ms: i64,
    pub scopes: Vec<String>,
}

/// Why a token was refused: the RFC 6750 status sent to the client, and the detail for
/// the server's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRejected {
    /// `invalid_token`, or `insufficient_scope` with the scope that was missing.
    pub status: &'static str,
    pub scope: Option<String>,
    pub reason: String,
}

impl TokenRejected {
    fn invalid(reason: impl Into<String>) -> Self {
        Self {
            status: "invalid_token",
            scope: None,
            reason: reason.into(),
        }
    }

    /// The JSON error the server answers with before failing the exchange (RFC 7628
    /// §3.2.2, Kafka's `jsonErrorResponse`).
    pub fn json(&self) -> String {
        let mut out = serde_json::Map::new();
        out.insert("status".into(), Value::String(self.status.into()));
        if let Some(scope) = &self.scope {
            out.insert("scope".into(), Value::String(scope.clone()));
        }
        Value::Object(out).to_string()
    }
}

/// The validator of one SASL listener's OAUTHBEARER tokens.
pub enum OAuthBearerValidator {
    Jwks(JwksValidator),
    Unsecured(UnsecuredValidator),
}

impl std::fmt::Debug for OAuthBearerValidator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Jwks(v) => write!(f, "Jwks({} keys)", v.keys.len()),
            Self::Unsecured(_) => f.write_str("Unsecured"),
        }
    }
}

impl OAuthBearerValidator {
    /// The validator `listener` is configured with (see the module docs).
    pub fn from_config(config: &BrokerConfig, listener: &str) -> Result<Self, BrokerError> {
        let err =
            |m: String| BrokerError::Config(format!("OAUTHBEARER (listener {listener}): {m}"));
        let scoped = |key: &str| {
            config
                .get(&format!(
                    "listener.name.{}.oauthbearer.{key}",
                    listener.to_ascii_lowercase()
                ))
                .map(str::trim)
                .filter(|v| !v.is_empty())
        };
        let value = |key: &str| {
            config
                .listener_value(listener, key)
                .map(str::trim)
                .filter(|v| !v.is_empty())
        };
        let jwks_url = value("sasl.oauthbearer.jwks.endpoint.url");
        let secured = match scoped("sasl.server.callback.handler.class") {
            Some(c) if VALIDATOR_CLASSES.contains(&c) => true,
            Some(UNSECURED_CLASS) => false,
            Some(other) => {
                return Err(err(format!(
                    "sasl.server.callback.handler.class {other} is not supported (use {} or {UNSECURED_CLASS})",
                    VALIDATOR_CLASSES[0]
                )))
            }
            None => jwks_url.is_some(),
        };
        if !secured {
            let jaas = scoped("sasl.jaas.config").unwrap_or_default();
            return UnsecuredValidator::from_jaas(jaas)
                .map(Self::Unsecured)
                .map_err(err);
        }
        let url = jwks_url.ok_or_else(|| {
            err("the JWT validator needs sasl.oauthbearer.jwks.endpoint.url".into())
        })?;
        let path = url.strip_prefix("file://").ok_or_else(|| {
            err(format!(
                "sasl.oauthbearer.jwks.endpoint.url {url}: only file: URLs are supported"
            ))
        })?;
        let text = std::fs::read_to_string(path).map_err(|e| err(format!("{path}: {e}")))?;
        let keys: JwkSet =
            serde_json::from_str(&text).map_err(|e| err(format!("{path}: not a JWKS: {e}")))?;
        let int = |key: &str, default: i64| -> Result<i64, BrokerError> {
            match value(key) {
                None => Ok(default),
                Some(v) => v
                    .parse::<i64>()
                    .ok()
                    .filter(|n| *n >= 0)
                    .ok_or_else(|| err(format!("{key} must be a non-negative integer: {v}"))),
            }
        };
        let audiences = value("sasl.oauthbearer.expected.audience")
            .map(|a| {
                a.split(',')
                    .map(|s| s.trim().to_string())
                    .filter(|s| !s.is_empty())
                    .collect()
            })
            .unwrap_or_default();
        JwksValidator::new(
            keys,
            audiences,
            value("sasl.oauthbearer.expected.issuer").map(str::to_string),
            int("sasl.oauthbearer.clock.skew.seconds", 30)?,
            value("sasl.oauthbearer.sub.claim.name")
                .unwrap_or("sub")
                .to_string(),
            value("sasl.oauthbearer.scope.claim.name")
                .unwrap_or("scope")
                .to_string(),
        )
        .map(Self::Jwks)
        .map_err(err)
    }

    /// Validates `token` at `now_ms` (milliseconds since the epoch).
    pub fn validate(&self, token: &str, now_ms: i64) -> Result<OAuthBearerToken, TokenRejected> {
        match self {
            Self::Jwks(v) => v.validate(token, now_ms),
            Self::Unsecured(v) => v.validate(token, now_ms),
        }
    }
}

/// Kafka's secured validator over the keys of a JWKS file.
pub struct JwksValidator {
    keys: Vec<Jwk>,
    audiences: HashSet<String>,
    issuer: Option<String>,
    clock_skew_ms: i64,
    sub_claim: String,
    scope_claim: String,
}

impl JwksValidator {
    pub fn new(
        set: JwkSet,
        audiences: HashSet<String>,
        issuer: Option<String>,
        clock_skew_seconds: i64,
        sub_claim: String,
        scope_claim: String,
    ) -> Result<Self, String> {
        // Only signature keys of an asymmetric type: a JWKS publishes public keys, and an
        // `oct` key would let the HMAC algorithms in.
        let keys: Vec<Jwk> = set
            .keys
            .into_iter()
            .filter(|k| {
                !matches!(k.algorithm, AlgorithmParameters::OctetKey(_))
                    && matches!(
                        k.common.public_key_use,
                        None | Some(PublicKeyUse::Signature)
                    )
            })
            .collect();
        if keys.is_empty() {
            return Err("the JWKS holds no public signature key".into());
        }
        Ok(Self {
            keys,
            audiences,
            issuer,
            clock_skew_ms: clock_skew_seconds.saturating_mul(1000),
            sub_claim,
            scope_claim,
        })
    }

    /// The key for a token: by `kid`, or the only key when the token names none.
    fn key(&self, kid: Option<&str>) -> Result<&Jwk, TokenRejected> {
        match kid {
            Some(kid) => self
                .keys
                .iter()
                .find(|k| k.common.key_id.as_deref() == Some(kid))
                .ok_or_else(|| {
                    TokenRejected::invalid(format!("no key with kid {kid:?} in the JWKS"))
                }),
            None if self.keys.len() == 1 => Ok(&self.keys[0]),
            None => Err(TokenRejected::invalid(
                "the token names no kid and the JWKS holds more than one key",
            )),
        }
    }

    pub fn validate(&self, token: &str, now_ms: i64) -> Result<OAuthBearerToken, TokenRejected> {
        // The header is read before anything is trusted, only to choose the key.
        let header = jsonwebtoken::decode_header(token)
            .map_err(|e| TokenRejected::invalid(format!("malformed JWT header: {e}")))?;
        let jwk = self.key(header.kid.as_deref())?;
        if !algorithm_fits(header.alg, jwk) {
            return Err(TokenRejected::invalid(format!(
                "algorithm {:?} does not fit the key {:?}",
                header.alg, jwk.common.key_id
            )));
        }
        let key = DecodingKey::from_jwk(jwk)
            .map_err(|e| TokenRejected::invalid(format!("unusable JWKS key: {e}")))?;
        // The signature only: every claim is checked below, against the caller's clock.
        let mut validation = Validation::new(header.alg);
        validation.validate_exp = false;
        validation.validate_nbf = false;
        validation.validate_aud = false;
        validation.required_spec_claims.clear();
        let data = jsonwebtoken::decode::<serde_json::Map<String, Value>>(token, &key, &validation)
            .map_err(|e| TokenRejected::invalid(format!("JWT refused: {e}")))?;
        let claims = data.claims;
        let exp = numeric_date(&claims, "exp")?
            .ok_or_else(|| TokenRejected::invalid("the token has no exp claim"))?;
        numeric_date(&claims, "iat")?
            .ok_or_else(|| TokenRejected::invalid("the token has no iat claim"))?;
        if now_ms >= exp.saturating_add(self.clock_skew_ms) {
            return Err(TokenRejected::invalid(format!(
                "the token expired at {exp} ms (now {now_ms} ms)"
            )));
        }
        if let Some(nbf) = numeric_date(&claims, "nbf")? {
            if now_ms.saturating_add(self.clock_skew_ms) < nbf {
                return Err(TokenRejected::invalid(format!(
                    "the token is not valid before {nbf} ms (now {now_ms} ms)"
                )));
            }
        }
        if let Some(issuer) = &self.issuer {
            match claims.get("iss") {
                Some(Value::String(iss)) if iss == issuer => {}
                other => {
                    return Err(TokenRejected::invalid(format!(
                        "issuer {other:?} is not the expected {issuer:?}"
                    )))
                }
            }
        }
        if !self.audiences.is_empty() {
            let audiences: Vec<&str> = match claims.get("aud") {
                Some(Value::String(a)) => vec![a.as_str()],
                Some(Value::Array(list)) => list.iter().filter_map(Value::as_str).collect(),
                _ => Vec::new(),
            };
            if !audiences.iter().any(|a| self.audiences.contains(*a)) {
                return Err(TokenRejected::invalid(format!(
                    "audience {audiences:?} holds none of the expected audiences"
                )));
            }
        }
        let principal_name = match claims.get(&self.sub_claim) {
            Some(Value::String(s)) if !s.trim().is_empty() => s.trim().to_string(),
            _ => {
                return Err(TokenRejected::invalid(format!(
                    "the {} claim is missing or not a non-empty string",
                    self.sub_claim
                )))
            }
        };
        let scopes = scopes(claims.get(&self.scope_claim), &self.scope_claim)?;
        Ok(OAuthBearerToken {
            principal_name,
            lifetime_ms: exp,
            scopes,
        })
    }
}

/// Whether the header's algorithm is one the key may verify (its type, its curve, and
/// its own `alg` when it names one); HMAC never is.
fn algorithm_fits(alg: Algorithm, jwk: &Jwk) -> bool {
    let fits_type = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => matches!(
            alg,
            Algorithm::RS256
                | Algorithm::RS384
                | Algorithm::RS512
                | Algorithm::PS256
                | Algorithm::PS384
                | Algorithm::PS512
        ),
        AlgorithmParameters::EllipticCurve(ec) => matches!(
            (alg, &ec.curve),
            (Algorithm::ES256, EllipticCurve::P256) | (Algorithm::ES384, EllipticCurve::P384)
        ),
        AlgorithmParameters::OctetKeyPair(_) => alg == Algorithm::EdDSA,
        AlgorithmParameters::OctetKey(_) => false,
    };
    let fits_alg = match jwk.common.key_algorithm {
        None => true,
        Some(named) => key_algorithm(alg) == Some(named),
    };
    fits_type && fits_alg
}

fn key_algorithm(alg: Algorithm) -> Option<KeyAlgorithm> {
    Some(match alg {
        Algorithm::RS256 => KeyAlgorithm::RS256,
        Algorithm::RS384 => KeyAlgorithm::RS384,
        Algorithm::RS512 => KeyAlgorithm::RS512,
        Algorithm::PS256 => KeyAlgorithm::PS256,
        Algorithm::PS384 => KeyAlgorithm::PS384,
        Algorithm::PS512 => KeyAlgorithm::PS512,
        Algorithm::ES256 => KeyAlgorithm::ES256,
        Algorithm::ES384 => KeyAlgorithm::ES384,
        Algorithm::EdDSA => KeyAlgorithm::EdDSA,
        _ => return None,
    })
}

/// A NumericDate claim (seconds since the epoch, RFC 7519 §2) in milliseconds; a claim of
/// another JSON type is an error, never taken as absent.
fn numeric_date(
    claims: &serde_json::Map<String, Value>,
    name: &str,
) -> Result<Option<i64>, TokenRejected> {
    match claims.get(name) {
        None => Ok(None),
        Some(Value::Number(n)) => n
            .as_f64()
            .filter(|s| s.is_finite() && *s >= 0.0 && *s < 1e13)
            .map(|s| Some((s * 1000.0) as i64))
            .ok_or_else(|| TokenRejected::invalid(format!("the {name} claim is out of range"))),
        Some(_) => Err(TokenRejected::invalid(format!(
            "the {name} claim is not a number"
        ))),
    }
}

/// A scope claim: a space-separated string or a list of strings, each non-empty (Kafka's
/// `ClaimValidationUtils.validateScopes`); absent is no scope.
fn scopes(claim: Option<&Value>, name: &str) -> Result<Vec<String>, TokenRejected> {
    let bad = || TokenRejected::invalid(format!("the {name} claim is malformed"));
    let raw: Vec<&str> = match claim {
        None => return Ok(Vec::new()),
        Some(Value::String(s)) => s.split(' ').filter(|s| !s.is_empty()).collect(),
        Some(Value::Array(list)) => list
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .ok_or_else(bad)
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(bad()),
    };
    Ok(raw.into_iter().map(str::to_string).collect())
}

/// Kafka's unsecured validator: an unsigned JWS, claims checked with the JAAS options.
pub struct UnsecuredValidator {
    principal_claim: String,
    scope_claim: String,
    required_scope: Vec<String>,
    clock_skew_ms: i64,
}

impl UnsecuredValidator {
    /// The options of an `OAuthBearerLoginModule` JAAS line (all optional).
    pub fn from_jaas(jaas: &str) -> Result<Self, String> {
        let option = |name: &str| jaas_option(jaas, name);
        let clock_skew_ms = match option("unsecuredValidatorAllowableClockSkewMs") {
            None => 0,
            Some(v) => v
                .trim()
                .parse::<i64>()
                .ok()
                .filter(|n| *n >= 0)
                .ok_or_else(|| {
                    format!("unsecuredValidatorAllowableClockSkewMs must not be negative: {v}")
                })?,
        };
        Ok(Self {
            principal_claim: option("unsecuredValidatorPrincipalClaimName")
                .filter(|v| !v.trim().is_empty())
                .map_or_else(|| "sub".to_string(), |v| v.trim().to_string()),
            scope_claim: option("unsecuredValidatorScopeClaimName")
                .filter(|v| !v.trim().is_empty())
                .map_or_else(|| "scope".to_string(), |v| v.trim().to_string()),
            required_scope: option("unsecuredValidatorRequiredScope")
                .map(|v| {
                    v.split(' ')
                        .filter(|s| !s.is_empty())
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default(),
            clock_skew_ms,
        })
    }

    pub fn validate(&self, token: &str, now_ms: i64) -> Result<OAuthBearerToken, TokenRejected> {
        use base64::Engine;
        let parts: Vec<&str> = token.split('.').collect();
        let [header, claims, signature] = parts[..] else {
            return Err(TokenRejected::invalid("an unsecured JWS has three parts"));
        };
        if !signature.is_empty() {
            return Err(TokenRejected::invalid(
                "a signed JWS is not an unsecured token",
            ));
        }
        let decode = |part: &str| -> Result<serde_json::Map<String, Value>, TokenRejected> {
            let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(part.trim_end_matches('='))
                .map_err(|_| TokenRejected::invalid("a JWS part is not base64url"))?;
            match serde_json::from_slice(&bytes) {
                Ok(Value::Object(map)) => Ok(map),
                _ => Err(TokenRejected::invalid("a JWS part is not a JSON object")),
            }
        };
        let header = decode(header)?;
        if header.get("alg").and_then(Value::as_str) != Some("none") {
            return Err(TokenRejected::invalid(
                "an unsecured JWS must have 'none' for an algorithm",
            ));
        }
        let claims = decode(claims)?;
        let principal_name = match claims.get(&self.principal_claim) {
            Some(Value::String(s)) if !s.is_empty() => s.clone(),
            _ => {
                return Err(TokenRejected::invalid(format!(
                    "the {} claim is missing or not a string",
                    self.principal_claim
                )))
            }
        };
        let iat = numeric_date(&claims, "iat")?;
        if let Some(iat) = iat {
            if iat > now_ms.saturating_add(self.clock_skew_ms) {
                return Err(TokenRejected::invalid("the token was issued in the future"));
            }
        }
        let exp = numeric_date(&claims, "exp")?
            .ok_or_else(|| TokenRejected::invalid("the token has no exp claim"))?;
        if now_ms >= exp.saturating_add(self.clock_skew_ms) {
            return Err(TokenRejected::invalid(format!(
                "the token expired at {exp} ms (now {now_ms} ms)"
            )));
        }
        if iat.is_some_and(|iat| exp <= iat) {
            return Err(TokenRejected::invalid(
                "the token expires before it was issued",
            ));
        }
        let scopes = scopes(claims.get(&self.scope_claim), &self.scope_claim)?;
        if let Some(missing) = self.required_scope.iter().find(|s| !scopes.contains(s)) {
            return Err(TokenRejected {
                status: "insufficient_scope",
                scope: Some(self.required_scope.join(" ")),
                reason: format!("the token lacks the required scope {missing}"),
            });
        }
        Ok(OAuthBearerToken {
            principal_name,
            lifetime_ms: exp,
            scopes,
        })
    }
}

/// `name="value"` (or unquoted `name=value`) in a JAAS line.
fn jaas_option(jaas: &str, name: &str) -> Option<String> {
    let mut rest = jaas;
    while let Some(i) = rest.find(name) {
        let before_ok = i == 0 || rest.as_bytes()[i - 1].is_ascii_whitespace();
        let after = rest[i + name.len()..].trim_start();
        rest = &rest[i + name.len()..];
        let Some(value) = after.strip_prefix('=').filter(|_| before_ok) else {
            continue;
        };
        let value = value.trim_start();
        return Some(match value.strip_prefix('"') {
            Some(q) => q.split('"').next().unwrap_or_default().to_string(),
            None => value
                .split(|c: char| c.is_whitespace() || c == ';')
                .next()
                .unwrap_or_default()
                .to_string(),
        });
    }
    None
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use base64::Engine;
    use jsonwebtoken::{EncodingKey, Header};
    use rsa::pkcs1::EncodeRsaPrivateKey;
    use rsa::traits::PublicKeyParts;
    use serde_json::json;

    const NOW_MS: i64 = 1_800_000_000_000;

    fn b64(bytes: &[u8]) -> String {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    }

    /// A signing key with its public JWK.
    pub(crate) struct TestKey {
        pub encoding: EncodingKey,
        pub alg: Algorithm,
        pub jwk: Value,
    }

    pub(crate) fn rsa_key(kid: &str) -> TestKey {
        let private = rsa::RsaPrivateKey::new(&mut rand::thread_rng(), 2048).unwrap();
        let der = private.to_pkcs1_der().unwrap();
        TestKey {
            encoding: EncodingKey::from_rsa_der(der.as_bytes()),
            alg: Algorithm::RS256,
            jwk: json!({"kty": "RSA", "kid": kid, "use": "sig", "alg": "RS256",
                "n": b64(&private.n().to_bytes_be()), "e": b64(&private.e().to_bytes_be())}),
        }
    }

    pub(crate) fn ec_key(kid: &str) -> TestKey {
        let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let point = pair.public_key_raw();
        assert_eq!(point[0], 4, "uncompressed point");
        TestKey {
            encoding: EncodingKey::from_ec_der(&pair.serialize_der()),
            alg: Algorithm::ES256,
            jwk: json!({"kty": "EC", "kid": kid, "crv": "P-256",
                "x": b64(&point[1..33]), "y": b64(&point[33..65])}),
        }
    }

    fn sign(key: &TestKey, kid: Option<&str>, claims: &Value) -> String {
        let mut header = Header::new(key.alg);
        header.kid = kid.map(str::to_string);
        jsonwebtoken::encode(&header, claims, &key.encoding).unwrap()
    }

    fn claims() -> Value {
        json!({"sub": "alice", "iss": "https://issuer.test", "aud": ["rill", "other"],
            "iat": NOW_MS / 1000 - 10, "exp": NOW_MS / 1000 + 600, "scope": "read write"})
    }

    fn validator(keys: &[&TestKey]) -> JwksValidator {
        let set: JwkSet = serde_json::from_value(
            json!({"keys": keys.iter().map(|k| k.jwk.clone()).collect::<Vec<_>>()}),
        )
        .unwrap();
        JwksValidator::new(
            set,
            ["rill".to_string()].into(),
            Some("https://issuer.test".into()),
            30,
            "sub".into(),
            "scope".into(),
        )
        .unwrap()
    }

    fn reason(r: Result<OAuthBearerToken, TokenRejected>) -> String {
        let e = r.unwrap_err();
        assert_eq!(e.status, "invalid_token");
        e.reason
    }

    #[test]
    fn signed_tokens_validate_with_rs256_and_es256() {
        let rsa = rsa_key("r1");
        let ec = ec_key("e1");
        let v = validator(&[&rsa, &ec]);
        for (key, kid) in [(&rsa, "r1"), (&ec, "e1")] {
            let t = v
                .validate(&sign(key, Some(kid), &claims()), NOW_MS)
                .unwrap();
            assert_eq!(t.principal_name, "alice");
            assert_eq!(t.lifetime_ms, (NOW_MS / 1000 + 600) * 1000);
            assert_eq!(t.scopes, ["read", "write"]);
        }
        // One key and no kid: that key.
        let only = validator(&[&ec]);
        assert!(only.validate(&sign(&ec, None, &claims()), NOW_MS).is_ok());
        // Two keys and no kid: refused.
        assert!(reason(v.validate(&sign(&ec, None, &claims()), NOW_MS)).contains("no kid"));
    }

    #[test]
    fn bad_signature_unknown_kid_and_wrong_key_are_refused() {
        let rsa = rsa_key("r1");
        let other = rsa_key("r1");
        let v = validator(&[&rsa]);
        // Signed by another key under the same kid.
        assert!(
            reason(v.validate(&sign(&other, Some("r1"), &claims()), NOW_MS))
                .contains("JWT refused")
        );
        // A signature of one token on another's claims.
        let good = sign(&rsa, Some("r1"), &claims());
        let forged_claims = b64(json!({"sub": "mallory", "exp": NOW_MS / 1000 + 600,
            "iat": NOW_MS / 1000, "iss": "https://issuer.test", "aud": "rill"})
        .to_string()
        .as_bytes());
        let parts: Vec<&str> = good.split('.').collect();
        let forged = format!("{}.{}.{}", parts[0], forged_claims, parts[2]);
        assert!(reason(v.validate(&forged, NOW_MS)).contains("JWT refused"));
        assert!(
            reason(v.validate(&sign(&rsa, Some("nope"), &claims()), NOW_MS))
                .contains("no key with kid")
        );
    }

    #[test]
    fn wrong_audience_issuer_and_times_are_refused() {
        let ec = ec_key("e1");
        let v = validator(&[&ec]);
        let with = |f: &dyn Fn(&mut serde_json::Map<String, Value>)| {
            let mut c = claims();
            f(c.as_object_mut().unwrap());
            v.validate(&sign(&ec, Some("e1"), &c), NOW_MS)
        };
        assert!(reason(with(&|c| {
            c.insert("aud".into(), json!("somebody-else"));
        }))
        .contains("audience"));
        assert!(reason(with(&|c| {
            c.remove("aud");
        }))
        .contains("audience"));
        assert!(reason(with(&|c| {
            c.insert("iss".into(), json!("https://evil.test"));
        }))
        .contains("issuer"));
        // Expired beyond the 30 s of skew; within it still good.
        assert!(reason(with(&|c| {
            c.insert("exp".into(), json!(NOW_MS / 1000 - 31));
        }))
        .contains("expired"));
        assert!(with(&|c| {
            c.insert("exp".into(), json!(NOW_MS / 1000 - 29));
        })
        .is_ok());
        assert!(reason(with(&|c| {
            c.insert("nbf".into(), json!(NOW_MS / 1000 + 60));
        }))
        .contains("not valid before"));
        // exp and iat are required, and a string is no date (CVE-2026-25537's lesson).
        assert!(reason(with(&|c| {
            c.remove("exp");
        }))
        .contains("no exp"));
        assert!(reason(with(&|c| {
            c.remove("iat");
        }))
        .contains("no iat"));
        assert!(reason(with(&|c| {
            c.insert("exp".into(), json!("99999999999"));
        }))
        .contains("not a number"));
        assert!(reason(with(&|c| {
            c.insert("nbf".into(), json!("99999999999"));
        }))
        .contains("not a number"));
        assert!(reason(with(&|c| {
            c.insert("sub".into(), json!(42));
        }))
        .contains("sub claim"));
        assert!(reason(with(&|c| {
            c.insert("scope".into(), json!({"x": 1}));
        }))
        .contains("scope claim"));
    }

    #[test]
    fn wrong_algorithms_and_alg_none_are_refused() {
        let rsa = rsa_key("r1");
        let ec = ec_key("e1");
        let v = validator(&[&rsa, &ec]);
        // An EC signature presented under the RSA key's kid.
        assert!(
            reason(v.validate(&sign(&ec, Some("r1"), &claims()), NOW_MS)).contains("does not fit")
        );
        // HS256 with the RSA key's public modulus as the secret (alg confusion).
        let n = rsa.jwk["n"].as_str().unwrap().to_string();
        let mut header = Header::new(Algorithm::HS256);
        header.kid = Some("r1".into());
        let hs = jsonwebtoken::encode(&header, &claims(), &EncodingKey::from_secret(n.as_bytes()))
            .unwrap();
        assert!(reason(v.validate(&hs, NOW_MS)).contains("does not fit"));
        // alg none, unsigned: not even a header the secured validator reads.
        let none = format!(
            "{}.{}.",
            b64(br#"{"alg":"none","kid":"r1"}"#),
            b64(claims().to_string().as_bytes())
        );
        assert!(reason(v.validate(&none, NOW_MS)).contains("header"));
        // A key whose JWK names RS512 does not verify RS256.
        let mut strict = rsa_key("r2");
        strict.jwk["alg"] = json!("RS512");
        let v2 = validator(&[&strict]);
        assert!(
            reason(v2.validate(&sign(&strict, Some("r2"), &claims()), NOW_MS))
                .contains("does not fit")
        );
        // Symmetric keys in the set are never used.
        let set: JwkSet = serde_json::from_value(
            json!({"keys": [{"kty": "oct", "kid": "h", "k": b64(b"secret")}]}),
        )
        .unwrap();
        assert!(
            JwksValidator::new(set, HashSet::new(), None, 30, "sub".into(), "scope".into())
                .is_err()
        );
        // Garbage of every shape is refused without a panic.
        for junk in [
            "",
            ".",
            "..",
            "a.b.c",
            "eyJ.eyJ.eyJ",
            "x".repeat(5000).as_str(),
        ] {
            assert!(v.validate(junk, NOW_MS).is_err(), "{junk}");
        }
    }

    fn unsecured_token(claims: &Value) -> String {
        format!(
            "{}.{}.",
            b64(br#"{"alg":"none"}"#),
            b64(claims.to_string().as_bytes())
        )
    }

    #[test]
    fn the_unsecured_validator_checks_claims_as_kafkas_does() {
        let v = UnsecuredValidator::from_jaas(
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required \
             unsecuredValidatorRequiredScope=\"produce\" unsecuredValidatorAllowableClockSkewMs=\"1000\";",
        )
        .unwrap();
        let good = json!({"sub": "bob", "iat": NOW_MS / 1000, "exp": NOW_MS / 1000 + 60,
            "scope": ["produce", "consume"]});
        let t = v.validate(&unsecured_token(&good), NOW_MS).unwrap();
        assert_eq!(t.principal_name, "bob");
        // Missing scope: insufficient_scope with the scope required.
        let mut c = good.clone();
        c["scope"] = json!("consume");
        let e = v.validate(&unsecured_token(&c), NOW_MS).unwrap_err();
        assert_eq!(e.status, "insufficient_scope");
        assert_eq!(
            e.json(),
            r#"{"scope":"produce","status":"insufficient_scope"}"#
        );
        // Expired, or signed, or not alg none: refused.
        let mut c = good.clone();
        c["exp"] = json!(NOW_MS / 1000 - 2);
        assert!(v.validate(&unsecured_token(&c), NOW_MS).is_err());
        let signed = format!("{}sig", unsecured_token(&good));
        assert!(v.validate(&signed, NOW_MS).is_err());
        let rs = format!(
            "{}.{}.",
            b64(br#"{"alg":"RS256"}"#),
            b64(good.to_string().as_bytes())
        );
        assert!(v.validate(&rs, NOW_MS).is_err());
        assert!(
            UnsecuredValidator::from_jaas("unsecuredValidatorAllowableClockSkewMs=\"-1\"").is_err()
        );
    }

    #[test]
    fn the_initial_response_parses_as_kafkas_pattern() {
        let r = ClientInitialResponse::parse(b"n,,\x01auth=Bearer abc.def.ghi\x01\x01").unwrap();
        assert_eq!(r.token, "abc.def.ghi");
        assert_eq!(r.authorization_id, "");
        let r = ClientInitialResponse::parse(
            b"n,a=alice,\x01auth=bearer a-b_c~d+e/f.g==\x01traceId=123\x01\x01",
        )
        .unwrap();
        assert_eq!(r.authorization_id, "alice");
        assert_eq!(r.token, "a-b_c~d+e/f.g==");
        assert_eq!(r.extensions, [("traceId".to_string(), "123".to_string())]);
        for bad in [
            &b""[..],
            b"n,,",
            b"y,,\x01auth=Bearer t\x01\x01",
            b"n,,\x01auth=Bearer t\x01",
            b"n,,\x01\x01",
            b"n,,\x01auth=Basic t\x01\x01",
            b"n,,\x01auth=Bearer \x01\x01",
            b"n,,\x01auth=Bearer t!\x01\x01",
            b"n,a=,\x01auth=Bearer t\x01\x01",
            b"n,a=x=2D,\x01auth=Bearer t\x01\x01",
            b"n,,\x01k1=v\x01auth=Bearer t\x01\x01",
            b"n,,\x01auth=Bearer t\x01k=\x01\x01",
            b"\xff,,\x01auth=Bearer t\x01\x01",
        ] {
            assert!(ClientInitialResponse::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn jaas_options_are_read_quoted_or_not() {
        let jaas = "X required unsecuredValidatorPrincipalClaimName=\"uid\" \
                    unsecuredValidatorScopeClaimName=scp;";
        assert_eq!(
            jaas_option(jaas, "unsecuredValidatorPrincipalClaimName").as_deref(),
            Some("uid")
        );
        assert_eq!(
            jaas_option(jaas, "unsecuredValidatorScopeClaimName").as_deref(),
            Some("scp")
        );
        assert_eq!(jaas_option(jaas, "unsecuredValidatorRequiredScope"), None);
    }
}
